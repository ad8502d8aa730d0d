"""per-target delivery state

Revision ID: 0007_targets
Revises: 0006_kept_dead_letters
Create Date: 2026-11-26 04:00:00

A sink that delivers to several named InfluxDB targets (``targets``) keeps,
per target, ``twophase_targets``: the last epoch delivered to it in epoch
order (``delivered_epoch``: every COMMITTED epoch of the sink up to it, from
``from_epoch`` on, is in that target), its state (``live``, ``lagging``,
``quarantined``) and since when; ``twophase_target_deliveries``: one row
per target and epoch delivered, with its counts; and the view
``twophase_target_backlog``: each target's COMMITTED epochs past its
cursor. A sink with one target (the one ``influx_url`` makes) has no rows:
its COMMITTED epochs are its deliveries. A promote-time dead letter names
the target that refused the point (``twophase_dead_letters.target``, ''
for the one target of a sink and for stage-time letters; one letter per
line and target), and a correction the target it is for
(``twophase_epochs.target``). New tables only; the downgrade drops them (the sinks then deliver
to one server again, and a lagging target's backlog is forgotten).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_targets"
down_revision = "0006_kept_dead_letters"
branch_labels = None
depends_on = None

_STATES = "state IN ('live', 'lagging', 'quarantined')"
_OLD_UNIQUE = "uq_twophase_dead_letters_write_id_phase_seq"
_UNIQUE = "uq_twophase_dead_letters_write_id_phase_seq_target"
BACKLOG = (
    "CREATE VIEW twophase_target_backlog AS"
    " SELECT t.sink_id, t.target, e.epoch, e.committed_at, e.staged_bytes, e.purged_at"
    " FROM twophase_targets t JOIN twophase_epochs e ON e.sink_id = t.sink_id"
    " WHERE e.state = 'COMMITTED' AND e.epoch >= t.from_epoch"
    " AND e.epoch > COALESCE(t.delivered_epoch, -1)"
)


def upgrade() -> None:
    op.create_table(
        "twophase_targets",
        sa.Column("sink_id", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False, server_default="live"),
        sa.Column(
            "delivered_epoch",
            sa.BigInteger(),
            nullable=True,
            comment="every COMMITTED epoch from from_epoch up to it is in this target",
        ),
        sa.Column("from_epoch", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("lagging_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("quarantined_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("added_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("sink_id", "target", name="pk_twophase_targets"),
        sa.CheckConstraint(_STATES, name="ck_twophase_targets_state"),
    )
    op.create_table(
        "twophase_target_deliveries",
        sa.Column("sink_id", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("delivered", sa.BigInteger(), nullable=False),
        sa.Column("rejected", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("sink_id", "target", "epoch", name="pk_twophase_target_deliveries"),
    )
    op.execute(BACKLOG)
    op.add_column(
        "twophase_dead_letters",
        sa.Column(
            "target",
            sa.Text(),
            nullable=False,
            server_default="",
            comment="the target that refused the point ('': the sink's one target, or stage)",
        ),
    )
    op.drop_constraint(_OLD_UNIQUE, "twophase_dead_letters", type_="unique")
    op.create_unique_constraint(
        _UNIQUE, "twophase_dead_letters", ["write_id", "phase", "seq", "target"]
    )
    op.add_column(
        "twophase_epochs",
        sa.Column("target", sa.Text(), nullable=True, comment="a correction's one target"),
    )


def downgrade() -> None:
    op.drop_column("twophase_epochs", "target")
    # one letter per line again: a line refused by several targets keeps its first
    op.execute(
        "DELETE FROM twophase_dead_letters d USING twophase_dead_letters e"
        " WHERE d.write_id = e.write_id AND d.phase = e.phase AND d.seq = e.seq"
        " AND d.id > e.id"
    )
    op.drop_constraint(_UNIQUE, "twophase_dead_letters", type_="unique")
    op.create_unique_constraint(_OLD_UNIQUE, "twophase_dead_letters", ["write_id", "phase", "seq"])
    op.drop_column("twophase_dead_letters", "target")
    op.execute("DROP VIEW twophase_target_backlog")
    op.drop_table("twophase_target_deliveries")
    op.drop_table("twophase_targets")
