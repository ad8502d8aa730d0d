"""Staged chunks and the promoter's send loop over them, with a fake reader and InfluxDB.

The promoter's request layout (chunks coalesced up to the batch limits,
oversized chunks cut), its dead-letter addressing (seq = first_seq + offset)
and its I1 checksums are pure logic; the integration tests run the same
paths against PostgreSQL and InfluxDB.
"""

from __future__ import annotations

import gzip
import random
import zlib

import pytest

from tests.fakes import FakeClock, FakeInflux, FakeReader, lines_of, make_sender, staged
from twophase import model
from twophase.config import TargetConfig
from twophase.errors import PermanentError
from twophase.model import LineChecksum, StagedChunk
from twophase.protocol.deliver.delivery import TargetDelivery
from twophase.protocol.stage.lanes import LaneChooser

# --- StagedChunk ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "lines",
    [["a"], ["m v=1", "m v=2"], ["", "x"], ['é,t=ü v="ß"', "tab\there", "back\\slash"]],
)
def test_chunk_gives_back_each_line(lines: list[str]) -> None:
    chunk = StagedChunk.of_lines("w", 7, lines).check()
    assert chunk.points == len(lines)
    assert chunk.lines() == lines
    assert [chunk.line(i) for i in range(len(lines))] == lines
    assert chunk.lines(1) == lines[1:]
    assert chunk.body == "\n".join(lines)


def test_joined_checksum_equals_line_by_line() -> None:
    lines = [*lines_of(17), "ünïcode v=1"]
    one, joined = LineChecksum(), LineChecksum()
    for line in lines:
        one.add(line)
    joined.add_joined("\n".join(lines[:5]).encode())
    joined.add_joined("\n".join(lines[5:]).encode())
    assert one.hexdigest() == joined.hexdigest()


def test_a_line_holding_a_newline_keeps_its_bounds() -> None:
    plain = StagedChunk.of_lines("w", 0, ["a", "b"])
    assert plain.ends is None  # the body's newlines are the bounds
    odd = StagedChunk.of_lines("w", 0, ['m s="x\ny"', "b", ""]).check()
    assert odd.ends == [10, 12, 13]
    assert odd.lines() == ['m s="x\ny"', "b", ""] and odd.line(1) == "b"


@pytest.mark.parametrize(
    ("points", "ends", "body"),
    [
        (0, None, ""),  # no line at all
        (2, None, "abcd"),  # one newline short
        (1, None, "a\nb"),  # one newline too many
        (1, [3], "abcd"),  # ends past the body
        (2, [2, 5], "a\nbcd"),
        (1, [2, 5], "a\nbcd"),  # ends and points disagree
    ],
)
def test_chunk_whose_lines_do_not_fit_its_body_is_refused(
    points: int, ends: list[int] | None, body: str
) -> None:
    with pytest.raises(PermanentError, match="damaged"):
        StagedChunk("w", 0, points, ends, body).check()


@pytest.mark.parametrize(
    "lines",
    [["a"], ["m v=1", "m v=2"], ["", "x"], ['é,t=ü v="ß"', "tab\there"], ['m s="x\ny"', "b"]],
)
def test_a_compressed_chunk_is_one_gzip_member_of_its_lines_and_a_last_newline(
    lines: list[str],
) -> None:
    chunk = StagedChunk.of_lines("w", 7, lines, compressed=True).check()
    assert chunk.body is None and chunk.compressed
    text = "\n".join(lines)
    assert gzip.decompress(chunk.stored) == (text + "\n").encode()
    assert chunk.size == len(text.encode())  # from the member's trailer
    assert chunk.lines() == lines and chunk.text == text
    assert StagedChunk.of_lines("w", 7, lines, compressed=True).stored == chunk.stored  # no time


def test_members_end_to_end_are_one_stream_of_the_chunks_lines() -> None:
    parts = [["a v=1 1", "b v=2 2"], ["c v=3 3"]]
    members = [StagedChunk.of_lines("w", 0, p, compressed=True).stored for p in parts]
    assert gzip.decompress(b"".join(members)) == b"a v=1 1\nb v=2 2\nc v=3 3\n"


@pytest.mark.parametrize(
    ("gz", "why"),
    [
        (b"m v=1 1", "not one gzip member"),
        (
            gzip.compress(b"a\nb\n", mtime=0)[:-9] + b"\x00" * 5 + b"\x04\0\0\0",
            "does not decompress",
        ),
        (gzip.compress(b"a\nb\n", mtime=0)[:-4] + b"\x00" * 4, "inflates past 0 bytes"),
        (
            gzip.compress(b"a\nb\n" * 1000, mtime=0)[:-4] + (3).to_bytes(4, "little"),
            "inflates past 3",
        ),
        (gzip.compress(b"a\nb\nc\n", mtime=0), "do not fit"),  # three lines for a chunk of two
    ],
)
def test_a_damaged_compressed_chunk_is_refused_when_read(gz: bytes, why: str) -> None:
    chunk = StagedChunk("w", 0, 2, None, None, 0, gz)
    with pytest.raises(PermanentError, match=f"damaged: .*{why}"):
        chunk.check().lines()


def test_compressed_chunks_go_out_as_stored_and_text_ones_as_text() -> None:
    """Whole compressed chunks are sent as their members end to end, gzip; text chunks
    and the pieces of a cut chunk as text; a request never mixes the two."""
    writes = [[f"m,w={w} v={i}i {i}" for i in range(12)] for w in range(2)]
    kinds = iter([True, True, False, True, True, True])
    plan, reader = staged(writes, 4, compressed=lambda: next(kinds))
    clock = FakeClock()
    influx = FakeInflux(clock)
    # 8 points a request: two chunks of 4; the text chunk stands alone between gzip ones
    assert promoter_for(reader, influx, clock, 8, 1 << 20).send(plan) == (24, 0)
    assert influx.gzipped == [True, False, True, True]
    assert [len(body) for body in influx.bodies] == [8, 4, 8, 4]
    assert list(influx.stored) == [line for lines in writes for line in lines]


def test_a_compressed_chunk_larger_than_a_request_is_cut_into_text() -> None:
    lines = [f"m v={i}i {i}" for i in range(10)]
    plan, reader = staged([lines], 10, compressed=lambda: True)
    clock = FakeClock()
    influx = FakeInflux(clock)
    assert promoter_for(reader, influx, clock, 4, 1 << 20).send(plan) == (10, 0)
    assert influx.gzipped == [False, False, False]
    assert list(influx.stored) == lines


# --- TargetDelivery.send over chunks ----------------------------------------------------------


def bad_if_marked(line: str) -> str | None:
    return "field type conflict" if "bad" in line else None


def promoter_for(
    reader: FakeReader, influx: FakeInflux, clock: FakeClock, points: int, size: int, lanes: int = 1
) -> TargetDelivery:
    sender = make_sender(influx, clock).sender
    config = TargetConfig(url="http://fake", batch_points=points, batch_bytes=size)
    return TargetDelivery("t", reader, (sender, sender), reader, config, lanes)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(40))
def test_send_delivers_every_good_line_in_order_and_addresses_rejects(seed: int) -> None:
    """Random write sizes, chunk sizes, batch limits and bad lines: InfluxDB gets every
    good line, first in plan order (a bisected request re-sends some), requests stay
    within the point limit, each bad line is one dead letter with its own write, seq
    and text."""
    rng = random.Random(seed)
    writes = []
    for w in range(rng.randint(1, 4)):
        lines = [f"m,w={w} v={i}i {i}" for i in range(rng.randint(0, 60))]
        for i in rng.sample(range(len(lines)), k=min(len(lines), rng.randint(0, 3))):
            lines[i] = f"m,w={w} bad={i} {i}"
        writes.append(lines)
    chunk_points, points, size = rng.randint(1, 25), rng.randint(1, 30), rng.randint(40, 600)
    plan, reader = staged(writes, chunk_points, compressed=lambda: rng.random() < 0.5)
    clock = FakeClock()
    influx = FakeInflux(clock, bad=bad_if_marked)
    promoter = promoter_for(reader, influx, clock, points, size)

    delivered, rejected = promoter.send(plan)  # checks the stored checksums (I1)

    good = [line for lines in writes for line in lines if "bad" not in line]
    bad = {
        (f"w{w}", seq): line
        for w, lines in enumerate(writes)
        for seq, line in enumerate(lines)
        if "bad" in line
    }
    assert (delivered, rejected) == (len(good), len(bad))
    assert list(influx.stored) == good  # in order of first arrival
    assert {key: d.payload for key, d in reader.letters.items()} == bad
    assert all("field type conflict" in d.reason for d in reader.letters.values())
    assert all(len(body) <= points for body in influx.bodies)


@pytest.mark.parametrize("seed", range(30))
def test_lanes_send_each_series_in_the_epochs_order_within_its_lane(seed: int) -> None:
    """Four lanes: every request holds one lane's lines; each series reaches InfluxDB
    in the plan's order (I4); bad lines are dead letters with their own address, and
    413 splitting and 400 bisection work within a lane."""
    rng = random.Random(seed)
    writes = []
    for w in range(rng.randint(1, 4)):
        lines = [f"m,s={rng.randrange(12)},w={w} v={i}i {i}" for i in range(rng.randint(5, 80))]
        for i in rng.sample(range(len(lines)), k=rng.randint(0, 3)):
            lines[i] = lines[i].replace(" v=", " bad=")
        writes.append(lines)
    total = sum(map(len, writes))
    chunk_points, points = rng.randint(1, 25), rng.randint(1, total - 1)
    plan, reader = staged(writes, chunk_points, lanes=4)
    clock = FakeClock()
    influx = FakeInflux(clock, bad=bad_if_marked, max_lines=rng.choice([None, 3]))

    delivered, rejected = promoter_for(reader, influx, clock, points, 1 << 20, 4).send(plan)

    chooser = LaneChooser(4)
    assert all(len({chooser.lane(line) for line in body}) == 1 for body in influx.bodies)
    in_plan = [
        line
        for _, chunk in reader.chunks_of([f"w{w}" for w in range(len(writes))])
        for line in chunk.lines()
    ]
    good = [line for line in in_plan if "bad" not in line]
    arrived = list(influx.stored)  # in order of first arrival
    for series in {line.split(" ")[0] for line in good}:
        assert [x for x in arrived if x.startswith(series + " ")] == [
            x for x in good if x.startswith(series + " ")
        ]
    assert (delivered, rejected) == (len(good), total - len(good))
    bad = {
        (f"w{w}", seq): line
        for w, _ in enumerate(writes)
        for _, chunk in reader.chunks_of([f"w{w}"])
        for seq, line in enumerate(chunk.lines(), chunk.first_seq)
        if "bad" in line
    }
    assert {key: d.payload for key, d in reader.letters.items()} == bad


def test_small_chunks_are_coalesced_into_one_request() -> None:
    writes = [lines_of(10), lines_of(10)[::-1], lines_of(3)]
    plan, reader = staged(writes, chunk_points=4)
    clock = FakeClock()
    influx = FakeInflux(clock)
    assert promoter_for(reader, influx, clock, 5000, 1 << 20).send(plan) == (23, 0)
    assert influx.bodies == [[line for lines in writes for line in lines]]


def test_chunk_larger_than_the_batch_is_cut_and_progress_reported_per_request() -> None:
    plan, reader = staged([lines_of(25)], chunk_points=25)
    clock = FakeClock()
    influx = FakeInflux(clock)
    progress: list[int] = []
    assert promoter_for(reader, influx, clock, 10, 1 << 20).send(plan, progress.append) == (25, 0)
    assert [len(body) for body in influx.bodies] == [10, 10, 5]
    assert progress == [10, 20, 25]


def test_request_refused_as_too_large_is_split() -> None:
    plan, reader = staged([lines_of(12)], chunk_points=6)
    clock = FakeClock()
    influx = FakeInflux(clock, max_lines=5)
    assert promoter_for(reader, influx, clock, 100, 1 << 20).send(plan) == (12, 0)
    assert set(influx.stored) == set(lines_of(12))


def test_changed_chunk_fails_the_checksum() -> None:
    plan, reader = staged([lines_of(8)], chunk_points=4)
    chunk = reader._chunks["w0"][1]
    reader._chunks["w0"][1] = StagedChunk.of_lines("w0", 4, [*chunk.lines()[:3], "m v=9 1"])
    assert reader._chunks["w0"][1].points == chunk.points  # same count, other content
    clock = FakeClock()
    with pytest.raises(PermanentError, match="changed after the decision"):
        promoter_for(reader, FakeInflux(clock), clock, 100, 1 << 20).send(plan)


def test_a_member_is_the_same_bytes_every_time_and_inflates_as_zlibs_does() -> None:
    # Staged with ISA-L's deflate where the spark extra installed it (the executors), else
    # with zlib: either way one standard gzip member, without a name or a time, whose
    # trailer holds the size, and which members end to end inflate as one stream.
    pytest.importorskip("isal")
    data = "".join(f"m,host=h{i % 7} v={i}i {i}\n" for i in range(5_000)).encode()
    member = model.gzip_member(data)
    assert model.gzip_member(data) == member
    assert model._deflate.__name__ == "isal.isal_zlib"
    assert member[:3] == b"\x1f\x8b\x08" and member[4:8] == bytes(4)  # no name, no time
    assert zlib.decompress(member, 31) == data
    assert gzip.decompress(member + member) == data + data
    assert int.from_bytes(member[-4:], "little") == len(data)
    by_zlib = zlib.compressobj(model.GZIP_LEVEL, zlib.DEFLATED, 31)
    assert len(member) < len(by_zlib.compress(data) + by_zlib.flush())
