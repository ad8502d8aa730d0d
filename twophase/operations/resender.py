"""Resend: an operator sends the retained staged points of COMMITTED epochs again
(``twophase resend``).

For when a target lost data a COMMITTED epoch delivered (restored from an old
backup, a measurement dropped by mistake). Re-sending is safe for the same
reason promotion may run twice: an epoch's point set is fixed (I1) and
a target overwrites a point with the same measurement, tag set and timestamp.
Each target takes the epochs in increasing order, so when a later epoch
rewrote a point of an earlier one (update output mode), its value is the one
left standing; and one target after the other, so a resend that fails on one
target (down, slow past its deadline) leaves no other half-way, holding an
earlier epoch's value over a later one's.

Not to be confused with a Spark replay (Spark running a batch again, which
the ledger detects and skips): a resend is an operator's decision. Epoch
states do not change. Each resend is recorded in the epoch's history (event
``resent``). No transaction is held while an epoch is sent (a slow target
would outlast the store's idle limit): the epoch's state and its decided
writes are read in one short transaction, and the decision never changes
after. A GC may purge the epoch meanwhile: the read of its chunks then
finds them gone, which fails the I1 check, and the resend names the purge
(StateError: part of the epoch may have been re-sent) instead of leaving
it half-sent silently. A read that began before the purge is whole (one
snapshot), and so is what it sent.

A resend runs under a lease of its own, checked before every request and
every retry (as a promotion's is): a query that claims the sink meanwhile
fences it, so an old value it re-sends can never land after the query's
newer one (I5).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from twophase.errors import StagingUnavailableError, StateError
from twophase.model import EpochPlan, EpochState, Lease
from twophase.protocol.deliver.delivery import TargetDelivery
from twophase.protocol.deliver.reader import decided_writes
from twophase.protocol.ledger.epoch_ledger import Ledger
from twophase.protocol.ledger.target_ledger import TargetLedger
from twophase.store.database import Database
from twophase.store.views import EpochInfo
from twophase.wording import compact_ranges, epochs_are


@dataclass(frozen=True)
class ResendPlan:
    """What a resend will send, and what it leaves out (and why)."""

    sink_id: str
    epochs: tuple[int, ...]
    points: int
    skipped_aborted: tuple[int, ...]
    skipped_purged: tuple[int, ...]


@dataclass(frozen=True)
class ResentEpoch:
    sink_id: str
    epoch: int
    points_sent: int
    points_rejected: int


def plan_resend(sink_id: str, epochs: Sequence[EpochInfo], everything: bool) -> ResendPlan:
    """Choose the epochs to re-send among ``epochs`` (the selection, in order).

    Refuses (StateError, nothing sent) when an epoch of the selection is
    PRECOMMITTED (recover delivers it), or when an explicitly selected epoch
    is past retention, naming them. With ``everything`` (``--all``) epochs
    past retention are left out and reported instead: they are history.
    """
    pending = [e.epoch for e in epochs if e.state == EpochState.PRECOMMITTED]
    if pending:
        raise StateError(
            f"sink {sink_id!r}: {epochs_are(pending)} PRECOMMITTED (not "
            f"delivered yet): run `twophase recover --sink {sink_id}` first; nothing was sent"
        )
    committed = [e for e in epochs if e.state == EpochState.COMMITTED]
    purged = [e.epoch for e in committed if e.purged_at is not None]
    if purged and not everything:
        raise StateError(
            f"sink {sink_id!r}: {epochs_are(purged)} past retention (their "
            "staged points were purged by GC) and cannot be re-sent; narrow the range to "
            "retained epochs; nothing was sent"
        )
    chosen = [e for e in committed if e.purged_at is None]
    aborted = tuple(e.epoch for e in epochs if e.state == EpochState.ABORTED)
    if not chosen:
        why = f"aborted: {compact_ranges(aborted)}" if aborted else "none is retained"
        raise StateError(f"sink {sink_id!r}: no COMMITTED epoch to re-send ({why})")
    return ResendPlan(
        sink_id,
        tuple(e.epoch for e in chosen),
        sum(e.points_staged for e in chosen),
        aborted,
        tuple(purged),
    )


class Resender:
    """Sends COMMITTED epochs again through the targets' own deliveries: the same
    batching, checks and dead letters as a promotion's."""

    def __init__(
        self,
        db: Database,
        ledger: Ledger,
        targets: TargetLedger,
        deliveries: Sequence[TargetDelivery],
    ):
        self._db = db
        self._ledger = ledger
        self._targets = targets
        self._deliveries = tuple(deliveries)

    def resend(
        self,
        lease: Lease,
        plan: ResendPlan,
        actor: str,
        on_epoch: Callable[[ResentEpoch], None] | None = None,
    ) -> list[ResentEpoch]:
        """Re-send the plan's epochs, one target after the other, each target's in
        increasing order; stop at the first failure.

        A target takes every epoch of the plan before the next target takes any, so a
        failure leaves each other target with all of them re-sent or none: never an
        earlier epoch's value standing over the later epoch's that rewrote it. Each
        epoch goes to every target of the deliveries that holds it and every epoch
        before it; a target still lacking one is left to its catch-up (sent now, it
        would hold the epoch before an older one, I9). Raises what promotion raises
        (TargetUnavailableError after the retry deadline, PermanentError when staged
        points changed after the decision, FencedError once a newer run holds the
        sink than ``lease``) and StateError when an epoch was purged or reset
        meanwhile. Epochs re-sent before a failure stay re-sent (and recorded).
        """
        check = self._ledger.watch(lease)  # one for the whole resend: fenced is final
        epochs = sorted(plan.epochs)
        ready = {epoch: self._ready(plan.sink_id, epoch) for epoch in epochs}
        plans: dict[int, EpochPlan] = {}
        done: dict[int, ResentEpoch] = {}  # counts: the first target's that took it
        for delivery in self._deliveries:
            for epoch in (e for e in epochs if delivery.name in ready[e]):
                if epoch not in plans:
                    plans[epoch] = self._retained(plan.sink_id, epoch)
                resent = ResentEpoch(
                    plan.sink_id, epoch, *self._send(delivery, plans[epoch], check)
                )
                # recorded as it is done: a kill leaves the history of what went before
                self._record(resent, delivery.name, actor)
                if epoch not in done:
                    done[epoch] = resent
                    if on_epoch is not None:
                        on_epoch(resent)
        for epoch in (e for e in epochs if e not in done):  # no target could take it
            self._retained(plan.sink_id, epoch)
            done[epoch] = ResentEpoch(plan.sink_id, epoch, 0, 0)
            self._record(done[epoch], None, actor)
            if on_epoch is not None:
                on_epoch(done[epoch])
        return [done[e] for e in epochs]

    def _ready(self, sink_id: str, epoch: int) -> set[str]:
        """The deliveries' targets owed ``epoch`` that hold it and every epoch before."""
        names = [d.name for d in self._deliveries]
        owed = {p.target for p in self._targets.places(sink_id, epoch, names) if p.owed}
        after = self._targets.places(sink_id, epoch + 1, names)
        return {p.target for p in after if p.caught_up and p.target in owed}

    def _send(
        self, delivery: TargetDelivery, plan: EpochPlan, check: Callable[[], None]
    ) -> tuple[int, int]:
        """One epoch to one target through its delivery's own loop: the same batching and
        order, dead letters recorded once, and the I1 check that the lines read back are
        the decided ones; ``check`` runs before every request and retry."""
        try:
            return delivery.send(plan, before_request=check)
        except Exception as exc:
            self._not_purged_meanwhile(plan.sink_id, plan.epoch, exc)
            raise

    def _record(self, epoch: ResentEpoch, target: str | None, actor: str) -> None:
        """The epoch's ``resent`` event for one target (``None``: no target could take
        it); none once the epoch is gone (reset meanwhile)."""
        detail = (
            f"re-sent {epoch.points_sent} points, {epoch.points_rejected} rejected,"
            f" to {target or 'no target'}"
        )
        with self._db.transaction() as cur:
            cur.execute(
                "INSERT INTO twophase_epoch_events (sink_id, epoch, event, run_id, detail)"
                " SELECT %s, %s, 'resent', %s, %s WHERE EXISTS (SELECT 1 FROM"
                " twophase_epochs WHERE sink_id = %s AND epoch = %s)",
                (epoch.sink_id, epoch.epoch, actor, detail, epoch.sink_id, epoch.epoch),
            )

    def _retained(self, sink_id: str, epoch: int) -> EpochPlan:
        """The epoch's decided writes, read in one short transaction with the check that
        it is COMMITTED and retained (StateError otherwise): the decision never changes
        after, so nothing is held while the epoch is sent."""
        with self._db.transaction() as cur:
            cur.execute(
                "SELECT state, purged_at FROM twophase_epochs WHERE sink_id = %s AND epoch = %s",
                (sink_id, epoch),
            )
            row = cur.fetchone()
            if row is None or row[0] != EpochState.COMMITTED or row[1] is not None:
                now = "not recorded" if row is None else ("purged" if row[1] else row[0])
                raise StateError(f"sink {sink_id!r} epoch {epoch} is {now} now; not re-sent")
            return EpochPlan(sink_id, epoch, decided_writes(cur, sink_id, epoch))

    def _not_purged_meanwhile(self, sink_id: str, epoch: int, failure: Exception) -> None:
        """StateError when GC purged the epoch while it was re-sent (its read then found
        its chunks gone: the target may hold part of it again), from ``failure``. Silent
        when the store cannot tell now: the caller raises ``failure`` itself."""
        try:
            with self._db.transaction() as cur:
                cur.execute(
                    "SELECT purged_at IS NOT NULL FROM twophase_epochs"
                    " WHERE sink_id = %s AND epoch = %s",
                    (sink_id, epoch),
                )
                row = cur.fetchone()
        except StagingUnavailableError:
            return
        if row is None or row[0]:
            raise StateError(
                f"sink {sink_id!r} epoch {epoch} was purged by GC while it was re-sent: "
                "part of it may have been re-sent, not all; its points are no longer "
                f"staged ({failure})"
            ) from failure
