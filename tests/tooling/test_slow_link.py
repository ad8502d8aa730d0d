"""The test kit's proxy, without a server: its link pacing on a fake clock, its count of
the lines in write bodies, plain and gzip, its reading of the answers, and its
recording of each write (through a socket of the test's own on loopback)."""

from __future__ import annotations

import gzip
import socket

import pytest

from devkit.faultproxy import (
    AnswerReader,
    FaultProxy,
    Recorded,
    TokenBucket,
    WriteCounter,
    wait_until,
)
from tests.fakes import FakeClock

MBIT = 1_000_000


def bucket(rate_bps: float, burst_bits: float) -> tuple[TokenBucket, FakeClock]:
    clock = FakeClock(100.0)
    return TokenBucket(rate_bps, burst_bits, clock=clock), clock


def test_the_burst_passes_at_once() -> None:
    link, _ = bucket(8 * MBIT, burst_bits=8_000)
    assert link.reserve(1_000) == 0.0


def test_beyond_the_burst_a_sender_waits_for_the_missing_bits() -> None:
    link, _ = bucket(8 * MBIT, burst_bits=8_000)
    # 1,000 bytes free, the other 1,000,000 bytes (8 Mbit) at 8 Mbit/s
    assert link.reserve(1_001_000) == pytest.approx(1.0)


def test_senders_queue_behind_each_other_on_a_shared_link() -> None:
    link, _ = bucket(8 * MBIT, burst_bits=0)
    waits = [link.reserve(100_000) for _ in range(3)]
    assert waits == pytest.approx([0.1, 0.2, 0.3])


def test_time_pays_the_debt_back() -> None:
    link, clock = bucket(8 * MBIT, burst_bits=0)
    assert link.reserve(1_000_000) == pytest.approx(1.0)
    clock.now += 0.75
    assert link.reserve(0) == pytest.approx(0.25)
    clock.now += 0.25
    assert link.reserve(500_000) == pytest.approx(0.5)


def test_an_idle_link_saves_no_more_than_its_burst() -> None:
    link, clock = bucket(8 * MBIT, burst_bits=80_000)
    clock.now += 3600
    # 10,000 bytes saved up, not an hour's worth: the rest waits
    assert link.reserve(1_010_000) == pytest.approx(1.0)


@pytest.mark.parametrize(("rate", "burst"), [(0, 0), (-1, 0), (1, -1)])
def test_a_link_needs_a_rate_and_a_burst_of_zero_or_more(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst)


def request(body: bytes, gzipped: bool = False, path: str = "/write?db=x") -> bytes:
    encoding = b"Content-Encoding: gzip\r\n" if gzipped else b""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode()
        + encoding
        + b"\r\n"
        + body
    )


def counted(*data: bytes) -> list[int]:
    writes: list[int] = []
    counter = WriteCounter(writes.append)
    for piece in data:
        counter.feed(piece)
    return writes


def test_a_plain_body_counts_its_lines_but_not_blanks_or_comments() -> None:
    assert counted(request(b"m v=1 1\n\n# note\nm v=2 2\n")) == [2]


def test_a_gzip_body_of_several_members_counts_every_members_lines() -> None:
    members = [b"m v=1 1\nm v=2 2\n", b"m v=3 3\n", b"m v=4 4\nm v=5 5\nm v=6 6\n"]
    body = b"".join(gzip.compress(member) for member in members)
    assert counted(request(body, gzipped=True)) == [6]


def test_a_body_split_across_reads_is_counted_once_whole() -> None:
    body = b"".join(gzip.compress(b"m v=%d %d\n" % (i, i)) for i in range(50))
    data = request(body, gzipped=True) + request(b"m v=1 1\n", path="/api/v2/write?bucket=b")
    pieces = [data[i : i + 7] for i in range(0, len(data), 7)]
    assert counted(*pieces) == [50, 1]


def test_a_body_that_is_not_gzip_counts_as_a_write_of_no_lines() -> None:
    assert counted(request(b"m v=1 1\n", gzipped=True)) == [0]


def test_other_requests_are_not_writes() -> None:
    assert counted(request(b"q=SHOW DATABASES", path="/query")) == []


def answered(*data: bytes) -> list[int]:
    statuses: list[int] = []
    reader = AnswerReader(statuses.append)
    for piece in data:
        reader.feed(piece)
    return statuses


def test_answers_are_read_whatever_frames_their_bodies() -> None:
    """An answer without a body (204), one with a Content-Length, a chunked one, an
    interim 100: each status once, in order, however the bytes are cut."""
    data = (
        b"HTTP/1.1 204 No Content\r\nX-Influxdb-Version: 1.6.7\r\n\r\n"
        b'HTTP/1.1 400 Bad Request\r\nContent-Length: 23\r\n\r\n{"error":"partial wr"}\n'
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        b"HTTP/1.1 204 No Content\r\n\r\n"
    )
    assert answered(data) == [204, 400, 200, 204]
    assert answered(*[data[i : i + 5] for i in range(0, len(data), 5)]) == [204, 400, 200, 204]


def test_a_recording_proxy_keeps_each_write_and_its_answer() -> None:
    """Every write request forwarded, its lines (a gzip body read decompressed) and its
    answer's status, matched to it on its connection; other requests left out."""
    answers = (
        b"HTTP/1.1 204 No Content\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
    )
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with FaultProxy("127.0.0.1", server.getsockname()[1]) as proxy:
            proxy.record = True
            with socket.create_connection(("127.0.0.1", proxy.port)) as client:
                client.sendall(
                    request(b"m v=1 1\nm v=2 2\n")
                    + request(b"q=SHOW DATABASES", path="/query")
                    + request(gzip.compress(b"m v=3 3\n"), gzipped=True)
                )
                upstream, _ = server.accept()
                with upstream:
                    upstream.sendall(answers)
                    received = b""
                    while received.count(b"HTTP/1.1 ") < 3:
                        received += client.recv(65536)
            assert wait_until(lambda: proxy.open_connections == 0, 5, 0.02)
            assert proxy.recorded() == [
                Recorded(1, (b"m v=1 1", b"m v=2 2"), 204),
                Recorded(1, (b"m v=3 3",), 400),
            ]
            assert [r.acknowledged for r in proxy.recorded()] == [True, False]
