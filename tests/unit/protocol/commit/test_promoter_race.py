"""The promoter's race between targets (pure logic): when a failing target is given up,
when a lagging one is needed, and what a correction needs."""

from __future__ import annotations

import threading
import time

import pytest

from twophase.errors import TargetAuthError, TargetUnavailableError
from twophase.protocol.commit.promoter import _Race
from twophase.protocol.ledger.target_ledger import Place

pytestmark = pytest.mark.unit
DOWN = TargetUnavailableError("down")


def place(name: str, caught_up: bool = True, state: str = "live") -> Place:
    return Place(name, state, owed=True, has=None, caught_up=caught_up)


def race(*places: Place, min_targets: int = 1, epoch: int = 0, deadline_s: float = 60) -> _Race:
    return _Race.of(list(places), min_targets, epoch, deadline_s)


def test_a_failed_round_is_repeated_while_too_few_targets_hold_the_epoch() -> None:
    assert not race(place("a"), place("b")).give_up("a", DOWN)  # nobody holds it yet


def test_a_failed_round_gives_up_once_enough_targets_hold_the_epoch() -> None:
    r = race(place("a"), place("b"))
    r.won("b")
    assert r.give_up("a", DOWN)  # left lagging: the commit goes on without it


def test_a_target_that_refuses_at_once_waits_for_the_others_not_the_whole_wait() -> None:
    r = race(place("a"), place("b"))
    threading.Timer(0.05, r.won, args=("b",)).start()
    started = time.monotonic()
    assert r.give_up("a", TargetAuthError("refused"))
    assert time.monotonic() - started < 0.9  # woken by the other target's success


def test_once_no_server_answered_for_the_retry_deadline_a_target_is_given_up() -> None:
    r = race(place("a"), place("b"), min_targets=2, deadline_s=0.01)
    r.won("b")
    time.sleep(0.05)
    assert r.give_up("b", DOWN)  # 1 of 2: the commit then raises, the epoch PRECOMMITTED


def test_an_answer_keeps_the_retry_deadline_from_running_out() -> None:
    r = race(place("a"), place("b"), min_targets=2, deadline_s=0.2)
    for _ in range(4):
        time.sleep(0.1)
        r.pulse.beat(10)  # a request of the other target acknowledged
    assert not r.give_up("b", DOWN)


def test_a_stop_ends_every_targets_rounds() -> None:
    r = race(place("a"), place("b"))
    r.stop()
    assert r.stopped and r.give_up("a", DOWN)


def test_a_lagging_target_waits_while_the_caught_up_ones_may_make_it() -> None:
    r = race(place("a"), place("b", caught_up=False))
    needed: list[bool] = []
    waiter = threading.Thread(target=lambda: needed.append(r.wait_for_need("b")))
    waiter.start()
    time.sleep(0.05)
    assert not needed  # a may still make min_targets alone
    assert not r.give_up("a", DOWN)  # a failed a round: b is needed now
    waiter.join(1)
    assert needed == [True]


def test_a_lagging_target_is_not_needed_once_the_others_made_it() -> None:
    r = race(place("a"), place("b", caught_up=False))
    r.won("b")
    assert r.wait_for_need("b") is False


def test_one_target_is_given_the_whole_deadline_in_one_round() -> None:
    assert race(place("default")).rounds_for("default") is False
    assert race(place("a"), place("b")).rounds_for("a") is True
    assert race(place("a"), place("b"), min_targets=2).rounds_for("a") is False


def test_a_correction_owed_to_some_targets_gates_nothing() -> None:
    other = Place("b", "live", owed=False, has=None, caught_up=True)
    r = race(place("a"), other, min_targets=2, epoch=-1)
    assert r.needed == 0 and r.enough()
    assert r.is_due("a") and not r.is_due("b")


def test_a_correction_owed_to_every_target_needs_them_as_an_epoch_does() -> None:
    assert race(place("default"), epoch=-1).needed == 1  # one target: as before targets
    assert race(place("a"), place("b"), min_targets=2, epoch=-1).needed == 2


def test_quarantined_targets_are_not_due() -> None:
    r = race(place("a"), place("b", state="quarantined"))
    assert r.is_due("a") and not r.is_due("b")


def test_a_lagging_target_is_needed_once_the_others_cannot_make_it_after_one_held() -> None:
    """min_targets 2 of a, b (caught up) and c (lagging): a takes the epoch, b fails a
    round: c is needed (a counted once, not as held and as hopeful)."""
    r = race(place("a"), place("b"), place("c", caught_up=False), min_targets=2)
    r.won("a")
    assert not r.give_up("b", DOWN)
    needed: list[bool] = []
    waiter = threading.Thread(target=lambda: needed.append(r.wait_for_need("c")))
    waiter.start()
    waiter.join(2)
    assert needed == [True]
