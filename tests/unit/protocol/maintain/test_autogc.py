"""When automatic GC starts a collection: due per sink, one at a time, never raising."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.fakes import FakeClock, FakeGc
from twophase.protocol.maintain.autogc import AutoGc

pytestmark = pytest.mark.unit


def auto_gc(gc: FakeGc, clock: FakeClock, interval_s: float = 60) -> AutoGc:
    fake: Any = gc
    return AutoGc(fake, interval_s, limit=7, clock=clock)


def test_a_sink_is_due_an_interval_after_its_first_commit_then_every_interval() -> None:
    gc, clock = FakeGc(), FakeClock(100.0)
    auto = auto_gc(gc, clock)
    assert not auto.poke("s")  # the first commit starts the interval
    clock.now += 59
    assert not auto.poke("s")
    clock.now += 1
    assert auto.poke("s") and auto.wait(10)
    assert gc.calls == [("s", 7)]  # bounded: the collector's limit
    clock.now += 30
    assert not auto.poke("s")
    clock.now += 30
    assert auto.poke("s") and auto.wait(10)
    assert not auto.poke("t")  # each sink has its own interval
    assert len(gc.calls) == 2


def test_a_collection_stopped_at_its_bound_is_followed_at_the_next_commit() -> None:
    gc, clock = FakeGc(), FakeClock(100.0)
    fake: Any = gc
    auto = AutoGc(fake, 60, limit=1, clock=clock)  # FakeGc purges 1 epoch: the bound
    auto.poke("s")
    clock.now += 60
    assert auto.poke("s") and auto.wait(10)
    assert auto.poke("s") and auto.wait(10)  # more may be left: at once, not an interval on
    auto = auto_gc(gc, clock)  # a bound of 7: the same collection left nothing
    auto.poke("s")
    clock.now += 60
    assert auto.poke("s") and auto.wait(10)
    assert not auto.poke("s")
    assert len(gc.calls) == 3


def test_never_two_collections_at_once() -> None:
    gc, clock = FakeGc(), FakeClock(100.0)
    auto = auto_gc(gc, clock)
    auto.poke("s")
    auto.poke("t")
    clock.now += 60
    gc.hold.clear()
    assert auto.poke("s")
    assert auto.running
    assert not auto.poke("t")  # due, but s is collecting
    gc.hold.set()
    assert auto.wait(10)
    assert auto.poke("t") and auto.wait(10)
    assert [sink for sink, _ in gc.calls] == ["s", "t"]


def test_interval_0_never_collects() -> None:
    gc, clock = FakeGc(), FakeClock(100.0)
    auto = auto_gc(gc, clock, interval_s=0)
    for _ in range(3):
        clock.now += 3600
        assert not auto.poke("s")
    assert gc.calls == []


def test_a_failed_collection_is_a_warning_and_the_next_one_tries_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gc, clock = FakeGc(error=RuntimeError("store away")), FakeClock(100.0)
    auto = auto_gc(gc, clock)
    auto.poke("s")
    clock.now += 60
    with caplog.at_level(logging.WARNING, logger="twophase.protocol.autogc"):
        assert auto.poke("s") and auto.wait(10)
    assert "automatic gc failed" in caplog.text and "store away" in caplog.text
    clock.now += 60
    assert auto.poke("s") and auto.wait(10)
    assert len(gc.calls) == 2


def test_close_starts_no_more_and_waits_a_bounded_time(caplog: pytest.LogCaptureFixture) -> None:
    gc, clock = FakeGc(), FakeClock(100.0)
    auto = auto_gc(gc, clock)
    auto.poke("s")
    clock.now += 60
    gc.hold.clear()
    assert auto.poke("s")
    with caplog.at_level(logging.WARNING, logger="twophase.protocol.autogc"):
        auto.close(timeout=0.05)  # still running: left to end with the process
    assert "still running" in caplog.text
    gc.hold.set()
    assert auto.wait(10)
    clock.now += 3600
    assert not auto.poke("s")
