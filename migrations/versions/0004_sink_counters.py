"""counters for metrics, and corrections (requeued dead letters)

Revision ID: 0004_sink_counters
Revises: 0003_run_ends
Create Date: 2026-11-23 09:00:00

* ``twophase_sinks`` gains running totals, kept by the ledger in the
  transactions that already update the sink row, so that a metrics scrape
  reads one row per sink whatever the history's length: epochs committed and
  aborted, points staged, delivered, rejected (per phase) and requeued,
  promotion attempts and retries, refused steps of fenced runs, staged bytes
  retained, the time of the last commit, and the number of the sink's last
  correction. The upgrade fills them from the existing epochs.
* ``twophase_epochs.staged_bytes``: the epoch's staged line protocol, counted
  at decision time, subtracted from the sink's total when it is purged.
* ``twophase_dead_letters.requeued_in``/``requeued_at``: the correction that
  carried a dead letter again (``twophase dead-letters --requeue``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_sink_counters"
down_revision = "0003_run_ends"
branch_labels = None
depends_on = None

# A copy of twophase.store.schema.SINK_COUNTERS as of this revision, on purpose: a migration is a
# frozen step and must not change when the package's schema moves on.
COUNTERS = (
    "epochs_committed",
    "epochs_aborted",
    "points_staged",
    "points_delivered",
    "points_rejected_stage",
    "points_rejected_promote",
    "points_requeued",
    "promote_attempts",
    "promote_retries",
    "fenced_attempts",
    "staged_bytes",
    "corrections",
)

_BACKFILL_EPOCH_BYTES = """
UPDATE twophase_epochs e SET staged_bytes = b.bytes FROM (
    SELECT e2.sink_id, e2.epoch, COALESCE(sum(octet_length(c.body)), 0) AS bytes
    FROM twophase_epochs e2 JOIN twophase_staged_chunks c ON c.write_id = ANY(e2.write_ids)
    WHERE e2.purged_at IS NULL AND e2.state <> 'ABORTED' GROUP BY e2.sink_id, e2.epoch) b
WHERE e.sink_id = b.sink_id AND e.epoch = b.epoch
"""

_BACKFILL_SINKS = """
UPDATE twophase_sinks s SET
    epochs_committed = t.committed, epochs_aborted = t.aborted,
    points_staged = t.staged, points_delivered = t.delivered,
    points_rejected_stage = t.rejected_stage, points_rejected_promote = t.rejected_promote,
    promote_attempts = t.attempts, promote_retries = t.retries,
    staged_bytes = t.bytes, last_committed_at = t.last_commit
FROM (SELECT sink_id,
        count(*) FILTER (WHERE state = 'COMMITTED') AS committed,
        count(*) FILTER (WHERE state = 'ABORTED') AS aborted,
        COALESCE(sum(points_staged), 0) AS staged,
        COALESCE(sum(points_delivered), 0) AS delivered,
        COALESCE(sum(points_rejected_stage), 0) AS rejected_stage,
        COALESCE(sum(points_rejected_promote), 0) AS rejected_promote,
        COALESCE(sum(promote_attempts), 0) AS attempts,
        COALESCE(sum(GREATEST(promote_attempts - 1, 0)), 0) AS retries,
        COALESCE(sum(staged_bytes), 0) AS bytes,
        max(committed_at) AS last_commit
      FROM twophase_epochs GROUP BY sink_id) t
WHERE s.sink_id = t.sink_id
"""


def upgrade() -> None:
    for name in COUNTERS:
        op.add_column(
            "twophase_sinks",
            sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"),
        )
    op.add_column(
        "twophase_sinks", sa.Column("last_committed_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "twophase_epochs",
        sa.Column("staged_bytes", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.add_column(
        "twophase_dead_letters",
        sa.Column(
            "requeued_in",
            sa.BigInteger(),
            nullable=True,
            comment="the correction (epoch -n) that carried it again",
        ),
    )
    op.add_column(
        "twophase_dead_letters",
        sa.Column("requeued_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.execute(_BACKFILL_EPOCH_BYTES)
    op.execute(_BACKFILL_SINKS)


def downgrade() -> None:
    op.drop_column("twophase_dead_letters", "requeued_at")
    op.drop_column("twophase_dead_letters", "requeued_in")
    op.drop_column("twophase_epochs", "staged_bytes")
    op.drop_column("twophase_sinks", "last_committed_at")
    for name in reversed(COUNTERS):
        op.drop_column("twophase_sinks", name)
