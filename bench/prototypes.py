"""Prototypes of proposed core changes, used only by ``bench/experiments.py``.

* :class:`PipelinedCommitter`: decide epoch N, promote it in the background
  while the caller stages N+1 (one epoch in flight, order kept).

The earlier prototypes (``FastStager``, ``PrefetchPromoter`` and the chunked
``ChunkStager``/``ChunkPromoter``) are gone: chunked staging is now the core
(migration ``0002_staged_chunks``); their measurements are in
``bench/README.md`` and ``results/2026112*T02*.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from twophase.committer import Committer, Promoter, PromoteResult
from twophase.ledger import Lease, Ledger
from twophase.schema import PRECOMMITTED
from twophase.staging import CommitMessage


class PipelinedCommitter:
    """Promotes epoch N in a background thread while the caller stages N+1.

    ``commit(N)``: wait for N-1's promotion (raising its error), recover any
    other PRECOMMITTED epoch (I3), decide N (durable before returning), start
    promoting N, return. At most one epoch is in flight, always the newest
    decided one, so epochs are still promoted in order; a failed promotion
    surfaces on the next ``commit`` (or ``flush``) and its epoch stays
    PRECOMMITTED for recovery, as today.
    """

    def __init__(self, committer: Committer, ledger: Ledger, promoter: Promoter) -> None:
        self._committer, self._ledger, self._promoter = committer, ledger, promoter
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="twophase-promote")
        self._pending: Future[PromoteResult] | None = None

    def commit(self, lease: Lease, epoch: int, messages: Sequence[CommitMessage]) -> None:
        self.flush()
        self._committer.recover(lease)
        decision = self._ledger.decide(lease, epoch, messages)
        if decision.state == PRECOMMITTED:
            self._pending = self._executor.submit(self._promoter.promote, lease, epoch)

    def flush(self) -> PromoteResult | None:
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> None:
        self.flush()
        self._executor.shutdown()
