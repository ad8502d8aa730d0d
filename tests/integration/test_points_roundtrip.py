"""Lines from PointBuilder, written to a real InfluxDB 1.x and read back intact.

Needs TWOPHASE_TARGET_URL (the 1.x HTTP API). Every test uses its own
database. Besides "what we accept arrives unchanged", the rejection rules are
checked for tightness: text we reject as unrepresentable really does not
survive the trip when written anyway (through influxdb_client.Point).
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from influxdb_client import Point, WritePrecision

from tests.support import Influx, Stored, create_influx_database, drop_influx_database
from twophase.errors import ConfigError, PointError
from twophase.points.builder import (
    MAX_SERIES_KEY_BYTES,
    MAX_TIME_NS,
    MIN_TIME_NS,
    PointBuilder,
    PointSpec,
)


@pytest.fixture
def new_database(influx_v1_url: str) -> Iterator[Any]:
    """A factory of fresh databases, all dropped at the end of the test."""
    created: list[str] = []

    def make() -> Influx:
        name = f"points_{uuid.uuid4().hex[:12]}"
        create_influx_database(influx_v1_url, name)
        created.append(name)
        return Influx(influx_v1_url, name)

    yield make
    for name in created:
        drop_influx_database(influx_v1_url, name)


@pytest.fixture
def influx(new_database: Any) -> Influx:
    database: Influx = new_database()
    return database


@dataclass(frozen=True)
class Case:
    measurement: str
    tags: dict[str, Any]
    fields: dict[str, Any]
    time: Any = None

    def line(self, index: int) -> str:
        """The builder's line; the row's time is its index unless given. Raw line breaks
        in string fields are allowed, as for targets that are all InfluxDB
        (``allow_newlines_in_strings``): these tests show InfluxDB reads them intact."""
        spec = PointSpec(self.measurement, tuple(self.tags), tuple(self.fields), "ts")
        row = {**self.tags, **self.fields, "ts": index if self.time is None else self.time}
        return PointBuilder(spec, allow_newlines=True).line(row)

    def expected(self, stamp: int) -> Stored:
        tags = {key: str(value) for key, value in self.tags.items() if value is not None}
        fields = {key: plain(value) for key, value in self.fields.items()}
        return stamp, tags, fields


def plain(value: Any) -> Any:
    if isinstance(value, Decimal | np.floating):
        return float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


# Text that line protocol treats specially or that often breaks encoders.
AWKWARD_TEXT = [
    "a b",
    "a,b",
    "a=b",
    'a"b',
    "a'b",
    "a\\b",
    "a\\\\b",
    "a\\n",
    "ünï ☃ 𝄞",
    " lead",
    "trail ",
    "=",
    ",",
    '"',
    "x#",
    "e\u0301",
    "\u2028",
    "\x0b\x0c\x1f\x7f\x85",
    "\\x",
    "{}[]()<>|&;$`",
    "😀",
]
TAG_KEY_TEXT = ["#k", "a\\\\ b", "a\\,b", 'a\\"b', "a\\=b", "C:\\dir\\sub", "a\\\\\\b"]
TAG_VALUE_TEXT = [*TAG_KEY_TEXT, "a\\\\ b", 'a\\\\ b\\="c']
FIELD_KEY_TEXT = ["#k", "a\\\\ b", "a\\\\,b", "a\\\\=b", "a\\\\\\\\ b"]
STRING_VALUES = [
    'a"b',
    "a\\",
    "\\",
    "a\\\\",
    'a\\"b',
    "line1\nline2",
    "cr\r\nlf",
    "x\nadmin,host=prod cpu=99 1700000000000000000\n",  # one value to InfluxDB, no point
    "tab\t",
    "",
    " ",
    "#",
    "\x0b\x7f",
    "ünï ☃ 𝄞 😀",
    "x" * 65_535,
    '\\"\\',
    "a\\nb",
]
OTHER_VALUES = [
    2**63 - 1,
    -(2**63),
    0,
    1.0,
    0.1,
    -2.5,
    1e16,
    5e-324,
    1.7976931348623157e308,
    True,
    False,
    Decimal("0.1"),
    np.int64(5),
    np.float32(0.5),
]


def tricky_cases() -> list[Case]:
    cases = [Case(text, {"t": "x"}, {"f": 1}) for text in AWKWARD_TEXT]
    # The tag values hold '\="': it is what exposes a misread tag key (see with_context()).
    cases += [
        Case(f"tagkey{i}", {text: 'v\\="'}, {"f": 1})
        for i, text in enumerate(AWKWARD_TEXT + TAG_KEY_TEXT)
    ]
    cases += [
        Case(f"tagvalue{i}", {"t": text}, {"f": 1})
        for i, text in enumerate(AWKWARD_TEXT + TAG_VALUE_TEXT)
    ]
    cases += [
        Case(f"fieldkey{i}", {"t": "x"}, {text: 1})
        for i, text in enumerate(AWKWARD_TEXT + FIELD_KEY_TEXT)
    ]
    # A field key per value: a query over many measurements gives a key one type.
    cases += [
        Case(f"value{i}", {"t": "x"}, {f"f{i}": value})
        for i, value in enumerate(STRING_VALUES + OTHER_VALUES)
    ]
    cases += [
        Case("edge_min", {}, {"f": 1}, MIN_TIME_NS),
        Case("edge_max", {}, {"f": 1}, MAX_TIME_NS),
        Case("iso_nanos", {}, {"f": 1}, "2024-01-01T01:00:00.000000001+01:00"),
        Case("null_tag", {"t": None, "u": 7}, {"f": 1}),
    ]
    return cases


def test_tricky_keys_and_values_arrive_intact(influx: Influx) -> None:
    cases = tricky_cases()
    lines = [case.line(index) for index, case in enumerate(cases)]
    # One body: string fields holding raw newlines must not split lines.
    status, error = influx.write("\n".join(lines))
    assert status == 204, error
    expected = {
        case.measurement: [case.expected(int(text.rsplit(" ", 1)[1]))]
        for case, text in zip(cases, lines, strict=True)
    }
    assert influx.points() == expected


def test_edges_of_the_time_range_and_series_key_are_influxdb_s(influx: Influx) -> None:
    # The constants are InfluxDB's: one step past them the server refuses the point.
    status, _ = influx.write(f"m f=1 {MAX_TIME_NS + 1}")
    assert status == 400
    status, _ = influx.write(f"m f=1 {MIN_TIME_NS - 1}")
    assert status == 400
    # InfluxDB's key limit counts measurement, tags, 4 and the field key ("f").
    build = PointBuilder(PointSpec("m", ("t",), ("f",), "ts"))
    longest = "é" * ((MAX_SERIES_KEY_BYTES - len("m,t=") - 4 - len("f")) // 2)
    status, error = influx.write(build.line({"t": longest, "f": 1, "ts": 1}))
    assert status == 204, error
    with pytest.raises(PointError, match="series key"):
        build.line({"t": longest + "x", "f": 1, "ts": 2})
    status, error = influx.write(f"m,t={longest}x f=1i 2")
    assert status == 400
    assert "max key length exceeded: 65536 > 65535" in json.loads(error)["error"]
    assert influx.points() == {"m": [(1, {"t": longest}, {"f": 1})]}


def test_clock_stamped_rows_of_one_series_all_arrive(influx: Influx) -> None:
    build = PointBuilder(PointSpec("m", ("t",), ("f",)), clock_ns=lambda: 1_000)  # stuck clock
    lines = list(build.convert({"t": "same", "f": i} for i in range(1_000)))
    status, error = influx.write("\n".join(str(text) for text in lines))
    assert status == 204, error
    stored = influx.points()["m"]
    assert sorted(fields["f"] for _, _, fields in stored) == list(range(1_000))
    assert [stamp for stamp, _, _ in stored] == list(range(1_000, 2_000))


# --- randomised: accepted => intact; rejected as unrepresentable => really is ----------------

WRITABLE = [*"ab Z,=\"'\\#é☃", "𝄞", "\\", "\\", "\\", " ", "\x0b", "\u2028", "\x85"]
# With the characters line protocol cannot carry outside string fields.
ALPHABET = [*WRITABLE, "\n", "\t", "\r"]


def random_case(rnd: random.Random, index: int, alphabet: list[str]) -> Case:
    """Two tags and two fields of random text; keys made distinct by their ends."""

    def text() -> str:
        return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 6)))

    def value() -> Any:
        return rnd.choice([text(), text(), rnd.randint(-(2**63), 2**63 - 1), rnd.random()])

    tags = {text() + "1": text(), text() + "2": text()}
    # Field keys unique to the case: a query over many measurements gives a key one type.
    fields = {f"{text()}{index}a": value(), f"{text()}{index}b": value()}
    return Case(f"{text()}{index}", tags, fields)


def build_or_reason(case: Case, index: int) -> tuple[str | None, str]:
    try:
        return case.line(index), ""
    except (ConfigError, PointError) as error:
        return None, str(error)


def test_random_accepted_points_arrive_intact(influx: Influx) -> None:
    rnd = random.Random(1234)
    accepted: dict[str, list[Stored]] = {}
    lines = []
    for index in range(1_500):
        case = random_case(rnd, index, WRITABLE)
        text, _ = build_or_reason(case, index)
        if text is not None:
            lines.append(text)
            accepted[case.measurement] = [case.expected(index)]
    assert len(lines) > 400
    status, error = influx.write("\n".join(lines))
    assert status == 204, error
    assert influx.points() == accepted


def point_line(case: Case, index: int) -> str:
    """The same point serialised by influxdb_client.Point, with no validation."""
    point = Point(case.measurement)
    for key, value in case.tags.items():
        point.tag(key, value)
    for key, value in case.fields.items():
        point.field(key, value)
    return point.time(index, WritePrecision.NS).to_line_protocol()


UNREPRESENTABLE = ("does not read back unchanged", "cannot carry")
BACKSLASHES = [*'a \\,="', "\\", "\\", "\\"]
# Where a rejection came from, by the start of its reason.
REJECTED_PARTS = {
    "measurement": "measurement: ",
    "tag key": "tags: tag key",
    "tag value": "tag ",
    "field key": "fields: field key",
}


REJECTED_EXAMPLES = [
    *(
        Case(text, {"t": "x"}, {"f": 1})
        for text in [
            "a\\ b",
            "a\\,b",
            "a\\=b",
            'a\\"b',
            "a\\",
            "a\\\\\\ b",
            "a\nb",
            "a\rb",
            "a\tb",
        ]
    ),
    *(
        Case("m", {text: "x"}, {"f": 1})
        for text in [
            "a\\",
            "a\\ b",
            "a\\\\\\ b",
            "a\nb",
            "a\rb",
            "a\tb",
        ]
    ),
    *(
        Case("m", {"t": text}, {"f": 1})
        for text in [
            "a\\",
            "a\\\\",
            "a\\ b",
            "a\\\\\\ b",
            "a\nb",
            "a\rb",
            "a\tb",
        ]
    ),
    *(
        Case("m", {"t": "x"}, {text: 1})
        for text in [
            "a\\",
            'a\\"b',
            "a\\ b",
            "a\\,b",
            "a\\=b",
            "a\\\\\\=b",
            "a\nb",
            "a\rb",
            "a\tb",
        ]
    ),
]


@pytest.mark.filterwarnings("ignore:The measurement name:SyntaxWarning")  # Point on '#...'
@pytest.mark.parametrize("case", REJECTED_EXAMPLES, ids=repr)
def test_each_rejection_rule_is_needed(new_database: Any, case: Case) -> None:
    text, reason = build_or_reason(case, 5)
    assert text is None and any(words in reason for words in UNREPRESENTABLE), reason
    assert not written_intact(new_database(), with_context(case), 5), reason


def written_intact(influx: Influx, case: Case, index: int) -> bool:
    """Whether Point's line for the case, followed by another line, arrives intact."""
    status, _ = influx.write(f"{point_line(case, index)}\nfollower f=1i 1")
    stored = influx.points() if status == 204 else {}
    return stored == {case.measurement: [case.expected(index)], "follower": [(1, {}, {"f": 1})]}


@pytest.mark.filterwarnings("ignore:The measurement name:SyntaxWarning")  # Point on '#...'
@pytest.mark.parametrize("alphabet", [BACKSLASHES, ALPHABET], ids=["backslashes", "controls"])
def test_text_rejected_as_unrepresentable_really_does_not_round_trip(
    new_database: Any, alphabet: list[str]
) -> None:
    # Written anyway, with a second line after it: some text breaks only its own
    # line, some only the lines after it (see with_context()).
    rnd = random.Random(99)
    parts: dict[str, int] = dict.fromkeys(REJECTED_PARTS, 0)
    for index in range(20_000):
        case = random_case(rnd, index, alphabet)
        case = with_context(case)
        text, reason = build_or_reason(case, index)
        if text is not None or not any(words in reason for words in UNREPRESENTABLE):
            continue
        part = next(part for part, start in REJECTED_PARTS.items() if reason.startswith(start))
        if parts[part] == 10:
            continue
        parts[part] += 1
        assert not written_intact(new_database(), case, index), (case, reason)
        if all(count == 10 for count in parts.values()):
            break
    assert parts == dict.fromkeys(REJECTED_PARTS, 10)


def with_context(case: Case) -> Case:
    """The case with '\\="' after its last tag value (in line order).

    Once InfluxDB's line scanner has started the fields too early, that "=" is
    counted and the quote opens a string that swallows the next line. (Not
    after a last backslash, which must stay last; one quote only, as a second
    would close the string again.)
    """
    last = max(case.tags)
    value = case.tags[last]
    if not value.endswith("\\"):
        value += '\\="'
    return Case(case.measurement, {**case.tags, last: value}, case.fields)
