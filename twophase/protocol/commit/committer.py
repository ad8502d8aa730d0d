"""Phase 2, driver side: the per-epoch entry point a sink calls. Recover, decide, promote.

``Committer.commit`` is what a sink calls once every task of an epoch has
staged, and where one epoch's commit reads top to bottom: promote older PRECOMMITTED
epochs first (I3), decide (the vote: PRECOMMITTED, I1), promote (COMMITTED, I2): the
plan, the delivery to each target and the mark of
[`Promoter.promote`][twophase.protocol.commit.promoter.Promoter.promote], inline or
on the hand-off's thread. It may be called any number of times for the same epoch: a
Spark replay of a decided epoch is detected by the ledger, its new writes are
discarded, and a COMMITTED epoch is never sent again (I4). ``Committer.claim`` is
what a run calls when it starts: it claims the sink and promotes what older runs left
PRECOMMITTED, so that recovery does not wait for a commit that may never come.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from twophase.faults import crash_point
from twophase.logs import lease_fields
from twophase.model import CommitMessage, EpochState, Lease
from twophase.protocol.commit.catchup import CatchUp
from twophase.protocol.commit.handoff import Handoff
from twophase.protocol.commit.promoter import Promoter, PromoteResult
from twophase.protocol.ledger.epoch_ledger import Ledger
from twophase.protocol.ledger.target_ledger import TargetRoster
from twophase.protocol.maintain.autogc import AutoGc
from twophase.protocol.maintain.gc import GarbageCollector

log = logging.getLogger("twophase.protocol.committer")


@dataclass(frozen=True)
class CommitOutcome:
    """What ``commit`` did: the epoch's final state, whether it was a replay, what it recovered."""

    sink_id: str
    epoch: int
    state: EpochState
    replay: bool
    recovered: tuple[int, ...]
    promoted: PromoteResult | None
    # Seconds each step took, in order: ("recover", s), ("decide", s), ("promote", s)
    # (promote: inline only; a handed-off epoch's promotion is not in its commit).
    steps: tuple[tuple[str, float], ...] = ()


class Committer:
    """The driver's per-epoch entry point: recover, decide, promote."""

    def __init__(
        self,
        ledger: Ledger,
        promoter: Promoter,
        gc: GarbageCollector,
        handoff: Handoff | None = None,
        auto_gc: AutoGc | None = None,
        *,
        roster: TargetRoster,
        catch_up: CatchUp,
    ):
        self._ledger = ledger
        self._promoter = promoter
        self._roster = roster  # the configured targets, registered by a query's claim
        self._catch_up = catch_up
        self._gc = gc
        self._handoff = handoff  # background promotion (None: inline)
        self._auto_gc = auto_gc  # collections after commits (None: only `twophase gc`)
        # Leases whose last commit in this process left no epoch PRECOMMITTED: until
        # they decide again, nothing can be pending (deciding for the sink takes
        # their token, I5), so their next commit need not look.
        self._settled: set[Lease] = set()

    def claim(
        self,
        sink_id: str,
        run_id: str,
        query_id: str | None,
        on_promoted: Callable[[PromoteResult], None] | None = None,
        *,
        watch: bool = True,
    ) -> Lease:
        """Begin ``run_id`` on the sink (fencing older runs, I5), then promote under the
        new lease every epoch older runs left PRECOMMITTED, in order (I3).

        So a run delivers what a crash left even when it never commits (an
        available-now query with no new input). Runs on the caller's thread, also
        with background promotion: the claim returns once those epochs are
        COMMITTED, and a query that ends at once has nothing to drain. A failure
        is raised as a commit's recovery raises it (TargetUnavailableError past
        the retry deadline, the epoch left PRECOMMITTED); the run keeps the sink,
        and its first commit, or the next claim, recovers again. This run's own
        epochs are left to its commits (one may be promoting on another thread).
        ``watch`` (a query's run, not an operator's command) registers the
        configured targets (a new one starts at the next epoch; a target's changed
        URL is recorded and warned of) and, once the claim recovered, watches for
        lagging targets' backlogs in this process. An operator's command never
        creates a target: it delivers to the configured targets the sink has.
        """
        lease = self._ledger.begin_run(sink_id, run_id, query_id)
        crash_point("after_begin_run", sink_id)
        if watch:
            self._roster.register(lease)
        recovered = self._recover(lease, on_promoted, inherited=True)
        if watch:
            self._catch_up.watch(lease)
        if recovered:
            log.info(
                "sink %s: run %s recovered epochs %s at its claim",
                sink_id,
                run_id,
                [r.epoch for r in recovered],
                extra=lease_fields(lease),
            )
        return lease

    def recover(
        self, lease: Lease, on_promoted: Callable[[PromoteResult], None] | None = None
    ) -> list[PromoteResult]:
        """Promote every PRECOMMITTED epoch of the sink, in increasing epoch order (I3).

        Stops at the first failure (a later epoch never overtakes an earlier
        one). ``on_promoted`` is called after each epoch, for progress.
        """
        return self._recover(lease, on_promoted, inherited=False)

    def _recover(
        self,
        lease: Lease,
        on_promoted: Callable[[PromoteResult], None] | None,
        inherited: bool,
    ) -> list[PromoteResult]:
        """Recover the pending epochs (``inherited``: only those of other runs) under
        the sink's recovery lock. Nothing pending, the common case, takes no lock."""
        other_than = lease.run_id if inherited else None
        if not self._ledger.pending(lease.sink_id, other_than=other_than):
            return []
        results: list[PromoteResult] = []
        with self._ledger.recovering(lease) as held:
            # Again under the lock: a recovery that held it may have promoted them.
            for epoch in self._ledger.pending(lease.sink_id, other_than=other_than):
                # The lock checked before every request, as the lease is (I3).
                results.append(self._promoter.promote(lease, epoch, guard=held))
                if on_promoted is not None:
                    on_promoted(results[-1])
        return results

    def commit(self, lease: Lease, epoch: int, messages: Sequence[CommitMessage]) -> CommitOutcome:
        """Decide and promote ``epoch`` once all its tasks staged ``messages``.

        With background promotion the epoch is handed off once decided, and
        the outcome is PRECOMMITTED: the next commit of the sink (or
        `drain`) waits for it first, and raises its failure.

        A replayed epoch (already decided by an earlier attempt or run) is
        detected: the new attempt's writes are discarded; a PRECOMMITTED epoch
        is completed from its original writes; a COMMITTED one is skipped.
        Older PRECOMMITTED epochs are promoted first (I3), unless this
        process's previous commit under the same lease left none.
        """
        settled = lease in self._settled
        self._settled.discard(lease)
        if self._handoff is not None:  # the previous epoch first; raises its failure
            self._handoff.wait(lease.sink_id)
        clock = _Steps()
        recovered = () if settled else tuple(r.epoch for r in self.recover(lease))
        clock.lap("recover")
        # decide; then plan, deliver to each target, mark (the promoter's three steps)
        decision = self._ledger.decide(lease, epoch, messages, start_promotion=True)
        crash_point("after_decide", lease.sink_id)
        if decision.replay:
            self._discard_replayed(lease, epoch, decision.state, messages)
        clock.lap("decide")
        promoted = None
        if decision.state == EpochState.PRECOMMITTED and self._handoff is not None:
            self._handoff.hand_off(lease, epoch, decision.plan)
        elif decision.state == EpochState.PRECOMMITTED:
            promoted = self._promoter.promote(lease, epoch, decision.plan)
            clock.lap("promote")
        self._settled.add(lease)
        if self._auto_gc is not None:  # starts a thread when due; never waits, never raises
            self._auto_gc.poke(lease.sink_id)
        state = EpochState.COMMITTED if promoted else decision.state
        return CommitOutcome(
            lease.sink_id, epoch, state, decision.replay, recovered, promoted, clock.steps
        )

    def _discard_replayed(
        self, lease: Lease, epoch: int, state: EpochState, messages: Sequence[CommitMessage]
    ) -> None:
        """Remove a replay's new writes now. They are orphans already (the epoch's decision
        names others), so a failure here only leaves them to GC: it must not fail a
        commit whose epoch is decided and delivered as it should be."""
        try:
            self._gc.discard([m.write_id for m in messages])
        except Exception as exc:
            log.warning(
                "sink %s epoch %d is a replay (%s): its new attempt is left to gc: %s",
                lease.sink_id,
                epoch,
                state,
                exc,
                extra=lease_fields(lease, epoch),
            )
            return
        log.info(
            "sink %s epoch %d is a replay (%s): new attempt discarded",
            lease.sink_id,
            epoch,
            state,
            extra=lease_fields(lease, epoch),
        )

    def drain(self) -> list[PromoteResult]:
        """Wait for the epochs promoting in the background (none when inline); raises
        the first failure, its epoch left PRECOMMITTED."""
        return [] if self._handoff is None else self._handoff.drain()

    def close(self) -> None:
        """Drain, then stop the background threads (promotions, collections, catch-up)."""
        try:
            if self._handoff is not None:
                self._handoff.close()
        finally:
            try:
                if self._auto_gc is not None:
                    self._auto_gc.close()
            finally:
                self._catch_up.close()


class _Steps:
    """The time each step of a commit took, for its log line (where an epoch's time goes,
    without a profiler)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.steps: tuple[tuple[str, float], ...] = ()

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self.steps += ((step, now - self._last),)
        self._last = now
