"""BatchSender, RetryPolicy and batches() against a fake writer and a fake clock."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from tests.fakes import FakeClock, FakeInflux, fake_config, lines_of, make_sender, text_of
from twophase.config import TargetConfig
from twophase.errors import (
    BadPointsError,
    BatchTooLargeError,
    EpochStartOverError,
    TargetAuthError,
    TargetNotFoundError,
    TargetUnavailableError,
    TransactionLostError,
    TransientWriteError,
)
from twophase.points.batching import batches
from twophase.targets.sender import (
    SPLIT_REQUESTS,
    START_OVERS,
    BatchSender,
    RetryEvent,
    RetryPolicy,
)

# --- RetryPolicy ----------------------------------------------------------------------


@pytest.mark.parametrize("attempt", range(1, 12))
def test_backoff_stays_within_the_jittered_exponential_step(attempt: int) -> None:
    policy = RetryPolicy(initial_s=0.5, max_s=8.0, deadline_s=60, jitter=0.5)
    step = min(8.0, 0.5 * 2 ** (attempt - 1))
    for r in (0.0, 0.3, 0.999999):
        delay = policy.delay(attempt, rand=itertools.repeat(r).__next__)
        assert step * 0.5 <= delay <= step


def test_full_jitter_spans_zero_to_the_step_and_never_exceeds_max() -> None:
    policy = RetryPolicy(initial_s=1.0, max_s=5.0, deadline_s=60, jitter=1.0)
    rng = random.Random(7)
    delays = [policy.delay(a, rand=rng.random) for a in range(1, 200) for _ in range(5)]
    assert all(0.0 <= d <= 5.0 for d in delays)
    assert min(delays) < 0.5 < 4.5 < max(delays)


def test_no_jitter_is_plain_exponential_and_huge_attempts_do_not_overflow() -> None:
    policy = RetryPolicy(initial_s=0.25, max_s=3.0, deadline_s=60, jitter=0.0)
    assert [policy.delay(a) for a in (1, 2, 3, 4, 5)] == [0.25, 0.5, 1.0, 2.0, 3.0]
    assert policy.delay(10_000) == 3.0


def test_retry_after_is_a_floor_even_above_max() -> None:
    policy = RetryPolicy(initial_s=0.5, max_s=2.0, deadline_s=60)
    assert policy.delay(1, retry_after=1.5, rand=lambda: 0.0) >= 1.5
    assert policy.delay(1, retry_after=10.0, rand=lambda: 0.0) == 10.0
    assert policy.delay(6, retry_after=0.1, rand=lambda: 0.0) == 2.0


def test_policy_from_config_and_validation() -> None:
    config = TargetConfig(url="http://x", retry_initial_s=0.2, retry_max_s=9, retry_deadline_s=42)
    assert RetryPolicy.from_config(config) == RetryPolicy(0.2, 9, 42)
    with pytest.raises(ValueError):
        RetryPolicy(0.5, 30, 300, jitter=1.5)
    with pytest.raises(ValueError):
        RetryPolicy(initial_s=-1, max_s=30, deadline_s=300)


# --- batches() ------------------------------------------------------------------------


def test_batches_by_count() -> None:
    assert list(batches(range(7), 3, 10**9, lambda _: 1)) == [[0, 1, 2], [3, 4, 5], [6]]


def test_batches_by_bytes_keep_order_and_put_an_oversized_item_alone() -> None:
    sizes = {"a": 4, "b": 4, "c": 3, "big": 50, "d": 1}
    got = list(batches(["a", "b", "c", "big", "d"], 100, 8, sizes.__getitem__))
    assert got == [["a", "b"], ["c"], ["big"], ["d"]]
    assert all(sum(map(sizes.__getitem__, b)) <= 8 for b in got if len(b) > 1)


def test_batches_by_points_of_several_per_item() -> None:
    pieces = [("a", 3), ("b", 2), ("c", 4), ("big", 9), ("d", 1)]
    got = list(batches(pieces, 5, 10**9, lambda _: 1, lambda piece: piece[1]))
    assert [[name for name, _ in b] for b in got] == [["a", "b"], ["c"], ["big"], ["d"]]


def test_batches_is_lazy() -> None:
    first_two = list(itertools.islice(batches(itertools.count(), 2, 100, lambda _: 1), 2))
    assert first_two == [[0, 1], [2, 3]]


def test_batches_of_nothing_and_bad_limits() -> None:
    assert list(batches([], 5, 5, len)) == []
    with pytest.raises(ValueError):
        list(batches([1], 0, 5, lambda _: 1))


def test_sender_splits_input_by_points_and_bytes() -> None:
    clock = FakeClock()
    writer = FakeInflux(clock)
    lines = lines_of(25)
    sender = make_sender(writer, clock, max_points=10, max_bytes=10**6)
    assert sender.send(lines) == []
    assert [len(b) for b in writer.bodies] == [10, 10, 5]
    limit = 3 * (len(lines[0]) + 1)
    writer.bodies.clear()
    assert make_sender(writer, clock, max_points=100, max_bytes=limit).send(lines) == []
    assert all(len("\n".join(b)) <= limit for b in writer.bodies)
    assert [line for body in writer.bodies for line in body] == lines


# --- retries and the deadline ---------------------------------------------------------


def test_transient_failures_are_retried_until_success() -> None:
    clock = FakeClock()
    writer = FakeInflux(clock, fail=lambda n, _: TransientWriteError("down") if n <= 3 else None)
    events: list[RetryEvent] = []
    lines = lines_of(5)
    assert make_sender(writer, clock, on_attempt_failed=events.append).send(lines) == []
    assert len(writer.bodies) == 4 and all(b == lines for b in writer.bodies)
    assert [e.attempt for e in events] == [1, 2, 3]
    assert [e.delay_s for e in events] == clock.sleeps
    assert all(isinstance(e.error, TransientWriteError) and e.lines == 5 for e in events)
    assert set(writer.stored) == set(lines)


def test_any_influx_unavailable_error_is_retried() -> None:
    clock = FakeClock()
    writer = FakeInflux(clock, fail=lambda n, _: TargetUnavailableError("x") if n == 1 else None)
    assert make_sender(writer, clock).send(lines_of(2)) == []
    assert len(writer.bodies) == 2 and len(clock.sleeps) == 1


def test_retry_after_is_honoured() -> None:
    clock = FakeClock()
    writer = FakeInflux(
        clock,
        fail=lambda n, _: (
            TransientWriteError("429", status=429, retry_after=7.0) if n == 1 else None
        ),
    )
    assert make_sender(writer, clock).send(lines_of(2)) == []
    assert clock.sleeps == [7.0]


def test_deadline_raises_influx_unavailable() -> None:
    clock = FakeClock()
    writer = FakeInflux(clock, fail=lambda _n, _l: TransientWriteError("connection refused"))
    start = clock.now
    with pytest.raises(TargetUnavailableError) as caught:
        make_sender(writer, clock, deadline_s=30).send(lines_of(3))
    assert not isinstance(caught.value, TransientWriteError)  # the final verdict, not one try
    assert "connection refused" in str(caught.value)
    assert len(writer.bodies) > 5  # it did retry
    assert 30 <= clock.now - start <= 30 + 2 * writer.request_s  # gave up right at the deadline
    assert max(clock.sleeps) <= 4.0


def _epoch(failures: list[Exception]) -> tuple[list[int], object]:
    """A transactional target's epoch for ``repeat``: it fails with ``failures`` in
    turn, then succeeds (its counts); the list of its tries."""
    tries: list[int] = []

    def send() -> tuple[int, int]:
        tries.append(len(tries) + 1)
        if failures:
            raise failures.pop(0)
        return (5, 0)

    return tries, send


def test_an_epoch_started_over_to_make_a_column_is_repeated_at_once() -> None:
    clock = FakeClock()
    sender = BatchSender(FakeInflux(clock), fake_config(1.0), sleep=clock.sleep, clock=clock)
    tries, send = _epoch([EpochStartOverError("column w added")] * 3)
    checks: list[int] = []
    assert sender.repeat(send, 5, lambda: checks.append(1)) == (5, 0)  # type: ignore[arg-type]
    assert tries == [1, 2, 3, 4] and clock.sleeps == []  # no backoff, no deadline spent
    assert len(checks) == 3  # fenced before every repeat all the same


def test_start_overs_past_their_bound_and_lost_transactions_are_an_outage() -> None:
    clock = FakeClock()
    sender = BatchSender(FakeInflux(clock), fake_config(1.0), sleep=clock.sleep, clock=clock)
    tries, send = _epoch([EpochStartOverError("again")] * (START_OVERS + 100))
    with pytest.raises(TargetUnavailableError, match="again"):
        sender.repeat(send, 5)  # type: ignore[arg-type]
    assert len(tries) > START_OVERS and clock.sleeps  # then backed off, until the deadline
    tries, send = _epoch([TransactionLostError("lost")])
    assert sender.repeat(send, 5) == (5, 0) and len(clock.sleeps) > 0  # type: ignore[arg-type]


def test_retry_after_beyond_the_deadline_gives_up_without_waiting() -> None:
    clock = FakeClock()
    writer = FakeInflux(clock, fail=lambda _n, _l: TransientWriteError("503", retry_after=120))
    with pytest.raises(TargetUnavailableError):
        make_sender(writer, clock, deadline_s=30).send(lines_of(1))
    assert clock.sleeps == [] and len(writer.bodies) == 1


def test_deadline_counts_from_the_last_progress() -> None:
    """Each batch may use the whole deadline: a long send that keeps making progress goes on."""
    clock = FakeClock()
    writer = FakeInflux(
        clock, request_s=0.0, fail=lambda n, _: None if n % 10 == 0 else TransientWriteError("blip")
    )
    sender = make_sender(writer, clock, deadline_s=30, max_points=1)
    start = clock.now
    assert sender.send(lines_of(4)) == []
    assert clock.now - start > 30  # longer than one deadline in total, yet no error


def test_a_bisection_longer_than_the_deadline_then_one_failure_is_retried() -> None:
    """A refused body is an answer too: InfluxDB was up while it bisected."""
    clock = FakeClock()
    writer = FakeInflux(
        clock,
        bad=lambda _: "nope",
        request_s=1.0,
        fail=lambda n, _: TransientWriteError("reset") if n == 100 else None,
    )
    start = clock.now
    rejected = make_sender(writer, clock, deadline_s=30).send(lines_of(64))
    assert len(rejected) == 64 and len(clock.sleeps) == 1
    assert clock.now - start > 100  # the failure came long after the call's start


def test_time_before_the_first_attempt_is_not_influx_time() -> None:
    """A fencing check that rode out a staging outage does not spend InfluxDB's deadline."""
    clock = FakeClock()
    writer = FakeInflux(clock, fail=lambda n, _: TransientWriteError("reset") if n == 1 else None)
    sender = make_sender(writer, clock, deadline_s=30).sender
    checks: list[float] = []

    def slow_check() -> None:
        if not checks:
            clock.now += 50.0
        checks.append(clock.now)

    assert sender.send(b"m v=1i 1", 1, lambda: ["m v=1i 1"], before_attempt=slow_check) == []
    assert len(writer.bodies) == 2 and len(clock.sleeps) == 1


def test_the_deadline_error_names_the_outage_not_the_send() -> None:
    clock = FakeClock()
    writer = FakeInflux(
        clock,
        bad=lambda _: "nope",
        request_s=1.0,
        fail=lambda n, _: TransientWriteError("down") if n >= 60 else None,
    )
    start = clock.now
    with pytest.raises(TargetUnavailableError) as caught:
        make_sender(writer, clock, deadline_s=30).send(lines_of(64))
    assert clock.now - start > 80  # the send lasted far longer than the outage
    message = str(caught.value)
    assert re.search(r"after \d+ attempt\(s\) over 3[01]s \(target_retry_deadline 30s", message)
    assert message.endswith(": down")


@pytest.mark.parametrize("error", [TargetAuthError("401"), TargetNotFoundError("404")])
def test_permanent_errors_propagate_at_once(error: Exception) -> None:
    clock = FakeClock()
    writer = FakeInflux(clock, fail=lambda _n, _l: error)
    with pytest.raises(type(error)):
        make_sender(writer, clock).send(lines_of(4))
    assert len(writer.bodies) == 1 and clock.sleeps == []


# --- 413 split and 400 bisection ------------------------------------------------------


def test_413_splits_until_batches_fit() -> None:
    clock = FakeClock()
    writer = FakeInflux(clock, max_lines=3)
    lines = lines_of(20)
    assert make_sender(writer, clock).send(lines) == []
    assert writer.stored == dict.fromkeys(lines, 1)  # each line accepted once, in a body <= 3
    assert [len(b) for b in writer.bodies[:3]] == [20, 10, 5]  # halves, left first


def test_413_on_a_single_line_rejects_it() -> None:
    clock = FakeClock()
    huge = "m v=1i 5"

    def fail(_n: int, body: list[str]) -> Exception | None:
        return BatchTooLargeError("request too large (413): body too big") if huge in body else None

    writer = FakeInflux(clock, fail=fail)
    lines = [*lines_of(3), huge, *lines_of(7)[3:]]
    rejected = make_sender(writer, clock).send(lines)
    assert rejected == [(3, "request too large (413): body too big")]
    assert set(writer.stored) == set(lines) - {huge}


def _bad_marker(line: str) -> str | None:
    return f"unable to parse {line!r}" if "BAD" in line else None


@pytest.mark.parametrize("seed", range(30))
def test_400_bisection_isolates_exactly_the_bad_lines(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 120)
    lines = lines_of(n)
    bad = set(rng.sample(range(n), rng.randint(0, min(n, 6))))
    lines = [f"BAD{i} {line}" if i in bad else line for i, line in enumerate(lines)]
    clock = FakeClock()
    writer = FakeInflux(clock, bad=_bad_marker)
    rejected = make_sender(writer, clock, max_points=rng.choice([7, 50, 500])).send(lines)
    assert rejected == [(i, f"partial write: unable to parse {lines[i]!r}") for i in sorted(bad)]
    assert set(writer.stored) == {line for i, line in enumerate(lines) if i not in bad}
    # bisection costs about 2*log2(n) requests per bad line, not n
    assert len(writer.bodies) <= 1 + len(bad) * 2 * max(1, n.bit_length()) + n // 7 + 1


class WholeInflux(FakeInflux):
    """An InfluxDB 3 stand-in (``accept_partial=false``): a body with a bad line is
    refused whole, naming its first bad line and sending its copy of it; ``misnamed``
    names a line past the body, ``miscopied`` sends another copy (servers that cannot
    be followed: the sender falls back to bisection)."""

    misnamed = False
    miscopied = False

    def write(self, body: bytes, gzipped: bool = False) -> None:
        lines = text_of(body, gzipped).split("\n")
        first = next((i for i, line in enumerate(lines) if self.bad(line)), None)
        if first is None:
            super().write(body, gzipped)
            return
        self.bodies.append(lines)
        self.clock.now += self.request_s
        reason = str(self.bad(lines[first]))
        line = len(lines) + 5 if self.misnamed else first
        copy = "another line" if self.miscopied else lines[first]
        raise BadPointsError(f"refused line {line + 1} (400): {reason}", reason, line, copy)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("misnamed", [None, "line", "copy"])
def test_a_refusal_that_names_its_line_costs_one_request_per_bad_line(
    seed: int, misnamed: str | None
) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 120)
    bad = set(rng.sample(range(n), rng.randint(0, min(n, 6))))
    lines = [f"BAD{i} {line}" if i in bad else line for i, line in enumerate(lines_of(n))]
    clock = FakeClock()
    writer = WholeInflux(clock, bad=_bad_marker)
    writer.misnamed, writer.miscopied = misnamed == "line", misnamed == "copy"
    max_points = rng.choice([7, 50, 500])
    rejected = make_sender(writer, clock, max_points=max_points).send(lines)
    assert sorted(rejected) == [(i, f"unable to parse {lines[i]!r}") for i in sorted(bad)]
    assert set(writer.stored) == {line for i, line in enumerate(lines) if i not in bad}
    assert all(count == 1 for count in writer.stored.values())  # refused whole: none twice
    bodies = -(-n // max_points)
    if misnamed is None:
        assert len(writer.bodies) == bodies + len(bad)  # each bad line: one request more


def test_a_body_of_many_bad_lines_is_bisected_after_a_few_named_ones() -> None:
    """A whole measurement refused (a field type conflict): a few lines are skipped by
    name, then the rest is bisected; no deep recursion. A third of 5,000 lines bad
    takes more requests than the cap allows: the lines left unresolved then are dead
    letters saying so, and every line is delivered once or a dead letter, never both."""
    n, bad = 5000, set(range(0, 5000, 3))
    lines = [f"BAD{i} {line}" if i in bad else line for i, line in enumerate(lines_of(n))]
    clock = FakeClock()
    writer = WholeInflux(clock, bad=_bad_marker)
    rejected = make_sender(writer, clock).send(lines)
    assert len(writer.bodies) == 1 + SPLIT_REQUESTS
    rejected_lines = {i for i, _ in rejected}
    assert len(rejected_lines) == len(rejected)  # each once
    assert bad <= rejected_lines
    assert set(writer.stored) == {line for i, line in enumerate(lines) if i not in rejected_lines}
    assert all(count == 1 for count in writer.stored.values())
    capped = [i for i, reason in rejected if "reached its cap of 1000 requests" in reason]
    assert capped and rejected_lines - set(capped) <= bad  # only the cap takes good lines


def test_bisection_re_sends_are_idempotent_and_survive_transient_faults() -> None:
    clock = FakeClock()
    writer = FakeInflux(
        clock,
        bad=_bad_marker,
        fail=lambda n, _: TransientWriteError("reset") if n % 3 == 0 else None,
    )
    lines = lines_of(16)
    lines[5] = "BAD " + lines[5]
    rejected = make_sender(writer, clock).send(lines)
    assert [i for i, _ in rejected] == [5]
    assert set(writer.stored) == set(lines) - {lines[5]}
    assert clock.sleeps  # the transient faults were retried


def test_every_line_bad() -> None:
    clock = FakeClock()
    writer = FakeInflux(clock, bad=lambda line: "nope")
    assert [i for i, _ in make_sender(writer, clock).send(lines_of(9))] == list(range(9))
    assert writer.stored == {}


def test_empty_input_sends_nothing() -> None:
    clock = FakeClock()
    writer = FakeInflux(clock)
    assert make_sender(writer, clock).send([]) == []
    assert writer.bodies == []


def test_the_retry_policy_comes_from_the_config() -> None:
    clock = FakeClock()
    writer = FakeInflux(clock, fail=lambda _n, _l: TransientWriteError("refused"))
    config = fake_config(deadline_s=7)
    sender = BatchSender(writer, config, sleep=clock.sleep, clock=clock)
    with pytest.raises(TargetUnavailableError, match="7s without progress"):
        sender.send(b"m v=1i 1", 1, lambda: ["m v=1i 1"])
    assert clock.sleeps and max(clock.sleeps) <= config.retry_max_s


# --- send: a body already joined (staged chunks) ----------------------------------


def test_send_sends_the_body_as_it_is() -> None:
    clock = FakeClock()
    influx = FakeInflux(clock)
    lines = lines_of(7)
    asked: list[int] = []

    def split() -> list[str]:
        asked.append(1)
        return lines

    sender = make_sender(influx, clock)
    assert sender.sender.send("\n".join(lines).encode(), len(lines), split) == []
    assert influx.bodies == [lines] and asked == []  # no per-line work on success


def test_send_bisects_a_refused_body() -> None:
    clock = FakeClock()
    lines = lines_of(9)
    lines[4] = "m bad=1 1"
    influx = FakeInflux(clock, bad=lambda x: "bad field" if "bad" in x else None)
    rejected = make_sender(influx, clock).sender.send(
        "\n".join(lines).encode(), len(lines), lambda: lines
    )
    assert rejected == [(4, "partial write: bad field")]
    assert set(influx.stored) == set(lines) - {lines[4]}


def test_send_retries_then_splits_a_body_too_large() -> None:
    clock = FakeClock()
    influx = FakeInflux(
        clock,
        fail=lambda n, _: TransientWriteError("503") if n == 1 else None,
        max_lines=3,
    )
    lines = lines_of(8)
    assert make_sender(influx, clock).sender.send("\n".join(lines).encode(), 8, lambda: lines) == []
    assert set(influx.stored) == set(lines) and len(clock.sleeps) == 1
