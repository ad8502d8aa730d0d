"""the generation of each sink's target: what a transactional target's record names

Revision ID: 0011_generations
Revises: 0010_compacted_history
Create Date: 2026-12-02 07:00:00

A transactional target (PostgreSQL) keeps a record of the epochs it holds in
its own database, where ``twophase reset`` cannot clear it. Epoch numbers
start again at 0 after a reset, so a record names the *generation* of the
epoch numbers too, and only a record of the target's current generation
skips an epoch.

``twophase_targets.generation``: the generation a target's deliveries are
recorded under; ``targets resync --from-epoch`` moves it on (the target's old
records become inert). ``twophase_sinks.generation``: the last generation
given out for the sink, which a target registered starts in; a reset and a
resync from an epoch each take the next, so none is given out twice (the
reset deletes the targets' rows, and the next query's targets start above
every record of the old query's).

Both are 0 for every existing sink and target, as every record an older
version wrote reads (its missing generation means 0): the re-send of an epoch
that was in flight across the upgrade is still found and skipped.

The downgrade drops them. An older version then finds every record again,
whatever its generation (the records were never keyed on it there); reset a
sink after the downgrade only once the records of its transactional targets
are cleared by hand.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_generations"
down_revision = "0010_compacted_history"
branch_labels = None
depends_on = None

SINK = "the sink's last generation given out: a target registered starts in it"
TARGET = "the generation its deliveries are recorded under (resync --from-epoch: a new one)"


def upgrade() -> None:
    for table, comment in (("twophase_sinks", SINK), ("twophase_targets", TARGET)):
        op.add_column(
            table,
            sa.Column(
                "generation", sa.BigInteger, nullable=False, server_default="0", comment=comment
            ),
        )


def downgrade() -> None:
    op.drop_column("twophase_targets", "generation")
    op.drop_column("twophase_sinks", "generation")
