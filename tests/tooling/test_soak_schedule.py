"""The soak's fault schedule: seeded, every kind at least once, overlapping, in order."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from tests.soak.schedule import (
    DEADLINE_S,
    KINDS,
    OUTAGES,
    PER_SINK,
    describe,
    make_schedule,
)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert make_schedule(7, 24, 300, 4) == make_schedule(7, 24, 300, 4)
    assert make_schedule(7, 24, 300, 4) != make_schedule(8, 24, 300, 4)


def test_every_kind_comes_once_before_any_repeats() -> None:
    schedule = make_schedule(11, len(KINDS), 100, 4)
    assert Counter(f.kind for f in schedule) == Counter(KINDS)
    assert len({f.kind for f in make_schedule(11, 24, 100, 4)}) == len(KINDS)


def test_faults_are_in_time_order_within_the_span_and_overlap() -> None:
    schedule = make_schedule(3, 40, 120, 4)
    times = [f.at_s for f in schedule]
    assert times == sorted(times) and times[0] >= 0 and times[-1] <= 120
    overlapping = [(a, b) for a, b in pairwise(schedule) if b.at_s < a.at_s + a.duration_s]
    assert overlapping  # outages run into the next fault


def test_per_sink_faults_name_a_sink_and_server_faults_none() -> None:
    for fault in make_schedule(5, 30, 100, 4):
        assert (fault.sink is not None) == (fault.kind in PER_SINK)
        assert fault.sink is None or 0 <= fault.sink < 4


def test_some_outages_outlast_the_retry_deadlines_and_the_rest_are_ridden_out() -> None:
    schedule = make_schedule(11, 24, 400, 4)
    outages = [f for f in schedule if f.kind in OUTAGES]
    long = [f for f in outages if f.duration_s > DEADLINE_S]
    assert len(long) == max(1, round(len(outages) / 5))
    assert all(f.duration_s < DEADLINE_S for f in outages if f not in long)
    assert all(f.duration_s == 0 for f in schedule if f.kind not in OUTAGES)
    assert "outlasts the retry deadlines" in long[0].describe()
    chosen = make_schedule(11, 24, 400, 4, long_outages=3)
    assert sum(f.duration_s > DEADLINE_S for f in chosen) == 3
    assert not any(f.duration_s > DEADLINE_S for f in make_schedule(11, 24, 400, 4, 0))


def test_the_description_names_the_seed_and_every_fault() -> None:
    schedule = make_schedule(9, 10, 60, 2)
    text = describe(9, schedule)
    assert "seed 9: 10 faults" in text and text.count("\n") == 10


def test_nonsense_is_refused() -> None:
    with pytest.raises(ValueError):
        make_schedule(1, 5, 0, 4)
