"""a sink's compacted history: every epoch up to its floor was delivered

Revision ID: 0010_compacted_history
Revises: 0009_every_sink_has_targets
Create Date: 2026-11-28 10:00:00

``twophase_sinks.compacted_through``: GC deletes the records of old epochs
(their rows, writes, history and deliveries), once their points are purged,
``history_retention`` has passed and every target holds them, and keeps in
their stead this floor: every Spark epoch of the sink up to it that was
decided is COMMITTED and delivered, so decide still recognises a replay of
one of them (I4) and skips it. Nullable, no default: PostgreSQL adds it
without rewriting the table; NULL (every existing sink) means nothing was
compacted.

The downgrade drops it. Records GC compacted meanwhile are not brought back:
the older code then refuses a replay of such an epoch (``StateError``: not
recorded, at or below the last decided epoch) instead of skipping it, so a
query restarted after the downgrade from a checkpoint that far behind stops
rather than sends anything twice.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_compacted_history"
down_revision = "0009_every_sink_has_targets"
branch_labels = None
depends_on = None

COMMENT = "every Spark epoch up to it that was decided is COMMITTED and delivered (gc)"


def upgrade() -> None:
    op.add_column(
        "twophase_sinks",
        sa.Column("compacted_through", sa.BigInteger, nullable=True, comment=COMMENT),
    )


def downgrade() -> None:
    op.drop_column("twophase_sinks", "compacted_through")
