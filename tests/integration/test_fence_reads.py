"""The fencing reads' own session against the real PostgreSQL (I5): every check reads
afresh, a session ended under it is opened again, an outage past the retry deadline is
the staging store's error, and closing the ledger ends the session."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from devkit.faultproxy import wait_until
from tests.support import admin_conninfo, begin_run, two_phase
from twophase.config import StagingConfig, TargetConfig
from twophase.errors import FencedError, StagingDeadlineError, StateError
from twophase.model import Lease
from twophase.protocol.ledger.epoch_ledger import Ledger
from twophase.store.database import Database

SINK = "fence-reads"


@pytest.fixture
def db(staging: StagingConfig) -> Iterator[Database]:
    staging = dataclasses.replace(staging, connect_timeout_s=1, retry_deadline_s=30)
    with Database(staging) as database:
        yield database


@pytest.fixture
def ledger(db: Database) -> Iterator[Ledger]:
    made = Ledger(db)
    yield made
    made.close()


def admin(
    url: str, statement: str, *params: object, database: str | None = None
) -> list[tuple[object, ...]]:
    with psycopg.connect(admin_conninfo(url, database), autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def fence_pid(ledger: Ledger) -> int:
    pid = ledger._fence.backend_pid
    assert pid is not None
    return pid


def backend_alive(url: str, pid: int) -> bool:
    return bool(admin(url, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", pid))


def backend_ends(url: str, pid: int) -> bool:
    """Whether the backend is gone within a few seconds (its exit is asynchronous)."""
    return wait_until(lambda: not backend_alive(url, pid), 5)


def test_each_check_reads_afresh_and_sees_a_newer_claim_at_once(ledger: Ledger) -> None:
    lease = ledger.begin_run(SINK, "rA", "q1")
    for _ in range(10):  # many reads of the same session: nothing cached
        ledger.check_lease(lease)
    pid = fence_pid(ledger)
    ledger.begin_run(SINK, "rB", "q1")
    with pytest.raises(FencedError, match="rB"):
        ledger.check_lease(lease)
    assert fence_pid(ledger) == pid  # a refusal is no failure of the session


def test_a_watch_reads_until_fenced_then_raises_without_reading(
    ledger: Ledger, staging: StagingConfig
) -> None:
    lease = ledger.begin_run(SINK, "rA", "q1")
    watch = ledger.watch(lease)
    watch()
    ledger.begin_run(SINK, "rB", "q1")
    with pytest.raises(FencedError):
        watch()
    ledger.close()  # no session left: a later call must not need one
    with pytest.raises(FencedError):
        watch()
    assert ledger._fence.backend_pid is None
    fenced = admin(
        staging.url.reveal(), "SELECT fenced_attempts FROM twophase_sinks WHERE sink_id = %s", SINK
    )
    assert fenced == [(1,)]  # the refusal counted once, as a pooled read counted it


def test_an_unknown_sink_is_a_state_error(ledger: Ledger) -> None:
    with pytest.raises(StateError, match="unknown sink"):
        ledger.check_lease(Lease("nowhere", "rA", "q1", 1))


def test_a_terminated_session_is_opened_again_and_the_check_succeeds(
    ledger: Ledger, staging: StagingConfig
) -> None:
    url = staging.url.reveal()
    lease = ledger.begin_run(SINK, "rA", "q1")
    ledger.check_lease(lease)
    old = fence_pid(ledger)
    assert admin(url, "SELECT pg_terminate_backend(%s)", old) == [(True,)]
    ledger.check_lease(lease)  # the read fails, is repeated, and opens a new session
    assert fence_pid(ledger) != old
    ledger.begin_run(SINK, "rB", "q1")
    with pytest.raises(FencedError):  # and the new session reads afresh too
        ledger.check_lease(lease)


def test_the_session_has_the_pools_settings(ledger: Ledger, staging: StagingConfig) -> None:
    ledger.check_lease(ledger.begin_run(SINK, "rA", "q1"))
    conn = ledger._fence._conn
    assert conn is not None and conn.autocommit
    shown = dict(conn.execute("SELECT name, setting FROM pg_settings").fetchall())
    assert shown["lock_timeout"] == str(int(staging.lock_timeout_s * 1000))
    assert shown["plan_cache_mode"] == "force_generic_plan"
    if staging.session_timeout_s > 0:
        expected = str(int(staging.session_timeout_s * 1000))
        assert shown["idle_in_transaction_session_timeout"] == expected


def test_lanes_share_the_session_one_read_at_a_time(ledger: Ledger) -> None:
    lease = ledger.begin_run(SINK, "rA", "q1")
    watch = ledger.watch(lease)
    errors: list[BaseException] = []

    def lane() -> None:
        try:
            for _ in range(200):
                watch()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=lane) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def conninfo(staging: StagingConfig) -> dict[str, object]:
    return psycopg.conninfo.conninfo_to_dict(staging.psycopg_conninfo())


@contextmanager
def no_connections(staging: StagingConfig) -> Iterator[None]:
    """The test's database refuses new sessions (its open ones are ended)."""
    url, name = staging.url.reveal(), conninfo(staging)["dbname"]
    admin(url, f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false', database="postgres")
    try:
        admin(
            url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            name,
            database="postgres",
        )
        yield
    finally:
        admin(url, f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true', database="postgres")


def test_an_outage_past_the_deadline_is_the_staging_stores_error(
    staging: StagingConfig,
) -> None:
    staging = dataclasses.replace(staging, connect_timeout_s=1, retry_deadline_s=1)
    url = staging.url.reveal()
    with Database(staging) as db:
        ledger = Ledger(db)
        lease = ledger.begin_run(SINK, "rA", "q1")
        ledger.check_lease(lease)
        pid = fence_pid(ledger)
        with no_connections(staging), pytest.raises(StagingDeadlineError) as raised:
            ledger.check_lease(lease)
        assert ledger._fence.backend_pid is None  # dropped, not kept broken
        message = str(raised.value)
        assert staging.display_url in message
        password = conninfo(staging).get("password")
        assert not password or f":{password}@" not in message  # the URL shown masked
        assert backend_ends(url, pid)
        ledger.check_lease(lease)  # the store is back: the next check opens a session
        ledger.close()


def test_closing_the_ledger_ends_its_session(ledger: Ledger, staging: StagingConfig) -> None:
    ledger.check_lease(ledger.begin_run(SINK, "rA", "q1"))
    pid = fence_pid(ledger)
    assert backend_alive(staging.url.reveal(), pid)
    ledger.close()
    assert ledger._fence.backend_pid is None
    assert backend_ends(staging.url.reveal(), pid)
    ledger.close()  # idempotent


def test_closing_the_parts_ends_the_session(staging: StagingConfig, influx: TargetConfig) -> None:
    with two_phase(staging, influx) as tp:
        tp.ledger.check_lease(begin_run(tp, SINK, "rA", "q1"))
        pid = fence_pid(tp.ledger)
    assert backend_ends(staging.url.reveal(), pid)
