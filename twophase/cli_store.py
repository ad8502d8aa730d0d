"""The CLI's commands on the staging store alone: status, epochs, dead-letters, abort,
gc, reset. None of them needs InfluxDB settings.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from twophase.cli_support import (
    EXIT_OK,
    Console,
    UsageError,
    actor,
    age,
    iso,
    open_store,
    refuse_if_live,
    selection_of,
    size,
    staging_config,
    table,
)
from twophase.db import Database
from twophase.errors import StateError
from twophase.gc import GarbageCollector
from twophase.inspect import (
    DeadLetterRow,
    EpochInfo,
    EpochRange,
    Inspector,
    SinkStatus,
    UnknownSinkError,
)
from twophase.ledger import Ledger
from twophase.schema import PRECOMMITTED

EXPORT_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}


def cmd_status(con: Console) -> int:
    args = con.args
    with open_store(args) as (_, inspector):
        if args.sink:
            inspector.require_sink(args.sink)
        rows = inspector.status(args.sink, args.live_window)
    con.emit({"sinks": rows}, _status_lines(rows))
    return EXIT_OK


def _status_lines(rows: Sequence[SinkStatus]) -> list[str]:
    if not rows:
        return ["no sinks in this staging store"]
    headers = (
        "SINK",
        "OWNER RUN",
        "LIVE",
        "DECIDED",
        "COMMITTED",
        "PRECOMMITTED",
        "OLDEST",
        "STAGED",
        "SIZE",
        "DEAD LETTERS",
        "REPLAYS",
        "LAST ERROR",
    )
    return table(
        headers,
        [
            (
                s.sink_id,
                s.owner_run_id,
                "yes" if s.owner_live else "no",
                s.last_decided_epoch,
                s.last_committed_epoch,
                s.precommitted_epochs,
                _oldest(s),
                s.staged_points,
                size(s.staged_bytes),
                s.dead_letters,
                s.replays_detected,
                s.last_error,
            )
            for s in rows
        ],
    )


def _oldest(status: SinkStatus) -> str | None:
    if status.oldest_precommitted_epoch is None:
        return None
    return f"{status.oldest_precommitted_epoch} ({age(status.oldest_precommitted_age_s)} old)"


def cmd_epochs(con: Console) -> int:
    args = con.args
    selection = selection_of(args)
    if selection is not None and args.last is not None:
        raise UsageError("--last cannot be combined with --epoch/--from/--to")
    with open_store(args) as (_, inspector):
        inspector.require_sink(args.sink)
        if selection is None:
            rows = inspector.epochs(args.sink, last_n=20 if args.last is None else args.last)
        else:
            rows = inspector.select_epochs(args.sink, selection)
        events = inspector.events(args.sink, args.epoch) if args.epoch is not None else None
    data: dict[str, Any] = {"sink_id": args.sink, "epochs": rows}
    lines = _epoch_lines(rows) if rows else [f"sink {args.sink!r} has no epochs"]
    if events is not None:
        data["events"] = events
        lines += ["", f"history of epoch {args.epoch}:"]
        lines += table(
            ("AT", "EVENT", "RUN", "DETAIL"), [(e.at, e.event, e.run_id, e.detail) for e in events]
        )
    con.emit(data, lines)
    return EXIT_OK


def _epoch_lines(rows: Sequence[EpochInfo]) -> list[str]:
    headers = (
        "EPOCH",
        "STATE",
        "STAGED",
        "DELIVERED",
        "REJECTED",
        "ATTEMPTS",
        "REPLAYS",
        "DECIDED",
        "ENDED",
        "PURGED",
        "ERROR",
    )
    return table(
        headers,
        [
            (
                e.epoch,
                e.state,
                e.points_staged,
                e.points_delivered,
                e.points_rejected_stage + (e.points_rejected_promote or 0),
                e.promote_attempts,
                e.replays,
                e.decided_at,
                e.committed_at or e.aborted_at,
                e.purged_at,
                e.last_error,
            )
            for e in rows
        ],
    )


def cmd_abort(con: Console) -> int:
    args = con.args
    with open_store(args) as (db, inspector):
        inspector.require_sink(args.sink)
        [info] = inspector.select_epochs(args.sink, EpochRange(args.epoch, args.epoch))
        if info.state != PRECOMMITTED:
            raise StateError(
                f"sink {args.sink!r} epoch {args.epoch} is {info.state}: only a PRECOMMITTED "
                "epoch can be aborted"
            )
        refuse_if_live(con, inspector, [args.sink], "abort")
        sent = (
            f" {info.promote_attempts} promotion attempt(s) ran already, so some of its points "
            "may be in InfluxDB; abort does not remove them."
            if info.promote_attempts
            else ""
        )
        con.confirm(
            f"Abort epoch {args.epoch} of sink {args.sink!r}? Its {info.points_staged} staged "
            f"points are deleted and will never be delivered.{sent}"
        )
        Ledger(db).abort(args.sink, args.epoch, args.reason, actor())
    con.emit(
        {
            "sink_id": args.sink,
            "epoch": args.epoch,
            "state": "ABORTED",
            "reason": args.reason,
            "points_discarded": info.points_staged,
        },
        [
            f"aborted epoch {args.epoch} of sink {args.sink!r}: {info.points_staged} staged "
            f"points discarded ({args.reason})"
        ],
    )
    return EXIT_OK


def cmd_dead_letters(con: Console) -> int:
    args = con.args
    form = _export_format(args.export) if args.export else None
    with open_store(args) as (_, inspector):
        inspector.require_sink(args.sink)
        if args.epoch is not None:
            inspector.select_epochs(args.sink, EpochRange(args.epoch, args.epoch))
        if form is not None:
            count = _export(inspector.dead_letters(args.sink, args.epoch), args.export, form)
            con.emit(
                {"exported": count, "file": args.export},
                [f"exported {count} dead letters of sink {args.sink!r} to {args.export}"],
            )
            return EXIT_OK
        total = inspector.count_dead_letters(args.sink, args.epoch)
        rows = list(inspector.dead_letters(args.sink, args.epoch, args.limit or None))
    lines = table(
        ("EPOCH", "PHASE", "WRITE", "SEQ", "REASON", "PAYLOAD"),
        [(d.epoch, d.phase, d.write_id[:8], d.seq, d.reason, d.payload) for d in rows],
    )
    if len(rows) < total:
        lines.append(f"... {total - len(rows)} more (--limit 0 lists all; --export FILE saves)")
    con.emit(
        {"total": total, "dead_letters": rows},
        lines if total else [f"no dead letters for sink {args.sink!r}"],
    )
    return EXIT_OK


def _export_format(path: str) -> str:
    form = EXPORT_FORMATS.get(Path(path).suffix.lower())
    if form is None:
        raise UsageError(f"--export: {path!r} must end in {', '.join(EXPORT_FORMATS)}")
    return form


def _export(rows: Iterator[DeadLetterRow], path: str, form: str) -> int:
    """Write every row, then rename into place: a failed export leaves no partial file."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    count = 0
    with partial.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle) if form == "csv" else None
        for row in rows:
            record = asdict(row) | {"created_at": iso(row.created_at)}
            if writer is None:
                handle.write(json.dumps(record, sort_keys=True) + "\n")
            else:
                if count == 0:
                    writer.writerow(list(record))
                writer.writerow(list(record.values()))
            count += 1
        if writer is not None and count == 0:
            writer.writerow(list(DeadLetterRow.__dataclass_fields__))
    os.replace(partial, target)
    return count


def cmd_gc(con: Console) -> int:
    args = con.args
    staging = staging_config(args)
    retention = staging.retention_s if args.retention is None else args.retention
    grace = staging.orphan_grace_s if args.orphan_grace is None else args.orphan_grace
    with Database(staging) as db:
        sinks = Inspector(db).sinks_with_data()
        if args.sink:
            if args.sink not in sinks:
                raise UnknownSinkError(f"unknown sink {args.sink!r} (no epochs or writes)")
            sinks = [args.sink]
        if not args.dry_run:
            con.confirm(
                f"Delete the staged points of epochs that ended more than {age(retention)} ago "
                f"(they can no longer be replayed or verified) and orphaned writes older than "
                f"{age(grace)}?"
            )
        collector = GarbageCollector(db, retention, grace)
        reports = []
        with con.progress("gc", len(sinks), "sinks") as bar:
            for sink in sinks:
                reports.append((sink, collector.collect(sink_id=sink, dry_run=args.dry_run)))
                bar.update(len(reports), sink)
    keys = ("epochs_purged", "points_purged", "orphan_writes")
    totals = {k: sum(getattr(r, k) for _, r in reports) for k in keys}
    verb = "would purge" if args.dry_run else "purged"
    lines = table(
        ("SINK", "EPOCHS PURGED", "POINTS PURGED", "ORPHAN WRITES"),
        [(s, r.epochs_purged, r.points_purged, r.orphan_writes) for s, r in reports],
    )
    lines.append(
        f"gc {verb} {totals['epochs_purged']} epochs ({totals['points_purged']} staged points) "
        f"past retention {age(retention)} and {totals['orphan_writes']} orphaned writes"
        + (" (dry run: nothing was removed)" if args.dry_run else "")
    )
    con.emit(
        {
            "dry_run": args.dry_run,
            "retention_s": retention,
            "orphan_grace_s": grace,
            **totals,
            "sinks": [{"sink_id": s, **{k: getattr(r, k) for k in keys}} for s, r in reports],
        },
        lines,
    )
    return EXIT_OK


def cmd_reset(con: Console) -> int:
    args = con.args
    with open_store(args) as (db, inspector):
        inspector.require_sink(args.sink)
        [status] = inspector.status(args.sink, args.live_window)
        if status.precommitted_epochs:
            raise StateError(
                f"sink {args.sink!r} has {status.precommitted_epochs} PRECOMMITTED epochs: run "
                f"`twophase recover --sink {args.sink}` before resetting it"
            )
        refuse_if_live(con, inspector, [args.sink], "reset")
        count = inspector.epoch_bounds(args.sink)[0]
        con.confirm(
            f"Reset sink {args.sink!r}? It is unbound from query {status.query_id} and its "
            f"{count} epoch records are forgotten (their retained staged points become orphans "
            "for gc: no replay or verify of them afterwards); the next query may start at any "
            "epoch."
        )
        Ledger(db).reset(args.sink, actor())
    con.emit(
        {"sink_id": args.sink, "query_id": status.query_id, "epochs_forgotten": count},
        [
            f"reset sink {args.sink!r}: unbound from query {status.query_id}, forgot {count} "
            "epochs; the next query may start at any epoch"
        ],
    )
    return EXIT_OK
