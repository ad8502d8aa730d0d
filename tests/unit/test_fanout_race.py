"""The fan-out's race between targets (pure logic): when a failing target is given up."""

from __future__ import annotations

import threading
import time

import pytest

from twophase.protocol.fanout import _Race

pytestmark = pytest.mark.unit


def test_a_failed_round_is_repeated_while_too_few_targets_hold_the_epoch() -> None:
    race = _Race(held=0, needed=1, deadline=time.monotonic() + 60)
    assert not race.give_up(0)  # nobody holds it yet: try the failing target again


def test_a_failed_round_gives_up_once_enough_targets_hold_the_epoch() -> None:
    race = _Race(held=0, needed=1, deadline=time.monotonic() + 60)
    race.won()
    assert race.give_up(0)  # left lagging: the commit goes on without it


def test_a_target_that_refuses_at_once_waits_for_the_others_not_the_whole_wait() -> None:
    race = _Race(held=0, needed=1, deadline=time.monotonic() + 60)
    threading.Timer(0.05, race.won).start()
    started = time.monotonic()
    assert race.give_up(5.0)
    assert time.monotonic() - started < 4.0  # woken by the other target's success


def test_past_the_retry_deadline_a_failing_target_fails_the_commit() -> None:
    race = _Race(held=0, needed=2, deadline=time.monotonic() - 1)
    race.won()
    assert race.give_up(0)  # 1 of 2: the commit then raises, the epoch PRECOMMITTED


def test_a_stop_ends_every_targets_rounds() -> None:
    race = _Race(held=0, needed=1, deadline=time.monotonic() + 60)
    race.stop()
    assert race.stopped and race.give_up(0)
