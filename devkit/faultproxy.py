"""A threaded TCP proxy on 127.0.0.1 that injects network faults and counts written lines.

Put it in front of InfluxDB (or VictoriaMetrics) and point a writer at
``proxy.url``. The mode is switchable at run time and applies to new
connections and to the next bytes a client sends on an open one:

* ``pass``       forward both ways;
* ``cut``        accept, then reset the connection (RST) without answering;
* ``stall``      accept and swallow requests, never answer (hits read timeouts);
* ``drop_reply`` forward the request, then reset the client before the answer
                 arrives: the server applied the write, the client sees a failure.

``delay_s`` (default 0) holds every answer that long before passing it on:
a request then takes a round trip of at least ``delay_s``, as to a server
far away (the benchmark's 20 ms round trip).

``bandwidth_bps`` (bits per second, default None: unlimited) makes the proxy
a link of that capacity: a :class:`TokenBucket` per direction, shared by all
the proxy's connections as a real link is, paces every byte relayed (headers
included). It adds to ``delay_s``: a request of ``n`` bytes then takes at
least ``delay_s + 8 n / bandwidth_bps``. It models a link's capacity only,
not TCP's window or slow start.

Whatever the mode, the proxy counts the line-protocol lines in the bodies of
``POST /write`` and ``POST /api/v2/write`` requests it forwards upstream
(``lines``, ``write_requests``), which shows how often points were re-sent.
A body sent with ``Content-Encoding: gzip`` is counted decompressed (one or
several gzip members, as InfluxDB reads it). ``count_writes = False`` turns
the counting off, for a proxy whose counts nobody reads (the benchmark's):
it spends no CPU parsing.

``record = True`` keeps every write request forwarded upstream as well
(``recorded()``: a :class:`Recorded` each, in the order the proxy got them,
with the connection it came on, its lines as InfluxDB reads them, and the
status of the server's answer once that came back; None while unanswered or
when the client went away first): a test then sees each delivery, a point
re-sent included, where the server's read-back shows a point written twice
once.

Only loopback upstreams are allowed. Every loop polls with a short timeout
and checks the stop flag, so ``stop()`` ends everything within a second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import selectors
import socket
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from devkit.daemon import wait_until

__all__ = [
    "BURST_BYTES",
    "CUT",
    "DROP_REPLY",
    "MODES",
    "PASS",
    "STALL",
    "AnswerReader",
    "FaultProxy",
    "Recorded",
    "TokenBucket",
    "WriteCounter",
    "wait_until",
]

PASS, CUT, STALL, DROP_REPLY = "pass", "cut", "stall", "drop_reply"
MODES = (PASS, CUT, STALL, DROP_REPLY)
WRITE_PATHS = ("/write", "/api/v2/write")
_POLL_S = 0.1
_LOOPBACK = ("127.0.0.1", "localhost")
# What a link passes at once after being idle: small, so that a request pays
# nearly all of its transmission time, as on a real link.
BURST_BYTES = 16 * 1024


@dataclass(frozen=True)
class Recorded:
    """A write request the proxy forwarded: the connection it came on (numbered from 1
    in the order the proxy accepted them), its lines (a gzip body decompressed; blank
    lines and comments left out) and the status the server answered it with (None:
    no answer came back)."""

    connection: int
    lines: tuple[bytes, ...]
    status: int | None = None

    @property
    def acknowledged(self) -> bool:
        """The server answered it with a success (2xx)."""
        return self.status is not None and 200 <= self.status < 300


class TokenBucket:
    """The pacing of a link of ``rate_bps`` bits per second, shared by its users.

    ``reserve(n)`` takes ``n`` bytes' worth of tokens at once, going into
    debt when there are too few, and returns how long the caller must wait
    before sending: callers queue in the order they reserve, as bytes do on
    a link. Tokens accrue at ``rate_bps`` up to ``burst_bits``. Thread-safe;
    ``clock`` is injectable so that tests can run it on a fake clock.
    """

    def __init__(
        self,
        rate_bps: float,
        burst_bits: float = 8 * BURST_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_bps <= 0 or burst_bits < 0:
            raise ValueError(
                f"a rate above 0 and a burst of 0 or more, not {rate_bps}, {burst_bits}"
            )
        self.rate_bps = rate_bps
        self.burst_bits = burst_bits
        self._clock = clock
        self._tokens = burst_bits  # may go negative: bytes reserved but not yet paid for
        self._stamp = clock()
        self._lock = threading.Lock()

    def reserve(self, size_bytes: int) -> float:
        """Take ``size_bytes`` now; the seconds to wait before sending them (0: at once)."""
        with self._lock:
            now = self._clock()
            earned = (now - self._stamp) * self.rate_bps
            self._tokens = min(self.burst_bits, self._tokens + earned)
            self._stamp = now
            self._tokens -= 8 * size_bytes
            return max(0.0, -self._tokens / self.rate_bps)


class FaultProxy:
    """A fault-injecting, line-counting TCP proxy on ``127.0.0.1:<free port>``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        if upstream_host not in _LOOPBACK:
            raise ValueError(f"the fault proxy only targets loopback, not {upstream_host!r}")
        self._upstream = ("127.0.0.1", upstream_port)
        self._mode = PASS
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(_POLL_S)
        self.port: int = self._listener.getsockname()[1]
        self.lines = 0
        self.write_requests = 0
        self.connections = 0
        self.open_connections = 0
        self.peak_connections = 0  # the most connections open at once
        self.delay_s = 0.0
        self.count_writes = True
        self.record = False
        self._recorded: list[Recorded] = []
        self._links: tuple[TokenBucket, TokenBucket] | None = None  # (upstream, downstream)

    @classmethod
    def for_url(cls, url: str) -> FaultProxy:
        parts = urlsplit(url)
        return cls(parts.hostname or "", parts.port or 80)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
        self._mode = mode

    @property
    def bandwidth_bps(self) -> float | None:
        """The link's capacity each way, bits per second (None: unlimited)."""
        return self._links[0].rate_bps if self._links else None

    @bandwidth_bps.setter
    def bandwidth_bps(self, rate_bps: float | None) -> None:
        # fresh buckets: a new rate starts from an idle link
        self._links = None if rate_bps is None else (TokenBucket(rate_bps), TokenBucket(rate_bps))

    def set_mode_later(self, mode: str, after_s: float) -> threading.Timer:
        """Switch to ``mode`` after ``after_s`` seconds (from a timer thread)."""
        timer = threading.Timer(after_s, self.set_mode, args=(mode,))
        timer.daemon = True
        timer.start()
        return timer

    def reset_counts(self) -> None:
        with self._lock:
            self.lines = self.write_requests = self.connections = 0
            self.peak_connections = self.open_connections

    def recorded(self) -> list[Recorded]:
        """The write requests recorded so far (``record``), in the order they came."""
        with self._lock:
            return list(self._recorded)

    def start(self) -> FaultProxy:
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._listener.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- internals ---------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                number = self.connections
            self._spawn(self._serve, client, number)

    def _serve(self, client: socket.socket, number: int = 0) -> None:
        mode = self._mode
        if mode == CUT:
            _reset(client)
        elif mode == STALL:
            self._swallow(client)
        else:
            self._pump(client, number)

    def _swallow(self, client: socket.socket, *others: socket.socket) -> None:
        """Read and discard until the client gives up or the proxy stops; never answer."""
        for other in others:
            other.close()
        client.settimeout(_POLL_S)
        with client:
            while not self._stop.is_set():
                try:
                    if not client.recv(65536):
                        return
                except TimeoutError:
                    continue
                except OSError:
                    return

    def _pump(self, client: socket.socket, number: int) -> None:
        try:
            upstream = socket.create_connection(self._upstream, timeout=5)
        except OSError:
            _reset(client)
            return
        # Relay each piece at once, as the endpoints (which both disable Nagle) send
        # it: with Nagle, a request's head and body, relayed as two writes, wait for
        # the server's delayed ACK (40 ms on Linux) before the body leaves.
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._opened(1)
        try:
            self._pump_pair(client, upstream, number)
        finally:
            self._opened(-1)

    def _opened(self, change: int) -> None:
        with self._lock:
            self.open_connections += change
            self.peak_connections = max(self.peak_connections, self.open_connections)

    def _pump_pair(self, client: socket.socket, upstream: socket.socket, number: int) -> None:
        counter = answers = None
        if self.record:
            counter, answers = self._recorder(number)
        elif self.count_writes:
            counter = WriteCounter(self._count)
        with selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ, upstream)
            selector.register(upstream, selectors.EVENT_READ, client)
            while not self._stop.is_set():
                for key, _ in selector.select(_POLL_S):
                    source, sink = key.fileobj, key.data
                    assert isinstance(source, socket.socket)
                    if not self._relay(source, sink, source is client, counter, answers):
                        return
        _close(client, upstream)

    def _relay(
        self,
        source: socket.socket,
        sink: socket.socket,
        from_client: bool,
        counter: WriteCounter | None,
        answers: AnswerReader | None = None,
    ) -> bool:
        """Move one chunk; False when the connection pair is finished (and closed)."""
        client, upstream = (source, sink) if from_client else (sink, source)
        try:
            data = source.recv(65536)
        except OSError:
            data = b""
        mode = self._mode
        if not data:
            _close(client, upstream)
            return False
        if from_client and mode == CUT:
            _reset(client)
            upstream.close()
            return False
        if from_client and mode == STALL:
            self._swallow(client, upstream)
            return False
        if not from_client and mode == DROP_REPLY:
            _reset(client)
            upstream.close()
            return False
        self._observe(data, from_client, counter, answers)
        self._pace(data, from_client)
        try:
            sink.sendall(data)
        except OSError:
            _close(client, upstream)
            return False
        return True

    def _observe(
        self,
        data: bytes,
        from_client: bool,
        counter: WriteCounter | None,
        answers: AnswerReader | None,
    ) -> None:
        """Count (or record) what the client sends; read the answers; hold them ``delay_s``."""
        if from_client:
            if counter is not None:
                counter.feed(data)
            return
        if answers is not None:
            answers.feed(data)
        if self.delay_s:
            time.sleep(self.delay_s)

    def _pace(self, data: bytes, from_client: bool) -> None:
        """Hold ``data`` for its time on the link (nothing when the bandwidth is unlimited)."""
        links = self._links
        wait_s = links[0 if from_client else 1].reserve(len(data)) if links else 0.0
        if wait_s:
            self._stop.wait(wait_s)  # not a sleep: stop() ends a long wait at once

    def _count(self, lines: int) -> None:
        with self._lock:
            self.lines += lines
            self.write_requests += 1

    def _recorder(self, number: int) -> tuple[WriteCounter, AnswerReader]:
        """What records the requests of connection ``number`` and their answers, which
        come back in the order of the requests (HTTP/1.1 without pipelining)."""
        waiting: deque[int | None] = (
            deque()
        )  # each request's place in _recorded (None: not a write)

        def on_request(body: bytes | None) -> None:
            with self._lock:
                if body is None:
                    waiting.append(None)
                    return
                lines = _lines(body)
                self.lines += len(lines)
                self.write_requests += 1
                waiting.append(len(self._recorded))
                self._recorded.append(Recorded(number, lines))

        def on_answer(status: int) -> None:
            with self._lock:
                place = waiting.popleft() if waiting else None
                if place is not None:
                    self._recorded[place] = dataclasses.replace(
                        self._recorded[place], status=status
                    )

        return WriteCounter(self._count, on_request), AnswerReader(on_answer)


class WriteCounter:
    """Incremental HTTP/1.1 request parser: reports the line count of each write body.

    A gzip body (``Content-Encoding: gzip``) is counted decompressed; several
    gzip members in one body are read one after the other, as InfluxDB reads
    them. A body that does not decompress counts as a write of 0 lines (the
    server refuses it).
    """

    def __init__(
        self,
        on_write: Callable[[int], None],
        on_request: Callable[[bytes | None], None] | None = None,
    ) -> None:
        self._on_write = on_write
        self._on_request = on_request  # instead of on_write: each request's decoded body
        self._buffer = bytearray()
        self._head: tuple[str, str, bool] | None = None  # method, path, gzipped
        self._need = 0
        self._broken = False

    def feed(self, data: bytes) -> None:
        if self._broken:
            return
        self._buffer += data
        while self._step():
            pass

    def _step(self) -> bool:
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return False
            head = self._buffer[:end].decode("latin-1")
            del self._buffer[: end + 4]
            return self._parse_head(head)
        if len(self._buffer) < self._need:
            return False
        body = bytes(self._buffer[: self._need])
        del self._buffer[: self._need]
        method, path, gzipped = self._head
        self._head = None
        write = method == "POST" and path in WRITE_PATHS
        decoded = (_decoded(body) if gzipped else body) if write else None
        if self._on_request is not None:
            self._on_request(decoded)
        elif decoded is not None:
            self._on_write(count_lines(decoded))
        return True

    def _parse_head(self, head: str) -> bool:
        request_line, *header_lines = head.split("\r\n")
        parts = request_line.split(" ")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        if len(parts) < 2 or "chunked" in headers.get("transfer-encoding", ""):
            self._broken = True  # not needed by our clients; stop counting this connection
            return False
        self._head = (parts[0], urlsplit(parts[1]).path, headers.get("content-encoding") == "gzip")
        self._need = int(headers.get("content-length", "0") or 0)
        return True


class AnswerReader:
    """Incremental HTTP/1.1 response parser: reports the status of each answer.

    A body is skipped by its ``Content-Length`` or its chunks (``Transfer-Encoding:
    chunked``, without trailers); an answer of status 1xx, 204 or 304 has none. An
    answer it cannot frame stops it (no more reports on that connection).
    """

    def __init__(self, on_answer: Callable[[int], None]) -> None:
        self._on_answer = on_answer
        self._buffer = bytearray()
        self._skip = 0  # bytes of the current body still to skip
        self._chunked = False
        self._broken = False

    def feed(self, data: bytes) -> None:
        if self._broken:
            return
        self._buffer += data
        while self._step():
            pass

    def _step(self) -> bool:
        if self._skip:
            taken = min(self._skip, len(self._buffer))
            del self._buffer[:taken]
            self._skip -= taken
            return bool(self._buffer) and not self._skip
        if self._chunked:
            return self._chunk()
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = self._buffer[:end].decode("latin-1")
        del self._buffer[: end + 4]
        status_line, *header_lines = head.split("\r\n")
        parts = status_line.split(" ")
        if len(parts) < 2 or not parts[1].isdigit():
            self._broken = True
            return False
        status = int(parts[1])
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        if not (status < 200 or status in (204, 304)):
            self._chunked = "chunked" in headers.get("transfer-encoding", "")
            self._skip = 0 if self._chunked else int(headers.get("content-length", "0") or 0)
        if status >= 200:
            self._on_answer(status)
        return True

    def _chunk(self) -> bool:
        end = self._buffer.find(b"\r\n")
        if end < 0:
            return False
        size = int(bytes(self._buffer[:end]).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            if len(self._buffer) < end + 4:
                return False
            del self._buffer[: end + 4]  # the last chunk and the empty line after it
            self._chunked = False
            return True
        del self._buffer[: end + 2]
        self._skip = size + 2  # the chunk and its CRLF
        return True


def _lines(body: bytes) -> tuple[bytes, ...]:
    """A write body's lines as :func:`count_lines` counts them."""
    return tuple(line for line in body.split(b"\n") if line.strip() and not line.startswith(b"#"))


def _decoded(body: bytes) -> bytes:
    """A gzip body decompressed (every member, in order); empty when it is not gzip."""
    try:
        return gzip.decompress(body)
    except (OSError, EOFError, zlib.error):
        return b""


def count_lines(body: bytes) -> int:
    """Line-protocol lines in a body (blank lines and comments do not count)."""
    return len(_lines(body))


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN, as a crashed or firewalled peer would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.close()
