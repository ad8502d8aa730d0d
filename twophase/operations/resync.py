"""``targets resync``: re-deliver to one target of a sink what staging still retains
of the epochs it lacks, in epoch order, naming the epochs it could not supply because GC
had purged them (a quarantined target, after its server is back)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from twophase.config import TwoPhaseConfig
from twophase.errors import UsageError
from twophase.model import EpochState
from twophase.operations.hooks import (
    SILENT,
    UNFORCED,
    Guard,
    Hooks,
    refuse_if_live,
)
from twophase.operations.target_choice import TARGETS_ENV, target_config
from twophase.protocol.commit.promoter import PromoteResult
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.ledger.target_ledger import QUARANTINED, TargetLedger, TargetState
from twophase.store.views import CLI_RUN_PREFIX, EpochRange, Views
from twophase.wording import epochs_are, name_epochs, plural


@dataclass(frozen=True)
class ResyncReport:
    """What ``targets resync`` did for one target of a sink.

    ``from_epoch`` is the first epoch it re-delivered from (None: the target
    lacked nothing); ``delivered`` the epochs sent to the target, in order;
    ``skipped_purged`` those the target lacked but GC had purged from staging
    (not supplied: the target lacks their points); ``promoted`` the PRECOMMITTED
    epochs the claim promoted first (I3); ``state`` the target's state after;
    ``compacted_through`` the sink's compacted floor when the resync started at or
    below it (the epochs up to it that have no record were not supplied either).
    """

    sink_id: str
    target: str
    from_epoch: int | None
    delivered: tuple[int, ...]
    skipped_purged: tuple[int, ...]
    state: str
    promoted: tuple[PromoteResult, ...] = ()
    compacted_through: int | None = None


def resync(
    config: TwoPhaseConfig,
    sink_id: str,
    target: str,
    from_epoch: int | None = None,
    guard: Guard = UNFORCED,
    hooks: Hooks = SILENT,
) -> ResyncReport:
    """Re-deliver to ``target`` every COMMITTED epoch of the sink from ``from_epoch``
    (default: the first it lacks) that staging retains, in epoch order; the epochs GC
    purged are skipped and named. For a quarantined target after its server is back.

    Claims the sink under a run of its own, as ``recover`` does (refused while a
    live run owns it, unless forced; confirmed through ``hooks``). UsageError when
    the configuration does not name the target, the sink has no such target, or
    ``from_epoch`` is past the first epoch the target lacks (it would skip some) or
    negative. The target ends live once it holds what staging retains, its lag clock
    restarted by the resync (a collection meanwhile does not quarantine it again).
    """
    if from_epoch is not None and from_epoch < 0:
        raise UsageError(f"--from-epoch {from_epoch}: an epoch is 0 or more")
    target_config(config.target, target)
    with TwoPhase.open(config) as tp:
        views = Views(tp.db)
        views.require_sink(sink_id)
        now = _stored(tp.targets, sink_id, target)
        start = _start(now, from_epoch)
        owed = [] if start is None else _committed_from(views, sink_id, start)
        if not owed and not now.lag_corrections:  # nothing to send: no claim
            if now.state == QUARANTINED:  # only made live
                tp.targets.restart(None, sink_id, target, from_epoch)
            return _report(tp, views, sink_id, target, None, 0, ())
        refuse_if_live(views, [sink_id], "targets resync", guard, hooks)
        hooks.confirm(_question(sink_id, target, start, owed, now.lag_corrections))
        promoted: list[PromoteResult] = []
        run = f"{CLI_RUN_PREFIX}{uuid.uuid4()}"
        lease = tp.committer.claim(sink_id, run, None, promoted.append, watch=False)
        mark = views.last_event_id()
        first = tp.targets.restart(lease, sink_id, target, from_epoch)
        caught_up = tp.catch_up.run(lease, [target], quarantined=True)  # corrections too
        for _, error in caught_up.failed:
            raise error
        return _report(tp, views, sink_id, target, first, mark, promoted)


def _stored(ledger: TargetLedger, sink_id: str, target: str) -> TargetState:
    """The sink's row of ``target``; UsageError naming its targets when it has none."""
    states = ledger.states(sink_id)
    found = next((s for s in states if s.target == target), None)
    if found is not None:
        return found
    has = f"its targets: {', '.join(s.target for s in states)}" if states else "none yet"
    raise UsageError(
        f"sink {sink_id!r} has no target {target!r} ({has}); a target is added to a sink "
        f"by running the sink's query with it in {TARGETS_ENV}"
    )


def _start(state: TargetState, from_epoch: int | None) -> int | None:
    """The first epoch to re-deliver: ``from_epoch``, or the first the target lacks.
    Starting past that one would record the epochs between as delivered unsent."""
    if state.first_missing is not None:
        lacks = state.first_missing
    elif state.delivered_epoch is None:
        lacks = state.from_epoch
    else:
        lacks = max(state.delivered_epoch + 1, state.from_epoch)
    if from_epoch is None:
        return state.first_missing
    if from_epoch > lacks:
        raise UsageError(
            f"--from-epoch {from_epoch}: target {state.target!r} of sink {state.sink_id!r} "
            f"lacks the epochs from {lacks} on; starting later would record "
            f"{name_epochs(list(range(lacks, from_epoch)))} as delivered without sending "
            f"them (use --from-epoch {lacks} or lower)"
        )
    return from_epoch


def _committed_from(views: Views, sink_id: str, first: int) -> list[tuple[int, bool]]:
    """(epoch, purged) of the sink's COMMITTED epochs from ``first`` on, in order."""
    epochs = views.epochs(sink_id, EpochRange(first=first))
    return [(e.epoch, e.purged_at is not None) for e in epochs if e.state == EpochState.COMMITTED]


def _question(
    sink_id: str,
    target: str,
    start: int | None,
    owed: Sequence[tuple[int, bool]],
    corrections: int,
) -> str:
    epochs = [e for e, _ in owed]
    purged = [e for e, gone in owed if gone]
    lost = (
        f" {epochs_are(purged)} purged from staging by GC: they cannot be supplied, and the "
        "target will lack their points."
        if purged
        else ""
    )
    what = []
    if corrections:
        what.append(f"the {plural(corrections, 'correction')} it lacks")
    if epochs:
        what.append(
            f"the {plural(len(epochs), 'COMMITTED epoch')} from epoch {start} on "
            f"({name_epochs(epochs)})"
        )
    return (
        f"Re-deliver to target {target!r} of sink {sink_id!r} {', then '.join(what)}, in "
        f"order?{lost} This claims the sink: a query running on it is fenced."
    )


def _report(
    tp: TwoPhase,
    views: Views,
    sink_id: str,
    target: str,
    first: int | None,
    mark: int,
    promoted: Sequence[PromoteResult],
) -> ResyncReport:
    """What the resync did, read back from the store: the target's cursor moved over
    every COMMITTED epoch from ``first``, each delivered, or skipped as purged (an
    event each; the driver's own catch-up may have delivered some meanwhile)."""
    after = _stored(tp.targets, sink_id, target)
    if first is None:
        return ResyncReport(sink_id, target, None, (), (), after.state, tuple(promoted))
    skipped = views.target_skips(sink_id, target, mark)
    cursor = after.delivered_epoch
    delivered = [
        epoch
        for epoch, _ in _committed_from(views, sink_id, first)
        if cursor is not None and epoch <= cursor and epoch not in skipped
    ]
    floor = views.compacted_through(sink_id)
    below = floor if floor is not None and first <= floor else None
    return ResyncReport(
        sink_id,
        target,
        first,
        tuple(delivered),
        tuple(skipped),
        after.state,
        tuple(promoted),
        below,
    )
