"""Fixtures shared by the unit tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class Stub(BaseHTTPRequestHandler):
    """Answers every request with ``server.reply`` and records what it got."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        server: Any = self.server
        headers = {k.lower(): v for k, v in self.headers.items()}
        server.seen.append((self.command, self.path, headers, body))
        status, reply_headers, reply = server.reply
        self.send_response(status)
        for name, value in reply_headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    server.seen, server.reply = [], (204, {}, b"")
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
