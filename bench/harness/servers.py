"""The bench's own scratch resources: staging databases migrated by Alembic, InfluxDB databases.

Every database the bench uses is created here under a unique prefix and
dropped afterwards (also after a failure), so a run never touches the
developer's ``twophase`` databases or another engineer's test databases.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from twophase.config import (
    InfluxDBSettings,
    StagingConfig,
    TargetConfig,
    TwoPhaseConfig,
    load_staging_config,
)
from twophase.influx.query import query_v1

REPO = Path(__file__).resolve().parents[2]
_ENV_HINT = 'start the servers and export their URLs: eval "$(scripts/dev.sh env)"'


class BenchSetupError(RuntimeError):
    """The servers or the schema are not there; the message says what to run."""


@dataclass(frozen=True)
class Servers:
    """Where the servers are (from TWOPHASE_STAGING_URL and TWOPHASE_TARGET_URL)."""

    staging_url: str
    influx_url: str

    @classmethod
    def from_env(cls) -> Servers:
        names = ("TWOPHASE_STAGING_URL", "TWOPHASE_TARGET_URL")
        # A shell set up before the rename has the URL under its former name.
        found = {n: os.environ.get(n) for n in names} | {
            names[1]: os.environ.get(names[1]) or os.environ.get("TWOPHASE_INFLUX_URL")
        }
        missing = [n for n in names if not found[n]]
        if missing:
            raise BenchSetupError(f"{', '.join(missing)} not set: {_ENV_HINT}")
        return cls(str(found[names[0]]), str(found[names[1]]).rstrip("/"))


def admin_conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _url_for(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def create_staging(servers: Servers, name: str, repo: Path = REPO) -> str:
    """CREATE DATABASE ``name`` and run ``alembic upgrade head`` on it, as users do, with
    the migrations of the checkout ``repo``; its URL."""
    with psycopg.connect(admin_conninfo(servers.staging_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = _url_for(servers.staging_url, name)
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=repo,
        env={**os.environ, "TWOPHASE_STAGING_URL": url},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        drop_staging(servers, name)
        raise BenchSetupError(f"alembic upgrade head failed on {name}:\n{done.stderr}")
    return url


def drop_staging(servers: Servers, name: str, attempts: int = 20) -> None:
    """DROP DATABASE, waiting for the bench's own pools to go away.

    Not ``WITH (FORCE)`` first: FORCE refuses to terminate an autovacuum worker
    (a superuser process) and fails, while a plain DROP makes autovacuum quit.
    """
    with psycopg.connect(admin_conninfo(servers.staging_url), autocommit=True) as conn:
        for _ in range(attempts):
            try:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
                return
            except psycopg.errors.ObjectInUse:
                time.sleep(0.25)
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def influx_admin(servers: Servers, statement: str) -> None:
    query_v1(servers.influx_url, None, statement, method="POST")


@dataclass
class Scratch:
    """The databases of one bench run; ``staging_url(role)`` / ``influx(role)`` make them lazily."""

    servers: Servers
    prefix: str = field(default_factory=lambda: f"twophase_bench_{uuid.uuid4().hex[:8]}")
    _staging: dict[str, str] = field(default_factory=dict)
    _influx: dict[str, str] = field(default_factory=dict)

    def staging_url(self, role: str, repo: Path = REPO) -> str:
        """The staging database of ``role``, migrated by ``repo``'s migrations when made."""
        if role not in self._staging:
            self._staging[role] = create_staging(self.servers, f"{self.prefix}_{role}", repo)
        return self._staging[role]

    def staging(self, role: str) -> StagingConfig:
        return load_staging_config(env={}, staging_url=self.staging_url(role))

    def influx(self, role: str) -> TargetConfig:
        name = self._influx.get(role)
        if name is None:
            name = self._influx[role] = f"{self.prefix}_{role}"
            influx_admin(self.servers, f'CREATE DATABASE "{name}"')
        return TargetConfig(
            url=self.servers.influx_url, influxdb=InfluxDBSettings(api="v1", database=name)
        )

    def drop(self, role: str) -> None:
        """Drop the staging and the InfluxDB database of ``role`` now, where made
        (a metric that makes one per run keeps the servers' disks small)."""
        if role in self._staging:
            del self._staging[role]
            drop_staging(self.servers, f"{self.prefix}_{role}")
        name = self._influx.pop(role, None)
        if name is not None:
            influx_admin(self.servers, f'DROP DATABASE "{name}"')

    def config(self, staging_role: str, influx_role: str) -> TwoPhaseConfig:
        return TwoPhaseConfig(self.staging(staging_role), self.influx(influx_role))

    def drop_all(self) -> None:
        """Drop everything made; a failure is reported and the rest still dropped."""
        drops = [partial(drop_staging, self.servers, f"{self.prefix}_{r}") for r in self._staging]
        drops += [
            partial(influx_admin, self.servers, f'DROP DATABASE "{name}"')
            for name in self._influx.values()
        ]
        self._staging.clear()
        self._influx.clear()
        for drop in drops:
            try:
                drop()
            except Exception as exc:  # keep dropping the others
                print(f"bench: could not drop a scratch database: {exc}", file=sys.stderr)


@dataclass(frozen=True)
class PgTarget:
    """A PostgreSQL target database: its URL without the password, the password apart."""

    url: str
    password: str
    database: str


@contextmanager
def pg_target(servers: Servers, name: str) -> Iterator[PgTarget]:
    """A fresh, empty database on the dev PostgreSQL to write into, dropped after."""
    with psycopg.connect(admin_conninfo(servers.staging_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # name: the bench's own prefix and hex
    base = make_url(servers.staging_url)
    url = f"postgresql://{base.username}@{base.host}:{base.port or 5432}/{name}"
    try:
        yield PgTarget(url, str(base.password or ""), name)
    finally:
        drop_staging(servers, name)


@contextmanager
def scratch(servers: Servers) -> Iterator[Scratch]:
    """Scratch databases, dropped on the way out whatever happened."""
    made = Scratch(servers)
    try:
        yield made
    finally:
        made.drop_all()
