"""record when and how a run ended

Revision ID: 0003_run_ends
Revises: 0002_staged_chunks
Create Date: 2026-11-23 03:00:00

``twophase_runs.ended_at`` and ``end_reason`` (``stopped`` or ``failed``): a
query that stops says so, and the operator's commands tell a stopped run
from a live one without waiting for the live window. Nullable columns, no
data moved; the downgrade drops them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_run_ends"
down_revision = "0002_staged_chunks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("twophase_runs", sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "twophase_runs",
        sa.Column("end_reason", sa.Text(), nullable=True, comment="stopped or failed"),
    )


def downgrade() -> None:
    op.drop_column("twophase_runs", "end_reason")
    op.drop_column("twophase_runs", "ended_at")
