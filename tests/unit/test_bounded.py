"""Memory bounds of pure logic, each shown with input far larger than its bound and the
peak memory measured (tracemalloc): the caches of the point builder and the lane
chooser, decompression of staged chunks and of InfluxDB's answers, and the longest
line staging takes."""

from __future__ import annotations

import gzip
import itertools
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from twophase.bounded import ENTRY_BYTES, Inflater, SizedCache, inflate
from twophase.errors import BadPointsError, InflateLimitError, TargetRequestError
from twophase.influx.classify import Target, classify_status, influx1_refusal
from twophase.influx.http import ANSWER_BYTES
from twophase.influx.query import query_v1
from twophase.influx.writers import V1Writer
from twophase.model import MAX_CHUNK_BYTES, StagedChunk
from twophase.points.builder import TAG_CACHE_BYTES, PointBuilder, PointSpec, Rejected
from twophase.protocol.stage import stager
from twophase.protocol.stage.lanes import SERIES_CACHE_BYTES, LaneChooser

MiB = 1024 * 1024


def peak_of(work: Callable[[], Any]) -> tuple[Any, int]:
    """``work()``'s result and the most memory it held at once, in bytes."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = work()
        return result, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


# --- SizedCache ---------------------------------------------------------------------


def test_a_sized_cache_stays_within_its_budget_and_keeps_no_large_entry() -> None:
    cache: SizedCache[str, str] = SizedCache(10_000, 1_000)
    for i in range(1_000):
        key = f"k{i:05d}"
        cache.put(key, key.upper(), 2 * len(key))
        assert cache.used <= cache.budget
    assert 0 < len(cache) <= 10_000 // (12 + ENTRY_BYTES)
    assert cache.entries["k00999"] == "K00999"  # the newest stays
    big = "x" * 1_000
    assert cache.put(big, big, 2_000) is big and big not in cache.entries
    with pytest.raises(ValueError):
        SizedCache(10, 11)


# --- the point builder's and the lane chooser's caches --------------------------------


def _rows(count: int, size: int, start: int = 0) -> Iterator[dict[str, Any]]:
    """Rows whose tag ``big`` is unique and ``size`` characters long, made one at a time."""
    pad = "t" * size
    for i in range(start, start + count):
        yield {"big": f"{i:012d}{pad[12:]}", "host": f"h{i % 50}", "v": i, "t": i}


def test_the_builders_tag_cache_keeps_to_its_budget_whatever_the_tags() -> None:
    """5,000 unique 60 KB tags (300 MB) and 60,000 unique 400-character ones (58 MB
    counted, 3.4 times the cache's budget) through one builder: the 60 KB tags are
    never cached, the others fill the cache to its budget and no further. Before,
    100,000 entries of 60 KB each could be held: about 12 GB."""
    builder = PointBuilder(PointSpec("m", ("big", "host"), ("v",), "t"))

    def convert() -> int:
        done = 0
        for row in itertools.chain(_rows(5_000, 60_000), _rows(60_000, 400, 5_000)):
            done += len(builder.line(row)) > 0
        return done

    done, peak = peak_of(convert)
    cache = builder._tag_cache
    print(f"builder: 65,000 rows of unique tags, peak {peak / MiB:.1f} MiB, cache {cache.used}")
    assert done == 65_000
    assert cache.used <= TAG_CACHE_BYTES and len(cache) > 1_000  # 400 characters are kept
    assert all(len(key) < 1_000 for key in cache.entries)  # no 60 KB tag was kept
    assert peak < TAG_CACHE_BYTES * 1.5, f"peak {peak / MiB:.1f} MiB"


def test_the_lane_choosers_series_cache_keeps_to_its_budget() -> None:
    builder = PointBuilder(PointSpec("m", ("big", "host"), ("v",), "t"))
    chooser = LaneChooser(4)

    def choose() -> set[int]:
        rows = itertools.chain(_rows(2_000, 60_000), _rows(60_000, 400, 2_000))
        return {chooser.lane(builder.line(row)) for row in rows}

    lanes, peak = peak_of(choose)
    print(f"builder and lane chooser: 62,000 unique series, peak {peak / MiB:.1f} MiB")
    assert lanes == {0, 1, 2, 3}
    assert chooser._cache.used <= SERIES_CACHE_BYTES and len(chooser._cache) > 1_000
    # the builder's own cache (16 MiB) and the chooser's: nothing beyond them
    assert peak < (TAG_CACHE_BYTES + SERIES_CACHE_BYTES) * 1.5, f"peak {peak / MiB:.1f} MiB"


def test_a_cached_lane_is_the_lane_computed_again() -> None:
    chooser, fresh = LaneChooser(7), LaneChooser(7)
    lines = [f"m,host=h{i % 300},dc=x v=1 {i}" for i in range(3_000)]
    assert (
        [chooser.lane(line) for line in lines]
        == [LaneChooser(7).lane(line) for line in lines]
        == [fresh.lane(line) for line in lines]
    )


# --- decompression ----------------------------------------------------------------------


def _bomb(inflated: int, trailer: int | None = None) -> bytes:
    """A gzip member of ``inflated`` zero bytes (about a thousandth of that compressed),
    made a MiB at a time; its trailer's size forged to ``trailer`` when given."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(MiB)
    parts = [compressor.compress(block) for _ in range(inflated // MiB)]
    member = b"".join([*parts, compressor.flush()])
    if trailer is not None:
        member = member[:-4] + trailer.to_bytes(4, "little")
    return member


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return _bomb(1024 * MiB)  # 1 GiB of zeros in about 1 MB


def test_a_chunk_that_records_more_than_a_chunk_holds_is_refused_without_inflating(
    bomb: bytes,
) -> None:
    chunk = StagedChunk("w", 0, 1, None, None, 0, bomb)
    with pytest.raises(InflateLimitError, match=r"records 1073741824 bytes.*not inflated"):
        chunk.check()

    def read() -> None:
        with pytest.raises(InflateLimitError):
            chunk.lines()

    assert peak_of(read)[1] < MiB


def test_a_chunk_that_inflates_past_its_recorded_size_is_refused_there(bomb: bytes) -> None:
    """The trailer says 100 bytes; the member holds a GiB: inflating stops at 101."""
    chunk = StagedChunk("w", 0, 1, None, None, 0, bomb[:-4] + (100).to_bytes(4, "little"))
    chunk.check()  # its form is right: only reading it shows it

    def read() -> str:
        with pytest.raises(InflateLimitError, match="damaged: its gzip member inflates past 100"):
            chunk.lines()
        return "refused"

    assert peak_of(read)[0] == "refused"
    assert peak_of(read)[1] < 2 * MiB  # the member's copy, not the GiB


def test_a_chunk_as_large_as_the_bound_still_inflates() -> None:
    member = gzip.compress(b"m v=1 1\n")
    assert inflate(member, 8, "x") == b"m v=1 1\n"
    with pytest.raises(InflateLimitError, match="x inflates past 7 bytes"):
        inflate(member, 7, "x")
    assert 64 * MiB + 1 == MAX_CHUNK_BYTES


def test_an_inflater_reads_members_end_to_end_in_bounded_pieces(bomb: bytes) -> None:
    stream = gzip.compress(b"a\n") + gzip.compress(b"b\n")
    assert Inflater(10, "x").feed(stream) == b"a\nb\n"
    inflater = Inflater(None, "x")  # no total: a stream read piece by piece
    sizes = [len(piece) for piece in itertools.islice(inflater.pieces(bomb), 20)]
    assert max(sizes) <= MiB and sum(sizes) == 20 * MiB


# --- InfluxDB's answers -----------------------------------------------------------------


def test_an_error_answer_is_read_within_its_bound_even_compressed(
    stub: Any,
    bomb: bytes,
) -> None:
    """A 400 whose text is a GiB once inflated: classified from its first MiB."""
    stub.reply = (400, {"Content-Encoding": "gzip"}, bomb)
    writer = V1Writer(_config(stub.url))

    def write() -> BadPointsError:
        with pytest.raises(BadPointsError) as refused:
            writer.write(b"m v=1 1")
        return refused.value

    error, peak = peak_of(write)
    print(f"a 400 answer of a GiB once inflated: peak {peak / MiB:.2f} MiB")
    assert "InfluxDB refused points (400)" in str(error)
    assert peak < ANSWER_BYTES + 4 * MiB, f"peak {peak / MiB:.1f} MiB"


def test_a_streamed_answer_refuses_a_line_past_its_bound(
    stub: Any,
    bomb: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GiB without a line feed, once inflated: refused past the longest line read."""
    from twophase.influx import query

    monkeypatch.setattr(query, "MAX_ANSWER_LINE", 8 * MiB)
    stub.reply = (200, {"Content-Encoding": "gzip"}, bomb)

    def read() -> None:
        with pytest.raises(TargetRequestError, match="longer than 8388608 bytes"):
            query_v1(stub.url, "db", "SELECT 1")

    peak = peak_of(read)[1]
    print(f"a /query answer of a GiB without a line feed: peak {peak / MiB:.2f} MiB")
    assert peak < 12 * MiB, f"peak {peak / MiB:.1f} MiB"  # the line, and a piece more
    chunks = b'{"results":[{"series":[{"name":"m","values":[[1,2]]}]}]}\n' * 3
    stub.reply = (200, {"Content-Encoding": "gzip"}, gzip.compress(chunks))
    assert [s["values"] for s in query_v1(stub.url, "db", "SELECT 1")] == [[[1, 2]]] * 3


def _config(url: str) -> Any:
    from twophase.config import InfluxDBSettings, TargetConfig

    return TargetConfig(url=url, influxdb=InfluxDBSettings(api="v1", database="db"))


@pytest.mark.parametrize(
    ("body", "read"),
    [
        (b'{"error":"partial write: field type conflict: ... dropped=3"}', (3, False)),
        (b'{"error":"partial write: unable to parse \'x\': bad dropped=0"}', (0, False)),
        (
            b"{\"error\":\"unable to parse 'a': missing fields\\nunable to parse 'b'\"}",
            (None, True),
        ),
        (b'{"error":"unable to parse \'a\': missing fie', (None, True)),  # cut short
        (b'{"error":"partial write: field type conflict: ... drop', (None, False)),
        (b'{"error":"database not found: \\"x\\""}', (None, False)),
        (b"", (None, False)),
    ],
)
def test_influx1_refusals_say_how_many_points_they_dropped(
    body: bytes, read: tuple[int | None, bool]
) -> None:
    assert influx1_refusal(body) == read
    error = classify_status(400, body, {}, Target("v1", "http://x", "db"))
    if isinstance(error, BadPointsError):
        assert (error.dropped, error.every_line) == read
    v2 = classify_status(400, body, {}, Target("v2", "http://x", bucket="b", org="o"))
    assert not isinstance(v2, BadPointsError) or (v2.dropped, v2.every_line) == (None, False)


# --- the longest line staged -------------------------------------------------------------


def test_a_line_longer_than_a_staged_line_may_be_is_a_dead_letter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound is 64 MiB; lowered here to keep the test small."""
    monkeypatch.setattr(stager, "MAX_LINE_BYTES", 40)
    monkeypatch.setattr(stager, "_LONG_CHARS", 10)
    shape = stager._Shape(chunk_points=3, chunk_chars=1_000, lanes=1, compressed=True)
    items = ["m v=1 1", "m,t=" + "é" * 20 + " v=1 2", Rejected(2, "bad row", "{}"), "m v=3 3"]
    rejects: list[Rejected] = []
    chunks = list(stager._encode(items, shape, "w", rejects.extend))
    assert [line for chunk in chunks for line in chunk.lines()] == ["m v=1 1", "m v=3 3"]
    assert [(r.index, r.reason) for r in rejects] == [
        (1, "the line is 50 bytes, over the 40 a staged line may hold"),
        (2, "bad row"),
    ]
    assert rejects[0].payload.startswith("m,t=é")
    encoded = stager._Reencoded(items, shape, "w")
    list(encoded.chunks())
    assert [r.index for r in encoded.rejects()] == [1, 2] and encoded.rejected == 2
