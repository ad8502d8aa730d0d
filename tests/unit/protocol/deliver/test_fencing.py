"""A promotion's fencing check with a fake ledger and InfluxDB: one read of the lease
before every request and every retry, in every lane, and nothing sent once fenced (the
real servers, a zombie and a new run: tests/integration/test_fencing.py)."""

from __future__ import annotations

import pytest

from tests.fakes import FakeClock, FakeInflux, FakeLedger, FakeReader, lines_of, make_sender, staged
from twophase.config import TargetConfig
from twophase.errors import FencedError, TargetUnavailableError
from twophase.model import Lease
from twophase.protocol.deliver.delivery import TargetDelivery
from twophase.protocol.ledger.epoch_ledger import Ledger

LEASE = Lease("s", "r1", "q1", 1)


def deliver(
    reader: FakeReader, ledger: FakeLedger, influx: FakeInflux, clock: FakeClock, lanes: int = 1
) -> tuple[int, int]:
    """The ledger's plan delivered under the lease's watch (as a promotion does), in
    requests of at most 10 points."""
    sender = make_sender(influx, clock).sender
    config = TargetConfig(url="http://fake", batch_points=10, batch_bytes=1 << 20)
    delivery = TargetDelivery("t", reader, (sender, sender), reader, config, lanes)  # type: ignore[arg-type]
    return delivery.deliver(ledger.plan, Ledger.watch(ledger, LEASE))  # type: ignore[arg-type]


def test_the_sender_runs_the_check_before_every_attempt_and_retry() -> None:
    clock = FakeClock()
    influx = FakeInflux(clock, fail=lambda n, _: TargetUnavailableError("down") if n < 3 else None)
    calls: list[int] = []
    sender = make_sender(influx, clock).sender
    sender.send(b"m v=1 1", 1, lambda: ["m v=1 1"], before_attempt=lambda: calls.append(1))
    assert len(influx.bodies) == 3 and len(calls) == 3  # two retries after their waits


def test_a_check_that_raises_before_a_retry_stops_the_send() -> None:
    clock = FakeClock()
    influx = FakeInflux(clock, fail=lambda _n, _l: TargetUnavailableError("down"))
    checks = iter([None])  # the first attempt's check passes, the retry's is fenced

    def check() -> None:
        if next(checks, "fenced") == "fenced":
            raise FencedError("fenced")

    sender = make_sender(influx, clock).sender
    with pytest.raises(FencedError):
        sender.send(b"m v=1 1", 1, lambda: ["m v=1 1"], before_attempt=check)
    assert len(influx.bodies) == 1 and len(clock.sleeps) == 1


def test_each_part_of_a_split_request_is_checked() -> None:
    clock = FakeClock()
    influx = FakeInflux(clock, max_lines=2)
    lines = lines_of(4)
    calls: list[int] = []
    make_sender(influx, clock).sender.send(
        "\n".join(lines).encode(), 4, lambda: lines, before_attempt=lambda: calls.append(1)
    )
    assert len(calls) == len(influx.bodies) == 3  # the whole body, then its two halves


@pytest.mark.parametrize("holds", [0, 1, 3])
def test_inline_promotion_stops_before_its_next_request_once_fenced(holds: int) -> None:
    plan, reader = staged([lines_of(60)], chunk_points=10)
    clock = FakeClock()
    influx = FakeInflux(clock)
    ledger = FakeLedger(plan, holds)
    with pytest.raises(FencedError):
        deliver(reader, ledger, influx, clock)
    assert len(influx.bodies) == holds  # one check per request; none sent after the fencing
    assert ledger.checks == holds + 1


def test_a_retry_after_the_fencing_is_not_sent() -> None:
    plan, reader = staged([lines_of(5)], chunk_points=10)
    clock = FakeClock()
    influx = FakeInflux(clock, fail=lambda _n, _l: TargetUnavailableError("connection reset"))
    ledger = FakeLedger(plan, holds=1)  # fenced while the first attempt failed
    with pytest.raises(FencedError):
        deliver(reader, ledger, influx, clock)
    assert len(influx.bodies) == 1


@pytest.mark.parametrize("holds", [0, 2, 7])
def test_every_lane_checks_before_each_request_and_stops_once_fenced(holds: int) -> None:
    """Four lanes share one check: every request sent had a read of its own that passed,
    and once a read saw the fencing no lane reads or sends again."""
    plan, reader = staged([[f"m,s={i % 16} v={i}i {i}" for i in range(400)]], 25, lanes=4)
    clock = FakeClock()
    influx = FakeInflux(clock)
    ledger = FakeLedger(plan, holds)
    with pytest.raises(FencedError):
        deliver(reader, ledger, influx, clock, lanes=4)
    assert len(influx.bodies) == ledger.passed == holds
    assert ledger.checks <= holds + 4  # at most one fenced read per lane, racing the first
    assert ledger.marked == []


def test_a_promotion_that_is_not_fenced_reads_the_lease_once_per_request() -> None:
    plan, reader = staged([lines_of(60)], chunk_points=10)
    clock = FakeClock()
    influx = FakeInflux(clock)
    ledger = FakeLedger(plan, holds=1000)
    assert deliver(reader, ledger, influx, clock) == (60, 0)
    assert ledger.checks == len(influx.bodies) == 6
