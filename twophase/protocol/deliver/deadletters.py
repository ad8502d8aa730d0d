"""Driver side: recording the points a target refused during promotion, once each.

Stage-time dead letters (rows that never became points) are written by the
[`Stager`][twophase.protocol.stage.stager.Stager] in the staging transaction itself; this
module records the promote-time ones, which a re-promotion meets again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from twophase.model import DeadLetter
from twophase.store.database import Database


class DeadLetterLog:
    """One role: record dead letters. Idempotent: a letter already recorded
    (same write, phase, seq and target) is left as it is, however often promotion
    runs. With several targets a line two targets refuse is two letters, each
    requeued to its own target."""

    def __init__(self, db: Database):
        self._db = db

    def record(self, letters: Sequence[DeadLetter]) -> None:
        if not letters:
            return
        with self._db.transaction() as cur:
            cur.executemany(
                "INSERT INTO twophase_dead_letters (sink_id, epoch, write_id, seq, phase, reason,"
                " payload, target) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (write_id, phase, seq, target) DO NOTHING",
                [
                    (
                        d.sink_id,
                        d.epoch,
                        uuid.UUID(d.write_id),
                        d.seq,
                        d.phase,
                        d.reason,
                        d.payload,
                        d.target,
                    )
                    for d in letters
                ],
            )
