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

from devkit import PG_SUPERUSER, InfluxServer, PostgresServer
from devkit.faultproxy import CUT, PASS, STALL, FaultProxy
from tests.e2e.harness import Job, session_members
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

TARGET_WAIT_S = 90.0  # how long a per-sink fault waits for its sink to be running
_WORKER_MARKS = (b"pyspark.daemon", b"pyspark.worker", b"pyspark/daemon.py", b"pyspark/worker.py")


class Injector:
    """Runs faults against the soak's servers and its sinks' jobs; counts what it did."""

    def __init__(
        self,
        postgres: PostgresServer,
        database: str,
        influx: InfluxServer,
        proxy: FaultProxy,
        jobs: Callable[[int], Job | None],
        on_kill: Callable[[int], None],
        log: Callable[[str], None],
    ) -> None:
        self._postgres, self._database = postgres, database
        self._influx, self._proxy = influx, proxy
        self._jobs, self._on_kill, self._log = jobs, on_kill, log
        # One outage of a server (or the proxy) at a time, so that the end of one does
        # not cut another short; outages of different servers do overlap.
        self._influx_lock, self._pg_lock = threading.Lock(), threading.Lock()
        self._proxy_lock = threading.Lock()
        self._started = time.monotonic()
        self.done: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self._threads: list[threading.Thread] = []

    def run(self, schedule: Sequence[Fault], started: float) -> None:
        """Start each fault at its time (from ``started``, a monotonic clock reading)."""
        self._started = started
        for fault in schedule:
            time.sleep(max(0.0, started + fault.at_s - time.monotonic()))
            thread = threading.Thread(target=self._apply, args=(fault,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def wait(self) -> None:
        for thread in self._threads:
            thread.join()

    def _say(self, what: str) -> None:
        self._log(f"[{time.monotonic() - self._started:7.1f}s] {what}")

    def _apply(self, fault: Fault) -> None:
        self._say(f"fault: {fault.describe()}")
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
            self._say(f"fault skipped (nothing to hit): {fault.describe()}")
        else:
            self.done[fault.kind] += 1
            if fault.duration_s:
                self._say(f"fault over: {fault.describe()}")

    def _driver_kill(self, fault: Fault) -> bool:
        job = self._target(fault, lambda job: True)
        if job is None:
            return False
        self._on_kill(int(fault.sink or 0))
        job.kill()
        self._say(f"SIGKILLed the driver of sink {fault.sink} (its whole session)")
        return True

    def _executor_kill(self, fault: Fault) -> bool:
        job = self._target(fault, lambda job: bool(_workers(job)))
        if job is None:
            return False
        workers = _workers(job)
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self._say(f"SIGKILLed {len(workers)} Python worker(s) of sink {fault.sink}")
        return bool(workers)

    def _target(self, fault: Fault, ready: Callable[[Job], bool]) -> Job | None:
        """The sink's running job once ``ready``: a sink that is restarting (a Spark start
        takes 20-60 s here) is waited for, so that the fault hits rather than misses."""
        deadline = time.monotonic() + TARGET_WAIT_S
        while time.monotonic() < deadline:
            job = self._jobs(int(fault.sink or 0))
            if job is not None and job.returncode is None and ready(job):
                return job
            time.sleep(0.5)
        return None

    def _influx_stop(self, fault: Fault) -> None:
        with self._influx_lock:
            self._influx.stop()
            time.sleep(fault.duration_s)
            self._influx.start()

    def _proxy_outage(self, fault: Fault, mode: str) -> None:
        with self._proxy_lock:
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
                    " WHERE usename = 'twophase' AND datname = %s",
                    (self._database,),
                ).fetchone()
        except psycopg.OperationalError:
            return False  # PostgreSQL is restarting: nothing to terminate
        return bool(row and row[0])


def _workers(job: Job) -> list[int]:
    """The job's Python workers, forked by pyspark.daemon: killed, their task fails and
    Spark retries it. Not the daemon itself (the JVM's child): without it, Spark fails
    the query ("EOFException ... reading the port number from pyspark.daemon")."""
    python = {pid for pid in session_members(job.proc.pid) if _is_python_worker(pid)}
    return [pid for pid in python if _parent(pid) in python]


def _is_python_worker(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(mark in cmdline for mark in _WORKER_MARKS)


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat.rsplit(b")", 1)[1].split()[1])
