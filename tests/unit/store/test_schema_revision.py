"""The revision the code checks for is Alembic's head (no database needed)."""

from __future__ import annotations

from alembic.config import Config
from alembic.script import ScriptDirectory

from tests.support import REPO
from twophase.store.schema import SCHEMA_REVISION, metadata


def test_code_expects_alembic_head() -> None:
    script = ScriptDirectory.from_config(Config(str(REPO / "alembic.ini")))
    assert script.get_heads() == [SCHEMA_REVISION]


def test_every_table_is_prefixed() -> None:
    assert all(name.startswith("twophase_") for name in metadata.tables)
