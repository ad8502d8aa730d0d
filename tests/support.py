"""Helpers shared by the integration and e2e tests (real servers only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from tests.docs_examples import program
from twophase.config import (
    ExporterConfig,
    PostgreSQLSettings,
    Secret,
    StagingConfig,
    TargetConfig,
    TwoPhaseConfig,
    load_staging_config,
)
from twophase.config.urls import DbUrl
from twophase.errors import TwoPhaseError
from twophase.influx.query import query_v1

if TYPE_CHECKING:  # at run time two_phase() imports it, when first called
    from twophase.model import Lease
    from twophase.protocol.commit.runtime import TwoPhase

REPO = Path(__file__).resolve().parents[1]


def target_config(url: str, **fields: Any) -> TargetConfig:
    """A target's configuration from fields by name: a kind's own (``database``,
    ``schema``...) go to its section."""
    return TargetConfig(url=url).with_fields(**fields)


def changed(config: TargetConfig, **fields: Any) -> TargetConfig:
    """``config`` with fields replaced by name, a kind's own in its section."""
    return config.with_fields(**fields)


def require_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"{name} is not set: run the tests through `scripts/dev.sh test`, which starts "
            "the servers and sets it"
        )
    return value


def admin_conninfo(url: str, database: str | None = None) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    if database:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


def alembic(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    """Run the real `alembic` command from the repository root, as users do."""
    env = {**os.environ, "TWOPHASE_STAGING_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def create_database(base_url: str, name: str, template: str | None = None) -> str:
    """A fresh database next to ``base_url``'s; returns its URL."""
    with psycopg.connect(admin_conninfo(base_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        suffix = f' TEMPLATE "{template}"' if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{suffix}')
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


def create_migrated_database(base_url: str, name: str, revision: str = "head") -> str:
    """A fresh database migrated by the real ``alembic upgrade``, as users do; its URL."""
    url = create_database(base_url, name)
    done = alembic("upgrade", revision, url=url)
    assert done.returncode == 0, done.stderr
    return url


def drop_database(base_url: str, name: str, attempts: int = 20) -> None:
    """DROP ... WITH (FORCE). An autovacuum worker in the database (a superuser's
    process, which the test role may not terminate) fails it for a moment: retried."""
    for attempt in range(attempts):
        try:
            with psycopg.connect(admin_conninfo(base_url), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except psycopg.errors.InsufficientPrivilege:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)


@contextmanager
def postgresql_target(base_url: str, prefix: str) -> Iterator[tuple[TargetConfig, str]]:
    """A PostgreSQL target in a database of its own on the staging server (its tables made
    from what it is sent), and that database's admin conninfo; dropped afterwards."""
    name = unique(prefix)
    create_database(base_url, name)
    base = DbUrl.parse(base_url)
    assert base.password is not None
    config = TargetConfig(
        url=f"postgresql://{base.user}@{base.hosts}/{name}",
        password=Secret(base.password),
        timeout_s=5,
        retry_deadline_s=20,
        retry_initial_s=0.05,
        retry_max_s=1,
        postgresql=PostgreSQLSettings(create_tables=True),
    )
    try:
        yield config, admin_conninfo(base_url, name)
    finally:
        drop_database(base_url, name)


def influx_admin(url: str, statement: str) -> None:
    """Run an InfluxQL admin statement; raises on errors InfluxDB reports inside a 200."""
    query_v1(url, None, statement, method="POST")


def create_influx_database(url: str, name: str, attempts: int = 5) -> None:
    """CREATE DATABASE ``name`` and wait until InfluxDB lists it.

    A 1.x server has answered a CREATE with 200 and then refused writes with
    "database not found" (seen once in CI, as in influxdb#5547 under rapid
    create/drop), so the statement is re-issued (it is idempotent) until
    SHOW DATABASES lists the database; the last error is raised otherwise.
    """
    problem = "never listed by SHOW DATABASES"
    for attempt in range(attempts):
        try:
            influx_admin(url, f'CREATE DATABASE "{name}"')
            if name in influx_databases(url):
                return
        except TwoPhaseError as exc:  # reported inside a 200, or a 5xx
            problem = str(exc)
        time.sleep(0.1 * (attempt + 1))
    raise AssertionError(f"InfluxDB at {url} did not create database {name!r}: {problem}")


def drop_influx_database(url: str, name: str) -> None:
    influx_admin(url, f'DROP DATABASE "{name}"')


def influx_databases(url: str) -> set[str]:
    series = query_v1(url, None, "SHOW DATABASES")
    return {row[0] for item in series for row in item.get("values") or []}


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def influx_query(config: TargetConfig, q: str) -> list[dict[str, Any]]:
    password = config.password.reveal() if config.password else None
    return query_v1(config.url, config.influxdb.database, q, config.username, password)


def influx_rows(config: TargetConfig, measurement: str) -> list[tuple[Any, ...]]:
    """Every point of a measurement as sorted (time, tags..., fields...) tuples."""
    rows: list[tuple[Any, ...]] = []
    # InfluxQL has no bind parameters for identifiers: quote it (test data only).
    quoted = measurement.replace("\\", "\\\\").replace('"', '\\"')
    query = f'SELECT * FROM "{quoted}" GROUP BY *'  # noqa: S608
    for series in influx_query(config, query):
        tags = tuple(sorted((series.get("tags") or {}).items()))
        for values in series.get("values", []):
            rows.append(
                (values[0], tags, tuple(zip(series["columns"][1:], values[1:], strict=True)))
            )
    return sorted(rows, key=repr)


def influx_count(config: TargetConfig, measurement: str) -> int:
    return len(influx_rows(config, measurement))


@contextmanager
def two_phase(staging: StagingConfig, influx: TargetConfig, **parts: Any) -> Iterator[TwoPhase]:
    from twophase.protocol.commit.runtime import TwoPhase

    tp = TwoPhase.open(TwoPhaseConfig(staging, influx), **parts)
    try:
        yield tp
    finally:
        tp.close()


def staging_config_for(url: str, **overrides: Any) -> StagingConfig:
    return load_staging_config(env={}, staging_url=url, **overrides)


OWN_INFLUX_DB = "outage"  # the database of the integration tests' own InfluxDB server


def begin_run(tp: TwoPhase, sink_id: str, run_id: str, query_id: str | None) -> Lease:
    """A run's claim of the sink without its recovery (``Ledger.begin_run``), with the
    configured targets registered as a query's claim registers them."""
    return tp.begin_run(sink_id, run_id, query_id)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


NO_CACHE = ExporterConfig(cache_s=0)


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


# The proxy settings of the environment must not apply to a local test server.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# What a point looks like when read back: time, tags, fields.
Stored = tuple[int, dict[str, str], dict[str, Any]]


@dataclass(frozen=True)
class Influx:
    """One scratch database on the server, through the plain 1.x HTTP API."""

    url: str
    database: str

    def write(self, body: str) -> tuple[int, str]:
        query = urllib.parse.urlencode({"db": self.database, "precision": "ns"})
        request = urllib.request.Request(f"{self.url}/write?{query}", data=body.encode("utf-8"))
        try:
            with OPENER.open(request, timeout=30) as response:
                return response.status, ""
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode("utf-8", "replace")

    def query(self, statement: str) -> list[dict[str, Any]]:
        params = {"db": self.database, "q": statement, "epoch": "ns"}
        request = urllib.request.Request(
            f"{self.url}/query", data=urllib.parse.urlencode(params).encode()
        )
        with OPENER.open(request, timeout=30) as response:
            result = json.load(response)["results"][0]
        assert "error" not in result, result
        return list(result.get("series", []))

    def points(self, source: str = "/.*/") -> dict[str, list[Stored]]:
        """Every point of the database (or of ``source``, an InfluxQL FROM) by measurement
        (GROUP BY * puts tags apart)."""
        found: dict[str, list[Stored]] = {}
        query = f"SELECT * FROM {source} GROUP BY *"  # noqa: S608 InfluxQL, the test's own names
        for series in self.query(query):
            # A series lists every tag key of its measurement; absent ones are "".
            tags = {key: value for key, value in (series.get("tags") or {}).items() if value}
            for values in series["values"]:
                fields = dict(zip(series["columns"][1:], values[1:], strict=True))
                fields = {key: value for key, value in fields.items() if value is not None}
                found.setdefault(series["name"], []).append((values[0], tags, fields))
        return found


def run_page(page: Path, staging_url: str, influx_url: str, tmp_path: Path) -> str:
    name = unique("docs")
    url = create_migrated_database(staging_url, name)
    create_influx_database(influx_url, name)
    env = {
        **os.environ,
        "TWOPHASE_STAGING_URL": url,
        "TWOPHASE_TARGET_URL": influx_url,
        "TWOPHASE_INFLUX_API": "v1",
        "TWOPHASE_INFLUX_DB": name,
        "PYSPARK_PYTHON": sys.executable,
    }
    env.pop("TWOPHASE_CONFIG", None)
    script = tmp_path / f"{page.stem}.py"
    script.write_text(program(page) or "")
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        drop_database(staging_url, name)
        drop_influx_database(influx_url, name)
    assert done.returncode == 0, f"{page.name}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


SQLITE_EXAMPLE = REPO / "examples" / "sqlite-target"


def sqlite_example() -> Any:
    """The example kinds' module, read from ``examples/sqlite-target`` under a name of its
    own (not the installed package's: a test that installs it finds it as users do)."""
    import importlib.util

    name = "sqlite_example_source"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, SQLITE_EXAMPLE / "twophase_sqlite_target.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
