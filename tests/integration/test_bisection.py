"""Taking a refused request apart against the real InfluxDB 1.x: what it answers and
writes, and what that costs in requests.

Measured on 1.6.7: a body whose points all conflict with the field's type is refused
with "partial write: field type conflict: ... dropped=N", N its line count, and
nothing written; a body none of whose lines parse with "unable to parse '...'" once
per line (no "partial write"), nothing written; a body with some bad lines is a
partial write: the good lines are written, "dropped=N" counts the refused points it
parsed, and the lines it could not parse are not counted (nor named, once points
were dropped too). So a body every line of which was refused costs one request,
whatever its size, and bisection is left for bodies with good lines.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import influx_count
from twophase.config import TargetConfig
from twophase.errors import BadPointsError
from twophase.influx.writers import V1Writer
from twophase.targets import sender as sender_module
from twophase.targets.sender import SPLIT_REQUESTS, BatchSender

BASE = 1_700_000_000_000_000_000


class Counting:
    """A real writer whose requests are counted."""

    def __init__(self, config: TargetConfig) -> None:
        self._writer = V1Writer(config)
        self.requests = 0

    def write(self, body: bytes, gzipped: bool = False) -> None:
        self.requests += 1
        self._writer.write(body, gzipped)

    def read(self, statement: str) -> Any:
        return self._writer.read(statement)

    def close(self) -> None:
        self._writer.close()


@pytest.fixture
def writer(influx: TargetConfig) -> Any:
    counting = Counting(influx)
    counting.write(f"typed v=1i {BASE}".encode())  # field v of "typed" is an integer
    counting.requests = 0
    yield counting
    counting.close()


def send(writer: Counting, influx: TargetConfig, lines: list[str]) -> list[tuple[int, str]]:
    return BatchSender(writer, influx).send("\n".join(lines).encode(), len(lines), lambda: lines)


def conflicting(n: int, start: int = 1) -> list[str]:
    return [f"typed,n={i} v={i}.5 {BASE + i}" for i in range(start, start + n)]


def test_influx_1x_says_how_many_points_it_dropped(influx: TargetConfig, writer: Counting) -> None:
    with pytest.raises(BadPointsError) as all_bad:
        writer.write("\n".join(conflicting(7)).encode())
    assert (all_bad.value.dropped, all_bad.value.every_line) == (7, False)
    assert "partial write: field type conflict" in all_bad.value.reason
    with pytest.raises(BadPointsError) as none_parsed:
        writer.write(b"garbage\nm,s=b v= 10\nfoo bar baz")
    assert (none_parsed.value.dropped, none_parsed.value.every_line) == (None, True)
    mixed = ["typed,n=a v=2i 5", "bad line", *conflicting(2, 100), "typed,n=b v=3i 6"]
    with pytest.raises(BadPointsError) as partial:
        writer.write("\n".join(mixed).encode())
    # two points dropped; the unparsed line is neither counted nor named
    assert (partial.value.dropped, partial.value.every_line) == (2, False)
    assert "unable to parse" not in partial.value.reason
    assert influx_count(influx, "typed") == 3  # the first point, and the two good ones


@pytest.mark.parametrize("n", [1, 300, 5000])
def test_a_body_of_points_all_refused_costs_one_request(
    influx: TargetConfig, writer: Counting, n: int
) -> None:
    rejected = send(writer, influx, conflicting(n))
    assert writer.requests == 1
    assert [i for i, _ in rejected] == list(range(n))
    assert all("field type conflict" in reason for _, reason in rejected)
    assert influx_count(influx, "typed") == 1


def test_a_body_of_lines_none_parsed_costs_one_request(
    influx: TargetConfig, writer: Counting
) -> None:
    lines = [f"unparsed,n={i} v= {i}" for i in range(2000)]
    rejected = send(writer, influx, lines)
    assert writer.requests == 1 and len(rejected) == 2000
    assert rejected[0][1].startswith("unable to parse 'unparsed,n=0 v= 0'")


def test_a_body_with_scattered_bad_lines_is_bisected_under_the_cap(
    influx: TargetConfig, writer: Counting
) -> None:
    """5,000 lines, 50 of them scattered type conflicts: each isolated, every good line
    written, in far fewer requests than the cap."""
    bad = set(range(37, 5000, 100))
    lines = [
        f"typed,n={i} v={i}.5 {BASE + i}" if i in bad else f"typed,n={i} v={i}i {BASE + i}"
        for i in range(5000)
    ]
    rejected = send(writer, influx, lines)
    assert sorted(i for i, _ in rejected) == sorted(bad)
    assert influx_count(influx, "typed") == 1 + 5000 - len(bad)
    # about 2 b log2(n / b) = 664 for b = 50 bad lines of n = 5,000; the same every time
    assert writer.requests == 759 < SPLIT_REQUESTS


def test_past_the_cap_the_unresolved_lines_are_dead_letters_saying_so(
    influx: TargetConfig, writer: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every third line bad, and a cap of 30 requests: nothing lost (every line is
    delivered or a dead letter), nothing twice, and the good lines among the ones left
    unresolved are in InfluxDB already (1.x wrote them with the first refusal)."""
    monkeypatch.setattr(sender_module, "SPLIT_REQUESTS", 30)
    bad = set(range(0, 600, 3))
    lines = [
        f"typed,n={i} v={i}.5 {BASE + i}" if i in bad else f"typed,n={i} v={i}i {BASE + i}"
        for i in range(600)
    ]
    rejected = send(writer, influx, lines)
    assert writer.requests == 1 + 30
    indexes = [i for i, _ in rejected]
    assert len(indexes) == len(set(indexes)) and bad <= set(indexes)
    capped = {i for i, reason in rejected if "reached its cap of 30 requests" in reason}
    assert capped and set(indexes) - capped <= bad  # only the cap takes good lines
    assert influx_count(influx, "typed") == 1 + 600 - len(bad)  # every good line written
