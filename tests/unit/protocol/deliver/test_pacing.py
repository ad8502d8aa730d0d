"""TokenBucket and counted: the pace of a catch-up, against a fake clock."""

from __future__ import annotations

import threading

import pytest

from tests.fakes import FakeClock
from twophase.protocol.deliver.pacing import TokenBucket, counted


def bucket(clock: FakeClock, rate: float = 1000.0, burst_s: float = 0.0) -> TokenBucket:
    return TokenBucket(rate, burst_s=burst_s, clock=clock, sleep=clock.sleep)


def test_the_first_request_goes_at_once_and_the_next_waits_off_its_points() -> None:
    clock = FakeClock()
    pace = bucket(clock)
    assert pace.wait() == 0.0
    pace.take(500)  # 500 points at 1,000 points/s: half a second owed
    assert pace.delay() == pytest.approx(0.5)
    assert pace.wait() == pytest.approx(0.5)
    assert pace.delay() == 0.0


def test_points_sent_keep_to_the_rate_over_many_requests() -> None:
    clock = FakeClock()
    pace = bucket(clock, rate=5000.0)
    began = clock()
    for _ in range(40):  # 40 requests of 250 points: 10,000 points
        pace.wait()
        pace.take(250)
    pace.wait()  # the last request's debt too
    assert clock() - began == pytest.approx(10_000 / 5000.0)


def test_time_passing_pays_the_debt_without_a_wait() -> None:
    clock = FakeClock()
    pace = bucket(clock)
    pace.take(2000)
    clock.now += 1.5
    assert pace.delay() == pytest.approx(0.5)
    clock.now += 0.5
    assert pace.wait() == 0.0
    assert clock.sleeps == []


def test_nothing_is_saved_up_while_idle_beyond_the_burst() -> None:
    clock = FakeClock()
    strict = bucket(clock)
    saving = TokenBucket(1000.0, clock=clock, sleep=clock.sleep)  # the default: 1 s
    clock.now += 3600.0  # an idle hour
    for pace in (strict, saving):
        pace.take(1500)
    assert strict.delay() == pytest.approx(1.5)  # nothing saved: the rate from the start
    assert saving.delay() == pytest.approx(0.5)  # one second's worth saved, no more


def test_a_catch_up_that_starts_forgets_what_was_saved_but_not_what_is_owed() -> None:
    clock = FakeClock()
    pace = TokenBucket(1000.0, clock=clock, sleep=clock.sleep)
    clock.now += 10.0
    pace.start()
    pace.take(500)
    assert pace.delay() == pytest.approx(0.5)  # the second saved while idle: forgotten
    pace.start()
    assert pace.delay() == pytest.approx(0.5)  # the debt: kept


def test_the_time_a_request_takes_counts_towards_the_next() -> None:
    clock = FakeClock()
    pace = TokenBucket(1000.0, clock=clock, sleep=clock.sleep)
    pace.wait()
    clock.now += 0.2  # the request on the wire
    pace.take(500)
    assert pace.delay() == pytest.approx(0.3)  # 500 points take 0.5 s, 0.2 s of it spent


def test_a_wait_sleeps_in_slices_and_stops_when_between_raises() -> None:
    clock = FakeClock()
    pace = bucket(clock, rate=100.0)
    pace.take(100)  # one second owed
    looks: list[float] = []

    def between() -> None:
        looks.append(clock())
        if len(looks) == 3:
            raise RuntimeError("closed")

    with pytest.raises(RuntimeError, match="closed"):
        pace.wait(between)
    assert len(looks) == 3 and max(clock.sleeps) <= 0.1  # looked at often, stopped early
    assert pace.delay() == pytest.approx(0.8)


def test_counted_pays_what_each_running_count_adds_and_a_send_started_over() -> None:
    clock = FakeClock()
    pace = bucket(clock)
    paid = counted(pace)
    paid(300)
    paid(700)  # a second request of 400
    assert pace.delay() == pytest.approx(0.7)
    paid(200)  # the send started over (a staging outage): 200 sent again
    assert pace.delay() == pytest.approx(0.9)


def test_lanes_share_a_bucket_without_losing_a_payment() -> None:
    clock = FakeClock()
    pace = bucket(clock, rate=1_000_000.0)

    def lane() -> None:
        for _ in range(1000):
            pace.take(1)

    threads = [threading.Thread(target=lane) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pace.delay() == pytest.approx(4000 / 1_000_000.0)


@pytest.mark.parametrize(("rate", "burst_s"), [(0.0, 0.0), (-1.0, 0.0), (10.0, -1.0)])
def test_a_rate_that_paces_nothing_is_refused(rate: float, burst_s: float) -> None:
    with pytest.raises(ValueError, match=r"rate|burst"):
        TokenBucket(rate, burst_s=burst_s)
