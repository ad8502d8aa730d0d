"""The staging store's session-level locks: 64-bit keys, and a holder that learns when
its lock went with its session."""

from __future__ import annotations

import threading

import psycopg
import pytest

from tests.support import admin_conninfo
from twophase.config import StagingConfig
from twophase.errors import LockLostError
from twophase.store.database import Database


def colliding_names(staging_url: str) -> tuple[str, str]:
    """Two lock names whose 32-bit ``hashtext`` is the same (a birthday collision among
    300,000 names: about ten are expected)."""
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        row = conn.execute(
            "SELECT min(n), max(n) FROM (SELECT 'twophase-target:s:' || g AS n,"
            " hashtext('twophase-target:s:' || g) AS h FROM generate_series(1, 300000) g) x"
            " GROUP BY h HAVING count(*) > 1 LIMIT 1"
        ).fetchone()
    assert row is not None, "no 32-bit collision among 300,000 names"
    return row[0], row[1]


def test_locks_of_names_whose_32_bit_hashes_collide_do_not_wait_on_each_other(
    staging: StagingConfig, staging_url: str
) -> None:
    first, second = colliding_names(staging_url)
    with Database(staging) as db, db.session_lock(first):
        taken = threading.Event()

        def take_the_other() -> None:
            with db.session_lock(second):
                taken.set()

        thread = threading.Thread(target=take_the_other, daemon=True)
        thread.start()
        assert taken.wait(10), f"{second!r} waited on {first!r}"
        thread.join(10)


def test_a_held_lock_knows_when_its_session_ended(staging: StagingConfig, staging_url: str) -> None:
    with Database(staging) as db, db.session_lock("twophase-target:s:a") as held:
        held.check()  # still held: nothing raised
        with psycopg.connect(admin_conninfo(staging_url)) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                " AND granted AND database = (SELECT oid FROM pg_database"
                " WHERE datname = current_database())"
            )
        with pytest.raises(LockLostError, match="twophase-target:s:a"):
            held.check()
