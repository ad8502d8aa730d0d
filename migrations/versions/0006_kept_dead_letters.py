"""dead letters a reset keeps

Revision ID: 0006_kept_dead_letters
Revises: 0005_chunk_lanes
Create Date: 2026-11-26 10:00:00

``twophase_dead_letters.reset_at``: set by ``twophase reset`` on the dead
letters of the writes the sink's epochs had chosen, before it deletes those
epochs. Such a letter stays the sink's (listed, requeueable) and GC never
removes it, although its write has become an orphan. Nullable, no default:
PostgreSQL adds it without rewriting the table, and every existing letter
is as before. The downgrade drops it: letters a reset kept are then letters
of orphaned writes again, which the next GC removes with their writes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_kept_dead_letters"
down_revision = "0005_chunk_lanes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "twophase_dead_letters",
        sa.Column(
            "reset_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="the reset that forgot the epoch of its (decided) write; kept by gc",
        ),
    )


def downgrade() -> None:
    op.drop_column("twophase_dead_letters", "reset_at")
