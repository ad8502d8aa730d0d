"""Operations on the staging store alone: none of them needs a target's settings."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TextIO

from twophase.config import StagingConfig, load_setting
from twophase.errors import StateError, UnknownSinkError, UsageError
from twophase.model import DeadLetter, EpochState
from twophase.operations.hooks import (
    LIVE_WINDOW_S,
    SILENT,
    UNFORCED,
    Guard,
    Hooks,
    Progress,
    actor,
    refuse_if_live,
)
from twophase.protocol.ledger.epoch_ledger import Ledger
from twophase.protocol.ledger.target_ledger import TargetLedger, TargetState
from twophase.protocol.maintain.gc import GarbageCollector, GcReport
from twophase.store.database import Database
from twophase.store.views import EpochEvent, EpochInfo, EpochRange, SinkStatus, Views
from twophase.wording import age, iso

LAST_EPOCHS = 20  # what `epochs` lists when no range is given
EXPORT_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
# The export's columns, the store's id first.
EXPORT_COLUMNS = ("id", *(f.name for f in fields(DeadLetter) if f.name != "id"))
# What a spreadsheet reads as the start of a formula (OWASP's CSV injection list): a
# CSV cell of text starting with one of them is written after a single quote.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class EpochListing:
    """Epochs of a sink in increasing order; ``events`` is one epoch's history, when asked."""

    sink_id: str
    epochs: tuple[EpochInfo, ...]
    events: tuple[EpochEvent, ...] | None = None
    # GC compacted the records of the epochs up to it (each decided one was delivered)
    compacted_through: int | None = None


@dataclass(frozen=True)
class DeadLetterListing:
    """The first ``limit`` dead letters of the decided writes and how many there are."""

    total: int
    dead_letters: tuple[DeadLetter, ...]


@dataclass(frozen=True)
class ExportReport:
    exported: int
    file: str


@dataclass(frozen=True)
class AbortReport:
    sink_id: str
    epoch: int
    state: EpochState
    reason: str
    points_discarded: int


@dataclass(frozen=True)
class GcSummary:
    dry_run: bool
    retention_s: float
    orphan_grace_s: float
    sinks: tuple[GcReport, ...]
    history_retention_s: float | None = None  # epoch records older are compacted

    def total(self, key: str) -> int:
        """The sum of one count (``epochs_purged``, ...) over the sinks."""
        return sum(getattr(sink, key) for sink in self.sinks)


@dataclass(frozen=True)
class ResetReport:
    """What a reset deleted (the epoch records) and kept (the dead letters of the writes
    those epochs chose, still listed and requeueable)."""

    sink_id: str
    query_id: str | None
    epochs_forgotten: int
    dead_letters_kept: int


@contextmanager
def _views(config: StagingConfig) -> Iterator[tuple[Database, Views]]:
    with Database(config) as db:
        yield db, Views(db)


def status(
    config: StagingConfig, sink_id: str | None = None, live_window_s: float = LIVE_WINDOW_S
) -> list[SinkStatus]:
    """Every sink at a glance (or one: UnknownSinkError if it does not exist)."""
    with _views(config) as (_, views):
        if sink_id is not None:
            views.require_sink(sink_id)
        return views.status(sink_id, live_window_s)


def target_states(config: StagingConfig, sink_id: str | None = None) -> list[TargetState]:
    """Every target of every sink (of one sink: UnknownSinkError when it does not
    exist); none from a store from before targets."""
    with Database(config) as db:
        if sink_id is not None:
            Views(db).require_sink(sink_id)
        return stored_states(db, sink_id)


def stored_states(db: Database, sink_id: str | None = None) -> list[TargetState]:
    """[`TargetLedger.states`][twophase.protocol.ledger.target_ledger.TargetLedger.states], or none
    when the store predates targets (0007)."""
    return TargetLedger(db).states(sink_id) if Views(db).has_targets() else []


def epochs(
    config: StagingConfig,
    sink_id: str,
    selection: EpochRange | None = None,
    last: int | None = None,
) -> EpochListing:
    """The epochs in ``selection``, or the ``last`` ones (default 20); a single
    selected epoch comes with its history. EpochRangeError when none is recorded."""
    if selection is not None and last is not None:
        raise UsageError("--last cannot be combined with --epoch/--from/--to")
    with _views(config) as (_, views):
        views.require_sink(sink_id)
        floor = views.compacted_through(sink_id)
        if selection is None:
            rows = views.epochs(sink_id, last_n=LAST_EPOCHS if last is None else last)
            return EpochListing(sink_id, tuple(rows), compacted_through=floor)
        rows = views.select_epochs(sink_id, selection)
        single = selection.first is not None and selection.first == selection.last
        events = tuple(views.events(sink_id, rows[0].epoch)) if single else None
        return EpochListing(sink_id, tuple(rows), events, floor)


def dead_letters(
    config: StagingConfig, sink_id: str, epoch: int | None = None, limit: int | None = 100
) -> DeadLetterListing:
    """The dead letters of the writes decisions chose (``limit`` None: all)."""
    with _views(config) as (_, views):
        _require_epoch(views, sink_id, epoch)
        total = views.count_dead_letters(sink_id, epoch)
        rows = tuple(views.dead_letters(sink_id, epoch, limit))
    return DeadLetterListing(total, rows)


def export_dead_letters(
    config: StagingConfig, sink_id: str, path: str, epoch: int | None = None
) -> ExportReport:
    """Write every dead letter to ``path`` (``.csv`` or ``.jsonl``), all or nothing.

    The file is readable by its owner alone (mode 0600: payloads are the pipeline's
    data). In CSV a text cell that a spreadsheet would take for a formula (it starts
    with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) starts with ``'``;
    JSON Lines hold every value as it is stored. The letters are read a page per short
    transaction ([`Views.dead_letters`][twophase.store.views.Views.dead_letters]): a
    slow disk holds no transaction open past the store's idle limit.
    """
    form = export_format(path)
    with _views(config) as (_, views):
        _require_epoch(views, sink_id, epoch)
        count = _export(views.dead_letters(sink_id, epoch), Path(path), form)
    return ExportReport(count, path)


def export_format(path: str) -> str:
    """``csv`` or ``jsonl``, by the file's suffix; UsageError for any other."""
    form = EXPORT_FORMATS.get(Path(path).suffix.lower())
    if form is None:
        raise UsageError(f"--export: {path!r} must end in {', '.join(EXPORT_FORMATS)}")
    return form


def _require_epoch(views: Views, sink_id: str, epoch: int | None) -> None:
    views.require_sink(sink_id)
    if epoch is not None:
        views.select_epochs(sink_id, EpochRange(epoch, epoch))


def _export(rows: Iterable[DeadLetter], target: Path, form: str) -> int:
    """Write every row to a new file, then rename it into place: a failed export leaves
    no partial file.

    The new file is made by ``mkstemp`` in the target's directory: a name no one can
    guess, created exclusively (never a file or symlink already there, which a fixed
    name would follow), mode 0600 whatever the umask. The rename replaces ``target``
    itself, a symlink too, never what it points to.
    """
    fd, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            count = _write_export(rows, handle, form)
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    return count


def _write_export(rows: Iterable[DeadLetter], handle: TextIO, form: str) -> int:
    count = 0
    writer = csv.writer(handle) if form == "csv" else None
    if writer is not None:
        writer.writerow(EXPORT_COLUMNS)
    for row in rows:
        record = _record(row)
        if writer is None:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        else:
            writer.writerow([csv_cell(record[column]) for column in EXPORT_COLUMNS])
        count += 1
    return count


def csv_cell(value: Any) -> Any:
    """A value for a CSV cell: text a spreadsheet would run as a formula after a single
    quote (``=1+1`` -> ``'=1+1``); numbers, and any other text, as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def _record(letter: DeadLetter) -> dict[str, Any]:
    created = letter.created_at
    stamp = None if created is None else iso(created)
    return asdict(letter) | {"phase": str(letter.phase), "created_at": stamp}


def abort(
    config: StagingConfig,
    sink_id: str,
    epoch: int,
    reason: str = "aborted by an operator",
    guard: Guard = UNFORCED,
    hooks: Hooks = SILENT,
) -> AbortReport:
    """Discard a PRECOMMITTED epoch by an operator's decision (confirmed through hooks)."""
    with _views(config) as (db, views):
        views.require_sink(sink_id)
        [info] = views.select_epochs(sink_id, EpochRange(epoch, epoch))
        if info.state != EpochState.PRECOMMITTED:
            raise StateError(
                f"sink {sink_id!r} epoch {epoch} is {info.state}: only a PRECOMMITTED "
                "epoch can be aborted"
            )
        refuse_if_live(views, [sink_id], "abort", guard, hooks)
        sent = (
            f" {info.promote_attempts} promotion attempt(s) ran already, so some of its points "
            "may be in its targets; abort does not remove them."
            if info.promote_attempts
            else ""
        )
        hooks.confirm(
            f"Abort epoch {epoch} of sink {sink_id!r}? Its {info.points_staged} staged "
            f"points are deleted and will never be delivered.{sent}"
        )
        Ledger(db).abort(sink_id, epoch, reason, actor())
    return AbortReport(sink_id, epoch, EpochState.ABORTED, reason, info.points_staged)


def gc(
    config: StagingConfig,
    sink_id: str | None = None,
    retention_s: float | None = None,
    orphan_grace_s: float | None = None,
    dry_run: bool = False,
    hooks: Hooks = SILENT,
) -> GcSummary:
    """Remove staged points past retention and orphaned writes, and compact the records
    of epochs past ``history_retention`` (``dry_run``: count only)."""
    retention = config.retention_s if retention_s is None else retention_s
    history = config.history_retention_s
    grace = config.orphan_grace_s if orphan_grace_s is None else orphan_grace_s
    with _views(config) as (db, views):
        sinks = views.sinks_with_data()
        if sink_id is not None:
            if sink_id not in sinks:
                raise UnknownSinkError(f"unknown sink {sink_id!r} (no epochs or writes)")
            sinks = [sink_id]
        if not dry_run:
            hooks.confirm(
                f"Delete the staged points of epochs that ended more than {age(retention)} ago "
                f"(they can no longer be resent or verified) and orphaned writes older than "
                f"{age(grace)}, and compact the records of delivered epochs that ended more "
                f"than {age(history)} ago?"
            )
        # targets lagging past target_max_lag (TWOPHASE_TARGET_MAX_LAG), or behind by more
        # than target_max_backlog_bytes, are quarantined first
        collector = GarbageCollector(
            db,
            retention,
            grace,
            max_lag_s=load_setting("target_max_lag"),
            max_backlog_bytes=load_setting("target_max_backlog_bytes"),
            history_s=history,
        )
        done: list[GcReport] = []
        for sink in sinks:
            done.append(collector.collect(sink_id=sink, dry_run=dry_run))
            hooks.progress(Progress("gc", "sinks", len(done), len(sinks), sink))
    return GcSummary(dry_run, retention, grace, tuple(done), history)


def reset(
    config: StagingConfig, sink_id: str, guard: Guard = UNFORCED, hooks: Hooks = SILENT
) -> ResetReport:
    """Unbind a sink from its query after a deliberate checkpoint reset (I6's way out)."""
    with _views(config) as (db, views):
        views.require_sink(sink_id)
        [row] = views.status(sink_id, guard.live_window_s)
        if row.precommitted_epochs:
            raise StateError(
                f"sink {sink_id!r} has {row.precommitted_epochs} PRECOMMITTED epochs: run "
                f"`twophase recover --sink {sink_id}` before resetting it"
            )
        refuse_if_live(views, [sink_id], "reset", guard, hooks)
        hooks.confirm(_reset_question(views, row))
        done = Ledger(db).reset(sink_id, actor())
    return ResetReport(sink_id, row.query_id, done.epochs, done.dead_letters_kept)


def _reset_question(views: Views, row: SinkStatus) -> str:
    """What a reset deletes and what it keeps, in the words of the confirmation."""
    sink_id = row.sink_id
    epochs = views.epoch_bounds(sink_id)[0]
    kept = views.count_dead_letters(sink_id, None)
    orphaned = views.orphan_dead_letters(sink_id)
    return (
        f"Reset sink {sink_id!r}? It is unbound from query {row.query_id}; the next query "
        f"may start at any epoch. Deleted: its {epochs} epoch records now; then, by gc, "
        f"every staged write of the sink, which the reset makes an orphan ({row.staged_points}"
        " staged points: no resend or verify of them afterwards), with the dead letters of "
        f"writes no epoch chose ({orphaned}). Kept: its {kept} dead letters of decided "
        "writes, still listed by `twophase dead-letters` and requeueable."
    )
