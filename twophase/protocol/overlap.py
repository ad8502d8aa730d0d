"""Phase 2 begun during phase 1 (``promotion = overlap``): each write a task of the running
epoch commits is sent to the targets while the other tasks still stage.

Inline promotion sends nothing before the decision, so an epoch's time is its staging
and then its sending. With ``overlap`` the driver starts
[`Overlap.start`][twophase.protocol.overlap.Overlap.start] before the staging job: a
thread reads the writes this run's tasks commit for the epoch (a task commits a write
every few chunks: [`Stager.stage_writes`][twophase.protocol.stager.Stager.stage_writes])
and delivers each to every caught-up target of a kind that overwrites. Once the tasks
are done, [`Sending.finish`][twophase.protocol.overlap.Sending.finish] ends it and
returns what was sent; the commit decides as always (I1: only the writes the messages
name count) and sends each target only the decided writes it does not hold yet. The
epoch is COMMITTED before the commit returns, as inline.

What it asks of the query: a replay of a batch gives the same points. A point is sent
before its epoch is decided, so a run that dies after sending and before deciding has
put points in InfluxDB that only the replay's decision names; they count once because
the replay stages the same points again (Spark's replayable sources with
deterministic batches: a micro-batch's partition gives the same data on a replay), and
InfluxDB overwrites a point sent again. A replay that differs would leave the first
run's points beside its own. Likewise a task attempt that staged a write and then
failed (a retry of the task stages the same points again). Within an epoch writes are
sent in the order they were staged, not the decision's: an epoch should not hold two
different points with the same measurement, tag set and time.

Nothing is sent early for an epoch already decided (a replay), while an older epoch is
pending (I3: the commit recovers it first), to a target that is lagging or
quarantined, or to a transactional kind (one transaction per epoch, which the commit
opens). Every request is fenced (I5). A failure of a target stops the early sending to
it: the commit sends it the whole epoch. Nothing here changes an epoch's state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from twophase.errors import TwoPhaseError
from twophase.faults import crash_point
from twophase.logs import lease_fields
from twophase.model import EpochPlan, Lease, WriteRef
from twophase.protocol.delivery import TargetDelivery
from twophase.protocol.ledger import Ledger
from twophase.protocol.targets import LIVE, TargetLedger
from twophase.store.database import Database

__all__ = ["Group", "Overlap", "Sending", "Sent"]

log = logging.getLogger("twophase.protocol.overlap")

# How often the thread looks for newly committed writes while it has nothing to send: a
# write of four chunks takes a task some 20-50 ms to stage, and a look is one indexed
# query of a fraction of a millisecond.
_POLL_S = 0.02

_MAY_SEND = (
    "SELECT NOT EXISTS (SELECT 1 FROM twophase_epochs WHERE sink_id = %(s)s"
    "  AND (epoch = %(e)s OR state = 'PRECOMMITTED'))"
    " AND coalesce(s.compacted_through < %(e)s, true)"
    " FROM twophase_sinks s WHERE s.sink_id = %(s)s"
)
# The epoch's writes not seen yet, in the order they were staged (a task's writes one
# after the other), each with whether this run staged it: only those are sent; the others
# (a crashed run's) are only seen, so that the commit discards them once decided.
_NEW_WRITES = (
    "SELECT write_id::text, points, checksum, run_id IS NOT DISTINCT FROM %(r)s"
    " FROM twophase_writes WHERE sink_id = %(s)s AND epoch = %(e)s"
    " AND NOT (write_id::text = ANY(%(seen)s)) ORDER BY staged_at, write_id"
)


Group = tuple[str, ...]  # the write ids of one early delivery, in the order they were sent


@dataclass(frozen=True)
class Sent:
    """What an epoch's overlap did before its decision: for each target, the groups of
    writes it acknowledged (each sent as one delivery), with their (delivered, rejected)
    counts; and every write of the epoch it saw (the commit discards those its decision
    does not name: orphans, I1)."""

    by_target: Mapping[str, Mapping[Group, tuple[int, int]]] = field(default_factory=dict)
    seen: frozenset[str] = frozenset()

    @property
    def writes(self) -> int:
        """How many writes reached at least one target before the decision."""
        return len({w for groups in self.by_target.values() for g in groups for w in g})

    def remaining(self, target: str, plan: EpochPlan) -> tuple[EpochPlan, tuple[int, int]]:
        """The part of ``plan`` ``target`` still lacks, and the counts of what it holds
        already. A group with a write the decision does not name is not counted (its
        counts cannot be split): its decided writes are sent again, which overwrites."""
        decided = {w.write_id for w in plan.writes}
        groups = self.by_target.get(target, {})
        whole = [(g, c) for g, c in groups.items() if decided.issuperset(g)]
        held = {w for g, _ in whole for w in g}
        rest = tuple(w for w in plan.writes if w.write_id not in held)
        counts = (sum(c[0] for _, c in whole), sum(c[1] for _, c in whole))
        return EpochPlan(plan.sink_id, plan.epoch, rest), counts

    def undecided(self, plan: EpochPlan) -> list[str]:
        """The writes seen that the decision does not name."""
        return sorted(self.seen - {w.write_id for w in plan.writes})


NOTHING = Sent()


class Overlap:
    """Starts the early sending of running epochs. One role: deliver committed writes of
    an undecided epoch to the caught-up targets that overwrite, and say which."""

    def __init__(
        self,
        db: Database,
        ledger: Ledger,
        targets: TargetLedger,
        deliveries: Sequence[TargetDelivery],
        poll_s: float = _POLL_S,
    ) -> None:
        self._db = db
        self._ledger = ledger
        self._targets = targets
        self._deliveries = tuple(d for d in deliveries if not d.transactional)
        self.poll_s = poll_s

    def start(self, lease: Lease, epoch: int) -> Sending:
        """Begin sending ``epoch``'s writes of ``lease``'s run as they commit, on a thread."""
        sending = Sending(self, lease, epoch)
        sending.thread.start()
        return sending

    def ready(self, lease: Lease, epoch: int) -> list[TargetDelivery]:
        """The targets ``epoch`` may go to before its decision: none while it is decided
        (a replay) or an older epoch is pending (I3); else the live, caught-up targets
        that overwrite and do not hold it."""
        if not self._deliveries:
            return []
        with self._db.transaction() as cur:
            cur.execute(_MAY_SEND, {"s": lease.sink_id, "e": epoch})
            row = cur.fetchone()
        if row is None or not row[0]:
            return []
        places = self._targets.places(lease.sink_id, epoch, [d.name for d in self._deliveries])
        ready = {
            p.target for p in places if p.state == LIVE and p.owed and p.caught_up and p.has is None
        }
        return [d for d in self._deliveries if d.name in ready]

    def new_writes(
        self, lease: Lease, epoch: int, seen: Collection[str]
    ) -> list[tuple[WriteRef, bool]]:
        """The epoch's writes not in ``seen`` in the order they were staged, each with
        whether ``lease``'s run staged it."""
        values = {"s": lease.sink_id, "e": epoch, "r": lease.run_id, "seen": sorted(seen)}
        with self._db.transaction() as cur:
            cur.execute(_NEW_WRITES, values)
            return [(WriteRef(w, int(p), c), bool(own)) for w, p, c, own in cur.fetchall()]

    def fence(self, lease: Lease) -> Callable[[], None]:
        """The check each request runs (I5): FencedError once a newer run holds the sink."""
        return self._ledger.watch(lease)


class Sending:
    """One epoch's early sending, on its own thread until ``finish``."""

    def __init__(self, overlap: Overlap, lease: Lease, epoch: int) -> None:
        self._overlap = overlap
        self._lease = lease
        self._epoch = epoch
        self._stop = threading.Event()
        self._done = threading.Condition()  # notified each time a look's writes are done
        self._by_target: dict[str, dict[Group, tuple[int, int]]] = {}
        self._seen: set[str] = set()
        self._ended = False
        self.thread = threading.Thread(
            target=self._run, name=f"twophase-overlap-{epoch}", daemon=True
        )

    def wait_for(self, write_id: str, timeout_s: float) -> bool:
        """Wait until ``write_id`` was seen, and sent if it could be; False after
        ``timeout_s`` or once the sending ended without it. For a driver that paces its
        own staging (a test's): a Spark job's tasks never wait for it."""
        with self._done:
            return (
                self._done.wait_for(lambda: write_id in self._seen or self._ended, timeout_s)
                and write_id in self._seen
            )

    def finish(self) -> Sent:
        """Stop looking for writes, let the one being sent arrive, and say what was sent.
        Never raises: what could not be sent early, the commit sends."""
        self._stop.set()
        self.thread.join()
        return Sent({t: dict(w) for t, w in self._by_target.items()}, frozenset(self._seen))

    def _run(self) -> None:
        try:
            self._send_while_staging()
        except Exception as exc:  # the commit sends what this did not
            log.warning(
                "sink %s epoch %d: early sending stopped (the commit sends the rest): %s",
                self._lease.sink_id,
                self._epoch,
                exc,
                extra=lease_fields(self._lease, self._epoch),
            )
        finally:
            with self._done:
                self._ended = True
                self._done.notify_all()

    def _send_while_staging(self) -> None:
        targets = self._overlap.ready(self._lease, self._epoch)
        self._by_target = {t.name: {} for t in targets}
        check = self._overlap.fence(self._lease)
        while targets and not self._stop.is_set():
            found = self._overlap.new_writes(self._lease, self._epoch, self._seen)
            own = tuple(write for write, mine in found if mine)
            if own and not self._stop.is_set():
                targets = self._send(own, targets, check)
            with self._done:
                self._seen.update(w.write_id for w, _ in found)
                self._done.notify_all()
            if not found:
                self._stop.wait(self._overlap.poll_s)

    def _send(
        self, writes: tuple[WriteRef, ...], targets: list[TargetDelivery], check: Callable[[], None]
    ) -> list[TargetDelivery]:
        """Deliver the writes found in one look to each target in turn, as one plan (its
        lanes kept busy across them); the targets that took them (one that failed is left
        to the commit, which sends it the whole epoch)."""
        plan = EpochPlan(self._lease.sink_id, self._epoch, writes)
        group = tuple(w.write_id for w in writes)
        kept = []
        for target in targets:
            try:
                counts = target.deliver(plan, check, round_only=True)
            except TwoPhaseError as exc:
                self._by_target.pop(target.name, None)
                log.info(
                    "sink %s epoch %d: target %s left out of early sending: %s",
                    self._lease.sink_id,
                    self._epoch,
                    target.name,
                    exc,
                    extra=lease_fields(self._lease, self._epoch),
                )
                continue
            self._by_target[target.name][group] = counts
            kept.append(target)
        crash_point("overlap_send", self._lease.sink_id)
        return kept
