"""GC: retention of committed epochs and removal of orphaned writes, never of decided ones."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

import pytest

import twophase.protocol.maintain.gc as gc_module
from tests.integration.cli_helpers import sql
from tests.staging import STAGED_POINTS, M, lines, scalar, stage
from tests.support import REPO, begin_run, influx_count
from twophase.model import EpochState
from twophase.protocol.commit.runtime import TwoPhase

# Seconds ahead of the database's clock: past the points' retention (7 days), within
# history_retention (30 days), so the epochs' records stay.
LATER = 8 * 86400
PURGED = (
    "SELECT COALESCE(array_agg(epoch ORDER BY epoch), '{}') FROM twophase_epochs"
    " WHERE purged_at IS NOT NULL"
)
WRITES = "SELECT count(*) FROM twophase_writes"


def test_retention_purges_committed_epochs_only(tp: TwoPhase, staging_url: str) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 5)]))
    tp.ledger.decide(lease, 1, stage(tp, "s", 1, [lines(1, 5)]))  # PRECOMMITTED: kept

    assert tp.gc.collect().epochs_purged == 0  # within retention (7 days)
    dry = tp.gc.collect(dry_run=True, ahead_s=LATER)
    assert (dry.epochs_purged, dry.points_purged) == (1, 5)
    assert scalar(staging_url, STAGED_POINTS) == 10

    report = tp.gc.collect(ahead_s=LATER)
    assert (report.epochs_purged, report.points_purged) == (1, 5)
    assert scalar(staging_url, STAGED_POINTS) == 5
    assert scalar(staging_url, "SELECT purged_at IS NOT NULL FROM twophase_epochs WHERE epoch = 0")
    assert tp.gc.collect(ahead_s=LATER).epochs_purged == 0  # idempotent
    tp.committer.recover(lease)  # the PRECOMMITTED epoch still promotes in full
    assert scalar(staging_url, "SELECT points_delivered FROM twophase_epochs WHERE epoch = 1") == 5


def test_orphans_removed_after_decision_or_grace(tp: TwoPhase, staging_url: str) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    chosen = stage(tp, "s", 0, [lines(0, 3)])
    loser = stage(tp, "s", 0, [lines(0, 3)], attempt=1)  # speculative duplicate attempt
    undecided = stage(tp, "s", 1, [lines(1, 4)])  # a run that died before voting
    tp.ledger.decide(lease, 0, chosen)

    report = tp.gc.collect()
    assert report.orphan_writes == 1  # the loser; the undecided write is within its grace
    assert (
        scalar(
            staging_url,
            "SELECT count(*) FROM twophase_writes WHERE write_id::text = %s",
            loser[0].write_id,
        )
        == 0
    )
    report = tp.gc.collect(ahead_s=2 * 3600)
    assert report.orphan_writes == 1
    assert (
        scalar(
            staging_url,
            "SELECT count(*) FROM twophase_writes WHERE write_id::text = %s",
            undecided[0].write_id,
        )
        == 0
    )
    assert scalar(staging_url, STAGED_POINTS) == 3
    tp.committer.recover(lease)
    assert scalar(staging_url, "SELECT state FROM twophase_epochs WHERE epoch = 0") == "COMMITTED"


def test_a_limit_bounds_one_collection(tp: TwoPhase, staging_url: str) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    for epoch in range(5):
        stage(tp, "s", epoch, [lines(epoch, 2)], attempt=1)  # an orphan once epoch is decided
        tp.committer.commit(lease, epoch, stage(tp, "s", epoch, [lines(epoch, 2)]))
    dry = tp.gc.collect("s", dry_run=True, limit=2, ahead_s=LATER)
    assert (dry.epochs_purged, dry.points_purged, dry.orphan_writes) == (2, 4, 2)

    first = tp.gc.collect("s", limit=2, ahead_s=LATER)
    assert (first.epochs_purged, first.points_purged, first.orphan_writes) == (2, 4, 2)
    assert scalar(staging_url, PURGED) == [0, 1]  # the oldest first
    assert scalar(staging_url, WRITES) == 5 + 3
    rest = tp.gc.collect("s", ahead_s=LATER)
    assert (rest.epochs_purged, rest.orphan_writes) == (3, 3)
    assert scalar(staging_url, PURGED) == [0, 1, 2, 3, 4]
    assert scalar(staging_url, STAGED_POINTS) == 0


def _host_clock(offset: timedelta) -> type[datetime]:
    """A ``datetime`` whose ``now`` is the host's clock ``offset`` off: what GC must not
    go by (the epochs and writes are stamped by the database's clock)."""

    class Skewed(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Skewed:
            moved = datetime.now(tz) + offset
            return cls.fromtimestamp(moved.timestamp(), tz)

    return Skewed


def test_ages_are_measured_by_the_database_clock(
    tp: TwoPhase, staging_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    for epoch in (0, 1):
        tp.committer.commit(lease, epoch, stage(tp, "s", epoch, [lines(epoch, 5)]))
    undecided = stage(tp, "s", 2, [lines(2, 4)])  # a run that died before voting
    # By the database's clock epoch 0 ended 8 days ago (retention: 7 days) and the
    # undecided write is 2 hours old (grace: 1 hour); epoch 1 ended just now.
    sql(
        staging_url,
        "UPDATE twophase_epochs SET committed_at = now() - interval '8 days' WHERE epoch = 0",
    )
    sql(
        staging_url,
        "UPDATE twophase_writes SET staged_at = now() - interval '2 hours'"
        " WHERE write_id::text = %s",
        undecided[0].write_id,
    )

    # A host whose clock runs 30 days ahead purges only what the database says expired,
    monkeypatch.setattr(gc_module, "datetime", _host_clock(timedelta(days=30)), raising=False)
    report = tp.gc.collect()
    assert (report.epochs_purged, report.points_purged, report.orphan_writes) == (1, 5, 1)
    assert scalar(staging_url, PURGED) == [0]

    # and one 30 days behind still purges what did.
    sql(
        staging_url,
        "UPDATE twophase_epochs SET committed_at = now() - interval '8 days' WHERE epoch = 1",
    )
    monkeypatch.setattr(gc_module, "datetime", _host_clock(timedelta(days=-30)), raising=False)
    assert tp.gc.collect().epochs_purged == 1
    assert scalar(staging_url, PURGED) == [0, 1]
    assert scalar(staging_url, STAGED_POINTS) == 0


# What Spark's writer calls on the driver when a micro-batch's write job failed: the
# staged writes of the tasks that finished, discarded (``DataSourceStreamWriter.abort``).
_ABORT = """
import pickle, sys
from twophase.spark.driver_commit import abort_epoch
from twophase.spark.options import parse_options
options, epoch, messages = pickle.load(open(sys.argv[1], "rb"))
abort_epoch(parse_options(options), epoch, messages)
"""


def test_sigkill_in_sparks_abort_then_gc(
    tp: TwoPhase, staging_url: str, influx: Any, tmp_path: Path
) -> None:
    """A failed micro-batch's abort is killed while it deletes the finished tasks' writes:
    nothing of it is committed, the re-run of the batch is delivered once, and GC removes
    the aborted attempt's writes, never the re-run's."""
    lease = begin_run(tp, "s", "r1", "q1")
    aborted = stage(tp, "s", 0, [lines(0, 5), lines(0, 5, host="b")])
    options = {"sink_id": "s", "measurement": M}
    arguments = tmp_path / "abort.pickle"
    arguments.write_bytes(pickle.dumps((options, 0, aborted)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_CRASH")}
    env["TWOPHASE_STAGING_URL"] = staging_url  # as executors get it: never a Spark option
    killed = subprocess.run(
        [sys.executable, "-c", _ABORT, str(arguments)],
        env=env | {"TWOPHASE_CRASH_AT": "in_discard"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert scalar(staging_url, WRITES) == 2  # the delete died with its transaction

    rerun = stage(tp, "s", 0, [lines(0, 5), lines(0, 5, host="b")], attempt=1)
    assert tp.committer.commit(lease, 0, rerun).state == EpochState.COMMITTED
    assert influx_count(influx, M) == 10  # the re-run's points, once
    assert tp.gc.collect().orphan_writes == 2  # the aborted attempt's: its epoch chose others
    chosen = sql(staging_url, "SELECT write_id::text FROM twophase_writes ORDER BY 1")
    assert chosen == sorted((m.write_id,) for m in rerun)
