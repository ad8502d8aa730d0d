"""``requeue``: a sink's promote-time dead letters delivered again, once, as a
correction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from twophase.config import TwoPhaseConfig
from twophase.errors import StateError
from twophase.operations.hooks import (
    SILENT,
    UNFORCED,
    Guard,
    Hooks,
    Progress,
    refuse_if_live,
)
from twophase.protocol.promoter import PromoteResult
from twophase.protocol.requeue import EVERY_LETTER, RequeueFilter, Requeuer, RequeueSelection
from twophase.protocol.runtime import TwoPhase
from twophase.protocol.targets import QUARANTINED
from twophase.store.views import CLI_RUN_PREFIX, Views


@dataclass(frozen=True)
class RequeueReport:
    """What a requeue carried (or, dry, would carry) as correction ``-correction``.

    ``promoted`` holds the sink's PRECOMMITTED epochs promoted first (I3) and
    then the correction; ``stage_letters`` rows rejected at staging were left
    alone (they never became points).
    """

    sink_id: str
    dry_run: bool
    correction: int | None
    requeued: int
    from_epochs: tuple[int, ...]
    stage_letters: int
    promoted: tuple[PromoteResult, ...] = ()

    @property
    def result(self) -> PromoteResult | None:
        """The correction's promotion, once it ran."""
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
    """Deliver the sink's promote-time dead letters again, once, as a correction
    ([`twophase.protocol.requeue`][twophase.protocol.requeue]). Claims the sink like ``recover``
    (refused while a
    live run owns it, unless forced); a crash at any step is finished by ``recover``."""
    with TwoPhase.open(config) as tp:
        views = Views(tp.db)
        views.require_sink(sink_id)
        requeuer = Requeuer(tp.db, tp.stager)
        selection = requeuer.select(sink_id, chosen)
        if selection.stage_letters:
            hooks.warn(
                f"{selection.stage_letters} rows rejected at staging are not requeued: they"
                " never became points; fix the input and process those rows again"
            )
        if dry_run or not selection.ids:
            return _requeue_report(selection, dry_run)
        _refuse_unreachable_target(tp, selection)
        refuse_if_live(views, [sink_id], "requeue", guard, hooks)
        earlier: list[PromoteResult] = []  # I3: the claim promotes what is pending first
        run = f"{CLI_RUN_PREFIX}{uuid.uuid4()}"
        lease = tp.committer.claim(sink_id, run, None, earlier.append, watch=False)
        selection = requeuer.select(sink_id, chosen)  # again, under the lease
        if not selection.ids:
            return _requeue_report(selection, False, earlier)
        requeuer.decide(lease, selection)
        hooks.progress(Progress("requeue", "points", 0, len(selection.ids)))
        done = tp.committer.recover(lease)
        hooks.progress(Progress("requeue", "points", len(selection.ids), len(selection.ids)))
    return _requeue_report(selection, False, (*earlier, *done))


def _refuse_unreachable_target(tp: TwoPhase, selection: RequeueSelection) -> None:
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
    selection: RequeueSelection, dry_run: bool, promoted: Sequence[PromoteResult] = ()
) -> RequeueReport:
    return RequeueReport(
        selection.sink_id,
        dry_run,
        selection.correction if selection.ids else None,
        len(selection.ids),
        selection.epochs,
        selection.stage_letters,
        tuple(promoted),
    )
