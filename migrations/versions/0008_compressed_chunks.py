"""staged chunks stored gzip-compressed, as promotion sends them

Revision ID: 0008_compressed_chunks
Revises: 0007_targets
Create Date: 2026-11-26 07:00:00

``twophase_staged_chunks.body_gz``: a chunk's lines (and one newline more) as
one gzip member, compressed on the executor and sent to InfluxDB as it is
(``Content-Encoding: gzip``) -- what ``compression = gzip`` stages. PostgreSQL
stores it as it is (``STORAGE EXTERNAL``: compressing it again would cost
CPU for nothing). ``body`` becomes nullable; exactly one of the two is set.
Nothing is converted: chunks staged before the upgrade keep their text
``body`` and are promoted, resent and verified as before (a nullable column
without a default is added without rewriting the table; the check scans it
once). The downgrade decompresses compressed chunks back into ``body``.
Run it with no twophase job running: the code of either revision refuses a
database at the other.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

from twophase.model import StagedChunk

revision = "0008_compressed_chunks"
down_revision = "0007_targets"
branch_labels = None
depends_on = None

_TABLE = "twophase_staged_chunks"
_CHECK = "ck_twophase_staged_chunks_one_body"
_BATCH = 1000  # compressed chunks decompressed per round trip by the downgrade


def upgrade() -> None:
    op.alter_column(_TABLE, "body", existing_type=sa.Text(), nullable=True)
    op.add_column(
        _TABLE,
        sa.Column(
            "body_gz", postgresql.BYTEA(), nullable=True, comment="the lines as one gzip member"
        ),
    )
    op.execute(f"ALTER TABLE {_TABLE} ALTER COLUMN body_gz SET STORAGE EXTERNAL")
    op.create_check_constraint(op.f(_CHECK), _TABLE, "(body IS NULL) <> (body_gz IS NULL)")


# A script (--sql) cannot decompress: it stops where compressed chunks are retained.
_REFUSE_COMPRESSED = f"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {_TABLE} WHERE body_gz IS NOT NULL) THEN
        RAISE EXCEPTION 'compressed staged chunks are retained: run twophase db downgrade'
            ' against the database (it decompresses them), not a SQL script';
    END IF;
END
$$
"""  # noqa: S608 - a constant


def downgrade() -> None:
    if context.is_offline_mode():
        op.execute(_REFUSE_COMPRESSED)
    else:
        _decompress_all()
    op.drop_constraint(op.f(_CHECK), _TABLE, type_="check")
    op.drop_column(_TABLE, "body_gz")
    op.alter_column(_TABLE, "body", existing_type=sa.Text(), nullable=False)


def _decompress_all() -> None:
    conn = op.get_bind()
    select = sa.text(
        f"SELECT write_id, chunk, first_seq, body_gz FROM {_TABLE}"  # noqa: S608
        " WHERE body_gz IS NOT NULL LIMIT :n"
    )
    update = sa.text(
        f"UPDATE {_TABLE} SET body = :body, body_gz = NULL"  # noqa: S608
        " WHERE write_id = :w AND chunk = :c"
    )
    while rows := conn.execute(select, {"n": _BATCH}).fetchall():
        for write_id, chunk, first_seq, gz in rows:
            # Inflated within the size its trailer records (a damaged one stops the downgrade).
            text = StagedChunk(str(write_id), first_seq, 1, None, None, gz=bytes(gz)).text
            conn.execute(update, {"body": text, "w": write_id, "c": chunk})
