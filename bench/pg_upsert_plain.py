"""The plain writer twophase's PostgreSQL target is measured against: the points of an
epoch upserted from several processes at once (as a Spark ``foreachBatch`` does from
its partitions), each with psycopg's ``executemany`` of ``INSERT ... ON CONFLICT DO
UPDATE``, committed per process. Self-contained: no twophase code.

    python bench/pg_upsert_plain.py CONNINFO [POINTS] [PROCESSES]

Prints wall seconds, the processes' CPU seconds and their server backends' CPU seconds
(read from /proc: PostgreSQL on this machine). The table is made when missing.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from datetime import datetime, timedelta, timezone

import psycopg

TABLE = "plain_metrics"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_T0 = 1_700_000_000_000_000_000


def rows(start: int, stop: int, seed: int) -> list[tuple[object, ...]]:
    """The same points the twophase measurement writes (time, host, region, value, count,
    ok), as the rows a partition holds."""
    base = _T0 + seed * 10**15
    return [
        (
            _EPOCH + timedelta(microseconds=(base + i * 1000) // 1000),
            f"host{i % 50}",
            f"r{i % 4}",
            i * 0.5,
            i,
            True,
        )
        for i in range(start, stop)
    ]


def backend_cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def partition(args: tuple[str, int, int, int, multiprocessing.Queue]) -> None:  # type: ignore[type-arg]
    conninfo, start, stop, seed, out = args
    data = rows(start, stop, seed)  # the partition's rows, before the clock starts
    with psycopg.connect(conninfo) as conn:
        pid = conn.info.backend_pid
        server0, cpu0 = backend_cpu(pid), time.process_time()
        out.put(("ready", 0.0, 0.0))
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {TABLE} (time, host, region, value, count, ok) "  # noqa: S608
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (time, host, region) DO UPDATE "
                "SET value = EXCLUDED.value, count = EXCLUDED.count, ok = EXCLUDED.ok",
                data,
            )
        conn.commit()
        out.put(("done", time.process_time() - cpu0, backend_cpu(pid) - server0))


def main() -> None:
    conninfo = sys.argv[1]
    points = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    processes = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    seed = int(os.environ.get("SEED", "1"))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} (time timestamptz NOT NULL, "
            "host text NOT NULL DEFAULT '', region text NOT NULL DEFAULT '', "
            "value double precision, count bigint, ok boolean, UNIQUE (time, host, region))"
        )
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    share = points // processes
    procs = [
        multiprocessing.Process(
            target=partition, args=((conninfo, k * share, (k + 1) * share, seed, out),)
        )
        for k in range(processes)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        out.get()  # every partition connected and its rows built
    start = time.perf_counter()
    done = [out.get() for _ in procs]
    wall = time.perf_counter() - start
    for proc in procs:
        proc.join()
    cpu, server = sum(d[1] for d in done), sum(d[2] for d in done)
    print(
        f"plain {processes} processes, {share * processes} points: wall {wall:.2f}s "
        f"client cpu {cpu:.2f}s server cpu {server:.2f}s {share * processes / wall:,.0f} pts/s"
    )


if __name__ == "__main__":
    main()
