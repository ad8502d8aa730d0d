"""A body loaded streamed (``twophase.postgresql.streamed``: its lines turned into COPY
rows by one pattern, PostgreSQL parsing the values) leaves the same rows as the same
body read point by point, or is read point by point: for every time, value and tag the
pattern takes, and for the bodies it leaves (another shape, a value PostgreSQL refuses,
a point written twice)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support import postgresql_target
from twophase.config import TargetConfig
from twophase.errors import BadPointsError
from twophase.postgresql import PostgresWriter, streamed

STAMPS = [
    0,
    1,
    -1,
    999,
    1000,
    1001,
    -999,
    -1000,
    -1001,
    1_700_000_000_123_456_789,
    -1_700_000_000_123_456_789,
    9_223_372_036_854_775_807,
    -9_223_372_036_854_775_000,
]
FLOATS = ["1.5", "-0.0", "0", "1e10", "1E-5", ".5", "5.", "-123456789.123456789e-3", "0.1"]
INTS = ["-5i", "9223372036854775807i", "0u", "007i", "-9223372036854775808i"]
BOOLS = ["t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE"]
# Tag and string values as line protocol escapes them, and unescaped characters.
HOSTS = ["a", "", "b-é.x", "a:b/c", "a\\ b", "x\\,y", "k\\=v", '"quoted"', "ü\\ \\,\\="]
TEXTS = ['""', '"x y"', '"say \\"hi\\""', '"back\\\\slash"', '"a,b c=d é"', '"\\\\\\""']


def _plain(measurement: str) -> bytes:
    """Lines of one shape: every time, value and tag value the pattern takes."""
    lines = []
    for i, stamp in enumerate(STAMPS):
        value, count, ok = FLOATS[i % len(FLOATS)], INTS[i % len(INTS)], BOOLS[i % len(BOOLS)]
        host = HOSTS[i] if i < len(HOSTS) else f"h{i}"  # no two rows alike
        text = TEXTS[i % len(TEXTS)]
        lines.append(f"{measurement},host={host} v={value},n={count},ok={ok},s={text} {stamp}")
    return "\n".join(lines).encode()


# Bodies the pattern leaves, each with the reason.
LEFT = {
    "two shapes": b"{m},host=a v=1.5 10\n{m},host=a v=2.5,n=1i 20",
    "a float out of float8's range": b"{m},host=a v=1e400 30",
    "a float float8 reads as zero": b"{m},host=a v=1e-400 40",
    "a point written twice": b"{m},host=a v=1.5 50\n{m},host=a v=2.5 50",
    "a backslash escaping nothing in a string": b'{m},host=a v=1.5,s="a\\nb" 60',
    "a backslash escaping nothing in a tag": b"{m},host=a\\b v=1.5 70",
    "a string into a number's column": b'{m},host=a v="1.5" 75',
    "no timestamp": b"{m},host=a v=1.5",
    "a timestamp out of int64": b"{m},host=a v=1.5 99999999999999999999",
    "an int out of bigint": b"{m},host=a n=9223372036854775808i 80",
    "a blank line": b"{m},host=a v=1.5 90\n\n{m},host=a v=2.5 91",
}


@pytest.fixture
def target(base_staging_url: str) -> Iterator[tuple[TargetConfig, str]]:
    with postgresql_target(base_staging_url, "tp_streamed") as made:
        yield made


def _write(writer: PostgresWriter, epoch: int, body: bytes) -> str | None:
    """The body in an epoch of its own; the refusal's reason when it is refused."""
    assert writer.begin("s", epoch, "t") is None
    try:
        writer.write(body)
    except BadPointsError as exc:
        writer.rollback()
        return exc.reason
    writer.commit(1, 0)
    return None


def _rows(admin: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin) as conn:
        return conn.execute(
            f'SELECT time, host, region, v, n, ok, s FROM "{table}" ORDER BY 1, 2'  # noqa: S608
        ).fetchall()


def _both(
    config: TargetConfig, monkeypatch: pytest.MonkeyPatch, bodies: list[bytes]
) -> tuple[list[str | None], list[str | None], int]:
    """Each body written streamed to ``fast`` and point by point to ``slow``: the
    outcomes of each, and how many bodies went streamed."""
    loads: list[int] = []
    load = streamed.load

    def counted(*args: Any) -> None:
        load(*args)
        loads.append(1)

    monkeypatch.setattr(streamed, "load", counted)
    writer = PostgresWriter(config)
    shape = b'host=z,region=z v=0.5,n=1i,ok=t,s="z" 5'
    setup = b"fast," + shape + b"\nslow," + shape
    writer.write(setup)  # both tables, with both tags
    fast = [_write(writer, i, body.replace(b"{m}", b"fast")) for i, body in enumerate(bodies)]
    monkeypatch.setattr(streamed, "first_keys", lambda text: None)
    base = len(bodies)
    slow = [
        _write(writer, base + i, body.replace(b"{m}", b"slow")) for i, body in enumerate(bodies)
    ]
    writer.close()
    return fast, slow, len(loads)


def test_a_plain_body_goes_streamed_and_leaves_the_rows_read_point_by_point_would(
    target: tuple[TargetConfig, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, admin = target
    fast, slow, loaded = _both(config, monkeypatch, [_plain("{m}")])
    assert fast == slow == [None]
    assert loaded == 1
    assert _rows(admin, "fast") == _rows(admin, "slow")
    assert len(_rows(admin, "fast")) == len(STAMPS) + 1


def test_bodies_the_pattern_leaves_are_read_point_by_point(
    target: tuple[TargetConfig, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, admin = target
    fast, slow, loaded = _both(config, monkeypatch, list(LEFT.values()))
    assert fast == slow
    assert loaded == 0  # none was loaded streamed to the end
    assert _rows(admin, "fast") == _rows(admin, "slow")
    assert len(_rows(admin, "fast")) > 3
