"""What an epoch's early sending (``promotion = overlap``) tells the commit: the part of
the decided plan each target still lacks, the counts of what it holds already, and the
writes seen that the decision does not name."""

from __future__ import annotations

import pytest

from twophase.model import EpochPlan, WriteRef
from twophase.protocol.overlap import NOTHING, Sent

pytestmark = pytest.mark.unit

W1, W2, W3 = (WriteRef(f"w{i}", 10 * i, f"sum{i}") for i in (1, 2, 3))
PLAN = EpochPlan("s", 7, (W1, W2, W3))


def test_a_target_lacks_the_decided_writes_it_was_not_sent_in_the_plans_order() -> None:
    sent = Sent({"a": {("w2",): (20, 0)}}, frozenset({"w1", "w2", "w3"}))
    rest, counts = sent.remaining("a", PLAN)
    assert rest == EpochPlan("s", 7, (W1, W3))
    assert counts == (20, 0)


def test_the_counts_held_add_up_delivered_and_rejected_of_every_decided_group() -> None:
    """A group is one early delivery of several writes: its counts count whole."""
    sent = Sent({"a": {("w1", "w3"): (37, 3)}}, frozenset({"w1", "w2", "w3"}))
    rest, counts = sent.remaining("a", PLAN)
    assert rest.writes == (W2,)
    assert counts == (37, 3)


def test_a_target_that_holds_every_decided_write_lacks_nothing() -> None:
    held = {("w1",): (10, 0), ("w2", "w3"): (49, 1)}
    rest, counts = Sent({"a": held}, frozenset({"w1", "w2", "w3"})).remaining("a", PLAN)
    assert rest == EpochPlan("s", 7, ())
    assert counts == (59, 1)


@pytest.mark.parametrize(
    "sent",
    [NOTHING, Sent({"b": {("w1",): (10, 0)}}, frozenset({"w1"})), Sent({"a": {}}, frozenset())],
    ids=["nothing-sent", "sent-to-another-target", "target-left-out"],
)
def test_a_target_sent_nothing_gets_the_whole_plan(sent: Sent) -> None:
    assert sent.remaining("a", PLAN) == (PLAN, (0, 0))


def test_a_write_sent_but_not_decided_is_not_counted() -> None:
    """A failed task attempt's write reached the target: the decision does not name it,
    so it adds nothing to the counts (I1)."""
    sent = Sent({"a": {("orphan",): (50, 5), ("w1",): (10, 0)}}, frozenset({"orphan", "w1"}))
    rest, counts = sent.remaining("a", PLAN)
    assert rest.writes == (W2, W3)
    assert counts == (10, 0)


def test_a_group_with_an_undecided_write_is_not_counted_and_its_decided_ones_go_again() -> None:
    """Its counts cannot be split between the decided write and the orphan: the decided
    one is sent again (an overwrite), and counted from that."""
    sent = Sent({"a": {("w1", "orphan"): (60, 0), ("w2",): (20, 0)}}, frozenset())
    rest, counts = sent.remaining("a", PLAN)
    assert rest.writes == (W1, W3)
    assert counts == (20, 0)


def test_each_target_is_answered_from_its_own_groups() -> None:
    sent = Sent({"a": {("w1",): (10, 0)}, "b": {("w3",): (30, 0)}}, frozenset({"w1", "w3"}))
    assert sent.remaining("a", PLAN)[0].writes == (W2, W3)
    assert sent.remaining("b", PLAN)[0].writes == (W1, W2)


def test_writes_counts_each_write_that_reached_a_target_once() -> None:
    sent = Sent(
        {"a": {("w1", "w2"): (30, 0)}, "b": {("w1",): (10, 0), ("w3",): (30, 0)}, "c": {}},
        frozenset({"w1", "w2", "w3", "w4"}),
    )
    assert sent.writes == 3  # w4 was seen, never sent
    assert NOTHING.writes == 0


def test_undecided_lists_the_writes_seen_the_decision_does_not_name_sorted() -> None:
    sent = Sent({}, frozenset({"w1", "zz-orphan", "a-orphan", "w3"}))
    assert sent.undecided(PLAN) == ["a-orphan", "zz-orphan"]


def test_undecided_is_empty_when_every_write_seen_is_decided_or_none_was_seen() -> None:
    assert Sent({}, frozenset({"w1", "w2"})).undecided(PLAN) == []
    assert NOTHING.undecided(PLAN) == []


def test_against_a_plan_without_writes_every_write_seen_is_undecided() -> None:
    assert Sent({}, frozenset({"w2", "w1"})).undecided(EpochPlan("s", 7, ())) == ["w1", "w2"]
