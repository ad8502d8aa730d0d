"""Lanes: which lane a staged line takes (stable, per series) and sending lanes side by side."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from twophase.protocol.stage.lanes import LaneChooser, fan_out


def test_a_series_keeps_its_lane_whatever_its_fields_time_and_tag_order() -> None:
    chooser = LaneChooser(4)
    same = [
        "cpu,host=a,zone=eu v=1 1",
        "cpu,host=a,zone=eu v=2,w=3i 2",
        "cpu,zone=eu,host=a v=3",  # the tag order names no other series
        'cpu,host=a,zone=eu s="with spaces, and commas" 4',
    ]
    assert len({chooser.lane(line) for line in same}) == 1
    # another process (a fresh chooser, no cache) chooses the same lane
    assert LaneChooser(4).lane(same[2]) == chooser.lane(same[0])


def test_escaped_spaces_and_commas_belong_to_the_series() -> None:
    chooser = LaneChooser(64)
    one = "m\\ x,host=a\\ b\\,c v=1 1"
    assert chooser.lane(one) == chooser.lane("m\\ x,host=a\\ b\\,c v=2 2")
    lanes = {chooser.lane(f"m,host=a\\ {i} v=1 1") for i in range(200)}
    assert len(lanes) > 32  # the text after an escaped space is part of the series


def test_series_spread_over_the_lanes() -> None:
    chooser = LaneChooser(4)
    counts = Counter(chooser.lane(f"qos,stream=s{i},isp=i{i % 7} v=1 1") for i in range(2000))
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) > 2000 / 4 * 0.8


def test_split_keeps_each_lanes_order_and_one_lane_is_the_list_itself() -> None:
    lines = [f"m,host=h{i % 9} v={i} {i}" for i in range(90)]
    chooser = LaneChooser(3)
    parts = chooser.split(lines)
    assert sorted(line for part in parts for line in part) == sorted(lines)
    for lane, part in enumerate(parts):
        assert part == [line for line in lines if chooser.lane(line) == lane]
    assert LaneChooser(1).split(lines) == [lines]


def test_lanes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        LaneChooser(0)


def test_fan_out_keeps_order_within_each_lane_and_runs_lanes_at_once() -> None:
    got: dict[int, list[int]] = {}
    running, peak, lock = [0], [0], threading.Lock()

    def send(lane: int, items: Iterator[int]) -> None:
        out = got.setdefault(lane, [])
        for item in items:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.002)
            out.append(item)
            with lock:
                running[0] -= 1

    fan_out(range(200), lambda i: i % 4, 4, send)
    assert {lane: items for lane, items in got.items()} == {
        lane: list(range(lane, 200, 4)) for lane in range(4)
    }
    assert peak[0] > 1


def test_a_failing_lane_stops_the_others_and_its_error_is_raised() -> None:
    taken: list[int] = []

    def send(lane: int, items: Iterator[int]) -> None:
        for item in items:
            if lane == 1 and item >= 5:
                raise RuntimeError("lane 1 failed")
            taken.append(item)
            time.sleep(0.001)

    with pytest.raises(RuntimeError, match="lane 1 failed"):
        fan_out(range(10_000), lambda i: i % 2, 2, send)
    assert len(taken) < 1000  # the other lane and the reading stopped early


def test_a_failing_read_stops_every_lane() -> None:
    def items() -> Iterator[int]:
        yield from range(10)
        raise OSError("read failed")

    ended: list[int] = []

    def send(lane: int, lane_items: Iterator[int]) -> None:
        for _ in lane_items:
            pass
        ended.append(lane)

    with pytest.raises(OSError, match="read failed"):
        fan_out(items(), lambda i: i % 3, 3, send)
    assert sorted(ended) == [0, 1, 2]  # every lane thread ended
