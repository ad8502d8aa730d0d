"""Background promotion: a decided epoch is promoted on a thread while the caller goes on.

Flink's two-phase commit sink pre-commits at the checkpoint barrier and commits once the
checkpoint is complete, while the job goes on; committables still pending are committed
again on restart. twophase has the durable half already: a decided epoch is PRECOMMITTED in
PostgreSQL, and every commit and ``twophase recover`` promotes PRECOMMITTED epochs first
(I3). With ``promotion = background`` the committer hands a decided epoch to a
[`Handoff`][twophase.protocol.commit.handoff.Handoff] and returns, so Spark computes the next
micro-batch while this one travels to its targets.

Contracts:

* At most one epoch per sink is in flight: the committer calls `wait`
  before it recovers or decides anything for the sink, so epoch N+1 is never
  decided, let alone promoted, while N is still promoting (I3).
* `wait` returns the promotion's result or raises its error: the query
  fails one micro-batch later than with inline promotion, with the epoch
  still PRECOMMITTED, which the next start or ``twophase recover`` promotes.
* `drain` waits for every sink; `TwoPhase.close` calls it, and so
  does interpreter exit (``concurrent.futures`` joins its threads).
* A crash anywhere leaves the epoch PRECOMMITTED (or COMMITTED): nothing is
  lost, since the promotion is the idempotent `Promoter.promote` (I4).
* A fenced run's promoter starts no request more: as inline, it checks its
  lease before every request and every retry of one (FencedError).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from twophase.faults import crash_point
from twophase.logs import fields, lease_fields
from twophase.model import EpochPlan, Lease
from twophase.protocol.commit.promoter import Promoter, PromoteResult

log = logging.getLogger("twophase.protocol.handoff")
# Sinks promoting at once: a job's points sink and its dead-letter sink. The parts they
# share are thread-safe (a psycopg pool, a urllib3 PoolManager).
_THREADS = 2


class Handoff:
    """Promotes handed-off epochs on threads of its own, one epoch per sink at a time."""

    def __init__(self, promoter: Promoter) -> None:
        self._promoter = promoter
        self._pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="twophase-promote")
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future[PromoteResult]] = {}

    def hand_off(self, lease: Lease, epoch: int, plan: EpochPlan | None) -> None:
        """Start promoting ``epoch`` (decided, PRECOMMITTED) and return at once.

        The sink must have nothing in flight (`wait` first): a second
        hand-off would let two epochs of one sink race (I3)."""
        with self._lock:
            if lease.sink_id in self._in_flight:
                raise RuntimeError(f"sink {lease.sink_id!r}: an epoch is still promoting")
            future = self._pool.submit(self._promoter.promote, lease, epoch, plan)
            self._in_flight[lease.sink_id] = future
        log.debug(
            "sink %s epoch %d handed off", lease.sink_id, epoch, extra=lease_fields(lease, epoch)
        )

    def wait(self, sink_id: str) -> PromoteResult | None:
        """Wait for the sink's promotion in flight: its result, None if there was none.
        Raises the promotion's error (the epoch stays PRECOMMITTED)."""
        with self._lock:
            future = self._in_flight.pop(sink_id, None)
        if future is None:
            return None
        crash_point("drain", sink_id)  # promoting still, or just done
        return future.result()

    def drain(self) -> list[PromoteResult]:
        """Wait for every sink's promotion in flight; raises the first error after all
        have ended (each failed epoch stays PRECOMMITTED)."""
        with self._lock:
            sinks = list(self._in_flight)
        results, errors = [], []
        for sink_id in sinks:
            try:
                result = self.wait(sink_id)
            except Exception as exc:  # every sink ends before the first error is raised
                log.error(
                    "sink %s: background promotion failed: %s", sink_id, exc, extra=fields(sink_id)
                )
                errors.append(exc)
            else:
                if result is not None:
                    results.append(result)
        if errors:
            raise errors[0]
        return results

    def close(self) -> None:
        """Drain, then stop the threads."""
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True)
