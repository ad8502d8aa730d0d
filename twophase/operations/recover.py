"""``recover``: promote what is PRECOMMITTED, then deliver every lagging target's
backlog (each target the sink has and the configuration names)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from twophase.config import TwoPhaseConfig
from twophase.model import EpochState
from twophase.operations.hooks import (
    SILENT,
    UNFORCED,
    Guard,
    Hooks,
    Progress,
    refuse_if_live,
)
from twophase.operations.target_choice import warn_unknown_targets
from twophase.protocol.commit.promoter import PromoteResult
from twophase.protocol.commit.runtime import TwoPhase
from twophase.store.views import CLI_RUN_PREFIX, EpochRange, Views


@dataclass(frozen=True)
class CaughtUp:
    """An epoch recover delivered to a lagging target (or, purged, skipped)."""

    sink_id: str
    target: str
    epoch: int


@dataclass(frozen=True)
class StillBehind:
    """A target recover could not catch up (its server still down, say): why."""

    sink_id: str
    target: str
    error: str


@dataclass(frozen=True)
class RecoverReport:
    """The epochs recover promoted, in the order it promoted them; then the epochs it
    delivered to lagging targets, and the targets it could not catch up."""

    recovered: tuple[PromoteResult, ...]
    caught_up: tuple[CaughtUp, ...] = ()
    still_behind: tuple[StillBehind, ...] = ()


def recover(
    config: TwoPhaseConfig,
    sink_id: str | None = None,
    guard: Guard = UNFORCED,
    hooks: Hooks = SILENT,
) -> RecoverReport:
    """Promote every PRECOMMITTED epoch of one sink (or all), in epoch order (I3).

    Claims each sink with work under a run of its own, which fences the
    sink's previous run (I5): refused while a live run owns it, unless forced.
    Then catches up every lagging target it can reach, in epoch order: a target
    that fails is reported (``still_behind``, and a warning) and the others are
    still caught up. A target the configuration names that the sink does not
    have is left alone (an operator's command never creates one), with a warning.
    """
    with TwoPhase.open(config) as tp:
        views = Views(tp.db)
        if sink_id is not None:
            views.require_sink(sink_id)
        sinks = [sink_id] if sink_id is not None else views.sink_ids()
        work = {sink: pending for sink in sinks if (pending := tp.ledger.pending(sink))}
        behind = _behind(tp, sinks)
        refuse_if_live(views, sorted(set(work) | behind), "recover", guard, hooks)
        total = _points_pending(views, work)
        results: list[PromoteResult] = []

        def on_promoted(result: PromoteResult) -> None:
            results.append(result)
            sent = sum(r.delivered + r.rejected for r in results)
            note = f"{result.sink_id}#{result.epoch}"
            hooks.progress(Progress("recover", "points", sent, total, note))

        caught_up: list[CaughtUp] = []
        still_behind: list[StillBehind] = []
        for sink in sorted(set(work) | behind):
            warn_unknown_targets(tp, sink, hooks)
            # A claim under a run of its own promotes what is pending, read again under
            # the new lease: the fenced run may have promoted some meanwhile.
            run = f"{CLI_RUN_PREFIX}{uuid.uuid4()}"
            lease = tp.committer.claim(sink, run, None, on_promoted, watch=False)
            report = tp.catch_up.run(lease)  # then each target's backlog
            caught_up += [CaughtUp(sink, t, e) for t, e in report.delivered]
            for target, error in report.failed:
                hooks.warn(f"sink {sink}: target {target} is still behind: {error}")
                still_behind.append(StillBehind(sink, target, f"{type(error).__name__}: {error}"))
    return RecoverReport(tuple(results), tuple(caught_up), tuple(still_behind))


def _behind(tp: TwoPhase, sinks: Sequence[str]) -> set[str]:
    """The sinks with a configured target that lacks COMMITTED epochs (not quarantined:
    those are resync's)."""
    configured = {name for name, _ in tp.roster.targets}
    return {
        t.sink_id
        for t in tp.targets.states()
        if t.sink_id in sinks
        and t.target in configured  # the others: recover cannot deliver to them
        and t.lag_epochs
        and t.state != "quarantined"
    }


def _points_pending(views: Views, work: Mapping[str, Sequence[int]]) -> int:
    return sum(
        e.points_staged
        for sink, pending in work.items()
        for e in views.epochs(sink, EpochRange(pending[0], pending[-1]))
        if e.state == EpochState.PRECOMMITTED
    )
