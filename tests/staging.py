"""Epochs staged on the real servers, for the integration tests: the points, ``stage()``,
reading the store back, and the threads and waits of tests that take it away."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from tests.fakes import FakeClock
from tests.support import admin_conninfo
from twophase.model import CommitMessage
from twophase.protocol.commit.committer import Committer
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.maintain.autogc import AutoGc

M = "proto"
STAGED_POINTS = "SELECT COALESCE(sum(points), 0) FROM twophase_staged_chunks"


def lines(epoch: int, n: int, value_offset: float = 0.0, host: str = "a") -> list[str]:
    """n distinct points of epoch ``epoch`` (timestamps fixed: deterministic)."""
    base = 1_700_000_000_000_000_000 + epoch * 1_000_000_000_000
    return [
        f"{M},host={host},n={i % 3} v={i + value_offset},e={epoch}i {base + i}" for i in range(n)
    ]


def stage(
    tp: TwoPhase,
    sink: str,
    epoch: int,
    parts: list[list[str]],
    attempt: int = 0,
    run: str = "r1",
    query: str = "q1",
) -> list[CommitMessage]:
    return [
        tp.stager.stage(
            sink, epoch, part, partition_id=i, attempt=attempt, run_id=run, query_id=query
        )
        for i, part in enumerate(parts)
    ]


def epoch_row(url: str, sink: str, epoch: int) -> dict[str, Any]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        cur = conn.execute(
            "SELECT state, points_staged, points_delivered, points_rejected_stage,"
            " points_rejected_promote, replays, promote_attempts, cardinality(write_ids)"
            " FROM twophase_epochs WHERE sink_id = %s AND epoch = %s",
            (sink, epoch),
        )
        row = cur.fetchone()
        assert row is not None, f"epoch {epoch} not recorded"
        keys = (
            "state",
            "staged",
            "delivered",
            "rejected_stage",
            "rejected_promote",
            "replays",
            "attempts",
            "writes",
        )
        return dict(zip(keys, row, strict=True))


def scalar(url: str, sql: str, *params: Any) -> Any:
    with psycopg.connect(admin_conninfo(url)) as conn:
        row = conn.execute(sql, params).fetchone()
        return row[0] if row else None


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # handed to the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def terminate_others(url: str) -> int:
    """End every other connection to the database (the pool's and a step's under way)."""
    return int(
        scalar(
            url,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
    )


INTERVAL_S = 60.0


def committer_of(tp: TwoPhase, clock: FakeClock, limit: int) -> tuple[Committer, AutoGc]:
    """The parts' committer, with an automatic collector on the test's clock."""
    auto = AutoGc(tp.gc, INTERVAL_S, limit=limit, clock=clock)
    return Committer(
        tp.ledger, tp.promoter, tp.gc, auto_gc=auto, roster=tp.roster, catch_up=tp.catch_up
    ), auto
