"""GC: retention of committed epochs and removal of orphaned writes, never of decided ones."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from tests.integration.test_protocol import STAGED_POINTS, lines, scalar, stage

LATER = datetime.now(timezone.utc) + timedelta(days=30)


def test_retention_purges_committed_epochs_only(tp: Any, staging_url: str) -> None:
    lease = tp.ledger.begin_run("s", "r1", "q1")
    tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 5)]))
    tp.ledger.decide(lease, 1, stage(tp, "s", 1, [lines(1, 5)]))  # PRECOMMITTED: kept

    assert tp.gc.collect().epochs_purged == 0  # within retention (7 days)
    dry = tp.gc.collect(now=LATER, dry_run=True)
    assert (dry.epochs_purged, dry.points_purged) == (1, 5)
    assert scalar(staging_url, STAGED_POINTS) == 10

    report = tp.gc.collect(now=LATER)
    assert (report.epochs_purged, report.points_purged) == (1, 5)
    assert scalar(staging_url, STAGED_POINTS) == 5
    assert scalar(staging_url, "SELECT purged_at IS NOT NULL FROM twophase_epochs WHERE epoch = 0")
    assert tp.gc.collect(now=LATER).epochs_purged == 0  # idempotent
    tp.committer.recover(lease)  # the PRECOMMITTED epoch still promotes in full
    assert scalar(staging_url, "SELECT points_delivered FROM twophase_epochs WHERE epoch = 1") == 5


def test_orphans_removed_after_decision_or_grace(tp: Any, staging_url: str) -> None:
    lease = tp.ledger.begin_run("s", "r1", "q1")
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
    report = tp.gc.collect(now=datetime.now(timezone.utc) + timedelta(hours=2))
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
