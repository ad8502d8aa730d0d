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

Whatever the mode, the proxy counts the line-protocol lines in the bodies of
``POST /write`` and ``POST /api/v2/write`` requests it forwards upstream
(``lines``, ``write_requests``), which shows how often points were re-sent.

Only loopback upstreams are allowed. Every loop polls with a short timeout
and checks the stop flag, so ``stop()`` ends everything within a second.
"""

from __future__ import annotations

import contextlib
import gzip
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

PASS, CUT, STALL, DROP_REPLY = "pass", "cut", "stall", "drop_reply"
MODES = (PASS, CUT, STALL, DROP_REPLY)
WRITE_PATHS = ("/write", "/api/v2/write")
_POLL_S = 0.1
_LOOPBACK = ("127.0.0.1", "localhost")


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
            self._spawn(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        mode = self._mode
        if mode == CUT:
            _reset(client)
        elif mode == STALL:
            self._swallow(client)
        else:
            self._pump(client)

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

    def _pump(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._upstream, timeout=5)
        except OSError:
            _reset(client)
            return
        self._opened(1)
        try:
            self._pump_pair(client, upstream)
        finally:
            self._opened(-1)

    def _opened(self, change: int) -> None:
        with self._lock:
            self.open_connections += change
            self.peak_connections = max(self.peak_connections, self.open_connections)

    def _pump_pair(self, client: socket.socket, upstream: socket.socket) -> None:
        counter = _WriteCounter(self._count)
        with selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ, upstream)
            selector.register(upstream, selectors.EVENT_READ, client)
            while not self._stop.is_set():
                for key, _ in selector.select(_POLL_S):
                    source, sink = key.fileobj, key.data
                    assert isinstance(source, socket.socket)
                    if not self._relay(source, sink, source is client, counter):
                        return
        _close(client, upstream)

    def _relay(
        self, source: socket.socket, sink: socket.socket, from_client: bool, counter: _WriteCounter
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
        if from_client:
            counter.feed(data)
        elif self.delay_s:
            time.sleep(self.delay_s)
        try:
            sink.sendall(data)
        except OSError:
            _close(client, upstream)
            return False
        return True

    def _count(self, lines: int) -> None:
        with self._lock:
            self.lines += lines
            self.write_requests += 1


class _WriteCounter:
    """Incremental HTTP/1.1 request parser: reports the line count of each write body."""

    def __init__(self, on_write: Callable[[int], None]) -> None:
        self._on_write = on_write
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
        if method == "POST" and path in WRITE_PATHS:
            self._on_write(count_lines(gzip.decompress(body) if gzipped else body))
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


def count_lines(body: bytes) -> int:
    """Line-protocol lines in a body (blank lines and comments do not count)."""
    return sum(1 for line in body.split(b"\n") if line.strip() and not line.startswith(b"#"))


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN, as a crashed or firewalled peer would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.close()


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
