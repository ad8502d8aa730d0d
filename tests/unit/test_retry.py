"""StagingRetry: how a protocol step rides out a staging outage, against a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.fakes import FakeClock, FakeInflux, FakeReader, lines_of, make_sender, staged
from twophase.config import TargetConfig
from twophase.errors import FencedError, StagingDeadlineError, StagingUnavailableError
from twophase.model import DeadLetter, StagedChunk
from twophase.protocol.deliver.delivery import TargetDelivery
from twophase.retry import Progress, RetryPolicy, StagingRetry


def retry(clock: FakeClock, deadline_s: float = 10.0) -> StagingRetry:
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
    clock = FakeClock()
    assert retry(clock)("decide", failing(3)) == "done"
    assert clock.sleeps == [0.5, 1.0, 2.0]


def test_the_repeat_is_the_again_call() -> None:
    clock, seen = FakeClock(), []

    def first() -> str:
        seen.append("first")
        raise StagingUnavailableError("commit unacknowledged")

    def again() -> str:
        seen.append("again")
        return "read back"

    assert retry(clock)("decide", first, again=again) == "read back"
    assert seen == ["first", "again"]


def test_past_the_deadline_the_step_fails_retryable_naming_the_step() -> None:
    clock = FakeClock()
    with pytest.raises(StagingDeadlineError, match=r"mark: .*unavailable for 4s.*down") as err:
        retry(clock, deadline_s=4.0)("mark", failing(100))
    assert isinstance(err.value, StagingUnavailableError)
    assert sum(clock.sleeps) == pytest.approx(4.0)  # the last wait is cut to the deadline


def test_an_inner_step_past_its_deadline_is_not_retried_again() -> None:
    clock, calls = FakeClock(), []

    def inner() -> str:
        calls.append(1)
        raise StagingDeadlineError("inner gave up")

    with pytest.raises(StagingDeadlineError, match="inner gave up"):
        retry(clock)("promote", inner)
    assert calls == [1] and clock.sleeps == []


def test_a_step_that_consumed_its_input_is_not_repeated() -> None:
    clock = FakeClock()
    with pytest.raises(StagingUnavailableError, match="down"):
        retry(clock)("stage", failing(1), repeatable=lambda: False)
    assert clock.sleeps == []


def test_other_errors_are_never_retried() -> None:
    clock = FakeClock()

    def fenced() -> str:
        raise FencedError("a newer run owns the sink")

    with pytest.raises(FencedError):
        retry(clock)("decide", fenced)
    assert clock.sleeps == []


def test_a_zero_deadline_means_one_attempt() -> None:
    clock = FakeClock()
    with pytest.raises(StagingDeadlineError):
        retry(clock, deadline_s=0)("claim", failing(1))
    assert clock.sleeps == []


def working_then_failing(clock: FakeClock, work_s: float, failures: int) -> Callable[[], str]:
    """A step that works for ``work_s`` seconds, then loses its connection; its next
    ``failures - 1`` attempts fail at once, and the one after succeeds."""
    calls = {"n": 0}

    def call() -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            clock.now += work_s
        if calls["n"] <= failures:
            raise StagingUnavailableError(f"connection dropped ({calls['n']})")
        return "done"

    return call


def test_a_step_that_worked_past_the_deadline_then_failed_once_is_repeated() -> None:
    clock = FakeClock()
    assert retry(clock, deadline_s=10)("promote", working_then_failing(clock, 120, 1)) == "done"
    assert clock.sleeps == [0.5]


def test_the_deadline_error_names_the_outage_not_the_step() -> None:
    clock = FakeClock()
    with pytest.raises(StagingDeadlineError) as err:
        retry(clock, deadline_s=10)("promote", working_then_failing(clock, 120, 100))
    assert "stayed unavailable for 10s" in str(err.value)
    assert "(staging_retry_deadline 10s): connection dropped" in str(err.value)
    assert sum(clock.sleeps) == pytest.approx(10.0)


def test_progress_reported_begins_a_new_outage() -> None:
    """An early blip, then minutes of progress, then a dropped connection: the second
    outage gets the whole deadline, and its backoff starts over."""
    clock, calls = FakeClock(), []
    progress = Progress()

    def step() -> str:
        calls.append(clock.now)
        if len(calls) == 1:
            raise StagingUnavailableError("refused at once")
        if len(calls) == 2:
            for _ in range(60):  # a request delivered every 2 s
                clock.now += 2
                progress()
            raise StagingUnavailableError("connection dropped")
        return "done"

    assert retry(clock, deadline_s=10)("promote", step, progress=progress) == "done"
    assert clock.sleeps == [0.5, 0.5]


def test_without_progress_an_outage_runs_from_its_first_failure() -> None:
    clock, calls = FakeClock(), []

    def step() -> str:
        calls.append(1)
        if len(calls) == 2:
            clock.now += 120  # worked, but reported nothing
        raise StagingUnavailableError("down")

    with pytest.raises(StagingDeadlineError, match=r"unavailable for 120s, 2 failed attempt"):
        retry(clock, deadline_s=10)("promote", step, progress=Progress())


class DroppingReader:
    """A reader that loses its connection at once on the first read, and after
    ``after`` chunks on the second; the third reads everything."""

    def __init__(self, reader: FakeReader, after: int) -> None:
        self.reader, self.after, self.reads = reader, after, 0

    def chunks_of(
        self, write_ids: Sequence[str], small: bool = False
    ) -> Iterator[tuple[int, StagedChunk]]:
        self.reads += 1
        for number, item in enumerate(self.reader.chunks_of(write_ids, small)):
            if (self.reads, number) in ((1, 0), (2, self.after)):
                raise StagingUnavailableError("connection dropped")
            yield item

    def record(self, letters: Sequence[DeadLetter]) -> None:
        self.reader.record(letters)


def test_a_promotion_that_delivered_since_the_last_failure_gets_the_whole_deadline() -> None:
    """A blip at the start, then 2 minutes of requests (InfluxDB takes 2 s each), then
    a dropped read: the requests were progress, so the promotion starts over."""
    clock = FakeClock()
    plan, staged_reader = staged([lines_of(100)], chunk_points=1)
    reader = DroppingReader(staged_reader, after=60)
    sender = make_sender(FakeInflux(clock, request_s=2.0), clock).sender
    config = TargetConfig(url="http://fake", batch_points=1, batch_bytes=1 << 20)
    delivery = TargetDelivery(
        "t",
        reader,  # type: ignore[arg-type]
        (sender, sender),
        reader,  # type: ignore[arg-type]
        config,
        retry=retry(clock, deadline_s=10),
    )
    assert delivery.deliver(plan, lambda: None) == (100, 0)
    assert reader.reads == 3 and clock.sleeps == [0.5, 0.5]
