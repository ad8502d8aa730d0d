"""The conformance kit's own parts: points compared as a store holds them, what a
difference says, a target's settings pointed at a closed port, and a kit that loads
without pytest until its checks are asked for."""

from __future__ import annotations

import subprocess
import sys

from twophase.config import TargetConfig
from twophase.testing.support import Case, difference, expected, normalized, unreachable


def test_expected_keeps_each_point_once_its_fields_merged_in_order() -> None:
    lines = ["m,host=a v=1.5 10", "m,host=a w=2i 10", "m,host=a v=3 10", "m,host=b v=1 10"]
    assert expected(lines) == [
        (10, (("host", "a"),), (("v", 3.0), ("w", 2.0))),
        (10, (("host", "b"),), (("v", 1.0),)),
    ]


def test_normalized_drops_empty_tags_and_null_fields_and_keeps_duplicates() -> None:
    series = [
        {"tags": {"host": "a", "dc": ""}, "columns": ["time", "v", "w"], "values": [[10, 1, None]]},
        {"tags": {"host": "a"}, "columns": ["time", "v"], "values": [[10, 1.0]]},
    ]
    point = (10, (("host", "a"),), (("v", 1.0),))
    assert normalized(series) == [point, point]
    assert "held more than once" in difference([point, point], [point])
    assert "missing" in difference([], [point])


def test_the_case_writes_recent_whole_milliseconds_within_its_window() -> None:
    case = Case.new()
    lines = [*case.lines(0, 3), *case.lines(1, 3), case.last(1)]
    times = [point[0] for point in expected(lines)]
    assert len(set(times)) == 7  # no two points of the case share a time
    assert all(t % 1_000_000 == 0 and case.window[0] <= t <= case.window[1] for t in times)


def test_unreachable_keeps_the_user_path_and_query() -> None:
    config = TargetConfig(url="postgresql://me@db.example:5432/points?sslmode=disable")
    down = unreachable(config)
    assert down.url.startswith("postgresql://me@127.0.0.1:")
    assert down.url.endswith("/points?sslmode=disable")
    assert down.retry_deadline_s <= 1


def test_importing_the_kit_needs_no_pytest() -> None:
    probe = "import sys, twophase.testing; print('pytest' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
