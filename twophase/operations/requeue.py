"""``requeue``: a sink's promote-time dead letters delivered again, once, as
corrections: one per batch of at most ``REQUEUE_LETTERS`` letters and
``REQUEUE_BYTES`` of lines ([`twophase.operations.requeuer`][twophase.operations.requeuer]),
each promoted before the next batch is read."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from twophase.config import TwoPhaseConfig
from twophase.errors import StateError
from twophase.model import Lease
from twophase.operations.hooks import (
    SILENT,
    UNFORCED,
    Guard,
    Hooks,
    Progress,
    refuse_if_live,
)
from twophase.operations.requeuer import (
    EVERY_LETTER,
    RequeueFilter,
    Requeuer,
    RequeueSummary,
)
from twophase.protocol.commit.promoter import PromoteResult
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.ledger.target_ledger import QUARANTINED
from twophase.store.views import CLI_RUN_PREFIX, Views


@dataclass(frozen=True)
class RequeueReport:
    """What a requeue carried (or, dry, would carry) as correction ``-correction`` and
    the ones after it, one per batch (``corrections``, once done).

    ``promoted`` holds the sink's PRECOMMITTED epochs promoted first (I3) and
    then the corrections; ``stage_letters`` rows rejected at staging were left
    alone (they never became points).
    """

    sink_id: str
    dry_run: bool
    correction: int | None
    requeued: int
    from_epochs: tuple[int, ...]
    stage_letters: int
    promoted: tuple[PromoteResult, ...] = ()
    corrections: tuple[int, ...] = ()

    @property
    def results(self) -> tuple[PromoteResult, ...]:
        """The corrections' promotions, once they ran."""
        epochs = {-n for n in self.corrections}
        return tuple(r for r in self.promoted if r.epoch in epochs)

    @property
    def result(self) -> PromoteResult | None:
        """The first correction's promotion, once it ran."""
        epoch = -self.correction if self.correction else None
        return next((r for r in self.promoted if r.epoch == epoch), None)


def requeue(
    config: TwoPhaseConfig,
    sink_id: str,
    chosen: RequeueFilter = EVERY_LETTER,
    dry_run: bool = False,
    guard: Guard = UNFORCED,
    hooks: Hooks = SILENT,
) -> RequeueReport:
    """Deliver the sink's promote-time dead letters again, once, as corrections
    ([`twophase.operations.requeuer`][twophase.operations.requeuer]): a batch at a time, each
    decided and promoted before the next is read. Claims the sink like ``recover``
    (refused while a live run owns it, unless forced); a crash at any step is finished
    by ``recover``, and the letters of the batches not decided yet are left for the
    same command again."""
    with TwoPhase.open(config) as tp:
        views = Views(tp.db)
        views.require_sink(sink_id)
        requeuer = Requeuer(tp.db, tp.stager)
        summary = requeuer.summary(sink_id, chosen)
        if summary.stage_letters:
            hooks.warn(
                f"{summary.stage_letters} rows rejected at staging are not requeued: they"
                " never became points; fix the input and process those rows again"
            )
        if dry_run or not summary.letters:
            return _requeue_report(summary, dry_run)
        _refuse_unreachable_target(tp, summary)
        refuse_if_live(views, [sink_id], "requeue", guard, hooks)
        promoted: list[PromoteResult] = []  # I3: the claim promotes what is pending first
        run = f"{CLI_RUN_PREFIX}{uuid.uuid4()}"
        lease = tp.committer.claim(sink_id, run, None, promoted.append, watch=False)
        summary = requeuer.summary(sink_id, chosen)  # again, under the lease
        carried = _batches(tp, requeuer, lease, summary, chosen, hooks, promoted)
    return _requeue_report(summary, False, promoted, carried)


def _batches(
    tp: TwoPhase,
    requeuer: Requeuer,
    lease: Lease,
    summary: RequeueSummary,
    chosen: RequeueFilter,
    hooks: Hooks,
    promoted: list[PromoteResult],
) -> _Carried:
    """Requeue the summary's letters a batch at a time, each batch a correction decided
    and promoted before the next is read; what was carried."""
    carried = _Carried()
    hooks.progress(Progress("requeue", "points", 0, summary.letters))
    while True:
        batch = requeuer.select(summary.sink_id, chosen, summary.last_id)
        if not batch.ids:
            return carried
        requeuer.decide(lease, batch)
        carried = _Carried(
            (*carried.corrections, batch.correction), carried.letters + len(batch.ids)
        )
        promoted += tp.committer.recover(lease)
        hooks.progress(Progress("requeue", "points", carried.letters, summary.letters))


@dataclass(frozen=True)
class _Carried:
    """The corrections a requeue made, and the letters they carried."""

    corrections: tuple[int, ...] = ()
    letters: int = 0


def _refuse_unreachable_target(tp: TwoPhase, selection: RequeueSummary) -> None:
    """StateError, nothing requeued, when the correction's one target is not one the
    configuration names or is quarantined: the correction would wait for it in its
    backlog for ever (no catch-up delivers to an unconfigured or quarantined target)."""
    name = selection.target
    if not name:
        return  # letters that name no target: owed to every target
    configured = [n for n, _ in tp.roster.targets]
    if name not in configured:
        raise StateError(
            f"sink {selection.sink_id!r}: the letters selected were refused by target "
            f"{name!r}, which this configuration does not name ({', '.join(configured)}); "
            "run the requeue with the sink's targets configured; nothing was requeued"
        )
    state = next((s for s in tp.targets.states(selection.sink_id) if s.target == name), None)
    if state is not None and state.state == QUARANTINED:
        raise StateError(
            f"sink {selection.sink_id!r}: target {name!r} is quarantined; resync it first "
            f"(`twophase targets resync {name} --sink {selection.sink_id}`), then requeue; "
            "nothing was requeued"
        )


def _requeue_report(
    summary: RequeueSummary,
    dry_run: bool,
    promoted: Sequence[PromoteResult] = (),
    carried: _Carried | None = None,
) -> RequeueReport:
    if carried is None:  # dry, or no letter: what it would carry
        carried = _Carried((summary.correction,) if summary.letters else (), summary.letters)
        corrections: tuple[int, ...] = ()
    else:
        corrections = carried.corrections
    return RequeueReport(
        summary.sink_id,
        dry_run,
        carried.corrections[0] if carried.corrections else None,
        carried.letters,
        summary.epochs if carried.letters else (),
        summary.stage_letters,
        tuple(promoted),
        corrections,
    )
