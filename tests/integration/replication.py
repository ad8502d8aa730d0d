"""A PostgreSQL primary and a streaming-replication standby made with ``pg_basebackup``,
for failover tests. Both are private clusters (``devkit.PostgresServer``) on
loopback; the standby follows the primary synchronously or asynchronously."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from devkit import PG_SUPERUSER, PostgresServer
from devkit.ports import free_port
from devkit.postgres import pg_bindir

REPLICATION_TIMEOUT_S = 60.0


class Primary(PostgresServer):
    """A cluster whose commits, once ``synchronous``, wait for its standby's flush
    (``synchronous_standby_names = '*'``, set when the standby streams: before, the
    primary's own bootstrap would wait for a standby that does not exist yet)."""

    def __init__(self, root: Path, port: int, *, synchronous: bool) -> None:
        super().__init__(root, port)
        self.synchronous = synchronous

    def admin(self, sql: str) -> list[tuple[object, ...]]:
        conninfo = f"host={self.socket_dir} port={self.port} user={PG_SUPERUSER} dbname=postgres"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            cur = conn.execute(sql)  # type: ignore[arg-type]  # the tests' own constant SQL
            return cur.fetchall() if cur.description else []

    def wait_for_standby(self) -> None:
        """Until one standby streams; then, when synchronous, until it is the sync one."""
        self._wait_for("async")
        if self.synchronous:
            self.admin("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.admin("SELECT pg_reload_conf()")
            self._wait_for("sync")

    def _wait_for(self, wanted: str) -> None:
        deadline = time.monotonic() + REPLICATION_TIMEOUT_S
        while time.monotonic() < deadline:
            if (wanted,) in self.admin("SELECT sync_state FROM pg_stat_replication"):
                return
            time.sleep(0.1)
        raise AssertionError(f"no {wanted} standby within {REPLICATION_TIMEOUT_S:g}s")


class Standby(PostgresServer):
    """A copy of ``primary`` by ``pg_basebackup -R`` (standby.signal and primary_conninfo
    written), streaming from it until :meth:`promote`."""

    def __init__(self, root: Path, port: int, primary: PostgresServer) -> None:
        super().__init__(root, port)
        self.primary = primary

    def start(self, timeout: float = 60.0) -> None:
        if not (self.data_dir / "PG_VERSION").exists():
            self._base_backup()
        super().start(timeout)  # its bootstrap finds the role and database replicated

    def _base_backup(self) -> None:
        self._ensure_layout()
        backup = [
            str(pg_bindir() / "pg_basebackup"),
            *("-h", str(self.primary.socket_dir), "-p", str(self.primary.port)),
            *("-U", PG_SUPERUSER, "-D", str(self.data_dir)),
            *("-R", "-X", "stream", "-c", "fast"),
        ]
        self._run(self._as_server_user(backup))

    def promote(self) -> None:
        """End recovery: this cluster becomes a primary that accepts writes."""
        self._pg_ctl("promote", "-w", "-t", "60")


def make_pair(tmp: Path, *, synchronous: bool) -> tuple[Primary, Standby]:
    primary = Primary(tmp / "primary", free_port(), synchronous=synchronous)
    primary.start()
    standby = Standby(tmp / "standby", free_port(), primary)
    standby.start()
    primary.wait_for_standby()
    return primary, standby


def failover_url(primary: PostgresServer, standby: PostgresServer, database: str) -> str:
    """One URL naming both hosts; libpq takes the first that accepts writes."""
    single = primary.url_for(database)
    prefix, _, rest = single.partition(f"127.0.0.1:{primary.port}")
    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    return f"{prefix}{hosts}{rest}?target_session_attrs=read-write"
