"""Operations that send to or read from InfluxDB: recover, resend, requeue, verify, and
targets resync.

With several InfluxDB targets (``TWOPHASE_TARGETS``),
[`target_config`][twophase.operations.delivery.target_config] picks one
by name (``verify --target``, ``resend --target``), and
[`resync`][twophase.operations.delivery.resync] re-delivers to one
target what staging still retains of the epochs it lacks, in epoch order, naming the
epochs it could not supply because GC had purged them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from twophase.config import DEFAULT_TARGET, InfluxConfig, TargetConfig, TwoPhaseConfig, env_name
from twophase.errors import StateError, UsageError
from twophase.influx.api import make_writer, resolve_api
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
from twophase.operations.store import stored_states
from twophase.operations.verify import Query, Verifier, VerifyReport
from twophase.protocol.fanout import FanOutPromoter
from twophase.protocol.promoter import EpochPromoter, PromoteResult
from twophase.protocol.reader import StagedReader
from twophase.protocol.requeue import EVERY_LETTER, RequeueFilter, Requeuer, RequeueSelection
from twophase.protocol.resend import Resender, ResendPlan, ResentEpoch, plan_resend
from twophase.protocol.runtime import TwoPhase
from twophase.protocol.targets import QUARANTINED, TargetLedger, TargetState
from twophase.store.database import Database
from twophase.store.views import CLI_RUN_PREFIX, EpochInfo, EpochRange, Views
from twophase.wording import epochs_are, name_epochs, plural

_TARGETS, _URL = env_name("targets"), env_name("influx_url")


@dataclass(frozen=True)
class CaughtUp:
    """An epoch recover delivered to a lagging target (or, purged, skipped)."""

    sink_id: str
    target: str
    epoch: int


@dataclass(frozen=True)
class RecoverReport:
    """The epochs recover promoted, in the order it promoted them; then, with several
    targets, the epochs it delivered to lagging targets: (sink, target, epoch)."""

    recovered: tuple[PromoteResult, ...]
    caught_up: tuple[CaughtUp, ...] = ()


@dataclass(frozen=True)
class ResendReport:
    """The epochs a resend sent, and those it left out (aborted, past retention)."""

    sink_id: str
    resent: tuple[ResentEpoch, ...]
    skipped_aborted: tuple[int, ...]
    skipped_purged: tuple[int, ...]


@dataclass(frozen=True)
class TargetVerifyReport:
    """``verify`` of one InfluxDB target of the sink."""

    target: str
    report: VerifyReport


def recover(
    config: TwoPhaseConfig,
    sink_id: str | None = None,
    guard: Guard = UNFORCED,
    hooks: Hooks = SILENT,
) -> RecoverReport:
    """Promote every PRECOMMITTED epoch of one sink (or all), in epoch order (I3).

    Claims each sink with work under a run of its own, which fences the
    sink's previous run (I5): refused while a live run owns it, unless forced.
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
        for sink in sorted(set(work) | behind):
            # A claim under a run of its own promotes what is pending, read again under
            # the new lease: the fenced run may have promoted some meanwhile.
            run = f"{CLI_RUN_PREFIX}{uuid.uuid4()}"
            lease = tp.committer.claim(sink, run, None, on_promoted, watch=False)
            if isinstance(tp.promoter, FanOutPromoter):  # then each target's backlog
                caught_up += [CaughtUp(sink, t, e) for t, e in tp.promoter.catch_up(lease)]
    return RecoverReport(tuple(results), tuple(caught_up))


def _behind(tp: TwoPhase, sinks: Sequence[str]) -> set[str]:
    """The sinks with a target that lacks COMMITTED epochs (not quarantined: those are
    resync's), when this configuration names several targets."""
    if not isinstance(tp.promoter, FanOutPromoter):
        return set()
    states = tp.targets.states()
    return {
        t.sink_id
        for t in states
        if t.sink_id in sinks and t.lag_epochs and t.state != "quarantined"
    }


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


def _points_pending(views: Views, work: Mapping[str, Sequence[int]]) -> int:
    return sum(
        e.points_staged
        for sink, pending in work.items()
        for e in views.epochs(sink, EpochRange(pending[0], pending[-1]))
        if e.state == EpochState.PRECOMMITTED
    )


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
    that configured target's InfluxDB only (UsageError for an unknown one);
    without it, to every target of the configuration.
    """
    only = None if target is None else target_config(config.influx, target)
    with TwoPhase.open(config) as tp:
        views = Views(tp.db)
        views.require_sink(sink_id)
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
        lease = tp.ledger.begin_run(sink_id, f"{CLI_RUN_PREFIX}{uuid.uuid4()}", None)
        promoter = tp.promoter if only is None else _target_promoter(tp, only)
        Resender(tp.db, promoter).resend(lease, plan, actor(), on_epoch)
    return ResendReport(sink_id, tuple(done), plan.skipped_aborted, plan.skipped_purged)


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


def _target_promoter(tp: TwoPhase, target: TargetConfig) -> EpochPromoter:
    """The promoter of one target (what ``resend --target`` sends through: the same
    batching, checks and dead letters as a promotion's)."""
    if isinstance(tp.promoter, FanOutPromoter):
        return tp.promoter.of(target.name)
    return tp.promoter  # one target: the sink's own


def _warn_about_left_out(views: Views, plan: ResendPlan, hooks: Hooks) -> None:
    if plan.skipped_purged:
        hooks.warn(f"{epochs_are(plan.skipped_purged)} past retention: not re-sent")
    after = views.epochs(plan.sink_id, EpochRange(first=plan.epochs[-1] + 1))
    last = max((e.epoch for e in after if e.state == EpochState.COMMITTED), default=None)
    if last is not None:
        hooks.warn(
            f"epochs after {plan.epochs[-1]} (up to {last}) are not re-sent: where they "
            "rewrote points of the re-sent epochs (update output mode) InfluxDB now holds "
            "the older values; "
            f"re-send through epoch {last} to restore them (check with `twophase verify`)"
        )


def verify(
    config: TwoPhaseConfig,
    sink_id: str,
    selection: EpochRange | None = None,
    hooks: Hooks = SILENT,
    target: str | None = None,
) -> VerifyReport:
    """Compare what the store says was delivered with what InfluxDB holds (1.x API):
    the one InfluxDB server's, or the named ``target``'s (required with several
    targets; [`verify_targets`][twophase.operations.delivery.verify_targets] verifies them all)."""
    if target is None and config.influx.targets:
        names = ", ".join(t.name for t in config.influx.targets)
        raise UsageError(
            f"the configuration names several targets ({names}): name the one to verify, "
            "or verify them all (verify_targets)"
        )
    (one,) = verify_targets(config, sink_id, selection, hooks, None if target is None else [target])
    return one.report


def verify_targets(
    config: TwoPhaseConfig,
    sink_id: str,
    selection: EpochRange | None = None,
    hooks: Hooks = SILENT,
    targets: Sequence[str] | None = None,
) -> tuple[TargetVerifyReport, ...]:
    """[`verify`][twophase.operations.delivery.verify] for each of ``targets`` (default: every
    configured target) in turn,
    against its own InfluxDB. A target of a sink with several is verified on the
    epochs it is owed (from the one it was added at); those it still lacks
    (lagging, quarantined) are verified too, reported missing, with a note."""
    if targets is None:
        chosen = list(config.influx.named_targets())
    else:
        chosen = [target_config(config.influx, name) for name in targets]
    with contextlib.ExitStack() as opened:
        queries = [(t.name, *_influx_query(t.influx, opened)) for t in chosen]
        return _verify_each(config, sink_id, selection, hooks, queries)


def _verify_each(
    config: TwoPhaseConfig,
    sink_id: str,
    selection: EpochRange | None,
    hooks: Hooks,
    queries: Sequence[tuple[str, Query, str | None]],
) -> tuple[TargetVerifyReport, ...]:
    with Database(config.staging) as db:
        views = Views(db)
        views.require_sink(sink_id)
        epochs = views.select_epochs(sink_id, selection or EpochRange())
        rows = {s.target: s for s in stored_states(db, sink_id)}
        reports = []
        for name, query, policy in queries:
            owed, notes = _owed(sink_id, name, epochs, rows.get(name))
            label = f"{name}: " if len(queries) > 1 else ""

            def progress(step: str, unit: str, done: int, total: int, label: str = label) -> None:
                hooks.progress(Progress(label + step, unit, done, total))

            named = name if config.influx.targets else ""  # one target: letters name none
            verifier = Verifier(views, StagedReader(db), query, policy, named)
            report = verifier.verify(sink_id, owed, progress)
            report = dataclasses.replace(report, notes=(*notes, *report.notes))
            reports.append(TargetVerifyReport(name, report))
    return tuple(reports)


def _influx_query(influx: InfluxConfig, opened: contextlib.ExitStack) -> tuple[Query, str | None]:
    """How verify reads one target back (its writer's ``read``: PermanentError at once
    for a store that cannot answer InfluxQL), and its retention policy."""
    writer = make_writer(resolve_api(influx))
    opened.callback(writer.close)
    writer.read("SHOW MEASUREMENTS LIMIT 1")  # fails fast: unsupported, or unreachable
    return writer.read, influx.retention_policy


def _owed(
    sink_id: str, name: str, epochs: Sequence[EpochInfo], state: TargetState | None
) -> tuple[list[EpochInfo], list[str]]:
    """The selected epochs a target is owed (all, for a sink with one target), and notes
    on those left out (before the target was added) and those it still lacks."""
    if state is None:
        return list(epochs), []
    first = state.from_epoch
    before = [e.epoch for e in epochs if 0 <= e.epoch < first]
    owed = [e for e in epochs if e.epoch < 0 or e.epoch >= first]
    notes = []
    if before:
        notes.append(
            f"not verified: {epochs_are(before)} older than target {name!r}, which is owed "
            f"the epochs from {first} on"
        )
    if not owed:
        raise StateError(f"sink {sink_id!r}: nothing to verify in target {name!r}; {notes[0]}")
    cursor = state.delivered_epoch
    lacking = [
        e.epoch
        for e in owed
        if e.epoch >= 0
        and e.state == EpochState.COMMITTED
        and e.purged_at is None
        and (cursor is None or e.epoch > cursor)
    ]
    if lacking:
        notes.append(
            f"target {name!r} is {state.state}: {epochs_are(lacking)} not delivered to it "
            "yet, so reported missing (`twophase recover` delivers them; `twophase targets "
            "resync` once it is quarantined)"
        )
    return owed, notes


def target_config(influx: InfluxConfig, name: str) -> TargetConfig:
    """The configured target ``name``; UsageError naming the ones configured."""
    targets = influx.named_targets()
    for target in targets:
        if target.name == name:
            return target
    if not influx.targets:
        raise UsageError(
            f"unknown target {name!r}: this configuration names one InfluxDB server ({_URL}, "
            f"target {DEFAULT_TARGET!r}); a sink's several targets are named by {_TARGETS}"
        )
    known = ", ".join(t.name for t in targets)
    raise UsageError(f"unknown target {name!r}: the configuration ({_TARGETS}) names {known}")


@dataclass(frozen=True)
class ResyncReport:
    """What ``targets resync`` did for one target of a sink.

    ``from_epoch`` is the first epoch it re-delivered from (None: the target
    lacked nothing); ``delivered`` the epochs sent to the target, in order;
    ``skipped_purged`` those the target lacked but GC had purged from staging
    (not supplied: the target lacks their points); ``promoted`` the PRECOMMITTED
    epochs the claim promoted first (I3); ``state`` the target's state after.
    """

    sink_id: str
    target: str
    from_epoch: int | None
    delivered: tuple[int, ...]
    skipped_purged: tuple[int, ...]
    state: str
    promoted: tuple[PromoteResult, ...] = ()


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
    ``from_epoch`` is past the first epoch the target lacks (it would skip some).
    """
    if not config.influx.targets:
        raise UsageError(
            f"targets resync needs the sink's targets in the configuration: set {_TARGETS} "
            f"(name=URL,...) as the sink's job does (this one names one server, {_URL})"
        )
    target_config(config.influx, target)
    with TwoPhase.open(config) as tp:
        views = Views(tp.db)
        views.require_sink(sink_id)
        now = _stored(tp.targets, sink_id, target)
        start = _start(now, from_epoch)
        owed = [] if start is None else _committed_from(views, sink_id, start)
        if not owed:  # nothing to send: no claim (a quarantined target is only made live)
            if now.state == QUARANTINED:
                tp.targets.restart(sink_id, target, from_epoch)
            return _report(tp, views, sink_id, target, None, 0, ())
        refuse_if_live(views, [sink_id], "targets resync", guard, hooks)
        hooks.confirm(_question(sink_id, target, start, owed))
        promoted: list[PromoteResult] = []
        run = f"{CLI_RUN_PREFIX}{uuid.uuid4()}"
        lease = tp.committer.claim(sink_id, run, None, promoted.append, watch=False)
        mark = views.last_event_id()
        first = tp.targets.restart(sink_id, target, from_epoch)
        if first is not None and isinstance(tp.promoter, FanOutPromoter):
            tp.promoter.catch_up(lease, [target])
        return _report(tp, views, sink_id, target, first, mark, promoted)


def _stored(ledger: TargetLedger, sink_id: str, target: str) -> TargetState:
    """The sink's row of ``target``; UsageError naming its targets when it has none."""
    states = ledger.states(sink_id)
    found = next((s for s in states if s.target == target), None)
    if found is not None:
        return found
    has = (
        f"its targets: {', '.join(s.target for s in states)}"
        if states
        else "it delivers to one InfluxDB server"
    )
    raise UsageError(
        f"sink {sink_id!r} has no target {target!r} ({has}); a target is added to a sink "
        f"by running the sink's query with it in {_TARGETS}"
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
    sink_id: str, target: str, start: int | None, owed: Sequence[tuple[int, bool]]
) -> str:
    epochs = [e for e, _ in owed]
    purged = [e for e, gone in owed if gone]
    lost = (
        f" {epochs_are(purged)} purged from staging by GC: they cannot be supplied, and the "
        "target will lack their points."
        if purged
        else ""
    )
    return (
        f"Re-deliver to target {target!r} the {plural(len(epochs), 'COMMITTED epoch')} of sink "
        f"{sink_id!r} from epoch {start} on ({name_epochs(epochs)}), in order?{lost} This "
        "claims the sink: a query running on it is fenced."
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
    return ResyncReport(
        sink_id, target, first, tuple(delivered), tuple(skipped), after.state, tuple(promoted)
    )
