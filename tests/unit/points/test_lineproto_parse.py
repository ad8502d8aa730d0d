"""The parser's two readings of a line agree: a line read plainly (split at its
spaces, commas and equals signs) gives the point the character scanner gives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twophase.errors import LineProtocolError
from twophase.points.lineproto import _parse_plain, _parse_scanned, parse_line

pytestmark = pytest.mark.unit

# The characters that matter to the cut (no backslash, no quote: the plain reading's
# domain), and a few that do not.
_TEXT = st.text(alphabet=" ,=abtfiu0123456789.-eE+_\t\r", max_size=40)
_NAME = st.text(alphabet="abc=_-.\t", min_size=0, max_size=4)
_VALUE = st.sampled_from(["1", "-2.5", "3i", "4u", "t", "false", "1e3", "", "x", "1i2", "nan"])


@st.composite
def lines(draw: st.DrawFn) -> str:
    """Lines that are mostly well formed, with the cuts moved about."""
    measurement = draw(_NAME)
    tags = "".join(f",{draw(_NAME)}={draw(_NAME)}" for _ in range(draw(st.integers(0, 3))))
    fields = ",".join(f"{draw(_NAME)}={draw(_VALUE)}" for _ in range(draw(st.integers(0, 3))))
    stamp = draw(st.sampled_from(["", " 1700000000000000000", " -5", " 1_0", " x", "  7"]))
    return f"{measurement}{tags} {fields}{stamp}"


def _scanned(line: str) -> object:
    try:
        return _parse_scanned(line)
    except LineProtocolError:
        return None


@settings(max_examples=2000)
@given(st.one_of(lines(), _TEXT))
def test_a_line_read_plainly_is_the_point_the_scanner_reads(line: str) -> None:
    plain = _parse_plain(line)
    if plain is not None:
        assert repr(plain) == repr(_scanned(line)), line  # repr: nan is not nan
    # Either way, the parser's answer is the scanner's.
    try:
        assert repr(parse_line(line)) == repr(_parse_scanned(line))
    except LineProtocolError:
        with pytest.raises(LineProtocolError):
            _parse_scanned(line)


def test_a_usual_line_is_read_plainly() -> None:
    line = "cpu,host=a,region=eu usage=0.5,count=3i,up=true 1700000000000000000"
    assert _parse_plain(line) == _parse_scanned(line)
    assert parse_line('cpu,host=a note="x y" 1').fields == {"note": "x y"}  # scanned
