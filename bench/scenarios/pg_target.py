"""Into a PostgreSQL target: one epoch through twophase (kind ``postgresql``, tables made
by it) against the plain upsert a user writes instead, without twophase's code: psycopg
``executemany`` of ``INSERT ... ON CONFLICT DO UPDATE``, 5,000 rows a call, one
transaction, on the same points (``stream_stats``: tags ``isp`` and ``stream_id``,
four integer fields). Each side writes into a target database of its own.

Figures: the epoch's wall seconds, and CPU seconds of this process and of the
backends of the run's databases (staging and both targets).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any

import psycopg

from bench.harness.scenario import Context, Figures, Scenario, in_process, timed
from bench.harness.servers import pg_target
from bench.harness.sides import ISPS, STEP_NS, STREAMS, TwoPhaseSide, epoch_lines, start_of
from twophase.config import PostgreSQLSettings, TargetConfig, TwoPhaseConfig
from twophase.config.values import Secret
from twophase.protocol.commit.runtime import TwoPhase

BATCH = 5000
CREATE = """CREATE TABLE IF NOT EXISTS stream_stats (
    time timestamptz NOT NULL, isp text NOT NULL, stream_id text NOT NULL,
    bytes_cdn bigint, bytes_p2p bigint, events bigint, users bigint,
    UNIQUE (time, isp, stream_id))"""
UPSERT = """INSERT INTO stream_stats VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (time, isp, stream_id) DO UPDATE SET bytes_cdn = EXCLUDED.bytes_cdn,
    bytes_p2p = EXCLUDED.bytes_p2p, events = EXCLUDED.events, users = EXCLUDED.users"""


def rows(count: int, seed: int) -> list[tuple[Any, ...]]:
    """The points of ``bench.harness.sides.line`` as rows (microseconds: timestamptz's)."""
    start = start_of(seed)
    return [
        (
            datetime.fromtimestamp((start + i * STEP_NS) / 1e9, timezone.utc),
            ISPS[i % 3],
            f"s{(i // 3) % STREAMS}",
            *(i * 7 % 100_000, i * 13 % 100_000, i % 500, i % 97),
        )
        for i in range(count)
    ]


class PlainSide:
    """The user's upsert, over one connection of its own."""

    def __init__(self, url: str, password: str) -> None:
        self.conn = psycopg.connect(url, password=password)
        self.conn.execute(CREATE)
        self.conn.commit()

    def run(self, batch: list[tuple[Any, ...]]) -> float:
        started = time.perf_counter()
        with self.conn.cursor() as cur:
            for at in range(0, len(batch), BATCH):
                cur.executemany(UPSERT, batch[at : at + BATCH])
        self.conn.commit()
        return time.perf_counter() - started


def make(ctx: Context) -> dict[str, Any]:
    """The sides, opened once per run of the scenario (closed by the harness)."""
    servers, prefix = ctx.scratch.servers, ctx.scratch.prefix
    targets = ExitStack()
    ctx.closers.append(targets.close)
    tp_db = targets.enter_context(pg_target(servers, f"{prefix}_tp_target"))
    plain_db = targets.enter_context(pg_target(servers, f"{prefix}_plain_target"))
    target = TargetConfig(
        url=tp_db.url,
        kind="postgresql",
        postgresql=PostgreSQLSettings(create_tables=True),
        password=Secret(tp_db.password),
    )
    tp = TwoPhase.open(TwoPhaseConfig(ctx.scratch.staging("main"), target))
    plain = PlainSide(plain_db.url, plain_db.password)
    ctx.closers += [tp.close, plain.conn.close]
    return {"twophase": TwoPhaseSide(tp, "bench-pg"), "plain": plain}


def run(ctx: Context, side: str, size: int) -> Figures:
    runner, seed = in_process(ctx, make)[side], ctx.fresh()
    epoch = epoch_lines(size, seed) if side == "twophase" else rows(size, seed)
    seconds, cpu = timed(ctx, runner, epoch)
    return {"epoch_s": round(seconds, 4)} | {f"cpu_{k}_s": v for k, v in cpu.items()}


SCENARIO = Scenario(
    name="pg_target",
    about="one epoch into a PostgreSQL target: twophase against a plain executemany upsert",
    sides=("twophase", "plain"),
    cases=lambda quick: {"10k": 10_000} if quick else {"100k": 100_000, "1M": 1_000_000},
    run=run,
    repeats=(2, 5),
    notes=("cpu_postgres_s: the backends of the run's staging and target databases",),
)
