"""One function per command: read the arguments, call the operation, render its result.

No SQL and no protocol logic here: that is [`twophase.operations`][twophase.operations]. Each
function returns the exit code.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from twophase import operations as ops
from twophase.cli import render
from twophase.cli.console import Console, printable
from twophase.config import (
    CLI_ALIASES,
    CLI_FLAGS,
    StagingConfig,
    TwoPhaseConfig,
    load_config,
    load_exporter_config,
    load_setting,
)
from twophase.config import load_staging_config as _load_staging
from twophase.errors import UsageError
from twophase.operations import EpochRange, RequeueFilter, TargetState

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# verify answers a question, as diff does: 1 is the answer "a target differs", so no
# answer (wrong usage, a setting, a server unreachable) must not read as one: it is 2.
EXIT_DIFFERS, EXIT_NO_ANSWER = 1, 2


def full_config(args: argparse.Namespace) -> TwoPhaseConfig:
    return load_config(**{name: getattr(args, name) for name in (*CLI_FLAGS, *CLI_ALIASES)})


def check_flags(args: argparse.Namespace) -> None:
    """A malformed connection flag fails even where the command does not use it."""
    for name in (*CLI_FLAGS, *CLI_ALIASES):
        if getattr(args, name) is not None:
            load_setting(name, {}, **{name: getattr(args, name)})


def staging_config(args: argparse.Namespace) -> StagingConfig:
    check_flags(args)
    return _load_staging(staging_url=args.staging_url)


def selection_of(args: argparse.Namespace) -> EpochRange | None:
    """--epoch N or --from A / --to B; None when none of them was given."""
    first, last = getattr(args, "first", None), getattr(args, "last_epoch", None)
    if args.epoch is not None:
        if first is not None or last is not None:
            raise UsageError("--epoch cannot be combined with --from/--to")
        return EpochRange(args.epoch, args.epoch)
    if first is None and last is None:
        return None
    if first is not None and last is not None and first > last:
        raise UsageError(f"--from {first} is after --to {last}")
    return EpochRange(first, last)


def cmd_status(con: Console) -> int:
    config = staging_config(con.args)
    rows = ops.status(config, con.args.sink, con.args.live_window)
    targets = ops.target_states(config, con.args.sink)
    sinks = [asdict(s) | _targets_of(s.sink_id, targets) for s in rows]
    con.emit({"sinks": sinks}, render.status_lines(rows, targets))
    return EXIT_OK


def _targets_of(sink_id: str, targets: list[TargetState]) -> dict[str, Any]:
    """``targets`` of the sink: every sink has at least one (``default``: the one server)."""
    mine = [_target_json(t) for t in targets if t.sink_id == sink_id]
    return {"targets": mine} if mine else {}


def _target_json(state: TargetState) -> dict[str, Any]:
    """[`TargetState.as_dict`][twophase.protocol.ledger.target_ledger.TargetState.as_dict], its
    times as the CLI writes every time (``...Z``)."""
    times = {
        "lagging_since": state.lagging_since,
        "quarantined_at": state.quarantined_at,
        "url_changed_at": state.url_changed_at,
    }
    return state.as_dict() | times


def cmd_targets(con: Console) -> int:
    args = con.args
    if args.action == "resync":
        return _resync(con)
    if args.action == "remove":
        return _remove(con)
    if args.name is not None:
        raise UsageError(f"{args.name!r}: a target is named with `targets resync|remove NAME`")
    if args.from_epoch is not None or args.force or args.yes:
        raise UsageError("--from-epoch, --force and --yes go with `targets resync` or `remove`")
    targets = ops.target_states(staging_config(args), args.sink)
    data = [{"sink_id": t.sink_id} | _target_json(t) for t in targets]
    con.emit({"targets": data}, render.targets_lines(targets, args.sink))
    return EXIT_OK


def _resync(con: Console) -> int:
    args = con.args
    if args.name is None or args.sink is None:
        raise UsageError("targets resync needs the target and its sink: resync NAME --sink S")
    with con.hooks() as hooks:
        report = ops.resync(
            full_config(args), args.sink, args.name, args.from_epoch, con.guard(), hooks
        )
    con.emit(report, render.resync_lines(report))
    return EXIT_OK


def _remove(con: Console) -> int:
    args = con.args
    if args.name is None or args.sink is None:
        raise UsageError("targets remove needs the target and its sink: remove NAME --sink S")
    if args.from_epoch is not None:
        raise UsageError("--from-epoch goes with `targets resync`")
    with con.hooks() as hooks:
        report = ops.remove_target(full_config(args), args.sink, args.name, con.guard(), hooks)
    con.emit(report, render.remove_lines(report))
    return EXIT_OK


def cmd_epochs(con: Console) -> int:
    args = con.args
    listing = ops.epochs(staging_config(args), args.sink, selection_of(args), args.last)
    data: dict[str, Any] = {
        "sink_id": listing.sink_id,
        "epochs": listing.epochs,
        "compacted_through": listing.compacted_through,
    }
    if listing.events is not None:
        data["events"] = listing.events
    con.emit(data, render.epoch_lines(listing))
    return EXIT_OK


def cmd_dead_letters(con: Console) -> int:
    args = con.args
    if args.requeue:
        return _requeue(con)
    if args.reason is not None or args.dry_run or args.target is not None:
        raise UsageError("--reason, --target and --dry-run go with --requeue")
    config = staging_config(args)
    if args.export:
        done = ops.export_dead_letters(config, args.sink, args.export, args.epoch)
        lines = [f"exported {done.exported} dead letters of sink {args.sink!r} to {done.file}"]
        con.emit(done, lines)
        return EXIT_OK
    listing = ops.dead_letters(config, args.sink, args.epoch, args.limit or None)
    con.emit(listing, render.dead_letter_lines(args.sink, listing))
    return EXIT_OK


def _requeue(con: Console) -> int:
    args = con.args
    if args.export or args.first is not None or args.last_epoch is not None:
        raise UsageError("--requeue takes --epoch N and --reason TEXT, not --export/--from/--to")
    chosen = RequeueFilter(args.epoch, args.reason, args.target)
    with con.hooks() as hooks:
        report = ops.requeue(full_config(args), args.sink, chosen, args.dry_run, con.guard(), hooks)
    con.emit(report, render.requeue_lines(report))
    return EXIT_OK


def cmd_abort(con: Console) -> int:
    args = con.args
    config = staging_config(args)
    with con.hooks() as hooks:
        done = ops.abort(config, args.sink, args.epoch, args.reason, con.guard(), hooks)
    con.emit(done, render.abort_lines(done))
    return EXIT_OK


def cmd_gc(con: Console) -> int:
    args = con.args
    with con.hooks() as hooks:
        config = staging_config(args)
        summary = ops.gc(config, args.sink, args.retention, args.orphan_grace, args.dry_run, hooks)
    counts = ("epochs_purged", "points_purged", "orphan_writes", "epochs_compacted")
    totals = {k: summary.total(k) for k in counts}
    con.emit(asdict(summary) | totals, render.gc_lines(summary))
    return EXIT_OK


def cmd_reset(con: Console) -> int:
    args = con.args
    with con.hooks() as hooks:
        done = ops.reset(staging_config(args), args.sink, con.guard(), hooks)
    con.emit(done, render.reset_lines(done))
    return EXIT_OK


def cmd_recover(con: Console) -> int:
    """Exit 1 when a target could not be caught up (each named in a warning): the
    epochs are COMMITTED, but that target still lacks some."""
    with con.hooks() as hooks:
        report = ops.recover(full_config(con.args), con.args.sink, con.guard(), hooks)
    con.emit(report, render.recover_lines(report))
    return EXIT_FAILED if report.still_behind else EXIT_OK


def cmd_resend(con: Console) -> int:
    args = con.args
    chosen = selection_of(args)
    if args.all and chosen is not None:
        raise UsageError("--all cannot be combined with --epoch/--from/--to")
    if not args.all and chosen is None:
        raise UsageError("choose epochs to re-send: --epoch N, --from A [--to B], or --all")
    with con.hooks() as hooks:
        config = full_config(args)
        report = ops.resend(config, args.sink, chosen, con.guard(), hooks, args.target)
    named = {"target": args.target} if args.target else {}
    con.emit(asdict(report) | named, render.resend_lines(report, args.target))
    return EXIT_OK


def cmd_verify(con: Console) -> int:
    """One target (``--target``, or the configuration's one): its report; several: one
    report per target, and ``ok`` when every target holds exactly the staged points."""
    args = con.args
    with con.hooks() as hooks:
        config = full_config(args)
        names = None if args.target is None else [args.target]
        reports = ops.verify(config, args.sink, selection_of(args), hooks, names)
    ok = all(r.report.ok for r in reports)
    if args.target is not None or len(reports) == 1:
        (one,) = reports
        named = {"target": one.target} if args.target else {}
        data = asdict(one.report) | {"ok": one.report.ok} | named
        con.emit(data, render.verify_lines(one.report, args.target))
    else:
        per_target = [asdict(r.report) | {"ok": r.report.ok, "target": r.target} for r in reports]
        data = {"sink_id": args.sink, "ok": ok, "targets": per_target}
        con.emit(data, render.verify_targets_lines(reports))
    return EXIT_OK if ok else EXIT_DIFFERS


def cmd_metrics(con: Console) -> int:
    """Serve until SIGTERM or Ctrl-C."""
    args = con.args
    settings = load_exporter_config(exporter_port=args.port, exporter_host=args.host)
    staging = staging_config(args)
    exporter = ops.start_exporter(staging, None, None, args.live_window, exporter=settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    where = printable(exporter.url)
    con.err.write(f"twophase: serving metrics on {where}\n")
    con.err.flush()
    try:
        stop.wait()
    finally:
        exporter.close()
    return EXIT_OK


def cmd_db_upgrade(con: Console) -> int:
    args = con.args
    if args.sql:
        return _print_sql(con, ops.upgrade_sql)
    revision = _target(args.revision)
    return _print_schema(con, ops.upgrade_schema(staging_config(args), revision))


def cmd_db_downgrade(con: Console) -> int:
    args = con.args
    if args.sql:
        return _print_sql(con, ops.downgrade_sql)
    revision = _target(args.revision)
    with con.hooks() as hooks:
        report = ops.downgrade_schema(staging_config(args), revision, hooks)
    return _print_schema(con, report)


def cmd_db_current(con: Console) -> int:
    return _print_schema(con, ops.current_schema(staging_config(con.args)))


def cmd_db_history(con: Console) -> int:
    history = ops.schema_history(staging_config(con.args))
    con.emit(history, render.history_lines(history))
    return EXIT_OK


def cmd_db_grants(con: Console) -> int:
    """The GRANTs printed (no connection), or applied as the schema's owner."""
    args = con.args
    roles = ops.RoleNames(args.executor, args.driver, args.operator, args.reader)
    if not args.apply:
        check_flags(args)  # no connection is made, but a wrong flag is still wrong
        printed = ops.grant_sql(roles, args.schema)
        con.emit(printed, printed.sql.splitlines())
        return EXIT_OK
    if args.schema is not None:
        raise UsageError("--schema goes with the printed SQL; --apply grants where the store is")
    report = ops.apply_grants(staging_config(args), roles)
    con.emit(report, render.grant_lines(report))
    return EXIT_OK


def _target(revision: str) -> str:
    """A revision to migrate the store to: it starts from where the store is."""
    if ":" in revision:
        raise UsageError(f"{revision}: FROM:TO goes with --sql (the store's revision is FROM)")
    return revision


def _print_schema(con: Console, report: ops.SchemaReport) -> int:
    con.emit(asdict(report) | {"at_head": report.at_head}, render.schema_lines(report))
    return EXIT_OK


def _print_sql(con: Console, offline: Callable[[str], ops.SchemaSql]) -> int:
    check_flags(con.args)  # no connection is made, but a wrong flag is still wrong
    migration = offline(con.args.revision)
    con.emit(migration, migration.sql.splitlines())
    return EXIT_OK
