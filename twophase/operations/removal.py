"""``targets remove``: decommission a target of a sink -- its cursor, deliveries, dead
letters and the corrections owed to it alone deleted in one transaction
([`twophase.operations.decommission`][twophase.operations.decommission]), so that GC compacts the
sink's history past what it lacked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from twophase.config import TwoPhaseConfig
from twophase.errors import RefusedError
from twophase.operations.decommission import Removal, TargetRemoval
from twophase.operations.hooks import SILENT, UNFORCED, Guard, Hooks, actor, refuse_if_live
from twophase.operations.target_choice import TARGETS_ENV, require_sink_target
from twophase.protocol.ledger.target_ledger import TargetLedger
from twophase.store.database import Database
from twophase.store.views import Views
from twophase.wording import plural


@dataclass(frozen=True)
class RemoveReport(Removal):
    """What ``targets remove`` deleted with the target (the fields of
    [`Removal`][twophase.operations.decommission.Removal]); ``still_configured``: the
    configuration it ran with still named the target (removed by ``--force``: a run of
    the query with that configuration registers it again, as a new target)."""

    still_configured: bool = False


def remove_target(
    config: TwoPhaseConfig,
    sink_id: str,
    target: str,
    guard: Guard = UNFORCED,
    hooks: Hooks = SILENT,
) -> RemoveReport:
    """Remove ``target`` from the sink: its cursor, its backlog, its deliveries, the dead
    letters it refused and the corrections owed to it alone, in one transaction under the
    target's and the sink's locks; confirmed through ``hooks`` (the question says what is
    lost). After it, GC no longer waits for the target.

    UsageError (naming the sink's targets) when the sink has no such target; StateError
    for its last target (a sink delivers to at least one). Refused (RefusedError) while
    the configuration still names the target, whose next run would register it again,
    and while a live run owns the sink, unless ``guard.force``: then with a warning, and
    the live run is not fenced (its commits leave the removed target out).
    """
    configured = [t.name for t in config.target.named_targets()]
    with Database(config.staging) as db:
        views = Views(db)
        views.require_sink(sink_id)
        require_sink_target(TargetLedger(db), sink_id, target)
        removal = TargetRemoval(db)
        preview = removal.preview(sink_id, target)  # refuses the last target
        still = target in configured
        if still:
            _still_configured(sink_id, target, configured, guard, hooks)
        refuse_if_live(views, [sink_id], "targets remove", guard, hooks)
        hooks.confirm(_question(preview))
        done = removal.remove(sink_id, target, actor())
    return RemoveReport(**asdict(done), still_configured=still)


def _still_configured(
    sink_id: str, target: str, configured: Sequence[str], guard: Guard, hooks: Hooks
) -> None:
    """Refused unless forced: the query run with this configuration registers the
    target again at its next claim, as a new target owed the epochs from then on."""
    what = (
        f"target {target!r} is still named by this configuration ({TARGETS_ENV}: "
        f"{', '.join(configured)}): the sink's query, run with it, registers the target "
        "again at its next start, as a new target from the sink's next epoch"
    )
    if not guard.force:
        raise RefusedError(
            f"{what}; take it out of the query's configuration first, or pass --force; "
            "nothing was removed"
        )
    hooks.warn(f"{what}; removing it because of --force")


def _question(preview: Removal) -> str:
    """What a removal loses, in the words of the confirmation."""
    who = f"target {preview.target!r} of sink {preview.sink_id!r}"
    at = "nothing" if preview.delivered_epoch is None else f"epoch {preview.delivered_epoch}"
    backlog = (
        f"its backlog of {plural(preview.backlog_epochs, 'COMMITTED epoch')} and "
        f"{plural(preview.backlog_corrections, 'correction')} "
        f"({preview.backlog_bytes} bytes staged), never delivered to it now"
    )
    owed = ", ".join(f"c{-e}" for e in preview.corrections)
    corrections = f"; the corrections owed to it alone ({owed})" if owed else ""
    return (
        f"Remove {who} (it is {preview.state}, delivered up to {at})? Deleted: {backlog}; "
        f"its {plural(preview.dead_letters, 'dead letter')}, no longer listed nor "
        f"requeueable{corrections}; its {plural(preview.deliveries, 'delivery record')}. "
        f"The sink's other targets ({', '.join(preview.remaining)}) keep theirs; GC no "
        "longer keeps anything for it. A target of that name that a run of the query "
        "registers later starts anew, from the sink's next epoch."
    )
