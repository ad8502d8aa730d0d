"""StagingRetry: how a protocol step rides out a staging outage, against a fake clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.unit.test_sender import FakeClock as Clock
from twophase.errors import (
    FencedError,
    StagingDeadlineError,
    StagingUnavailableError,
)
from twophase.retry import RetryPolicy, StagingRetry


def retry(clock: Clock, deadline_s: float = 10.0) -> StagingRetry:
    policy = RetryPolicy(initial_s=0.5, max_s=2.0, deadline_s=deadline_s, jitter=0.0)
    return StagingRetry(policy, sleep=clock.sleep, clock=clock)


def failing(times: int, result: str = "done") -> Callable[[], str]:
    calls = {"n": 0}

    def call() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise StagingUnavailableError(f"down ({calls['n']})")
        return result

    return call


def test_a_step_is_repeated_with_backoff_until_the_store_answers() -> None:
    clock = Clock()
    assert retry(clock)("decide", failing(3)) == "done"
    assert clock.sleeps == [0.5, 1.0, 2.0]


def test_the_repeat_is_the_again_call() -> None:
    clock, seen = Clock(), []

    def first() -> str:
        seen.append("first")
        raise StagingUnavailableError("commit unacknowledged")

    def again() -> str:
        seen.append("again")
        return "read back"

    assert retry(clock)("decide", first, again=again) == "read back"
    assert seen == ["first", "again"]


def test_past_the_deadline_the_step_fails_retryable_naming_the_step() -> None:
    clock = Clock()
    with pytest.raises(StagingDeadlineError, match=r"mark: .*unavailable for 4s.*down") as err:
        retry(clock, deadline_s=4.0)("mark", failing(100))
    assert isinstance(err.value, StagingUnavailableError)
    assert sum(clock.sleeps) == pytest.approx(4.0)  # the last wait is cut to the deadline


def test_an_inner_step_past_its_deadline_is_not_retried_again() -> None:
    clock, calls = Clock(), []

    def inner() -> str:
        calls.append(1)
        raise StagingDeadlineError("inner gave up")

    with pytest.raises(StagingDeadlineError, match="inner gave up"):
        retry(clock)("promote", inner)
    assert calls == [1] and clock.sleeps == []


def test_a_step_that_consumed_its_input_is_not_repeated() -> None:
    clock = Clock()
    with pytest.raises(StagingUnavailableError, match="down"):
        retry(clock)("stage", failing(1), repeatable=lambda: False)
    assert clock.sleeps == []


def test_other_errors_are_never_retried() -> None:
    clock = Clock()

    def fenced() -> str:
        raise FencedError("a newer run owns the sink")

    with pytest.raises(FencedError):
        retry(clock)("decide", fenced)
    assert clock.sleeps == []


def test_a_zero_deadline_means_one_attempt() -> None:
    clock = Clock()
    with pytest.raises(StagingDeadlineError):
        retry(clock, deadline_s=0)("claim", failing(1))
    assert clock.sleeps == []
