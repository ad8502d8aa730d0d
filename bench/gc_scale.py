"""What purging retained points costs, for ``python -m bench staging_scale``: today's
GC (``DELETE`` of the epochs' chunk rows) against dropping partitions of a table
partitioned by epoch.

A scratch staging database is filled with committed epochs (staged through
``Stager``, committed through ``Committer.commit`` to :mod:`bench.blackhole`, so
InfluxDB plays no part). The same rows are then copied, as stored, into a
table of the bench's own, ``scale_chunks``, partitioned by range of epoch, and
both are emptied in two halves, oldest first:

* ``GarbageCollector.collect`` as if the retention had passed (its ``DELETE``
  in transactions of 200 epochs), half of the epochs (``limit``), then the rest;
  then ``VACUUM`` of the chunks table, the work the deletes leave behind
  (autovacuum is off on the table, so it waits for this);
* ``DETACH PARTITION`` and ``DROP TABLE`` of the older half of the partitions,
  then ``DROP TABLE`` of the other half.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from bench.blackhole import Blackhole
from bench.cpu import backend_pids
from bench.lines import Seeds, iter_lines
from bench.servers import Scratch, admin_conninfo
from bench.taskcpu import tasks_cpu_s
from twophase.config import InfluxDBSettings, StagingConfig, TargetConfig, TwoPhaseConfig
from twophase.model import EpochState
from twophase.protocol.commit.runtime import TwoPhase

ROLE = "scale_gc"
SINK = "scale-gc"
TABLE = "scale_chunks"
PARTITIONS = 10


@dataclass(frozen=True)
class GcPlan:
    """Committed epochs retained, points each."""

    epochs: int
    points: int

    @property
    def total(self) -> int:
        return self.epochs * self.points


class Timer:
    """Wall seconds of a block, the CPU seconds of the scratch database's backends, and
    the WAL the server wrote meanwhile (server-wide: other databases' writes too)."""

    def __init__(self, made: Scratch) -> None:
        self._conninfo = admin_conninfo(made.servers.staging_url)
        self._database = f"{made.prefix}_{ROLE}"

    def __call__(self, block: Callable[[], Any]) -> dict[str, Any]:
        backends = backend_pids(self._conninfo, self._database)
        with psycopg.connect(self._conninfo, autocommit=True) as admin:
            lsn, cpu = wal_lsn(admin), tasks_cpu_s(backends)
            started = time.perf_counter()
            outcome = block()
            wall = time.perf_counter() - started
            spent = tasks_cpu_s(backends) - cpu
            wal = wal_since(admin, lsn)
        return {
            "wall_s": round(wall, 3),
            "postgres_cpu_s": round(spent, 3),
            "wal_bytes": wal,
            "outcome": outcome,
        }


def wal_lsn(conn: psycopg.Connection[Any]) -> str:
    """The server's current WAL position."""
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    return str(row[0]) if row else "0/0"


def wal_since(conn: psycopg.Connection[Any], lsn: str) -> int:
    """WAL bytes the server wrote since ``lsn`` (every database's)."""
    row = conn.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (lsn,)
    ).fetchone()
    return int(row[0]) if row else 0


def fill(tp: TwoPhase, plan: GcPlan, log: Callable[[str], None]) -> dict[str, float]:
    """Stage and commit ``plan.epochs`` epochs of ``plan.points`` points: the fill's time."""
    seeds = Seeds(first=1_000)
    lease = tp.begin_run(SINK, uuid.uuid4().hex, "bench-scale")
    started = time.perf_counter()
    for epoch in range(plan.epochs):
        message = tp.stager.stage(SINK, epoch, iter_lines(plan.points, seeds.take()))
        outcome = tp.committer.commit(lease, epoch, [message])
        if outcome.state != EpochState.COMMITTED:
            raise RuntimeError(f"{SINK} epoch {epoch}: {outcome.state}")
        if (epoch + 1) % max(plan.epochs // 10, 1) == 0:
            log(f"staging_scale gc: {epoch + 1}/{plan.epochs} epochs retained")
    return {"fill_s": round(time.perf_counter() - started, 1)}


def sizes(conn: psycopg.Connection[Any], table: str) -> dict[str, int]:
    """A table's bytes on disk with its TOAST and indexes (its partitions' too)."""
    row = conn.execute(
        "SELECT pg_total_relation_size(%(t)s::regclass) + COALESCE((SELECT"
        " sum(pg_total_relation_size(relid)) FROM pg_partition_tree(%(t)s)"
        " WHERE relid <> %(t)s::regclass), 0)",
        {"t": table},
    ).fetchone()
    return {"total": int(row[0]) if row else 0}


def partitioned_copy(conn: psycopg.Connection[Any], plan: GcPlan) -> list[str]:
    """``scale_chunks``: the chunks table's columns as stored, plus the epoch, partitioned
    by epoch into equal ranges, with the chunks table's key as an index; filled with the
    same rows. Its partitions, oldest first."""
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (LIKE twophase_staged_chunks INCLUDING DEFAULTS"
            " INCLUDING STORAGE INCLUDING COMPRESSION, epoch bigint NOT NULL)"
            " PARTITION BY RANGE (epoch)"
        ).format(sql.Identifier(TABLE))
    )
    per = -(-plan.epochs // PARTITIONS)
    names = []
    for number in range(PARTITIONS):
        name = f"{TABLE}_{number}"
        conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(name),
                sql.Identifier(TABLE),
                sql.Literal(number * per),
                sql.Literal((number + 1) * per),
            )
        )
        names.append(name)
    conn.execute(sql.SQL("CREATE INDEX ON {} (write_id, chunk)").format(sql.Identifier(TABLE)))
    # Compressed values are copied as they are stored (PostgreSQL 14+ does not
    # recompress on INSERT ... SELECT), so both tables hold the same bytes.
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT c.*, w.epoch FROM twophase_staged_chunks c"
            " JOIN twophase_writes w USING (write_id)"
        ).format(sql.Identifier(TABLE))
    )
    return names


def drop(conn: psycopg.Connection[Any], names: Sequence[str], detach: bool) -> int:
    """Drop partitions in one transaction (detached first, or not); how many."""
    with conn.transaction():
        for name in names:
            if detach:
                conn.execute(
                    sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
                        sql.Identifier(TABLE), sql.Identifier(name)
                    )
                )
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))
    return len(names)


def purge(tp: TwoPhase, limit: int | None) -> dict[str, int]:
    """Today's GC as if the retention had passed: epochs and points purged."""
    ahead = tp.config.staging.retention_s + 3_600
    report = tp.gc.collect(SINK, limit=limit, ahead_s=ahead)
    return {"epochs": report.epochs_purged, "points": report.points_purged}


def measure_gc(
    made: Scratch, hole: Blackhole, plan: GcPlan, staging: StagingConfig, log: Callable[[str], None]
) -> dict[str, Any]:
    """Fill, copy into partitions, then time both ways of emptying, half and half."""
    staging = dataclasses.replace(staging, gc_interval_s=0.0)  # no collection but ours
    influx = TargetConfig(url=hole.url, influxdb=InfluxDBSettings(api="v1", database="scale"))
    timer = Timer(made)
    with (
        TwoPhase.open(TwoPhaseConfig(staging, influx)) as tp,
        psycopg.connect(staging.psycopg_conninfo(), autocommit=True) as conn,
    ):
        conn.execute(
            "ALTER TABLE twophase_staged_chunks"
            " SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)"
        )
        out: dict[str, Any] = {"epochs": plan.epochs, "points": plan.total, **fill(tp, plan, log)}
        log(f"staging_scale gc: copying {plan.total:,} points into {PARTITIONS} partitions")
        copied = timer(lambda: partitioned_copy(conn, plan))
        names = copied.pop("outcome")
        out["partitioned_copy"] = copied
        out["bytes"] = {
            "chunks": sizes(conn, "twophase_staged_chunks"),
            TABLE: sizes(conn, TABLE),
        }
        half = len(names) // 2
        log("staging_scale gc: timing DELETE and DROP, half and half")
        out["delete_half"] = timer(lambda: purge(tp, plan.epochs // 2))
        out["delete_rest"] = timer(lambda: purge(tp, None))
        out["vacuum"] = timer(lambda: conn.execute("VACUUM twophase_staged_chunks"))
        out["vacuum"].pop("outcome")
        out["bytes"]["chunks_after_vacuum"] = sizes(conn, "twophase_staged_chunks")
        out["detach_drop_half"] = timer(lambda: drop(conn, names[:half], detach=True))
        out["drop_rest"] = timer(lambda: drop(conn, names[half:], detach=False))
    return out
