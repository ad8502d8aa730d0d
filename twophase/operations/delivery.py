"""Operations that send to or read from InfluxDB: recover, resend, requeue, verify."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twophase.config import TwoPhaseConfig
from twophase.errors import PermanentError
from twophase.influx.api import resolve_api
from twophase.influx.http import tls_of
from twophase.influx.query import query_v1
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
from twophase.operations.verify import Verifier, VerifyReport
from twophase.protocol.promoter import PromoteResult
from twophase.protocol.reader import StagedReader
from twophase.protocol.requeue import EVERY_LETTER, RequeueFilter, Requeuer, RequeueSelection
from twophase.protocol.resend import Resender, ResendPlan, ResentEpoch, plan_resend
from twophase.protocol.runtime import TwoPhase
from twophase.store.database import Database
from twophase.store.views import CLI_RUN_PREFIX, EpochRange, Views
from twophase.wording import epochs_are


@dataclass(frozen=True)
class RecoverReport:
    """The epochs recover promoted, in the order it promoted them."""

    recovered: tuple[PromoteResult, ...]


@dataclass(frozen=True)
class ResendReport:
    """The epochs a resend sent, and those it left out (aborted, past retention)."""

    sink_id: str
    resent: tuple[ResentEpoch, ...]
    skipped_aborted: tuple[int, ...]
    skipped_purged: tuple[int, ...]


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
        refuse_if_live(views, list(work), "recover", guard, hooks)
        total = _points_pending(views, work)
        results: list[PromoteResult] = []

        def on_promoted(result: PromoteResult) -> None:
            results.append(result)
            sent = sum(r.delivered + r.rejected for r in results)
            note = f"{result.sink_id}#{result.epoch}"
            hooks.progress(Progress("recover", "points", sent, total, note))

        for sink in work:
            # A claim under a run of its own promotes what is pending, read again under
            # the new lease: the fenced run may have promoted some meanwhile.
            tp.committer.claim(sink, f"{CLI_RUN_PREFIX}{uuid.uuid4()}", None, on_promoted)
    return RecoverReport(tuple(results))


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
    (:mod:`twophase.protocol.requeue`). Claims the sink like ``recover`` (refused while a
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
        lease = tp.committer.claim(sink_id, f"{CLI_RUN_PREFIX}{uuid.uuid4()}", None, earlier.append)
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


_API_NAMES = {"v2": "2.x", "v3": "InfluxDB 3"}


def resend(
    config: TwoPhaseConfig,
    sink_id: str,
    selection: EpochRange | None = None,
    guard: Guard = UNFORCED,
    hooks: Hooks = SILENT,
) -> ResendReport:
    """Send the retained points of COMMITTED epochs again, in increasing order.

    ``selection`` None means every retained COMMITTED epoch (epochs past
    retention are then left out and reported, not refused). Takes the sink
    under a run of its own, as ``recover`` does but without promoting what is
    pending (refused while a live run owns it, unless forced): a query that
    claims it back meanwhile stops the resend (FencedError).
    """
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
        lease = tp.ledger.begin_run(sink_id, f"{CLI_RUN_PREFIX}{uuid.uuid4()}", None)
        Resender(tp.db, tp.promoter).resend(lease, plan, actor(), on_epoch)
    return ResendReport(sink_id, tuple(done), plan.skipped_aborted, plan.skipped_purged)


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
) -> VerifyReport:
    """Compare what the store says was delivered with what InfluxDB holds (1.x API)."""
    influx = resolve_api(config.influx)
    if influx.api != "v1":
        raise PermanentError(
            "verify reads InfluxDB back with InfluxQL through the 1.x /query API; with the "
            f"{_API_NAMES.get(influx.api, influx.api)} API (TWOPHASE_INFLUX_API={influx.api})"
            " verification is not supported"
        )

    def query(statement: str) -> list[dict[str, Any]]:
        timeout = max(influx.timeout_s, 30.0)
        password = influx.password
        return query_v1(
            influx.url,
            influx.database,
            statement,
            influx.username,
            password,
            timeout,
            tls=tls_of(influx),
        )

    def progress(label: str, unit: str, done: int, total: int) -> None:
        hooks.progress(Progress(label, unit, done, total))

    with Database(config.staging) as db:
        views = Views(db)
        views.require_sink(sink_id)
        epochs = views.select_epochs(sink_id, selection or EpochRange())
        verifier = Verifier(views, StagedReader(db), query, influx.retention_policy)
        return verifier.verify(sink_id, epochs, progress)
