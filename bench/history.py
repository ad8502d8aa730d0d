"""Metric 3: the fixed cost per epoch stays flat as committed history piles up.

Two staging databases (both migrated by Alembic) hold one sink with 100 and
10,000 COMMITTED epochs, each with its write, its retained staged points and
its events -- what ten thousand real epochs leave behind within the retention
period (a 10-second trigger makes 10,000 epochs in 28 hours; retention is 7
days). The history is written by SQL in bulk, because running 10,000 real
epochs would take most of the bench's time. Then 10-point epochs run on both,
interleaved. Afterwards GC runs as if the retention had passed, to show the
staging tables shrink back, and EXPLAIN ANALYZE records the per-epoch
statements' plans on the large history.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.context import TP_INFLUX, Context
from bench.sides import QUERY_ID, TwoPhaseSide
from bench.stats import Summary, entry, interleaved
from bench.throughput import FIXED_POINTS, SharedLines, _millis
from twophase.protocol.commit.runtime import TwoPhase
from twophase.store.database import Database

FLAT_TARGET = 1.2
SINK = "bench-history"
TABLES = ("twophase_epochs", "twophase_writes", "twophase_staged_chunks", "twophase_epoch_events")

_SEED_SQL = (
    "INSERT INTO twophase_sinks (sink_id, query_id, owner_run_id, fencing_token,"
    " last_decided_epoch, last_committed_epoch) VALUES (%(sink)s, %(query)s, 'seed', 1,"
    " %(epochs)s - 1, %(epochs)s - 1)",
    "INSERT INTO twophase_runs (run_id, sink_id, query_id, fencing_token)"
    " VALUES ('seed', %(sink)s, %(query)s, 1)",
    "CREATE TEMP TABLE seeded ON COMMIT DROP AS SELECT e AS epoch,"
    " md5(%(sink)s || ':' || e)::uuid AS write_id FROM generate_series(0, %(epochs)s - 1) e",
    "INSERT INTO twophase_writes (write_id, sink_id, epoch, run_id, partition_id, attempt,"
    " points, rejected, checksum, staged_at) SELECT write_id, %(sink)s, epoch, 'seed', 0, 0,"
    " %(points)s, 0, 'seeded', now() - interval '1 hour' FROM seeded",
    "INSERT INTO twophase_epochs (sink_id, epoch, state, run_id, query_id, write_ids, checksum,"
    " points_staged, points_delivered, points_rejected_promote, promote_attempts, decided_at,"
    " committed_at) SELECT %(sink)s, epoch, 'COMMITTED', 'seed', %(query)s, ARRAY[write_id],"
    " 'seeded', %(points)s, %(points)s, 0, 1, now() - interval '1 hour',"
    " now() - interval '1 hour' FROM seeded",
    "INSERT INTO twophase_staged_chunks (write_id, chunk, first_seq, points, ends, body)"
    " SELECT write_id, 0, 0, count(*), NULL, string_agg(line, E'\\n' ORDER BY s)"
    " FROM (SELECT write_id, s, 'stream_stats,isp=acme,stream_id=s'"
    " || (s %% 100) || ' bytes_cdn=' || s || 'i,bytes_p2p=' || epoch || 'i,events=1i,users=1i '"
    " || (1600000000000000000 + epoch::bigint * 1000000 + s) AS line"
    " FROM seeded, generate_series(0, %(points)s - 1) s) AS l GROUP BY write_id",
    "INSERT INTO twophase_epoch_events (sink_id, epoch, event, run_id, detail)"
    " SELECT %(sink)s, epoch, ev, 'seed', 'seeded history' FROM seeded,"
    " unnest(ARRAY['decided', 'committed']) ev",
)


def seed_history(db: Database, epochs: int, points: int) -> None:
    """Write ``epochs`` COMMITTED epochs of ``points`` retained points each, then ANALYZE."""
    params = {"sink": SINK, "query": QUERY_ID, "epochs": epochs, "points": points}
    with db.transaction() as cur:
        for sql in _SEED_SQL:
            cur.execute(sql, params)
    with db.connection() as conn:
        conn.autocommit = True
        conn.execute("ANALYZE")
        conn.autocommit = False


def row_counts(db: Database) -> dict[str, int]:
    counts = {}
    with db.transaction() as cur:
        for table in TABLES:
            cur.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 constant names
            row = cur.fetchone()
            counts[table] = int(row[0]) if row else 0
        cur.execute("SELECT COALESCE(sum(points), 0) FROM twophase_staged_chunks")
        row = cur.fetchone()
        counts["staged_points"] = int(row[0]) if row else 0
    return counts


def open_with_history(ctx: Context, epochs: int) -> TwoPhase:
    role = f"h{epochs}"
    tp = TwoPhase.open(ctx.scratch.config(role, TP_INFLUX))
    started = time.perf_counter()
    seed_history(tp.db, epochs, ctx.plan.history_points)
    ctx.log(f"history: seeded {epochs:,} epochs in {time.perf_counter() - started:.1f}s")
    return tp


def measure_history(ctx: Context) -> dict[str, Any]:
    """Metric 3: ms per 10-point epoch with little and with much history, interleaved."""
    small, large = ctx.plan.history
    stores = [open_with_history(ctx, n) for n in (small, large)]
    try:
        sides = [
            TwoPhaseSide(tp, SINK, first_epoch=n)
            for tp, n in zip(stores, (small, large), strict=True)
        ]
        n = ctx.plan.history_epochs
        ctx.log(f"history: {n} {FIXED_POINTS}-point epochs on each store")
        lines = SharedLines(ctx, FIXED_POINTS)
        a, b = interleaved(n, _millis(sides[0].run, lines), _millis(sides[1].run, lines))
        ratio = statistics.median(b) / statistics.median(a)
        before = row_counts(stores[1].db)
        plans = explain_protocol(stores[1].db, sides[1])
        gc = gc_effect(stores[1])
        return entry(
            "ms per epoch",
            {f"{small}_epochs": Summary.of(a), f"{large}_epochs": Summary.of(b)},
            ratio,
            f"{large} / {small} committed epochs (medians)",
            f"<= {FLAT_TARGET}x; GC keeps the staging tables bounded",
            ratio <= FLAT_TARGET and gc["bounded"],
            points_per_history_epoch=ctx.plan.history_points,
            rows_with_history=before,
            gc=gc,
            explain_ms=plans,
        )
    finally:
        for tp in stores:
            tp.close()


def gc_effect(tp: TwoPhase) -> dict[str, Any]:
    """Run GC as if the retention had passed: what it removed, how long it took."""
    before = row_counts(tp.db)
    size_before = _relation_mb(tp.db)
    started = time.perf_counter()
    report = tp.gc.collect(ahead_s=30 * 86400)  # the database's clock, 30 days on
    took = time.perf_counter() - started
    after = row_counts(tp.db)
    with tp.db.connection() as conn:
        conn.autocommit = True
        conn.execute("VACUUM twophase_staged_chunks")
        conn.autocommit = False
    return {
        "seconds": round(took, 3),
        "epochs_purged": report.epochs_purged,
        "points_purged": report.points_purged,
        "staged_points_before": before["staged_points"],
        "staged_points_after": after["staged_points"],
        "staged_mb_before": size_before,
        "staged_mb_after_vacuum": _relation_mb(tp.db),
        "bounded": after["staged_points"] == 0 and after["twophase_staged_chunks"] == 0,
        "note": "epochs, writes and events rows stay (history); their points go",
    }


def _relation_mb(db: Database) -> float:
    with db.transaction() as cur:
        cur.execute("SELECT pg_total_relation_size('twophase_staged_chunks')")
        row = cur.fetchone()
        return round(int(row[0]) / 2**20, 2) if row else 0.0


def explain_protocol(db: Database, side: TwoPhaseSide) -> dict[str, float]:
    """EXPLAIN ANALYZE of the per-epoch reads on the large history: execution ms of each."""
    sink, epoch = side.sink_id, side.epoch - 1
    statements = {
        "lock_sink": ("SELECT * FROM twophase_sinks WHERE sink_id = %s FOR UPDATE", (sink,)),
        "pending": (
            "SELECT epoch FROM twophase_epochs WHERE state = 'PRECOMMITTED' AND sink_id = %s"
            " ORDER BY epoch",
            (sink,),
        ),
        "epoch_row": (
            "SELECT state FROM twophase_epochs WHERE sink_id = %s AND epoch = %s",
            (sink, epoch),
        ),
        "writes_of_epoch": (
            "SELECT write_id FROM twophase_writes WHERE sink_id = %s AND epoch = %s",
            (sink, epoch),
        ),
        "chunks_of_write": (
            "SELECT first_seq, points, ends, body FROM twophase_staged_chunks WHERE write_id ="
            " (SELECT write_id FROM twophase_writes WHERE sink_id = %s AND epoch = %s"
            " LIMIT 1) ORDER BY chunk",
            (sink, epoch),
        ),
    }
    return {name: _explain_ms(db, sql, args) for name, (sql, args) in statements.items()}


def _explain_ms(db: Database, sql: str, args: tuple[Any, ...]) -> float:
    with db.transaction() as cur:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, args)
        row = cur.fetchone()
        plan = row[0][0] if row else {}
    return round(float(plan.get("Execution Time", 0.0)), 3)
