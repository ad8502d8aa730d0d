"""A stand-in for InfluxDB 3's write API, answering as its documentation says.

No InfluxDB 3 server can be installed on the test machines, so the ``v3``
writer is tested against this one: ``POST /api/v3/write_lp`` with
``accept_partial=false`` takes a request whole (204) or refuses it whole (400,
``{"error": ..., "data": {"original_line", "line_number", "error_message"}}``,
the line counted from 1); while it is made unavailable it answers 503 with a
``Retry-After``; a wrong token gets 401. A body sent with
``Content-Encoding: gzip`` is decompressed first (members end to end are one
stream, as for the real server's reader); empty lines are skipped, as line
protocol allows. A line is refused when its field ``v``
is a string: the field type conflict the tests use on InfluxDB 1.x. Accepted
points overwrite points of the same series and time, as InfluxDB's do.
"""

from __future__ import annotations

import gzip
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Influx3:
    """The server's state: what it holds, what it was sent, how it should answer."""

    token: str
    points: dict[tuple[str, str], str] = field(default_factory=dict)  # (series, time) -> fields
    requests: list[dict[str, Any]] = field(default_factory=list)
    unavailable: int = 0  # answer this many requests with 503
    retry_after: str = "1"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(
        self, query: dict[str, list[str]], auth: str | None, body: bytes, encoding: str | None
    ) -> Any:
        """(status, headers, JSON body or None) for one write request."""
        if encoding == "gzip":
            body = gzip.decompress(body)
        lines = body.decode("utf-8").split("\n")
        with self.lock:
            self.requests.append(
                {"query": query, "auth": auth, "lines": sum(map(bool, lines)), "encoding": encoding}
            )
            if auth != f"Bearer {self.token}":
                return 401, {}, {"error": "the request was not authenticated"}
            if self.unavailable > 0:
                self.unavailable -= 1
                return 503, {"Retry-After": self.retry_after}, {"error": "server busy"}
            for number, line in enumerate(lines, start=1):
                if 'v="' in line:
                    data = {
                        "original_line": line,
                        "line_number": number,
                        "error_message": "invalid column type for column 'v', expected Float",
                    }
                    return 400, {}, {"error": "parsing failed for write_lp endpoint", "data": data}
            for line in filter(None, lines):
                series, fields, time = line.rsplit(" ", 2)
                self.points[(series, time)] = fields
            return 204, {}, None


def serve(state: Influx3) -> tuple[ThreadingHTTPServer, str]:
    """Start the server on a free loopback port; (server, base URL)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            url = urlsplit(self.path)
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size)
            if url.path != "/api/v3/write_lp":
                self._reply(404, {}, {"error": f"no route {url.path}"})
                return
            status, headers, payload = state.answer(
                parse_qs(url.query),
                self.headers.get("Authorization"),
                body,
                self.headers.get("Content-Encoding"),
            )
            self._reply(status, headers, payload)

        def _reply(self, status: int, headers: dict[str, str], payload: Any) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if data:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:  # quiet
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"
