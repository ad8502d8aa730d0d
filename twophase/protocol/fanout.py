"""Phase 2 for a sink with several targets: promote an epoch to every caught-up target at
once, and mark it COMMITTED once ``min_targets`` of them hold it.

``FanOutPromoter.promote`` sends the epoch's fixed point set (I1) to each
target that is caught up ([`Place`][twophase.protocol.targets.Place]), each
over its own lanes, on a thread per target. A target that fails keeps being
retried by the commit only while fewer than ``min_targets`` targets have the
epoch, and for at most ``target_deadline`` per round after that: then it is
left *lagging* and the catch-up worker ([`twophase.protocol.catchup`][twophase.protocol.catchup])
delivers its backlog, oldest first. If fewer than ``min_targets`` take the
epoch before ``influx_retry_deadline``, the commit fails as with one target
and the epoch stays PRECOMMITTED. Each target's delivery is recorded
(``TargetLedger.delivered``) before the mark, so a promotion run again after
a crash skips the targets that already hold the epoch (I4 makes re-sending
harmless anyway) and delivers to the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from twophase.errors import TARGET_FAILURES, InfluxUnavailableError
from twophase.faults import crash_point
from twophase.logs import lease_fields
from twophase.model import EpochPlan, Lease
from twophase.protocol.catchup import CatchUp, TargetPromoters
from twophase.protocol.ledger import Ledger
from twophase.protocol.promoter import Promoter, PromoteResult
from twophase.protocol.targets import Place, TargetLedger

__all__ = ["FanOutPromoter"]

log = logging.getLogger("twophase.protocol.fanout")

_REFUSED_WAIT_S = 1.0  # a target that refuses at once waits this long between rounds


class FanOutPromoter:
    """Promotes each decided epoch to every caught-up target of the sink; marks it
    COMMITTED once ``min_targets`` hold it. Idempotent like
    [`Promoter`][twophase.protocol.promoter.Promoter]."""

    def __init__(
        self,
        ledger: Ledger,
        targets: TargetLedger,
        promoters: Sequence[TargetPromoters],
        catch_up: CatchUp,
        min_targets: int,
        retry_deadline_s: float,
    ) -> None:
        self._ledger = ledger
        self._targets = targets
        self._promoters = tuple(promoters)
        self._names = [p.name for p in promoters]
        self._catch_up = catch_up
        self._min = min_targets
        self._deadline_s = retry_deadline_s
        self._registered: set[str] = set()

    def promote(self, lease: Lease, epoch: int, plan: EpochPlan | None = None) -> PromoteResult:
        """Send the epoch to every caught-up target that lacks it, at once, then mark it
        COMMITTED. Raises the first target's error when fewer than ``min_targets``
        hold it (the epoch left PRECOMMITTED), and at once what is no target's fault
        (FencedError, a damaged epoch, the staging store's deadline)."""
        self._register(lease.sink_id)
        plan = plan or self._ledger.plan_promotion(lease, epoch)
        places = self._targets.places(lease.sink_id, epoch, self._names)
        held = {p.target: p.has for p in places if p.has is not None}
        due = [t for t in self._promoters if _due(places, t.name)]
        # min_targets of those owed it: a correction is owed to its one target only
        needed = max(1, min(self._min, sum(p.owed for p in places)))
        race = _Race(len(held), needed, time.monotonic() + self._deadline_s)
        outcomes = self._send_all(lease, plan, due, race)
        held |= {name: out for name, out in outcomes.items() if isinstance(out, tuple)}
        failed = {name: out for name, out in outcomes.items() if isinstance(out, Exception)}
        if len(held) < needed:
            error = next(iter(failed.values()), None) or _none_caught_up(plan, places)
            self._ledger.record_error(lease.sink_id, epoch, f"{type(error).__name__}: {error}")
            raise error
        for name, error in failed.items():
            self._targets.lagging(lease.sink_id, name, f"{type(error).__name__}: {error}")
        crash_point("after_promote", lease.sink_id)
        delivered, rejected = next(held[n] for n in self._names if n in held)
        self._ledger.mark_committed(lease, epoch, delivered, rejected)
        crash_point("after_mark", lease.sink_id)
        if len(held) < sum(p.owed for p in places):
            self._catch_up.poke(lease)  # a target without the epoch: its backlog grew
        log.info(
            "sink %s epoch %d committed: in %s of %d targets",
            lease.sink_id,
            epoch,
            ", ".join(n for n in self._names if n in held),
            len(self._names),
            extra=lease_fields(lease, epoch),
        )
        return PromoteResult(lease.sink_id, epoch, delivered, rejected)

    def _send_all(
        self, lease: Lease, plan: EpochPlan, due: Sequence[TargetPromoters], race: _Race
    ) -> dict[str, tuple[int, int] | Exception]:
        """Each due target's outcome: its counts, or the failure that left it. Raises
        the first failure that is no target's fault, once every thread ended."""
        outcomes: dict[str, tuple[int, int] | Exception] = {}
        errors: dict[str, BaseException] = {}

        def run(target: TargetPromoters) -> None:
            try:
                outcomes[target.name] = self._send_one(lease, plan, target, race)
            except BaseException as exc:  # raised below, on the committing thread
                errors[target.name] = exc
                race.stop()

        threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in due[1:]]
        for thread in threads:
            thread.start()
        if due:
            run(due[0])  # the first target on the caller's thread
        for thread in threads:
            thread.join()
        for name in self._names:
            if name in errors:
                raise errors[name]
        return outcomes

    def _send_one(
        self, lease: Lease, plan: EpochPlan, target: TargetPromoters, race: _Race
    ) -> tuple[int, int] | Exception:
        """Deliver the plan to one target in rounds of ``target_deadline``: repeated
        while the others have not yet made ``min_targets``, then given up."""
        check = _stoppable(target.commit.lease_check(lease), race)
        while True:
            try:
                counts = target.commit.deliver(plan, check)
            except TARGET_FAILURES as exc:
                if race.give_up(0 if isinstance(exc, InfluxUnavailableError) else _REFUSED_WAIT_S):
                    return exc
                continue
            self._targets.delivered(lease.sink_id, target.name, plan.epoch, counts, lease.run_id)
            race.won()
            return counts

    def lease_check(self, lease: Lease) -> Callable[[], None]:
        return self._promoters[0].commit.lease_check(lease)

    def send(
        self,
        plan: EpochPlan,
        on_batch: Callable[[int], None] | None = None,
        before_request: Callable[[], None] | None = None,
    ) -> tuple[int, int]:
        """Send the plan again to every target that holds it and every epoch before it,
        in turn (an operator's resend); no state change. A target still lacking it or
        an earlier epoch is left to its catch-up: sent now, it would hold the epoch
        before an older one (I9). Returns the first target's counts ((0, 0): none)."""
        self._register(plan.sink_id)
        after = self._targets.places(plan.sink_id, plan.epoch + 1, self._names)
        ready = {p.target for p in after if p.caught_up}
        sent = [
            t.catch_up.send(plan, on_batch, before_request)
            for t in self._promoters
            if t.name in ready
        ]
        return sent[0] if sent else (0, 0)

    def of(self, name: str) -> Promoter:
        """Target ``name``'s own promoter (full retry deadline): a resend to it alone."""
        return next(t.catch_up for t in self._promoters if t.name == name)

    def claimed(self, lease: Lease, watch: bool = True) -> None:
        """A run claimed the sink and recovered it: record the targets, and (``watch``:
        a query's run) watch for a backlog to deliver for as long as the run commits
        here. An operator's command delivers backlogs on its own thread instead."""
        self._registered.discard(lease.sink_id)  # a new query may follow a reset
        self._register(lease.sink_id)
        if watch:
            self._catch_up.poke(lease)

    def catch_up(self, lease: Lease, names: Sequence[str] | None = None) -> list[tuple[str, int]]:
        """Deliver the backlog of every target (of ``names``) now, on this thread, in
        epoch order; (target, epoch) of each delivered. For ``twophase recover``."""
        self._register(lease.sink_id)
        return self._catch_up.run(lease, names)

    def close(self) -> None:
        self._catch_up.close()

    def _register(self, sink_id: str) -> None:
        if sink_id not in self._registered:
            self._targets.register(sink_id, self._names)
            self._registered.add(sink_id)


class _Race:
    """The targets of one promotion: how many hold the epoch, against how many it needs."""

    def __init__(self, held: int, needed: int, deadline: float) -> None:
        self._held, self._needed, self._deadline = held, needed, deadline
        self._changed = threading.Condition()
        self.stopped = False

    def won(self) -> None:
        with self._changed:
            self._held += 1
            self._changed.notify_all()

    def stop(self) -> None:
        """A target failed with what is no target's fault: the others stop too."""
        with self._changed:
            self.stopped = True
            self._changed.notify_all()

    def give_up(self, wait_s: float) -> bool:
        """After a failed round: True once enough targets hold the epoch (this one is
        left lagging) or the retry deadline passed; waits up to ``wait_s`` first."""
        with self._changed:
            self._changed.wait_for(lambda: self._held >= self._needed or self.stopped, wait_s)
            return self._held >= self._needed or self.stopped or time.monotonic() > self._deadline


def _stoppable(check: Callable[[], None], race: _Race) -> Callable[[], None]:
    def before_request() -> None:
        if race.stopped:
            raise InfluxUnavailableError("stopped: another target's delivery failed")
        check()

    return before_request


def _due(places: Sequence[Place], name: str) -> bool:
    place = next((p for p in places if p.target == name), None)
    return place is not None and place.owed and place.has is None and place.caught_up


def _none_caught_up(plan: EpochPlan, places: Sequence[Place]) -> InfluxUnavailableError:
    behind = ", ".join(p.target for p in places if not p.caught_up)
    return InfluxUnavailableError(
        f"sink {plan.sink_id!r} epoch {plan.epoch}: no target can take it in epoch order "
        f"(catching up: {behind or 'none'}); the epoch stays PRECOMMITTED"
    )
