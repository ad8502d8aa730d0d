"""The end of a run: a query that stops records when, and whether it failed.

A run begins with [`Ledger.begin_run`][twophase.protocol.ledger.epoch_ledger.Ledger.begin_run],
which fences every older run of the sink (I5). Ending it changes no epoch and fences
nothing; it tells the operator's commands that the owner is gone, so that
``recover`` and ``resend`` need no ``--force`` after a clean stop. A driver
killed by SIGKILL records nothing: its run looks live until the live window
passes, then *unknown* (it may be dead or hung), as before.
"""

from __future__ import annotations

from twophase.errors import UsageError
from twophase.store.database import Database

STOPPED, FAILED = "stopped", "failed"
END_REASONS = (STOPPED, FAILED)


class Runs:
    """Records the ends of runs in ``twophase_runs``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def end(self, sink_id: str, run_id: str, reason: str) -> bool:
        """Record that ``run_id`` of ``sink_id`` ended, ``stopped`` or ``failed``.

        Idempotent: the first end recorded stands, later calls change nothing.
        True when this call recorded it; False when the run had already ended or
        never claimed the sink.
        """
        if reason not in END_REASONS:
            raise UsageError(f"a run ends {' or '.join(END_REASONS)}, not {reason!r}")
        with self._db.transaction() as cur:
            cur.execute(
                "UPDATE twophase_runs SET ended_at = now(), end_reason = %s"
                " WHERE sink_id = %s AND run_id = %s AND ended_at IS NULL",
                (reason, sink_id, run_id),
            )
            return cur.rowcount == 1

    def query_of(self, sink_id: str, run_id: str) -> str | None:
        """The query id ``run_id`` claimed ``sink_id`` with; None while it has not (or
        claimed it without one). Read-only."""
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT query_id FROM twophase_runs WHERE sink_id = %s AND run_id = %s",
                (sink_id, run_id),
            )
            row = cur.fetchone()
        return None if row is None else row[0]
