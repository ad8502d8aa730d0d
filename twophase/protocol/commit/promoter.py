"""Phase 2, driver side: promote a decided epoch to the sink's targets, then mark it
COMMITTED once ``min_targets`` of them hold it.

Every sink has targets: one (``target_url``, named ``default``) or several
(``targets``); one target is the case N = 1 of the same path.
[`Promoter.promote`][twophase.protocol.commit.promoter.Promoter.promote] sends the
epoch's fixed point set (I1) to every target it is owed, each through its
[`TargetDelivery`][twophase.protocol.deliver.delivery.TargetDelivery] on a thread of
its own. A caught-up target gets it at once; several caught-up ones share one
read of it, checked once ([`shared_read`][twophase.protocol.deliver.delivery.shared_read]),
each taking it at its own pace. A lagging target is caught up
first, in epoch order ([`CatchUp.below`][twophase.protocol.commit.catchup.CatchUp.below]),
but only while the caught-up ones cannot make ``min_targets`` by themselves:
the sink makes progress whenever ``min_targets`` targets are reachable,
whatever their lag (I10). Where each target stands is read again every
round, so a target that catches up meanwhile takes part.

A target that fails is retried by the commit, in rounds of ``target_deadline``,
while fewer than ``min_targets`` hold the epoch and its server has answered
within ``target_retry_deadline``; once enough hold it, it is left *lagging*
and the catch-up ([`twophase.protocol.commit.catchup`][twophase.protocol.commit.catchup])
delivers its backlog. When every target the epoch is owed to is needed (one
target, or ``min_targets`` of all), there is nothing to choose between: the
target gets the whole ``target_retry_deadline`` in one round. Fewer than
``min_targets`` at the end: the commit fails and the epoch stays
PRECOMMITTED. The targets' deliveries are recorded in the mark's transaction
(one commit per epoch); when the commit fails, those that took the epoch are
recorded by themselves, so that the repeat skips them (I4 makes re-sending
harmless anyway). After a commit that every target took, the next epoch of
the same lease does not read where the targets stand: nothing but its own
commits moves them meanwhile (a claim would fence it), and recording a
delivery checks the target's order again.

A correction (epoch < 0) is owed to its one target (or, naming none, to
every target). Owed to some targets only, it gates nothing: it is marked
COMMITTED after one round, and a target that could not take it holds it in
its backlog, so a correction owed to a target that is down never blocks the
others. Owed to every target, it needs ``min_targets`` as an epoch does.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from twophase.errors import (
    TARGET_FAILURES,
    StateError,
    TargetOrderError,
    TargetUnavailableError,
    TwoPhaseError,
)
from twophase.faults import crash_point
from twophase.logs import lease_fields
from twophase.model import EpochPlan, Lease
from twophase.protocol.commit.catchup import CatchUp
from twophase.protocol.deliver.delivery import (
    Pulse,
    SharedRead,
    TargetDelivery,
    before_each,
    shared_read,
)
from twophase.protocol.ledger.epoch_ledger import Ledger
from twophase.protocol.ledger.target_ledger import LIVE, QUARANTINED, Place, TargetLedger

__all__ = ["PromoteResult", "Promoter"]

log = logging.getLogger("twophase.protocol.promoter")

_REFUSED_WAIT_S = 1.0  # a target that refuses at once waits this long between rounds


@dataclass(frozen=True)
class PromoteResult:
    """A COMMITTED epoch: the points the first target holding it (in configured order)
    acknowledged and those it refused."""

    sink_id: str
    epoch: int
    delivered: int
    rejected: int


def _nothing() -> None:
    """No check of the caller's own: a commit's promotion's catch-up."""


@dataclass(frozen=True)
class _Plan:
    """One promotion's plan: the decided epoch, where its targets stand, the race between
    them, those it is due to (in configured order), what runs before each of their
    requests, and the read they share (several caught-up targets) or None."""

    decided: EpochPlan
    places: list[Place]
    race: _Race
    due: tuple[TargetDelivery, ...]
    check: Callable[[], None]
    guard: Callable[[], None] | None
    shared: SharedRead | None


class Promoter:
    """Promotes decided epochs to the sink's targets and marks them COMMITTED.

    Idempotent: the epoch's point set is fixed (I1) and sent in the same
    order each time; a crash anywhere leaves the epoch PRECOMMITTED and the
    next ``promote`` re-sends it to every target without a delivery of it.
    Raises the first target's failure when fewer than ``min_targets`` hold
    the epoch (TargetUnavailableError past the retry deadline: the epoch stays
    PRECOMMITTED for a later recovery), and at once what is no target's fault
    (FencedError, a damaged epoch, the staging store's deadline)."""

    def __init__(
        self,
        ledger: Ledger,
        targets: TargetLedger,
        deliveries: Sequence[TargetDelivery],
        catch_up: CatchUp,
        min_targets: int,
        retry_deadline_s: float,
    ) -> None:
        self._ledger = ledger
        self._targets = targets
        self._deliveries = tuple(deliveries)
        self._names = [d.name for d in deliveries]
        self._catch_up = catch_up
        self._min = min_targets
        self._deadline_s = retry_deadline_s
        # Leases whose last promotion here every target took: that epoch, those targets.
        self._settled: dict[Lease, tuple[int, tuple[str, ...]]] = {}

    def promote(
        self,
        lease: Lease,
        epoch: int,
        plan: EpochPlan | None = None,
        guard: Callable[[], None] | None = None,
    ) -> PromoteResult:
        """Send the epoch to every target it is owed that lacks it, at once, then mark it
        COMMITTED. ``plan`` is the attempt the decision already started
        ([`Ledger.decide`][twophase.protocol.ledger.epoch_ledger.Ledger.decide] with
        ``start_promotion``); without it an attempt is started here. ``guard`` runs before every
        request, after the lease's check, and stops the promotion by raising (a recovery's: its lock
        still held).

        Reads top to bottom: plan (which targets are due, the shared read), deliver to
        each target (in parallel), mark (each target's delivery recorded, the epoch
        COMMITTED); each step calls down into the layer that owns it."""
        planned = self._plan(lease, plan or self._ledger.plan_promotion(lease, epoch), guard)
        outcomes = self._deliver_each(lease, planned)
        return self._mark(lease, planned, outcomes)

    def _plan(self, lease: Lease, decided: EpochPlan, guard: Callable[[], None] | None) -> _Plan:
        """Where the targets stand, which are due, how many are needed; one read of the
        epoch for the caught-up ones when there are several (one reads on its own, as a
        lagging one does)."""
        places = self._places(lease, decided.epoch)
        pulse = Pulse()
        race = _Race.of(places, self._min, decided.epoch, self._deadline_s, pulse)
        due = tuple(d for d in self._deliveries if race.is_due(d.name))
        caught_up = [d for d in due if race.was_caught_up(d.name)]
        fenced = self._ledger.watch(lease)
        check = before_each(pulse.check, fenced, guard)  # stopped? fenced? the caller's own
        shared = shared_read(decided, caught_up) if len(caught_up) > 1 else None
        return _Plan(decided, places, race, due, check, guard, shared)

    def _deliver_each(
        self, lease: Lease, planned: _Plan
    ) -> dict[str, tuple[int, int] | TwoPhaseError]:
        """Each due target's outcome, delivered on a thread of its own (the first on the
        caller's): its counts, or the failure that left it (or nothing: a lagging target
        the others made do without). Raises the first failure that is no target's fault,
        once every thread ended."""
        outcomes: dict[str, tuple[int, int] | TwoPhaseError] = {}
        errors: dict[str, BaseException] = {}

        def run(target: TargetDelivery) -> None:
            try:
                outcome = self._deliver_one(lease, planned, target)
            except BaseException as exc:  # raised below, on the committing thread
                errors[target.name] = exc
                planned.race.stop()
                return
            if outcome is not None:
                outcomes[target.name] = outcome

        due = planned.due
        threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in due[1:]]
        for thread in threads:
            thread.start()
        try:
            if due:
                run(due[0])
            for thread in threads:
                thread.join()
        finally:
            if planned.shared is not None:
                planned.shared.close()
        for name in self._names:
            if name in errors:
                raise errors[name]
        return outcomes

    def _deliver_one(
        self, lease: Lease, planned: _Plan, target: TargetDelivery
    ) -> tuple[int, int] | TwoPhaseError | None:
        """Deliver the plan to one target, round after round (where it stands read
        again each round): caught up, it gets the epoch; lagging, it is caught up
        first while the others cannot make ``min_targets`` without it (None once they
        have). Given up once enough targets hold the epoch or its server stayed
        silent past the retry deadline. A caught-up target's first round takes the
        read ``shared`` with the others; a later one reads on its own."""
        race = planned.race
        rounds = race.rounds_for(target.name)
        while True:
            try:
                if not self._caught_up(lease, planned, target.name, rounds):
                    return None
                counts = target.deliver(
                    planned.decided,
                    planned.check,
                    round_only=rounds,
                    on_batch=race.pulse.beat,
                    shared=planned.shared,
                )
            except TARGET_FAILURES as exc:
                # Without rounds the target had the whole retry deadline: its failure is
                # the commit's, at once (a refused credential fails fast, as it should).
                if not rounds or race.give_up(target.name, exc):
                    return exc
                continue
            race.won(target.name)
            return counts

    def _caught_up(self, lease: Lease, planned: _Plan, name: str, rounds: bool) -> bool:
        """Whether ``name`` holds every epoch it is owed below the plan's epoch, once
        caught up if the others need it to (False: they made it without). Read again from
        the second round on: the target may have been caught up meanwhile."""
        race, epoch = planned.race, planned.decided.epoch
        if race.first_round(name):
            caught_up = race.was_caught_up(name)
        else:
            (place,) = self._targets.places(lease.sink_id, epoch, [name])
            caught_up = place.caught_up
        if caught_up:
            return True
        if not race.wait_for_need(name):
            return False
        return self._catch_up.below(
            lease,
            name,
            epoch,
            race.over,
            round_only=rounds,
            progress=race.pulse.beat,
            guard=planned.guard or _nothing,
        )

    def _mark(
        self, lease: Lease, planned: _Plan, outcomes: dict[str, tuple[int, int] | TwoPhaseError]
    ) -> PromoteResult:
        """Mark the epoch COMMITTED once enough targets hold it, recording the new
        deliveries in the mark's transaction; fewer: record them by themselves and raise."""
        race, epoch = planned.race, planned.decided.epoch
        new = {n: out for n, out in outcomes.items() if isinstance(out, tuple)}
        held = race.held | new
        failed = {n: out for n, out in outcomes.items() if isinstance(out, TwoPhaseError)}
        if len(held) < race.needed or (not held and epoch >= 0):
            self._settled.pop(lease, None)
            self._record(lease, epoch, new)  # a repeat skips them (I4 makes re-sending safe)
            error = race.failure(planned.decided, failed)
            self._ledger.record_error(lease.sink_id, epoch, f"{type(error).__name__}: {error}")
            raise error
        for name, error in failed.items():
            self._targets.lagging(lease.sink_id, name, f"{type(error).__name__}: {error}")
        crash_point("after_promote", lease.sink_id)
        delivered, rejected = next((held[n] for n in self._names if n in held), (0, 0))
        held = self._mark_committed(lease, epoch, (delivered, rejected), new, race.needed)
        held |= race.held
        crash_point("after_mark", lease.sink_id)
        self._remember(lease, epoch, planned.places, held)
        if len(held) < race.owed:
            self._catch_up.watch(lease)  # a target without the epoch: its backlog grew
        log.info(
            "sink %s epoch %d committed: %d delivered, %d rejected, in %s of %d targets",
            lease.sink_id,
            epoch,
            delivered,
            rejected,
            ", ".join(n for n in self._names if n in held) or "none",
            race.owed,
            extra=lease_fields(lease, epoch),
        )
        return PromoteResult(lease.sink_id, epoch, delivered, rejected)

    def _mark_committed(
        self,
        lease: Lease,
        epoch: int,
        counts: tuple[int, int],
        new: dict[str, tuple[int, int]],
        needed: int,
    ) -> dict[str, tuple[int, int]]:
        """Mark the epoch COMMITTED, recording the deliveries in the mark's transaction
        (one commit per epoch). A target whose delivery cannot be recorded in its
        order (its cursor moved meanwhile) is left lagging and the mark made without
        it, while enough others hold the epoch. The deliveries recorded."""
        while True:
            record = functools.partial(self._targets.record, lease=lease, epoch=epoch, counts=new)
            try:
                self._ledger.mark_committed(lease, epoch, *counts, within=record)
                return new
            except TargetOrderError as exc:
                self._settled.pop(lease, None)
                if exc.target not in new or len(new) - 1 < needed:
                    raise
                new = {n: c for n, c in new.items() if n != exc.target}
                self._targets.lagging(lease.sink_id, exc.target, f"TargetOrderError: {exc}")

    def _places(self, lease: Lease, epoch: int) -> list[Place]:
        """Where the targets stand for ``epoch``. After this process committed epoch
        N under this lease and every target took it, epoch N+1 finds them so without
        asking: Spark commits its batches one after the other, so no other process
        committed between them (a later epoch than N+1 asks: another process of the
        query may have committed the ones between); nothing else moves a sink's
        targets back but a claim, which fences the lease (a resync, a requeue, a new
        target), and a catch-up only moves lagging ones on. Recording the delivery
        checks the target's order again anyway."""
        last, names = self._settled.get(lease, (None, ()))
        if last is not None and epoch == last + 1:
            return [Place(n, LIVE, owed=True, has=None, caught_up=True) for n in names]
        places = self._targets.places(lease.sink_id, epoch, self._names)
        if not places:
            raise StateError(
                f"sink {lease.sink_id!r} has none of this configuration's targets "
                f"({', '.join(self._names)}): a query's run registers its targets when it "
                "claims the sink (TwoPhase.claim); the epoch stays PRECOMMITTED"
            )
        return places

    def _remember(
        self, lease: Lease, epoch: int, places: Sequence[Place], held: dict[str, Any]
    ) -> None:
        if epoch >= 0 and all(p.owed and p.target in held for p in places):
            self._settled[lease] = (epoch, tuple(p.target for p in places))
        else:
            self._settled.pop(lease, None)

    def _record(self, lease: Lease, epoch: int, new: dict[str, tuple[int, int]]) -> None:
        """Record each delivery in a transaction of its own (the commit failed): best
        effort, so that the commit's own failure is what is raised; a delivery left
        unrecorded is sent again by the repeat (I4)."""
        for name, counts in new.items():
            try:
                self._targets.delivered(lease, name, epoch, counts)
            except TwoPhaseError as exc:
                log.warning(
                    "sink %s epoch %d: the delivery to target %s was not recorded: %s",
                    lease.sink_id,
                    epoch,
                    name,
                    exc,
                    extra=lease_fields(lease, epoch),
                )


class _Race:
    """The targets of one promotion: how many hold the epoch, against how many it needs;
    which are caught up and still in the running; the retry deadline."""

    def __init__(
        self,
        places: Sequence[Place],
        needed: int,
        owed: int,
        deadline_s: float,
        pulse: Pulse,
    ) -> None:
        self.held = {p.target: p.has for p in places if p.has is not None}
        self.needed, self.owed = needed, owed
        self._due = {
            p.target for p in places if p.owed and p.has is None and p.state != QUARANTINED
        }
        # caught-up targets not yet failed a round: while they can make `needed` without
        # the lagging ones, those wait
        self._hopeful = {p.target for p in places if p.target in self._due and p.caught_up}
        self._caught_up = frozenset(p.target for p in places if p.caught_up)
        self._quarantined = {p.target for p in places if p.owed and p.state == QUARANTINED}
        self._rounds: dict[str, int] = {}
        self._count = len(self.held)
        self._deadline_s = deadline_s
        # what the targets' deliveries share from their threads: a server's last answer
        # (with the last target that took the epoch, here), the stop
        self.pulse = pulse
        self._won_at = time.monotonic()
        self._changed = threading.Condition()

    @classmethod
    def of(
        cls,
        places: Sequence[Place],
        min_targets: int,
        epoch: int,
        deadline_s: float,
        pulse: Pulse | None = None,
    ) -> _Race:
        owed = [p for p in places if p.owed]
        needed = min(min_targets, len(owed))
        if epoch < 0 and len(owed) < len(places):
            # a correction owed to some targets only gates nothing: the others go on,
            # and a target that cannot take it has it in its backlog
            needed = 0
        return cls(places, needed, len(owed), deadline_s, pulse or Pulse())

    def is_due(self, name: str) -> bool:
        return name in self._due

    def first_round(self, name: str) -> bool:
        """True the first time it is asked for ``name`` (its thread's first round)."""
        rounds = self._rounds[name] = self._rounds.get(name, 0) + 1
        return rounds == 1

    def was_caught_up(self, name: str) -> bool:
        return name in self._caught_up

    def rounds_for(self, name: str) -> bool:
        """Whether ``name`` is delivered in rounds of ``target_deadline``: only when the
        epoch could be committed without it (one target, or every owed one needed:
        the whole retry deadline in one round)."""
        return self._count + len(self._due) > self.needed

    def won(self, name: str) -> None:
        with self._changed:
            self._count += 1
            self._hopeful.discard(name)  # held: no longer one that may yet make it
            self._won_at = time.monotonic()
            self._changed.notify_all()

    def stop(self) -> None:
        """A target failed with what is no target's fault: the others stop too."""
        with self._changed:
            self.pulse.stop()
            self._changed.notify_all()

    @property
    def stopped(self) -> bool:
        return self.pulse.stopped

    def enough(self) -> bool:
        return self._count >= self.needed or self.stopped

    def over(self) -> bool:
        """Enough targets hold the epoch, or none answered for the retry deadline: a
        lagging target's catch-up (or its wait for its lock) stops."""
        with self._changed:
            return self.enough() or self._silent()

    def wait_for_need(self, name: str) -> bool:
        """A lagging target waits while the caught-up ones may make ``needed`` without
        it; True once it is needed, False once they made it."""
        with self._changed:
            # Bounded: should a wake-up be missed, the target tries rather than wait on.
            self._changed.wait_for(
                lambda: self.enough() or self._count + len(self._hopeful - {name}) < self.needed,
                self._deadline_s,
            )
            return not self.enough()

    def give_up(self, name: str, exc: TwoPhaseError) -> bool:
        """After a failed round: True once enough targets hold the epoch (this one is
        left lagging) or no server answered for the retry deadline; waits a little
        first for a target that refused at once."""
        wait_s = 0 if isinstance(exc, TargetUnavailableError) else _REFUSED_WAIT_S
        with self._changed:
            self._hopeful.discard(name)
            self._changed.notify_all()
            self._changed.wait_for(self.enough, wait_s)
            return self.enough() or self._silent()

    def _silent(self) -> bool:
        """No server answered, nor a target took the epoch, for the retry deadline."""
        since_won = time.monotonic() - self._won_at
        return min(self.pulse.silent_s(), since_won) > self._deadline_s

    def failure(self, plan: EpochPlan, failed: dict[str, TwoPhaseError]) -> TwoPhaseError:
        """What the commit raises when fewer than ``needed`` targets hold the epoch."""
        if failed and self.owed == 1:
            return next(iter(failed.values()))  # one target: its own error, as it is
        errors = "; ".join(f"{name}: {error}" for name, error in failed.items())
        if self._quarantined:
            names = ", ".join(sorted(self._quarantined))
            errors += f"{'; ' if errors else ''}quarantined (`twophase targets resync`): {names}"
        return TargetUnavailableError(
            f"sink {plan.sink_id!r} epoch {plan.epoch}: {self._count} of {self.owed} targets "
            f"hold it, {self.needed} needed (min_targets); no target answered for "
            f"{self._deadline_s:g}s (target_retry_deadline), each tried in rounds of "
            f"target_deadline: {errors or 'no target can take it'}; the epoch stays PRECOMMITTED"
        )
