"""Carrying out the soak's faults on the real processes and servers.

Each fault runs on a thread of its own, so outages overlap: InfluxDB may be
stopped while PostgreSQL restarts and a driver is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg

from scripts.services import PG_SUPERUSER, InfluxServer, PostgresServer
from tests.e2e.harness import Job, session_members
from tests.integration.faultproxy import CUT, PASS, STALL, FaultProxy
from tests.soak.schedule import (
    DRIVER_KILL,
    EXECUTOR_KILL,
    INFLUX_STOP,
    PG_FAST,
    PG_IMMEDIATE,
    PG_TERMINATE,
    PROXY_CUT,
    PROXY_STALL,
    Fault,
)

_WORKER_MARKS = (b"pyspark.daemon", b"pyspark.worker", b"pyspark/daemon.py", b"pyspark/worker.py")


class Injector:
    """Runs faults against the soak's servers and its sinks' jobs; counts what it did."""

    def __init__(
        self,
        postgres: PostgresServer,
        influx: InfluxServer,
        proxy: FaultProxy,
        jobs: Callable[[int], Job | None],
        on_kill: Callable[[int], None],
        log: Callable[[str], None],
    ) -> None:
        self._postgres, self._influx, self._proxy = postgres, influx, proxy
        self._jobs, self._on_kill, self._log = jobs, on_kill, log
        # One outage of a server at a time; the two servers' outages do overlap.
        self._influx_lock, self._pg_lock = threading.Lock(), threading.Lock()
        self.done: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self._threads: list[threading.Thread] = []

    def run(self, schedule: Sequence[Fault], started: float) -> None:
        """Start each fault at its time (from ``started``, a monotonic clock reading)."""
        for fault in schedule:
            time.sleep(max(0.0, started + fault.at_s - time.monotonic()))
            thread = threading.Thread(target=self._apply, args=(fault,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def wait(self) -> None:
        for thread in self._threads:
            thread.join()

    def _apply(self, fault: Fault) -> None:
        self._log(f"fault: {fault.describe()}")
        action = {
            DRIVER_KILL: self._driver_kill,
            EXECUTOR_KILL: self._executor_kill,
            INFLUX_STOP: self._influx_stop,
            PROXY_STALL: lambda f: self._proxy_outage(f, STALL),
            PROXY_CUT: lambda f: self._proxy_outage(f, CUT),
            PG_FAST: lambda f: self._pg_restart(f, "fast"),
            PG_IMMEDIATE: lambda f: self._pg_restart(f, "immediate"),
            PG_TERMINATE: self._pg_terminate,
        }[fault.kind]
        if action(fault) is False:
            self.skipped[fault.kind] += 1
            self._log(f"fault skipped (nothing to hit): {fault.describe()}")
        else:
            self.done[fault.kind] += 1

    def _driver_kill(self, fault: Fault) -> bool:
        job = self._jobs(int(fault.sink or 0))
        if job is None or job.returncode is not None:
            return False
        self._on_kill(int(fault.sink or 0))
        job.kill()
        return True

    def _executor_kill(self, fault: Fault) -> bool:
        job = self._jobs(int(fault.sink or 0))
        if job is None or job.returncode is not None:
            return False
        workers = [pid for pid in session_members(job.proc.pid) if _is_python_worker(pid)]
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return bool(workers)

    def _influx_stop(self, fault: Fault) -> None:
        with self._influx_lock:
            self._influx.stop()
            time.sleep(fault.duration_s)
            self._influx.start()

    def _proxy_outage(self, fault: Fault, mode: str) -> None:
        self._proxy.set_mode(mode)
        time.sleep(fault.duration_s)
        self._proxy.set_mode(PASS)

    def _pg_restart(self, fault: Fault, mode: str) -> None:
        with self._pg_lock:
            self._postgres.stop(mode=mode)
            time.sleep(fault.duration_s)
            self._postgres.start()

    def _pg_terminate(self, fault: Fault) -> bool:
        pg = self._postgres
        conninfo = f"host={pg.socket_dir} port={pg.port} user={PG_SUPERUSER} dbname=postgres"
        try:
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
                row = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE usename = 'twophase'"
                ).fetchone()
        except psycopg.OperationalError:
            return False  # PostgreSQL is restarting: nothing to terminate
        return bool(row and row[0])


def _is_python_worker(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(mark in cmdline for mark in _WORKER_MARKS)
