"""promotion lanes of staged chunks

Revision ID: 0005_chunk_lanes
Revises: 0004_sink_counters
Create Date: 2026-11-23 11:00:00

``twophase_staged_chunks.lane``: the lane (InfluxDB connection, with
``promote_connections`` > 1) the chunk's lines are promoted over, chosen
when they are staged. Existing chunks are lane 0, which every number of
connections promotes as before; the column has a constant default, so
PostgreSQL adds it without rewriting the table. The downgrade drops it:
promotion is then over one connection, in the same order within each series.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_chunk_lanes"
down_revision = "0004_sink_counters"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "twophase_staged_chunks",
        sa.Column("lane", sa.SmallInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("twophase_staged_chunks", "lane")
