"""The dev kit's fault proxy (``devkit/faultproxy.py``) in a process of its own.

On threads of the bench process, a proxy's relaying would share the bench's
interpreter lock with the promotion threads it measures; a remote server's
network path shares nothing with the client's Python. A child process per
proxy keeps the relaying off the bench's lock (it still shares the machine's
cores). Its mode (``pass``, or ``cut``: a server that is down), its delay and
its bandwidth are fixed. It counts no lines: nobody reads a child's counts,
and parsing (and decompressing) every body would take CPU from the sides
being measured.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from multiprocessing.connection import Connection
from types import TracebackType

from devkit.faultproxy import FaultProxy

_START_TIMEOUT_S = 30.0


def _serve(
    upstream: str, delay_s: float, mode: str, bandwidth_bps: float | None, pipe: Connection
) -> None:
    """The child: a proxy to ``upstream``; sends its port, serves until told to stop."""
    proxy = FaultProxy.for_url(upstream)
    proxy.delay_s = delay_s
    proxy.bandwidth_bps = bandwidth_bps
    proxy.count_writes = False
    proxy.set_mode(mode)
    proxy.start()
    pipe.send(proxy.port)
    try:
        pipe.recv()  # "stop"
    except EOFError:  # the parent is gone
        pass
    finally:
        proxy.stop()


class ProxyProcess:
    """A fault proxy to ``upstream`` holding each answer ``delay_s``, in a child process;
    with ``bandwidth_bps``, a link of that many bits per second each way, shared by all
    its connections (None: unlimited)."""

    def __init__(
        self,
        upstream: str,
        delay_s: float,
        mode: str = "pass",
        bandwidth_bps: float | None = None,
    ) -> None:
        # spawn, not fork: the parent may already run threads (pools, other proxies)
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(upstream, delay_s, mode, bandwidth_bps, child), daemon=True
        )
        self._process.start()
        child.close()
        if not self._pipe.poll(_START_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"the proxy to {upstream} did not start")
        self.port: int = self._pipe.recv()

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(OSError):  # the child is gone already
                self._pipe.send("stop")
            self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._pipe.close()

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
