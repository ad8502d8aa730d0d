"""Phase 2, driver side: promote decided epochs to InfluxDB, recover, commit.

``Promoter.promote`` streams one PRECOMMITTED epoch's fixed point set to
InfluxDB and marks it COMMITTED. ``Committer.commit`` is what a sink calls
once every task of an epoch has staged: recover older PRECOMMITTED epochs
(I3), decide (the vote), promote. Both may be called any number of times for
the same epoch: InfluxDB overwrites identical points, so re-sending a fixed
point set changes nothing (I4), and a COMMITTED epoch is never re-sent.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from twophase.errors import PermanentError, TwoPhaseError
from twophase.faults import crash_point
from twophase.ledger import EpochPlan, Lease, Ledger
from twophase.schema import PRECOMMITTED
from twophase.sender import BatchSender, batches
from twophase.staging import PROMOTE, CommitMessage, DeadLetter, LineChecksum, StagedReader, Stager

log = logging.getLogger("twophase.committer")

# (index of the write in the plan, seq, line)
_Staged = tuple[int, int, str]


@dataclass(frozen=True)
class PromoteResult:
    sink_id: str
    epoch: int
    delivered: int
    rejected: int


@dataclass(frozen=True)
class CommitOutcome:
    """What ``commit`` did: the epoch's final state, whether it was a replay, what it recovered."""

    sink_id: str
    epoch: int
    state: str
    replay: bool
    recovered: tuple[int, ...]
    promoted: PromoteResult | None


class Promoter:
    """Sends one decided epoch to InfluxDB and marks it COMMITTED.

    Idempotent: the epoch's point set is fixed (I1) and sent in the same
    order each time; a crash anywhere leaves the epoch PRECOMMITTED and the
    next ``promote`` re-sends it whole. Rejected points become dead letters
    (once each, however often promotion runs). Raises InfluxUnavailableError
    when InfluxDB stays unreachable past the retry deadline; the epoch then
    stays PRECOMMITTED for a later recovery.
    """

    def __init__(
        self,
        ledger: Ledger,
        reader: StagedReader,
        sender: BatchSender,
        batch_points: int = 5000,
        batch_bytes: int = 4 * 1024 * 1024,
    ):
        self._ledger = ledger
        self._reader = reader
        self._sender = sender
        self._batch_points = batch_points
        self._batch_bytes = batch_bytes

    def promote(self, lease: Lease, epoch: int) -> PromoteResult:
        plan = self._ledger.plan_promotion(lease, epoch)
        try:
            delivered, rejected = self.send(plan)
        except TwoPhaseError as exc:
            self._ledger.record_error(lease.sink_id, epoch, f"{type(exc).__name__}: {exc}")
            raise
        crash_point("after_promote")
        self._ledger.mark_committed(lease, epoch, delivered, rejected)
        crash_point("after_mark")
        log.info(
            "sink %s epoch %d committed: %d delivered, %d rejected",
            lease.sink_id,
            epoch,
            delivered,
            rejected,
        )
        return PromoteResult(lease.sink_id, epoch, delivered, rejected)

    def _staged(self, plan: EpochPlan) -> Iterator[_Staged]:
        return itertools.chain.from_iterable(
            ((index, seq, line) for seq, line in self._reader.lines(write.write_id))
            for index, write in enumerate(plan.writes)
        )

    def send(
        self, plan: EpochPlan, on_batch: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        """Send a plan's fixed point set once, in its fixed order; no state change.

        Returns (delivered, rejected). Rejections become dead letters (once
        each). ``on_batch`` gets the running count of points sent, for progress.
        Raises PermanentError if the lines read back are not the decided ones
        (I1). Used by :meth:`promote` and by replay of COMMITTED epochs.
        """
        sums = [LineChecksum() for _ in plan.writes]
        counts = [0] * len(plan.writes)
        delivered = rejected = 0
        for batch in batches(
            self._staged(plan),
            self._batch_points,
            self._batch_bytes,
            size=lambda item: len(item[2]) + 1,
        ):
            rejects = self._sender.send([line for _, _, line in batch])
            self._reader.add_dead_letters([_dead_letter(plan, batch[i], why) for i, why in rejects])
            for index, _, line in batch:
                sums[index].add(line)
                counts[index] += 1
            delivered += len(batch) - len(rejects)
            rejected += len(rejects)
            if on_batch is not None:
                on_batch(delivered + rejected)
            crash_point("promote_batch")
        _check_unchanged(plan, sums, counts)
        return delivered, rejected


def _dead_letter(plan: EpochPlan, item: _Staged, reason: str) -> DeadLetter:
    index, seq, line = item
    return DeadLetter(
        plan.sink_id,
        plan.epoch,
        plan.writes[index].write_id,
        seq,
        PROMOTE,
        f"InfluxDB rejected the point: {reason}",
        line,
    )


def _check_unchanged(plan: EpochPlan, sums: Sequence[LineChecksum], counts: Sequence[int]) -> None:
    """I1: what was read back is exactly what was staged and decided."""
    for write, digest, count in zip(plan.writes, sums, counts, strict=True):
        if count != write.points or digest.hexdigest() != write.checksum:
            raise PermanentError(
                f"sink {plan.sink_id!r} epoch {plan.epoch}: staged points of write "
                f"{write.write_id} changed after the decision ({count} read, {write.points} "
                "staged); the epoch's state is left as it was for an operator to inspect"
            )


class Committer:
    """The driver's per-epoch entry point: recover, decide, promote."""

    def __init__(self, ledger: Ledger, promoter: Promoter, stager: Stager):
        self._ledger = ledger
        self._promoter = promoter
        self._stager = stager

    def recover(
        self, lease: Lease, on_promoted: Callable[[PromoteResult], None] | None = None
    ) -> list[PromoteResult]:
        """Promote every PRECOMMITTED epoch of the sink, in increasing epoch order (I3).

        Stops at the first failure (a later epoch never overtakes an earlier
        one). ``on_promoted`` is called after each epoch, for progress.
        """
        results = []
        for epoch in self._ledger.pending(lease.sink_id):
            results.append(self._promoter.promote(lease, epoch))
            if on_promoted is not None:
                on_promoted(results[-1])
        return results

    def commit(self, lease: Lease, epoch: int, messages: Sequence[CommitMessage]) -> CommitOutcome:
        """Decide and promote ``epoch`` once all its tasks staged ``messages``.

        A replayed epoch (already decided by an earlier attempt or run) is
        detected: the new attempt's writes are discarded; a PRECOMMITTED epoch
        is completed from its original writes; a COMMITTED one is skipped.
        """
        recovered = tuple(r.epoch for r in self.recover(lease))
        decision = self._ledger.decide(lease, epoch, messages)
        crash_point("after_decide")
        if decision.replay:
            self._stager.discard([m.write_id for m in messages])
            log.info(
                "sink %s epoch %d is a replay (%s): new attempt discarded",
                lease.sink_id,
                epoch,
                decision.state,
            )
        promoted = None
        if decision.state == PRECOMMITTED:
            promoted = self._promoter.promote(lease, epoch)
        state = "COMMITTED" if promoted else decision.state
        return CommitOutcome(lease.sink_id, epoch, state, decision.replay, recovered, promoted)
