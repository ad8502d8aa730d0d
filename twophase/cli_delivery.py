"""The CLI's commands that send to or read from InfluxDB: recover, replay, verify."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import Any

from twophase.cli_support import (
    EXIT_FAILED,
    EXIT_OK,
    Console,
    Phases,
    UsageError,
    actor,
    full_config,
    plural,
    refuse_if_live,
    selection_of,
    table,
)
from twophase.committer import PromoteResult
from twophase.db import Database
from twophase.errors import PermanentError
from twophase.influx import query_v1, resolve_api
from twophase.inspect import EpochRange, Inspector, compact_ranges, epochs_are, name_epochs
from twophase.replay import ReplayedEpoch, Replayer, plan_replay
from twophase.runtime import TwoPhase
from twophase.schema import COMMITTED, PRECOMMITTED
from twophase.staging import StagedReader
from twophase.verify import Verifier, VerifyReport


def cmd_recover(con: Console) -> int:
    args = con.args
    with TwoPhase.open(full_config(args)) as tp:
        inspector = Inspector(tp.db)
        if args.sink:
            inspector.require_sink(args.sink)
        sinks = [args.sink] if args.sink else inspector.sink_ids()
        work = {sink: pending for sink in sinks if (pending := tp.ledger.pending(sink))}
        refuse_if_live(con, inspector, list(work), "recover")
        total = sum(
            e.points_staged
            for sink, pending in work.items()
            for e in inspector.epochs(sink, EpochRange(pending[0], pending[-1]))
            if e.state == PRECOMMITTED
        )
        results: list[PromoteResult] = []
        sent = 0
        with con.progress("recover", total, "points") as bar:

            def progress(result: PromoteResult) -> None:
                nonlocal sent
                sent += result.delivered + result.rejected
                bar.update(sent, f"{result.sink_id}#{result.epoch}")

            for sink in work:
                lease = tp.ledger.begin_run(sink, f"cli-{uuid.uuid4()}", None)
                # Pending is read again under the new lease: the fenced run may have
                # promoted some meanwhile.
                results += tp.committer.recover(lease, on_promoted=progress)
    if not results:
        lines = ["nothing to recover: no PRECOMMITTED epochs"]
    else:
        rows = [(r.sink_id, r.epoch, r.delivered, r.rejected) for r in results]
        lines = table(("SINK", "EPOCH", "DELIVERED", "REJECTED"), rows)
        lines.append(f"recovered {plural(len(results), 'epoch')}; no PRECOMMITTED epoch is left")
        if any(r.rejected for r in results):
            lines.append("InfluxDB rejected some points: see `twophase dead-letters`")
    con.emit({"recovered": results}, lines)
    return EXIT_OK


def cmd_replay(con: Console) -> int:
    args = con.args
    selection = EpochRange() if args.all else selection_of(args)
    if selection is None:
        raise UsageError("choose epochs to re-send: --epoch N, --from A [--to B], or --all")
    if args.all and any(x is not None for x in (args.epoch, args.first, args.last_epoch)):
        raise UsageError("--all cannot be combined with --epoch/--from/--to")
    with TwoPhase.open(full_config(args)) as tp:
        inspector = Inspector(tp.db)
        inspector.require_sink(args.sink)
        plan = plan_replay(args.sink, inspector.select_epochs(args.sink, selection), args.all)
        refuse_if_live(con, inspector, [args.sink], "replay")
        if plan.skipped_purged:
            con.warn(f"{epochs_are(plan.skipped_purged)} past retention: not re-sent")
        after = inspector.epochs(args.sink, EpochRange(first=plan.epochs[-1] + 1))
        last = max((e.epoch for e in after if e.state == COMMITTED), default=None)
        if last is not None:
            con.warn(
                f"epochs after {plan.epochs[-1]} (up to {last}) are not re-sent: where they "
                "rewrote points of the re-sent epochs (update output mode) InfluxDB now holds "
                "the older values; "
                f"re-send through epoch {last} to restore them (check with `twophase verify`)"
            )
        with con.progress("replay", plan.points, "points") as bar:
            sent = 0

            def on_epoch(done: ReplayedEpoch) -> None:
                nonlocal sent
                sent += done.points_sent + done.points_rejected
                bar.update(sent, f"epoch {done.epoch}")

            results = Replayer(tp.db, tp.promoter).replay(plan, actor(), on_epoch)
    rows = [(r.epoch, r.points_sent, r.points_rejected) for r in results]
    lines = table(("EPOCH", "SENT", "REJECTED"), rows)
    lines.append(
        f"re-sent {plural(sum(r.points_sent for r in results), 'point')} of "
        f"{plural(len(results), 'epoch')} of sink {args.sink!r}"
    )
    if plan.skipped_aborted:
        lines.append(f"skipped aborted epochs {compact_ranges(plan.skipped_aborted)}")
    data = {
        "sink_id": args.sink,
        "replayed": [
            {"epoch": r.epoch, "points_sent": r.points_sent, "points_rejected": r.points_rejected}
            for r in results
        ],
        "skipped_aborted": plan.skipped_aborted,
        "skipped_purged": plan.skipped_purged,
    }
    con.emit(data, lines)
    return EXIT_OK


def cmd_verify(con: Console) -> int:
    args = con.args
    selection = selection_of(args) or EpochRange()
    config = full_config(args)
    influx = resolve_api(config.influx)
    if influx.api != "v1":
        raise PermanentError(
            "verify reads InfluxDB back with InfluxQL through the 1.x /query API; with the "
            "2.x API (TWOPHASE_INFLUX_API=v2) verification is not supported"
        )

    def query(statement: str) -> list[dict[str, Any]]:
        return query_v1(
            influx.url,
            influx.database,
            statement,
            influx.username,
            influx.password,
            max(influx.timeout_s, 30.0),
        )

    phases = Phases(con)
    try:
        with Database(config.staging) as db:
            inspector = Inspector(db)
            inspector.require_sink(args.sink)
            epochs = inspector.select_epochs(args.sink, selection)
            verifier = Verifier(inspector, StagedReader(db), query, influx.retention_policy)
            report = verifier.verify(args.sink, epochs, phases)
    finally:
        phases.close()
    con.emit(asdict(report) | {"ok": report.ok}, _verify_lines(report))
    return EXIT_OK if report.ok else EXIT_FAILED


def _verify_lines(report: VerifyReport) -> list[str]:
    what = (
        f"sink {report.sink_id!r}, {name_epochs(report.epochs)}: "
        f"{report.points} points in {report.series} series"
    )
    lines = [f"note: {note}" for note in report.notes]
    if report.ok:
        return [*lines, f"OK: InfluxDB holds exactly the staged points ({what})"]
    diffs = report.differences
    rows = [
        (
            d.measurement,
            _tags(d.tags),
            d.points_expected,
            d.points_influx,
            d.missing,
            d.different,
            d.extra,
        )
        for d in diffs
    ]
    lines += table(
        ("MEASUREMENT", "TAGS", "EXPECTED", "INFLUX", "MISSING", "DIFFERENT", "EXTRA"), rows
    )
    lines += [f"  {d.measurement},{_tags(d.tags)}: {x}" for d in diffs[:10] for x in d.examples]
    if report.unparseable:
        lines.append(f"{report.unparseable} staged lines could not be parsed")
    lines.append(f"DIFFERENCES in {len(diffs)} series ({what})")
    return lines


def _tags(tags: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in tags.items())
