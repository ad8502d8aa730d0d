"""every sink has targets: the one influx_url makes too; corrections in backlogs

Revision ID: 0009_every_sink_has_targets
Revises: 0008_compressed_chunks
Create Date: 2026-11-26 23:00:00

A sink delivers to its targets through one path, whether it has one or
several: a sink with one server has one target, named ``default``, with a
cursor like any other. The upgrade gives every sink that has epochs but no
target row its ``default`` target, holding every COMMITTED epoch (they are
its deliveries): ``from_epoch`` 0, the cursor at the last one, a delivery
row per COMMITTED correction, and its promote-time dead letters named
``default`` (as the sink's new ones are). ``''`` is left to stage-time
letters.

``twophase_targets.url``: the target's URL as its last query run registered
it, credentials removed, so that a name pointed at another server is
reported (``url_changed_at``: when it last was).
``twophase_targets.resynced_at``: a resync restarts the lag clock
(``target_max_lag`` counts from the later of an epoch's commit and the
resync).

The view ``twophase_target_backlog`` now also holds the COMMITTED
corrections a target is owed (one naming it, or naming none, decided after
the target was added) and has no delivery of, and each row's ``position`` in
the target's order: corrections first, in the order they were decided (-1,
-2, ...), then Spark's epochs.

The downgrade restores the view, drops the columns and the ``default`` rows
of sinks that have no other target (the old code keeps no rows for them),
and names their promote-time dead letters ``''`` again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_every_sink_has_targets"
down_revision = "0008_compressed_chunks"
branch_labels = None
depends_on = None

_OLD_LETTER_TARGET = "the target that refused the point ('': the sink's one target, or stage)"
_LETTER_TARGET = "the target that refused the point ('': none named: stage, or older letters)"
_OLD_BACKLOG = (
    "CREATE VIEW twophase_target_backlog AS"
    " SELECT t.sink_id, t.target, e.epoch, e.committed_at, e.staged_bytes, e.purged_at"
    " FROM twophase_targets t JOIN twophase_epochs e ON e.sink_id = t.sink_id"
    " WHERE e.state = 'COMMITTED' AND e.epoch >= t.from_epoch"
    " AND e.epoch > COALESCE(t.delivered_epoch, -1)"
)
# Two parts, each an index range of twophase_epochs (sink_id, epoch): the Spark epochs
# past the cursor, and the (few) corrections; a target's backlog costs no scan of the
# sink's history.
BACKLOG = (
    "CREATE VIEW twophase_target_backlog AS"
    " SELECT t.sink_id, t.target, e.epoch, e.committed_at, e.staged_bytes, e.purged_at,"
    " e.epoch AS position"
    " FROM twophase_targets t JOIN twophase_epochs e ON e.sink_id = t.sink_id"
    " AND e.epoch > GREATEST(COALESCE(t.delivered_epoch, -1), t.from_epoch - 1)"
    " WHERE e.state = 'COMMITTED'"
    " UNION ALL"
    " SELECT t.sink_id, t.target, e.epoch, e.committed_at, e.staged_bytes, e.purged_at,"
    " -e.epoch - 4611686018427387904"
    " FROM twophase_targets t JOIN twophase_epochs e ON e.sink_id = t.sink_id AND e.epoch < 0"
    " WHERE e.state = 'COMMITTED' AND (e.target IS NULL OR e.target = t.target)"
    " AND e.decided_at >= t.added_at AND NOT EXISTS (SELECT 1 FROM twophase_target_deliveries d"
    " WHERE d.sink_id = t.sink_id AND d.target = t.target AND d.epoch = e.epoch)"
)
# One statement: the sinks without targets get ``default``; its corrections delivered
# and its promote-time letters named, for those sinks only.
_DEFAULT_TARGETS = (
    "WITH added AS (INSERT INTO twophase_targets"
    " (sink_id, target, delivered_epoch, from_epoch, added_at)"
    " SELECT e.sink_id, 'default', max(e.epoch) FILTER (WHERE e.epoch >= 0"
    " AND e.state = 'COMMITTED'), 0, min(e.decided_at) FROM twophase_epochs e"
    " WHERE NOT EXISTS (SELECT 1 FROM twophase_targets t WHERE t.sink_id = e.sink_id)"
    " GROUP BY e.sink_id RETURNING sink_id),"
    " corrections AS (INSERT INTO twophase_target_deliveries"
    " (sink_id, target, epoch, delivered, rejected, run_id)"
    " SELECT e.sink_id, 'default', e.epoch, COALESCE(e.points_delivered, 0),"
    " COALESCE(e.points_rejected_promote, 0), e.run_id FROM twophase_epochs e"
    " JOIN added a ON a.sink_id = e.sink_id WHERE e.epoch < 0 AND e.state = 'COMMITTED')"
    " UPDATE twophase_dead_letters d SET target = 'default' FROM added a"
    " WHERE d.sink_id = a.sink_id AND d.phase = 'promote' AND d.target = ''"
)
_ONLY_DEFAULT = (
    "SELECT sink_id FROM twophase_targets GROUP BY sink_id"
    " HAVING count(*) = 1 AND bool_and(target = 'default')"
)


def upgrade() -> None:
    op.add_column(
        "twophase_targets",
        sa.Column(
            "url", sa.Text(), nullable=True, comment="as last registered, credentials removed"
        ),
    )
    op.add_column(
        "twophase_targets",
        sa.Column("url_changed_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.add_column(
        "twophase_targets",
        sa.Column("resynced_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.alter_column(
        "twophase_dead_letters",
        "target",
        existing_type=sa.Text(),
        existing_nullable=False,
        existing_server_default="",
        comment=_LETTER_TARGET,
        existing_comment=_OLD_LETTER_TARGET,
    )
    op.execute("DROP VIEW twophase_target_backlog")
    op.execute(BACKLOG)
    op.execute(_DEFAULT_TARGETS)


def downgrade() -> None:
    op.execute(
        "UPDATE twophase_dead_letters SET target = '' WHERE phase = 'promote'"  # noqa: S608
        f" AND target = 'default' AND sink_id IN ({_ONLY_DEFAULT})"
    )
    op.execute(
        f"DELETE FROM twophase_target_deliveries WHERE sink_id IN ({_ONLY_DEFAULT})"  # noqa: S608
    )
    op.execute(f"DELETE FROM twophase_targets WHERE sink_id IN ({_ONLY_DEFAULT})")  # noqa: S608
    op.execute("DROP VIEW twophase_target_backlog")
    op.execute(_OLD_BACKLOG)
    op.alter_column(
        "twophase_dead_letters",
        "target",
        existing_type=sa.Text(),
        existing_nullable=False,
        existing_server_default="",
        comment=_OLD_LETTER_TARGET,
        existing_comment=_LETTER_TARGET,
    )
    op.drop_column("twophase_targets", "resynced_at")
    op.drop_column("twophase_targets", "url_changed_at")
    op.drop_column("twophase_targets", "url")
