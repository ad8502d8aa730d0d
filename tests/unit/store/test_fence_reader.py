"""The fencing reads' session's own logic with a fake connection: opened at the first
read, kept, dropped after a failure and opened again at the next read, closed once (the
real PostgreSQL: tests/integration/test_fence_reads.py)."""

from __future__ import annotations

import psycopg
import pytest

from tests.fakes import FakeConnection
from twophase.errors import StagingUnavailableError
from twophase.store.fencing import FenceReader

SHOWN = "postgresql://tp:***@db/staging"


class Opener:
    def __init__(self, *made: FakeConnection) -> None:
        self.made = list(made)
        self.opened: list[FakeConnection] = []

    def __call__(self) -> FakeConnection:
        conn = self.made.pop(0)
        self.opened.append(conn)
        return conn


def reader(opener: Opener) -> FenceReader:
    return FenceReader(opener, SHOWN)  # type: ignore[arg-type]


def test_one_session_opened_at_the_first_read_and_kept() -> None:
    opener = Opener(FakeConnection((3, "rA")))
    fence = reader(opener)
    assert opener.opened == []
    assert fence.read("s") == {"fencing_token": 3, "owner_run_id": "rA"}
    assert fence.read("s") == {"fencing_token": 3, "owner_run_id": "rA"}
    assert len(opener.opened) == 1
    assert opener.opened[0].prepared == [True, True]


def test_an_unknown_sink_reads_none() -> None:
    assert reader(Opener(FakeConnection(None))).read("s") is None


@pytest.mark.parametrize(
    "failure", [psycopg.OperationalError("server closed the connection"), psycopg.InterfaceError()]
)
def test_a_failed_read_drops_the_session_and_the_next_opens_another(
    failure: BaseException,
) -> None:
    broken, fresh = FakeConnection((3, "rA"), failure), FakeConnection((4, "rB"))
    opener = Opener(broken, fresh)
    fence = reader(opener)
    with pytest.raises(StagingUnavailableError, match=r"tp:\*\*\*@db"):
        fence.read("s")
    assert broken.closed
    assert fence.read("s") == {"fencing_token": 4, "owner_run_id": "rB"}


def test_any_other_failure_drops_the_session_too_and_is_raised_as_it_is() -> None:
    broken = FakeConnection((3, "rA"), psycopg.errors.InsufficientPrivilege("no"))
    opener = Opener(broken, FakeConnection((3, "rA")))
    fence = reader(opener)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fence.read("s")
    assert broken.closed
    assert fence.read("s") is not None


def test_close_ends_the_session_once_and_a_later_read_opens_one() -> None:
    first = FakeConnection((3, "rA"))
    opener = Opener(first, FakeConnection((3, "rA")))
    fence = reader(opener)
    fence.close()  # nothing open: nothing to do
    fence.read("s")
    fence.close()
    fence.close()
    assert first.closed and fence.backend_pid is None
    fence.read("s")
    assert len(opener.opened) == 2
