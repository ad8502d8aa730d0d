"""The development servers (PostgreSQL, InfluxDB, VictoriaMetrics) and the command that
starts, stops and reports them: ``python -m devkit start|stop|status|env`` (what
``scripts/dev.sh start|stop|status|env`` runs)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

from devkit.daemon import DEFAULT_LOCAL_DIR, INFLUX_DATABASE, ServiceError, log
from devkit.postgres import PostgresServer
from devkit.servers import InfluxServer, VictoriaMetricsServer


def _port(env_var: str, default: int) -> int:
    return int(os.environ.get(env_var, default))


def _local_dir() -> Path:
    return Path(os.environ.get("TWOPHASE_LOCAL_DIR", DEFAULT_LOCAL_DIR))


@contextlib.contextmanager
def _cli_lock() -> Iterator[None]:
    # Two `dev.sh test` runs started together must not both run initdb on the same folder.
    _local_dir().mkdir(parents=True, exist_ok=True)
    with open(_local_dir() / ".services.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def default_servers() -> tuple[PostgresServer, InfluxServer, VictoriaMetricsServer]:
    """The development servers; ports via TWOPHASE_*_PORT, folder via TWOPHASE_LOCAL_DIR."""
    local = _local_dir()
    return (
        PostgresServer(local / "postgres", _port("TWOPHASE_PG_PORT", 55432)),
        InfluxServer(local / "influxdb", _port("TWOPHASE_INFLUX_PORT", 18086)),
        VictoriaMetricsServer(local / "victoria-metrics", _port("TWOPHASE_VM_PORT", 18428)),
    )


def env_lines() -> list[str]:
    pg, influx, vm = default_servers()
    values = {
        "TWOPHASE_STAGING_URL": pg.url,
        "TWOPHASE_TARGET_URL": influx.url,
        "TWOPHASE_INFLUX_API": "v1",
        "TWOPHASE_INFLUX_DB": INFLUX_DATABASE,
        "TWOPHASE_TEST_VM_URL": vm.url,
    }
    return [f"export {key}={shlex.quote(value)}" for key, value in values.items()]


def _cmd_start() -> int:
    pg, influx, vm = default_servers()
    with _cli_lock():
        for server in (pg, influx, vm):
            server.start()
        influx.create_database(INFLUX_DATABASE)
    return _cmd_status()


def _cmd_stop() -> int:
    servers = default_servers()
    with _cli_lock():
        for server in servers:
            server.stop()
            print(server.status())
    # Success means none of *our* processes is left; a foreign server on a port is not ours.
    return 1 if any(server.is_running() for server in servers) else 0


def _cmd_status() -> int:
    servers = default_servers()
    for server in servers:
        print(server.status())
    return 0 if all(server.is_reachable() for server in servers) else 1


def _cmd_env() -> int:
    print("\n".join(env_lines()))
    return 0


COMMANDS = {"start": _cmd_start, "stop": _cmd_stop, "status": _cmd_status, "env": _cmd_env}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in COMMANDS:
        print(f"usage: python -m devkit {{{'|'.join(COMMANDS)}}}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]]()
    except ServiceError as exc:
        log(f"error: {exc}")
        return 1
