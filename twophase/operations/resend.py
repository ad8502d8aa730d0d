"""``resend``: the retained points of COMMITTED epochs sent again, to every target or
to one (``--target``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from twophase.config import TwoPhaseConfig
from twophase.errors import StateError
from twophase.model import EpochState
from twophase.operations.hooks import (
    SILENT,
    UNFORCED,
    Guard,
    Hooks,
    Progress,
    actor,
    refuse_if_live,
)
from twophase.operations.resender import Resender, ResendPlan, ResentEpoch, plan_resend
from twophase.operations.target_choice import (
    require_sink_target,
    target_config,
    warn_unknown_targets,
)
from twophase.protocol.commit.runtime import TwoPhase
from twophase.store.views import CLI_RUN_PREFIX, EpochRange, Views
from twophase.wording import epochs_are


@dataclass(frozen=True)
class ResendReport:
    """The epochs a resend sent, and those it left out (aborted, past retention)."""

    sink_id: str
    resent: tuple[ResentEpoch, ...]
    skipped_aborted: tuple[int, ...]
    skipped_purged: tuple[int, ...]


def resend(
    config: TwoPhaseConfig,
    sink_id: str,
    selection: EpochRange | None = None,
    guard: Guard = UNFORCED,
    hooks: Hooks = SILENT,
    target: str | None = None,
) -> ResendReport:
    """Send the retained points of COMMITTED epochs again, in increasing order.

    ``selection`` None means every retained COMMITTED epoch (epochs past
    retention are then left out and reported, not refused). Takes the sink
    under a run of its own, as ``recover`` does but without promoting what is
    pending (refused while a live run owns it, unless forced): a query that
    claims it back meanwhile stops the resend (FencedError). ``target`` sends to
    that configured target only (UsageError for an unknown one, or one the
    sink does not have: never registered, or removed by ``targets remove``);
    without it, to every target of the configuration.
    """
    only = None if target is None else target_config(config.target, target)
    with TwoPhase.open(config) as tp:
        views = Views(tp.db)
        views.require_sink(sink_id)
        if only is not None:  # configured, but perhaps removed from the sink
            require_sink_target(tp.targets, sink_id, only.name)
        chosen = views.select_epochs(sink_id, selection or EpochRange())
        plan = plan_resend(sink_id, chosen, everything=selection is None)
        refuse_if_live(views, [sink_id], "resend", guard, hooks)
        _warn_about_left_out(views, plan, hooks)
        done: list[ResentEpoch] = []

        def on_epoch(epoch: ResentEpoch) -> None:
            done.append(epoch)
            sent = sum(e.points_sent + e.points_rejected for e in done)
            hooks.progress(Progress("resend", "points", sent, plan.points, f"epoch {epoch.epoch}"))

        # A run of its own, fencing the sink's previous run, but no recovery: what is
        # pending stays for the query's claim or `twophase recover`, and is not sent
        # here unasked and unreported.
        if only is not None:
            _refuse_behind(tp, sink_id, only.name, max(plan.epochs))
        warn_unknown_targets(tp, sink_id, hooks)
        _warn_about_behind(tp, sink_id, only.name if only else None, hooks)
        lease = tp.ledger.begin_run(sink_id, f"{CLI_RUN_PREFIX}{uuid.uuid4()}", None)
        chosen_targets = [d for d in tp.deliveries.values() if only is None or d.name == only.name]
        resent = Resender(tp.db, tp.ledger, tp.targets, chosen_targets).resend(
            lease, plan, actor(), on_epoch
        )
    return ResendReport(sink_id, tuple(resent), plan.skipped_aborted, plan.skipped_purged)


def _refuse_behind(tp: TwoPhase, sink_id: str, target: str, last: int) -> None:
    """StateError when ``target`` still lacks an epoch up to ``last``: re-sent now, a
    later epoch would land before an older one it is still owed (I9)."""
    state = next((s for s in tp.targets.states(sink_id) if s.target == target), None)
    if state is not None and state.first_missing is not None and state.first_missing <= last:
        raise StateError(
            f"sink {sink_id!r}: target {target!r} still lacks epoch {state.first_missing} "
            f"({state.state}); deliver its backlog first (`twophase recover --sink {sink_id}`, "
            f"or `twophase targets resync {target} --sink {sink_id}`); nothing was sent"
        )


def _warn_about_behind(tp: TwoPhase, sink_id: str, only: str | None, hooks: Hooks) -> None:
    """Warn of each target a resend leaves alone: one that lacks an earlier epoch or a
    correction gets nothing re-sent past it (its catch-up delivers in order)."""
    for state in tp.targets.states(sink_id):
        if state.lag_epochs and (only is None or state.target == only):
            hooks.warn(
                f"target {state.target!r} lacks {state.lag_epochs} COMMITTED epochs or "
                "corrections: nothing is re-sent to it past the first it lacks; deliver its "
                f"backlog first (`twophase recover --sink {sink_id}`, or `twophase targets "
                f"resync {state.target} --sink {sink_id}`)"
            )


def _warn_about_left_out(views: Views, plan: ResendPlan, hooks: Hooks) -> None:
    if plan.skipped_purged:
        hooks.warn(f"{epochs_are(plan.skipped_purged)} past retention: not re-sent")
    after = views.epochs(plan.sink_id, EpochRange(first=plan.epochs[-1] + 1))
    last = max((e.epoch for e in after if e.state == EpochState.COMMITTED), default=None)
    if last is not None:
        hooks.warn(
            f"epochs after {plan.epochs[-1]} (up to {last}) are not re-sent: where they "
            "rewrote points of the re-sent epochs (update output mode) the target now holds "
            "the older values; "
            f"re-send through epoch {last} to restore them (check with `twophase verify`)"
        )
