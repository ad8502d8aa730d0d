"""Helpers shared by the integration and e2e tests (real servers only)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from twophase.config import InfluxConfig, StagingConfig, TwoPhaseConfig, load_staging_config
from twophase.errors import TwoPhaseError
from twophase.influx.query import query_v1

REPO = Path(__file__).resolve().parents[1]


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


def influx_query(config: InfluxConfig, q: str) -> list[dict[str, Any]]:
    password = config.password.reveal() if config.password else None
    return query_v1(config.url, config.database, q, config.username, password)


def influx_rows(config: InfluxConfig, measurement: str) -> list[tuple[Any, ...]]:
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


def influx_count(config: InfluxConfig, measurement: str) -> int:
    return len(influx_rows(config, measurement))


@contextmanager
def two_phase(staging: StagingConfig, influx: InfluxConfig, **parts: Any) -> Iterator[Any]:
    from twophase.protocol.runtime import TwoPhase

    tp = TwoPhase.open(TwoPhaseConfig(staging, influx), **parts)
    try:
        yield tp
    finally:
        tp.close()


def staging_config_for(url: str, **overrides: Any) -> StagingConfig:
    return load_staging_config(env={}, staging_url=url, **overrides)


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A free port whose neighbour +2 is free too (influxd binds its RPC port there)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port_is_free(port + 2):
            return port
    raise RuntimeError("no free pair of ports")


OWN_INFLUX_DB = "outage"  # the database of the integration tests' own InfluxDB server


def start_own_influx(root: Path, database: str) -> Any:
    """A dedicated InfluxDB 1.x server on free ports, with ``database``; retried on a new
    port when another process grabbed the chosen one between the check and influxd's bind."""
    from scripts.services import InfluxServer, ServiceError

    for attempt in range(3):
        server = InfluxServer(root / f"influxd-{attempt}", free_port())
        try:
            server.start()
        except ServiceError:
            server.kill()
            continue
        server.create_database(database)
        return server
    raise RuntimeError("influxd did not start on three pairs of free ports")


def start_own_victoria_metrics(root: Path, dedup_interval: str | None) -> Any:
    """A dedicated VictoriaMetrics on a free port, ``-dedup.minScrapeInterval`` set to
    ``dedup_interval`` (None: deduplication off, every sample kept); retried on a new port
    like ``start_own_influx``."""
    from scripts.services import ServiceError, VictoriaMetricsServer

    for attempt in range(3):
        server = VictoriaMetricsServer(root / f"vm-{attempt}", free_port(), dedup_interval)
        try:
            server.start()
        except ServiceError:
            server.kill()
            continue
        return server
    raise RuntimeError("victoria-metrics did not start on three free ports")


def begin_run(tp: Any, sink_id: str, run_id: str, query_id: str | None) -> Any:
    """A run's claim of the sink without its recovery (``Ledger.begin_run``), with the
    configured targets registered as a query's claim registers them."""
    return tp.begin_run(sink_id, run_id, query_id)
