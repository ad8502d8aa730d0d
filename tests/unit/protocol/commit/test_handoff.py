"""The hand-off's bookkeeping with a stand-in promoter (the real promotion is tested
against the servers in tests/integration/test_background_promotion.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from twophase.model import Lease
from twophase.protocol.commit.handoff import Handoff
from twophase.protocol.commit.promoter import PromoteResult


class Gate:
    """A promoter whose promotions wait for ``release`` and fail for listed sinks."""

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        self.release = threading.Event()
        self.failing = failing
        self.calls: list[tuple[str, int]] = []

    def promote(self, lease: Lease, epoch: int, plan: Any = None) -> PromoteResult:
        self.calls.append((lease.sink_id, epoch))
        self.release.wait(10)
        if lease.sink_id in self.failing:
            raise RuntimeError(f"{lease.sink_id} failed")
        return PromoteResult(lease.sink_id, epoch, 5, 0)


def lease(sink: str) -> Lease:
    return Lease(sink, "run", "query", 1)


def test_wait_returns_the_promotion_and_then_nothing() -> None:
    gate = Gate()
    handoff = Handoff(gate)  # type: ignore[arg-type]
    handoff.hand_off(lease("a"), 3, None)
    gate.release.set()
    assert handoff.wait("a") == PromoteResult("a", 3, 5, 0)
    assert handoff.wait("a") is None
    handoff.close()


def test_a_second_epoch_of_a_sink_cannot_be_handed_off_while_one_promotes() -> None:
    gate = Gate()
    handoff = Handoff(gate)  # type: ignore[arg-type]
    handoff.hand_off(lease("a"), 0, None)
    with pytest.raises(RuntimeError, match="still promoting"):
        handoff.hand_off(lease("a"), 1, None)
    handoff.hand_off(lease("b"), 0, None)  # another sink may promote meanwhile
    gate.release.set()
    handoff.close()
    assert sorted(gate.calls) == [("a", 0), ("b", 0)]


def test_drain_waits_for_every_sink_then_raises_the_first_failure() -> None:
    gate = Gate(failing=("a",))
    handoff = Handoff(gate)  # type: ignore[arg-type]
    handoff.hand_off(lease("a"), 0, None)
    handoff.hand_off(lease("b"), 0, None)
    gate.release.set()
    with pytest.raises(RuntimeError, match="a failed"):
        handoff.drain()
    assert handoff.drain() == []  # both ended: nothing left in flight
    handoff.close()
