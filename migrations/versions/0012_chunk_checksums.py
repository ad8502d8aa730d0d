"""a checksum per staged chunk, checked before the chunk is sent

Revision ID: 0012_chunk_checksums
Revises: 0011_generations
Create Date: 2026-12-02 07:30:00

``twophase_staged_chunks.checksum``: a digest of the chunk as stored (its text
or its gzip member), bound to its write, its first seq and its count of
lines, recorded when it is staged. A promotion, a resend or a catch-up checks
each chunk against it as it reads the chunk back, before anything of it goes
to a target (I1): a chunk changed after the decision never reaches one.

Nullable, no default: PostgreSQL adds it without rewriting the table. Chunks
staged before the upgrade keep NULL and are checked as before, by their
write's checksum once the write is read whole. The downgrade drops the
column; the older code checks every write by its write checksum, which
chunks staged after the upgrade still have.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012_chunk_checksums"
down_revision = "0011_generations"
branch_labels = None
depends_on = None

COMMENT = "blake2b of the chunk as stored, bound to its write, first seq and points (I1)"


def upgrade() -> None:
    op.add_column(
        "twophase_staged_chunks",
        sa.Column("checksum", postgresql.BYTEA(), nullable=True, comment=COMMENT),
    )


def downgrade() -> None:
    op.drop_column("twophase_staged_chunks", "checksum")
