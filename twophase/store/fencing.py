"""The fencing reads' own session: a sink's fencing token and owner, read cheaply.

A promotion reads the sink's token before every request to a target and every
retry of one (I5). Through the pool each read costs a checkout, the pool's
connection check and a transaction around one statement; here it is one
prepared statement on an autocommit session kept for the purpose (about a fifth
of the client's CPU per read). The session has every pooled session's settings
([`Database.session`][twophase.store.database.Database.session]).

A read that fails for the connection's sake (the server restarted, the backend
was ended, the network went away) drops the session and raises
[`StagingUnavailableError`][twophase.errors.StagingUnavailableError], as a pooled
step does: the caller repeats the read under ``Database.retry``, and the next
read opens a new session. Errors name the store by its display URL, never its
password.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from twophase.errors import StagingUnavailableError
from twophase.store.locks import first_line

__all__ = ["FenceReader"]

# Prepared once per session: one parse and plan for all of a run's reads.
_READ = "SELECT fencing_token, owner_run_id FROM twophase_sinks WHERE sink_id = %s"


class FenceReader:
    """Reads a sink's ``fencing_token`` and ``owner_run_id`` on one session of its own.

    Thread-safe: a promotion's lanes (threads) share it, one read at a time (a read
    is a fraction of a millisecond). Every ``read`` reads the row afresh: nothing is
    cached. Reads change nothing, so a failed one is safe to repeat. The session is
    opened at the first read, not before, and again after a failure; ``close`` ends
    it (idempotent; a read after it opens a new session).
    """

    def __init__(self, connect: Callable[[], psycopg.Connection], display_url: str) -> None:
        self._connect = connect  # a configured autocommit session; StagingUnavailableError
        self._display_url = display_url
        self._lock = threading.Lock()
        self._conn: psycopg.Connection | None = None

    def read(self, sink_id: str) -> dict[str, Any] | None:
        """The sink's row (``fencing_token``, ``owner_run_id``), or None for an unknown sink.

        StagingUnavailableError when the store cannot be reached (the session is dropped).
        """
        with self._lock:
            conn = self._conn if self._conn is not None else self._open()
            try:
                row = conn.execute(_READ, (sink_id,), prepare=True).fetchone()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                self._drop()
                raise StagingUnavailableError(
                    f"staging database {self._display_url}: {first_line(exc)}"
                ) from None
            except BaseException:
                self._drop()  # the session's state is unknown: the next read starts afresh
                raise
        return None if row is None else {"fencing_token": row[0], "owner_run_id": row[1]}

    @property
    def backend_pid(self) -> int | None:
        """The server process of the open session (None when none is open): diagnostics."""
        conn = self._conn
        return None if conn is None or conn.closed else conn.info.backend_pid

    def close(self) -> None:
        """End the session, if one is open."""
        with self._lock:
            self._drop()

    def _open(self) -> psycopg.Connection:
        self._conn = self._connect()
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
