"""Staging in a process of its own, as a Spark executor's task stages: for the overlap side
of the slow link (:class:`bench.background.Overlapped`), whose driver thread sends while
the tasks stage. Staging on the bench's own thread would share its interpreter lock with
that sending thread, which a Spark job's driver never does.

The lines are handed over before the clock starts (``load``); ``stage`` then stages one
epoch's lines as writes of four chunks (``Stager.stage_writes``) and returns their
messages once the last write committed.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from twophase.config import StagingConfig
from twophase.model import CommitMessage
from twophase.protocol.stager import Stager
from twophase.store.database import Database


class StagingProcess:
    """A child process that stages what it is told; close it when done."""

    def __init__(self, config: StagingConfig) -> None:
        context = multiprocessing.get_context("spawn")  # no inherited threads or pools
        self._conn, theirs = context.Pipe()
        self._process = context.Process(target=_serve, args=(theirs, config), daemon=True)
        self._process.start()
        theirs.close()

    def load(self, lines: Sequence[Sequence[str]]) -> None:
        """Hand over the epochs' lines (outside any timing): epoch ``i`` of the next
        ``stage`` calls is ``lines[i]``."""
        self._call("load", [list(epoch) for epoch in lines])

    def stage(self, index: int, sink_id: str, epoch: int, run_id: str) -> list[CommitMessage]:
        messages: list[CommitMessage] = self._call("stage", index, sink_id, epoch, run_id)
        return messages

    def close(self) -> None:
        self._conn.send(("stop",))
        self._process.join(30)
        self._conn.close()

    def _call(self, *request: Any) -> Any:
        self._conn.send(request)
        ok, answer = self._conn.recv()
        if not ok:
            raise RuntimeError(f"staging process: {answer}")
        return answer


def _serve(conn: Connection, config: StagingConfig) -> None:
    db = Database(config, max_size=1)
    stager = Stager(db, config)
    epochs: list[list[str]] = []
    try:
        while (request := conn.recv())[0] != "stop":
            try:
                if request[0] == "load":
                    epochs = request[1]
                    conn.send((True, None))
                    continue
                _, index, sink_id, epoch, run_id = request
                writes = stager.stage_writes(sink_id, epoch, epochs[index], run_id=run_id)
                conn.send((True, list(writes)))
            except Exception as exc:  # told to the bench, which raises it
                conn.send((False, f"{type(exc).__name__}: {exc}"))
    finally:
        db.close()
