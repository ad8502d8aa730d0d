"""The line-protocol parser verify uses, against hand-written lines and the serialisers."""

from __future__ import annotations

import random
import string

import pytest
from influxdb_client import Point

from twophase.errors import LineProtocolError
from twophase.points.builder import PointBuilder, PointSpec
from twophase.points.lineproto import ParsedPoint, parse_line


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("m v=1 10", ParsedPoint("m", (), {"v": 1.0}, 10)),
        (
            "m,b=2,a=1 v=1i,w=-3.5e-7 -5",
            ParsedPoint("m", (("a", "1"), ("b", "2")), {"v": 1, "w": -3.5e-7}, -5),
        ),
        (
            "m f=t,g=FALSE,h=True,u=7u",
            ParsedPoint("m", (), {"f": True, "g": False, "h": True, "u": 7}, None),
        ),
        (
            r"m\ x\,y,k\ 1=v\,\=\ w f\=x=1 1",
            ParsedPoint("m x,y", (("k 1", "v,= w"),), {"f=x": 1.0}, 1),
        ),
        ('m s="a \\"q\\" b\\\\c, d=e" 3', ParsedPoint("m", (), {"s": 'a "q" b\\c, d=e'}, 3)),
        ('m s="two\nlines",v=2 4', ParsedPoint("m", (), {"s": "two\nlines", "v": 2.0}, 4)),
        (r"m\n,t=a\tb v=1 5", ParsedPoint("m\\n", (("t", "a\\tb"),), {"v": 1.0}, 5)),
        ('m s="" 6', ParsedPoint("m", (), {"s": ""}, 6)),
        ("m,t=x=y v=1 7", ParsedPoint("m", (("t", "x=y"),), {"v": 1.0}, 7)),
    ],
)
def test_parse(line: str, expected: ParsedPoint) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("", "no measurement"),
        ("m", "no fields"),
        ("m,t v=1", "has no value"),
        ("m v 1", "key=value"),
        ("m v=abc 1", "bad field value"),
        ('m s="open 1', "unterminated"),
        ('m s="x"y 1', "text after the string"),
        ("m v=1 12ab", "bad timestamp"),
    ],
)
def test_malformed_lines(line: str, problem: str) -> None:
    with pytest.raises(LineProtocolError, match=problem):
        parse_line(line)


_ALPHABET = string.ascii_letters + string.digits + " ,=\"\\'é€😀"


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 8)))


def _key(rng: random.Random) -> str:
    # what points.py accepts as a key: no trailing backslash, no backslash before escapes
    return "k" + _text(rng).replace("\\", "") + "x"


@pytest.mark.parametrize("seed", range(20))
def test_round_trip_with_influxdb_client_serialisation(seed: int) -> None:
    rng = random.Random(seed)
    tags = {_key(rng): _text(rng).replace("\\", "") + "t" for _ in range(rng.randint(0, 3))}
    fields: dict[str, object] = {}
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(("float", "int", "bool", "str"))
        value = {
            "float": rng.uniform(-1e9, 1e9),
            "int": rng.randint(-(2**63), 2**63 - 1),
            "bool": rng.random() < 0.5,
            "str": _text(rng) + "\n" + _text(rng),
        }[kind]
        fields[_key(rng)] = value
    measurement = "m" + _text(rng).replace("\\", "")
    point = Point(measurement)
    for key, tag in tags.items():
        point = point.tag(key, tag)
    for key, value in fields.items():
        point = point.field(key, value)
    point = point.time(1_700_000_000_123_456_789)
    parsed = parse_line(point.to_line_protocol())
    assert parsed.measurement == measurement
    assert parsed.tags == tuple(sorted(tags.items()))
    assert parsed.fields == fields
    assert parsed.time_ns == 1_700_000_000_123_456_789


def test_round_trip_with_the_staging_point_builder() -> None:
    builder = PointBuilder(PointSpec("cpu load", tag_columns=("host, dc",), time_column="t"))
    row = {"host, dc": "a=b c", "t": 5, "usage": 0.25, "n": 3, "ok": True, "note": 'say "hi"\\'}
    parsed = parse_line(builder.line(row))
    assert parsed == ParsedPoint(
        "cpu load",
        (("host, dc", "a=b c"),),
        {"n": 3, "note": 'say "hi"\\', "ok": True, "usage": 0.25},
        5,
    )
