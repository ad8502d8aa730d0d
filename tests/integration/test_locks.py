"""The staging store's locks: 64-bit keys; a holder that learns when its lock went with
its session; a fenced run's holder ended by the newer run; every wait bounded."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

import psycopg
import pytest

from tests.integration.fanout_helpers import Targets, deliveries, points
from tests.staging import M, epoch_row, lines, stage
from tests.support import (
    admin_conninfo,
    begin_run,
    create_database,
    drop_database,
    influx_count,
    staging_config_for,
    two_phase,
    unique,
)
from twophase.config import StagingConfig, TargetConfig
from twophase.errors import (
    FencedError,
    LockLostError,
    RecoveryLockLostError,
    StagingUnavailableError,
    TargetUnavailableError,
)
from twophase.protocol.commit.runtime import TwoPhase
from twophase.store.database import Database
from twophase.store.locks import LOCK_SEED, LockOwner

OWNER = LockOwner("s", 1)


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
    with Database(staging) as db, db.session_lock(first, OWNER):
        taken = threading.Event()

        def take_the_other() -> None:
            with db.session_lock(second, OWNER):
                taken.set()

        thread = threading.Thread(target=take_the_other, daemon=True)
        thread.start()
        assert taken.wait(10), f"{second!r} waited on {first!r}"
        thread.join(10)


def test_a_held_lock_knows_when_its_session_ended(staging: StagingConfig, staging_url: str) -> None:
    with Database(staging) as db, db.session_lock("twophase-target:s:a", OWNER) as held:
        held.check()  # still held: nothing raised
        with psycopg.connect(admin_conninfo(staging_url)) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                " AND granted AND database = (SELECT oid FROM pg_database"
                " WHERE datname = current_database())"
            )
        with pytest.raises(LockLostError, match="twophase-target:s:a"):
            held.check()


@pytest.mark.lanes(1)  # one request at a time: none under way when the lock goes
def test_a_recovery_that_lost_its_lock_stops_before_its_next_request(
    staging: StagingConfig, influx: TargetConfig, staging_url: str
) -> None:
    """The recovery lock's session ends between two requests of the epoch it recovers
    (a PostgreSQL restart, a cut connection): another process of the run may now take
    the lock and recover the sink, so the recovery sends no request more and stops; the
    epoch stays PRECOMMITTED for the next recovery."""
    config = dataclasses.replace(influx, batch_points=10)  # 30 points: three requests
    with two_phase(staging, config) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        tp.ledger.decide(lease, 0, stage(tp, "s", 0, [lines(0, 30)]))
        writer = tp.writers["default"]
        sent = []

        def write_then_lose_the_lock(body: bytes, gzipped: bool = False) -> None:
            original(body, gzipped)
            sent.append(len(body))
            with psycopg.connect(admin_conninfo(staging_url)) as conn:
                conn.execute(  # the session of the only advisory lock held: recover:s
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND granted AND database = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database())"
                )

        original = writer.write
        writer.write = write_then_lose_the_lock  # type: ignore[method-assign]
        with pytest.raises(RecoveryLockLostError, match="recover:s"):
            tp.committer.recover(lease)
    assert len(sent) == 1  # one request, then the lock was seen gone
    assert influx_count(config, M) == 10
    assert epoch_row(staging_url, "s", 0)["state"] == "PRECOMMITTED"


@pytest.mark.lanes(1)
def test_a_recovery_that_lost_its_lock_while_catching_a_target_up_stops_too(
    staging: StagingConfig, two: Targets, staging_url: str
) -> None:
    """A recovery whose promotion catches a lagging target up first (the other target
    down) checks its lock there too: lost after the catch-up's request, the catch-up
    is not recorded and the recovered epoch is sent to no target."""
    with two_phase(staging, two.config) as tp:
        lease = tp.committer.claim("s", "r1", "q1")
        tp.catch_up.close()  # b's backlog is the recovery's
        two.down("b")
        tp.committer.commit(lease, 0, stage(tp, "s", 0, [points(0)]))  # in a alone
        two.down("a")
        with pytest.raises(TargetUnavailableError):
            tp.committer.commit(lease, 1, stage(tp, "s", 1, [points(1)]))
    two.up("b")  # a still down: the recovery of 1 catches b up with 0 first
    with two_phase(staging, two.config) as tp:
        tp.catch_up.close()
        lease = begin_run(tp, "s", "r2", "q1")
        writer = tp.writers["b"]
        sent = []

        def write_then_lose_the_lock(body: bytes, gzipped: bool = False) -> None:
            original(body, gzipped)
            sent.append(len(body))
            with psycopg.connect(admin_conninfo(staging_url)) as conn:
                conn.execute(  # the recovery lock's session, not b's lock's
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND granted AND database = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database())"
                    " AND (classid::int8 << 32 | objid::int8) = hashtextextended(%s, %s)",
                    ("recover:s", LOCK_SEED),
                )

        original = writer.write
        writer.write = write_then_lose_the_lock  # type: ignore[method-assign]
        with pytest.raises(RecoveryLockLostError, match="recover:s"):
            tp.committer.recover(lease)
    assert len(sent) == 1  # epoch 0's one request to b; epoch 1's never went
    assert deliveries(staging_url, "s", "b") == []  # the catch-up not recorded
    assert epoch_row(staging_url, "s", 1)["state"] == "PRECOMMITTED"


def test_a_newer_run_ends_the_session_of_a_fenced_run_that_holds_its_lock(tp: TwoPhase) -> None:
    """A frozen driver's lock session answers TCP and never ends by itself: the run that
    fenced it ends it (pg_terminate_backend) and takes the lock, and the old holder
    learns it lost the lock."""
    old = begin_run(tp, "s", "r1", "q1")
    db = tp.db
    with db.session_lock("recover:s", LockOwner("s", old.token)) as held:
        new = begin_run(tp, "s", "r2", "q1")  # fences r1
        started = time.monotonic()
        with db.session_lock("recover:s", LockOwner("s", new.token)):
            assert time.monotonic() - started < 5
            with pytest.raises(LockLostError, match="recover:s"):
                held.check()


def test_a_live_runs_holder_is_waited_for_never_ended(tp: TwoPhase) -> None:
    """A holder of the same run, or of a newer one, is never ended: the waiter waits while
    its between-tries check lets it, and a fenced waiter gives up with FencedError."""
    old = begin_run(tp, "s", "r1", "q1")
    new = begin_run(tp, "s", "r2", "q1")
    db = tp.db
    tries: list[int] = []

    def give_up_after_three() -> None:
        tries.append(1)
        if len(tries) == 3:
            raise TimeoutError("gave up")

    with db.session_lock("recover:s", LockOwner("s", new.token)) as held:
        with (
            pytest.raises(TimeoutError),
            db.session_lock("recover:s", LockOwner("s", new.token), give_up_after_three),
        ):
            pass
        with pytest.raises(FencedError), tp.ledger.recovering(old):
            pass
        held.check()  # still held by the newer run


def test_a_waiter_looks_only_at_the_holders_of_its_own_database(
    tp: TwoPhase, base_staging_url: str, template_db: str, influx: TargetConfig
) -> None:
    """Two staging stores on one server, a sink of the same name in each: a waiter of
    one ends its own store's fenced holder and never the other store's live holder (of
    an older token than the waiter's). Tried each way round, so that whichever of the
    two holders the server lists first, a waiter that read both would pick the wrong
    one once."""
    name = unique("twophase_t")
    other_url = create_database(base_staging_url, name, template=template_db)
    try:
        with two_phase(staging_config_for(other_url), influx) as other:
            for waiter, bystander in ((tp, other), (other, tp)):
                _waiter_spares_the_other_store(waiter, bystander)
    finally:
        drop_database(base_staging_url, name)


def _waiter_spares_the_other_store(waiter: TwoPhase, bystander: TwoPhase) -> None:
    """The bystander's live holder has a token below the waiter's, which the waiter's
    store fences: what would have the waiter end it, had it read the other store."""
    live = begin_run(bystander, "s", f"live-{uuid.uuid4()}", "q1")
    old = begin_run(waiter, "s", f"old-{uuid.uuid4()}", "q1")
    while old.token < live.token:
        old = begin_run(waiter, "s", f"old-{uuid.uuid4()}", "q1")
    with (
        bystander.db.session_lock("recover:s", LockOwner("s", live.token)) as spared,
        waiter.db.session_lock("recover:s", LockOwner("s", old.token)) as fenced,
    ):
        new = begin_run(waiter, "s", f"new-{uuid.uuid4()}", "q1")  # fences the old run
        started = time.monotonic()
        with waiter.db.session_lock("recover:s", LockOwner("s", new.token)):
            assert time.monotonic() - started < 5
            with pytest.raises(LockLostError):
                fenced.check()
            spared.check()  # the other store's live holder still holds its lock


def test_a_lock_wait_without_a_check_gives_up_at_the_retry_deadline(
    staging: StagingConfig,
) -> None:
    quick = dataclasses.replace(staging, retry_deadline_s=1.0)
    with Database(quick) as db, db.session_lock("recover:s", OWNER):
        started = time.monotonic()
        with (
            pytest.raises(StagingUnavailableError, match="held by another session"),
            db.session_lock("recover:s", OWNER),
        ):
            pass
        assert time.monotonic() - started < 10


def test_every_session_has_bounded_lock_waits_idle_transactions_and_keepalives(
    staging: StagingConfig, staging_url: str
) -> None:
    """A step waiting for a row lock gives up after staging_lock_timeout (retryably); a
    session idle in a transaction is ended by PostgreSQL after staging_session_timeout,
    and its row locks with it; the server watches a silent client with keepalives."""
    quick = dataclasses.replace(staging, lock_timeout_s=0.5, session_timeout_s=2.0)
    with Database(quick) as db:
        with db.transaction() as cur:
            cur.execute(
                "SELECT current_setting('lock_timeout'),"
                " current_setting('idle_in_transaction_session_timeout'),"
                " current_setting('tcp_user_timeout')"
            )
            assert cur.fetchone() == ("500ms", "2s", "2000")  # ms, on TCP
        with psycopg.connect(admin_conninfo(staging_url)) as other:
            other.execute("INSERT INTO twophase_sinks (sink_id) VALUES ('s')")
            other.commit()
            other.execute("SELECT 1 FROM twophase_sinks WHERE sink_id = 's' FOR UPDATE")
            started = time.monotonic()
            with (
                pytest.raises(StagingUnavailableError, match="staging_lock_timeout"),
                db.transaction() as cur,
            ):
                cur.execute("UPDATE twophase_sinks SET updated_at = now() WHERE sink_id = 's'")
            assert time.monotonic() - started < 5
            other.rollback()
        # A twophase session left idle in its transaction, as a frozen driver leaves it.
        with db.connection() as frozen:
            frozen.execute("SELECT 1 FROM twophase_sinks WHERE sink_id = 's' FOR UPDATE")
            started = time.monotonic()
            with db.transaction() as cur:  # waits, retried, until PostgreSQL ends it
                cur.execute("SET LOCAL lock_timeout = '10s'")
                cur.execute("UPDATE twophase_sinks SET updated_at = now() WHERE sink_id = 's'")
            waited = time.monotonic() - started
            assert 1.0 < waited < 8, waited
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                frozen.execute("SELECT 1")
