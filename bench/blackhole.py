"""An HTTP server that takes InfluxDB writes and throws them away, in a process of its own.

Put in InfluxDB's place, it leaves the promoting process alone on the wire: every
``POST`` body is read to its end (``Content-Length`` or chunked) and answered
``204``, nothing is parsed or decompressed, so what is measured is the relay, not an
ingest. It counts requests, body bytes as they came on the wire, and the requests
sent with ``Content-Encoding: gzip``; ``GET /stats`` returns the counts as JSON and
``GET /ping`` answers as an InfluxDB 1.x would.

Run as ``python -m bench.blackhole`` (it prints its port on the first line of its
output), or through :class:`Blackhole`. :func:`flood` measures how much it takes on
its own, so that a relay's rate can be shown not to be the server's ceiling.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, cast

_REPO = Path(__file__).resolve().parents[1]
_NO_CONTENT = (
    b"HTTP/1.1 204 No Content\r\nX-Influxdb-Version: 1.8.10-blackhole\r\nContent-Length: 0\r\n\r\n"
)
_BUFFER = 1 << 20  # one read from the socket at most; the body is dropped as it comes


class _Totals:
    """What the server took, summed over its connections' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = self.bytes = self.gzip = 0

    def add(self, size: int, gzip: bool) -> None:
        with self._lock:
            self.requests += 1
            self.bytes += size
            self.gzip += gzip

    def as_json(self) -> bytes:
        with self._lock:
            data = {"requests": self.requests, "bytes": self.bytes, "gzip": self.gzip}
        return json.dumps({**data, "cpu_s": time.process_time()}).encode()


def _head(stream: io.BufferedReader) -> tuple[str, str, dict[str, str]] | None:
    """A request's method, path and headers (lower-case names); None at the end."""
    first = stream.readline()
    if not first:
        return None
    method, path, _ = first.decode("latin-1").split(" ", 2)
    headers = {}
    while (text := stream.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = text.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return method, path, headers


def _drop(stream: io.BufferedReader, size: int, buffer: memoryview) -> None:
    """Read ``size`` bytes and keep none of them."""
    while size > 0:
        got = stream.readinto(buffer[: min(size, len(buffer))])
        if not got:
            raise ConnectionError("the client went away mid-body")
        size -= got


def _drop_body(stream: io.BufferedReader, headers: dict[str, str], buffer: memoryview) -> int:
    """Read a body to its end, without keeping it; its size on the wire (chunk data only)."""
    if headers.get("transfer-encoding", "").lower() != "chunked":
        size = int(headers.get("content-length", "0"))
        _drop(stream, size, buffer)
        return size
    total = 0
    while size := int(stream.readline().split(b";", 1)[0], 16):
        _drop(stream, size + 2, buffer)  # the data and its CRLF
        total += size
    while stream.readline() not in (b"\r\n", b"\n", b""):  # trailers
        pass
    return total


def _answer(path: str, totals: _Totals) -> bytes:
    if path.startswith("/stats"):
        body = totals.as_json()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        return head.encode() + b"\r\n\r\n" + body
    return _NO_CONTENT


def _serve(conn: socket.socket, totals: _Totals) -> None:
    buffer = memoryview(bytearray(_BUFFER))
    stream = cast(io.BufferedReader, conn.makefile("rb", buffering=_BUFFER))
    with conn, stream:
        try:
            while (head := _head(stream)) is not None:
                method, path, headers = head
                if method in ("POST", "PUT"):
                    size = _drop_body(stream, headers, buffer)
                    totals.add(size, headers.get("content-encoding", "").lower() == "gzip")
                conn.sendall(_answer(path, totals))
        except (ConnectionError, ValueError):
            return  # a client that went away or spoke something else: drop the connection


def serve(port: int = 0, ready: Callable[[int], None] | None = None) -> None:
    """Accept connections forever, a thread each; ``ready`` gets the port once bound."""
    totals = _Totals()
    with socket.create_server(("127.0.0.1", port), backlog=64) as listener:
        if ready is not None:
            ready(listener.getsockname()[1])
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_serve, args=(conn, totals), daemon=True).start()


class Blackhole:
    """The server in a child process: ``url``, ``pid``, ``stats()``; stopped on exit."""

    def __init__(self) -> None:
        self._child = subprocess.Popen(
            [sys.executable, "-m", "bench.blackhole"],
            cwd=_REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._child.stdout is not None
        port = int(self._child.stdout.readline())
        self.url = f"http://127.0.0.1:{port}"
        self.pid = self._child.pid

    def stats(self) -> dict[str, Any]:
        """Requests, body bytes, gzip requests and the server's CPU seconds so far."""
        with urllib.request.urlopen(f"{self.url}/stats", timeout=10) as answer:
            data: dict[str, Any] = json.load(answer)
        return data

    def close(self) -> None:
        self._child.terminate()
        self._child.wait(timeout=10)

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _post_loop(url: str, body: bytes, headers: str, until: float, sent: list[int]) -> None:
    """POST ``body`` over one connection until ``until``; the bytes sent go into ``sent``."""
    host, port = url.removeprefix("http://").split(":")
    request = (
        f"POST /write?db=x HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
    ).encode() + body
    total = 0
    with socket.create_connection((host, int(port))) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while time.perf_counter() < until:
            conn.sendall(request)
            answer = b""
            while not answer.endswith(b"\r\n\r\n"):
                answer += conn.recv(4096)
            total += len(body)
    sent.append(total)


def flood(
    hole: Blackhole, body: bytes, connections: int, seconds: float, gzip: bool = False
) -> dict[str, float]:
    """Send ``body`` as fast as the client can over ``connections`` at once for ``seconds``:
    the body MB/s the server took, and its CPU seconds per GB (its ceiling on one core is
    1 / that). The client is raw sockets (the GIL released in ``sendall``), far lighter
    than the server's reading."""
    headers = "Content-Encoding: gzip\r\n" if gzip else ""
    sent: list[int] = []
    before = hole.stats()
    started = time.perf_counter()
    threads = [
        threading.Thread(target=_post_loop, args=(hole.url, body, headers, started + seconds, sent))
        for _ in range(connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    after = hole.stats()
    taken = after["bytes"] - before["bytes"]
    return {
        "mb_per_s": round(taken / wall / 1e6, 1),
        "server_cpu_s_per_gb": round((after["cpu_s"] - before["cpu_s"]) / (taken / 1e9), 3),
        "request_bytes": len(body),
        "connections": connections,
        "seconds": round(wall, 2),
    }


if __name__ == "__main__":

    def _announce(port: int) -> None:
        print(port, flush=True)

    serve(ready=_announce)
