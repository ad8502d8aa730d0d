"""What the operations return, as the text lines of the CLI's tables and summaries."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from twophase.cli.console import printable
from twophase.operations import (
    AbortReport,
    DeadLetterListing,
    EpochInfo,
    EpochListing,
    GcSummary,
    GrantReport,
    RecoverReport,
    RemoveReport,
    RequeueReport,
    ResendReport,
    ResetReport,
    ResyncReport,
    SchemaHistory,
    SchemaReport,
    SeriesDiff,
    SinkStatus,
    TargetState,
    TargetVerifyReport,
    VerifyReport,
)
from twophase.wording import (
    age,
    compact_ranges,
    epoch_label,
    epochs_are,
    iso,
    name_epochs,
    plural,
)


def cell(value: Any, width: int = 60) -> str:
    """A table cell: '-' for nothing, times to the second, one line, at most ``width``.

    Runs of whitespace are one space; any other control character is shown escaped
    ([`printable`][twophase.cli.console.printable]), before the width is measured.
    """
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return iso(value.replace(microsecond=0))
    text = printable(" ".join(str(value).split()))
    return text if len(text) <= width else text[: width - 3] + "..."


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], width: int = 60) -> list[str]:
    """Plain aligned columns, cells at most ``width``; the last one is not padded."""
    cells = [[cell(v, width) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    return [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *cells]
    ]


def size(octets: int) -> str:
    """``1536`` -> ``'1.5 KiB'``; bytes whole, GiB the largest unit."""
    value = float(octets)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


_STATUS_HEADERS = (
    "SINK",
    "OWNER RUN",
    "RUN STATE",
    "DECIDED",
    "COMMITTED",
    "PRECOMMITTED",
    "OLDEST",
    "STAGED",
    "SIZE",
    "DEAD LETTERS",
    "CORRECTIONS",
    "REPLAYS",
    "LAST ERROR",
)


def status_lines(rows: Sequence[SinkStatus], targets: Sequence[TargetState] = ()) -> list[str]:
    """The sinks' table, then a table of targets per sink with several, or with one that
    is not live or whose URL changed (``twophase targets`` lists them all)."""
    if not rows:
        return ["no sinks in this staging store"]
    lines = table(_STATUS_HEADERS, [_status_row(s) for s in rows])
    for s in rows:
        if s.compacted_through is not None:
            lines += [f"sink {s.sink_id!r}: {line}" for line in _compacted(s.compacted_through)]
    for s in rows:
        mine = [t for t in targets if t.sink_id == s.sink_id]
        if len(mine) > 1 or any(t.state != "live" or t.url_changed_at for t in mine):
            lines += ["", f"targets of sink {s.sink_id!r}:"]
            lines += table(_TARGET_HEADERS, [_target_row(t) for t in mine])
    return lines


def _status_row(s: SinkStatus) -> tuple[Any, ...]:
    oldest = None
    if s.oldest_precommitted_epoch is not None:
        label = epoch_label(s.oldest_precommitted_epoch)
        oldest = f"{label} ({age(s.oldest_precommitted_age_s)} old)"
    return (
        s.sink_id,
        s.owner_run_id,
        _run_state(s),
        s.last_decided_epoch,
        s.last_committed_epoch,
        s.precommitted_epochs,
        oldest,
        s.staged_points,
        size(s.staged_bytes),
        s.dead_letters,
        s.corrections,
        s.replays_detected,
        s.last_error,
    )


_TARGET_HEADERS = ("TARGET", "STATE", "DELIVERED", "LAG EPOCHS", "LAG", "LAG BYTES", "URL")


def _target_row(t: TargetState) -> tuple[Any, ...]:
    lag = None if t.lag_seconds is None else age(t.lag_seconds)
    url = t.url
    if url is not None and t.url_changed_at is not None:
        url = f"{url} (changed {iso(t.url_changed_at)})"
    return (t.target, t.state, t.delivered_epoch, t.lag_epochs, lag, size(t.lag_bytes), url)


def targets_lines(targets: Sequence[TargetState], sink_id: str | None) -> list[str]:
    """Every target of every sink: its table row, when it lags or was quarantined, and
    the last error its server gave."""
    if not targets:
        where = "this staging store" if sink_id is None else f"sink {sink_id!r}"
        return [f"no targets in {where}: a sink's query registers them when it starts"]
    headers = ("SINK", *_TARGET_HEADERS, "SINCE", "LAST ERROR")
    rows = [(t.sink_id, *_target_row(t), _since(t), t.last_error) for t in targets]
    return table(headers, rows)


def _since(t: TargetState) -> Any:
    """Since when the target is out of the live state: quarantined, else lagging."""
    return t.quarantined_at or t.lagging_since


def resync_lines(report: ResyncReport) -> list[str]:
    who = f"target {report.target!r} of sink {report.sink_id!r}"
    lines = []
    if report.promoted:
        pending = name_epochs([r.epoch for r in report.promoted])
        lines.append(f"promoted first (they were pending): {pending}")
    if report.from_epoch is None:
        return [*lines, f"{who} lacks no epoch staging could supply; it is {report.state}"]
    if report.delivered:
        done = f"{name_epochs(report.delivered)} ({plural(len(report.delivered), 'epoch')})"
        lines.append(f"re-delivered {done} to {who}, in epoch order from {report.from_epoch}")
    else:
        lines.append(f"re-delivered no epoch to {who} (from epoch {report.from_epoch})")
    if report.skipped_purged:
        lines.append(
            f"NOT supplied: {epochs_are(report.skipped_purged)} purged from staging by GC "
            f"before {report.target!r} had them: that target lacks their points"
        )
    if report.compacted_through is not None:
        lines.append(
            f"NOT supplied: the epochs up to {report.compacted_through} whose records GC "
            "compacted (their points were purged before): that target lacks their points"
        )
    lines.append(f"{who} is {report.state}")
    return lines


def remove_lines(report: RemoveReport) -> list[str]:
    """What went with the removed target, and what follows for GC."""
    at = "-" if report.delivered_epoch is None else report.delivered_epoch
    owed = ", ".join(f"c{-e}" for e in report.corrections) or "none"
    return [
        f"removed target {report.target!r} from sink {report.sink_id!r} (it was "
        f"{report.state}, delivered up to {at}); its targets now: {', '.join(report.remaining)}",
        f"deleted with it: its backlog of {plural(report.backlog_epochs, 'COMMITTED epoch')} "
        f"and {plural(report.backlog_corrections, 'correction')} ({size(report.backlog_bytes)}"
        f" staged; never delivered to it), {plural(report.dead_letters, 'dead letter')}, "
        f"{plural(report.deliveries, 'delivery record')}, the corrections owed to it alone: "
        f"{owed}",
        "gc no longer waits for it: the sink's history is compacted past what it lacked "
        "once history_retention passes",
    ]


def _run_state(s: SinkStatus) -> str | None:
    """live, ended (stopped|failed), unknown (silent: killed?), or nothing for no owner."""
    if s.owner_state == "ended":
        return f"ended ({s.owner_end_reason})"
    if s.owner_state == "unknown":
        return "unknown (silent; killed?)"
    return s.owner_state


_EPOCH_HEADERS = (
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


def epoch_lines(listing: EpochListing) -> list[str]:
    compacted = _compacted(listing.compacted_through)
    if not listing.epochs:
        return [f"sink {listing.sink_id!r} has no epochs", *compacted]
    lines = table(_EPOCH_HEADERS, [_epoch_row(e) for e in listing.epochs]) + compacted
    if listing.events is not None:
        lines += ["", f"history of epoch {epoch_label(listing.epochs[0].epoch)}:"]
        lines += table(
            ("AT", "EVENT", "RUN", "DETAIL"),
            [(e.at, e.event, e.run_id, e.detail) for e in listing.events],
        )
    return lines


def _compacted(floor: int | None) -> list[str]:
    """The line saying how far GC compacted a sink's history (none: nothing)."""
    if floor is None:
        return []
    return [
        f"older epochs were compacted, up to {floor}: gc deleted their records, and every "
        "one of them that was decided was delivered"
    ]


def _epoch_row(e: EpochInfo) -> tuple[Any, ...]:
    return (
        epoch_label(e.epoch),
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


def dead_letter_lines(sink_id: str, listing: DeadLetterListing) -> list[str]:
    if not listing.total:
        return [f"no dead letters for sink {sink_id!r}"]
    rows = listing.dead_letters
    targets = any(d.target for d in rows)  # several targets: which one refused it
    target = ("TARGET",) if targets else ()
    lines = table(
        ("EPOCH", "PHASE", *target, "WRITE", "SEQ", "REQUEUED", "REASON", "PAYLOAD"),
        [
            (
                epoch_label(d.epoch),
                d.phase,
                *((d.target,) if targets else ()),
                d.write_id[:8],
                d.seq,
                _requeued(d.requeued_in),
                d.reason,
                d.payload,
            )
            for d in rows
        ],
    )
    if len(rows) < listing.total:
        more = listing.total - len(rows)
        lines.append(f"... {more} more (--limit 0 lists all; --export FILE saves)")
    return lines


def _requeued(epoch: int | None) -> str:
    return "-" if epoch is None else f"in {epoch_label(epoch)}"


def requeue_lines(report: RequeueReport) -> list[str]:
    lines = []
    results = report.results  # the corrections' promotions, once done
    earlier = [r for r in report.promoted if all(r is not done for done in results)]
    if earlier:
        pending = name_epochs([r.epoch for r in earlier])
        lines.append(f"promoted first (they were pending): {pending}")
    if report.correction is None:
        return [*lines, f"no dead letters of sink {report.sink_id!r} to requeue"]
    numbers = report.corrections or (report.correction,)
    named = f"correction c{numbers[0]}"
    if len(numbers) > 1:  # one per batch of letters
        named = f"corrections c{numbers[0]}-c{numbers[-1]}"
    what = (
        f"{plural(report.requeued, 'dead letter')} of {name_epochs(report.from_epochs)} as {named}"
    )
    if report.dry_run:
        return [*lines, f"would requeue {what} (dry run: nothing sent)"]
    if not results:  # cannot happen once recover returned; said for completeness
        return [*lines, f"requeued {what}; run `twophase recover --sink {report.sink_id}`"]
    delivered, rejected = sum(r.delivered for r in results), sum(r.rejected for r in results)
    lines.append(f"requeued {what}: {delivered} delivered, {rejected} rejected again")
    if rejected:
        lines.append(f"the points rejected again are dead letters of the {named.split()[0]}")
    return lines


def schema_lines(report: SchemaReport) -> list[str]:
    before, after = report.before or "no schema", report.after or "no schema"
    where = f"staging schema of {report.url}"
    if before == after:
        state = "at the head" if report.at_head else f"this twophase needs {report.head}"
        return [f"{where}: {after} ({state})"]
    lines = [f"{where}: {before} -> {after}"]
    if not report.at_head:
        lines.append(
            f"this twophase needs {report.head}: its jobs refuse the store until "
            "`twophase db upgrade`"
        )
    return lines


def grant_lines(report: GrantReport) -> list[str]:
    """The statements run, then where."""
    done = f"{len(report.statements)} statements run in schema {report.schema} of {report.url}"
    return [*report.statements, done]


def history_lines(history: SchemaHistory) -> list[str]:
    """The revisions oldest first, the head and the store's current one marked."""
    rows = [(r.revision, r.description, _marks(r.head, r.current)) for r in history.revisions]
    lines = table(("REVISION", "DESCRIPTION", ""), rows, width=100)  # descriptions whole
    return [*lines, f"staging schema of {history.url}: {_where(history)}"]


def _where(history: SchemaHistory) -> str:
    current = history.current
    if current is None:
        return "no schema (`twophase db upgrade` creates it)"
    if current == history.head:
        return f"{current} (at the head)"
    if current not in {r.revision for r in history.revisions}:
        return f"{current}, a revision this twophase does not ship"
    return f"{current} (this twophase needs {history.head}: `twophase db upgrade`)"


def _marks(head: bool, current: bool) -> str:
    marks = [word for word, on in (("head", head), ("current", current)) if on]
    return f"({', '.join(marks)})" if marks else ""


def abort_lines(done: AbortReport) -> list[str]:
    return [
        f"aborted epoch {done.epoch} of sink {done.sink_id!r}: {done.points_discarded} staged "
        f"points discarded ({done.reason})"
    ]


def reset_lines(done: ResetReport) -> list[str]:
    return [
        f"reset sink {done.sink_id!r}: unbound from query {done.query_id}, forgot "
        f"{done.epochs_forgotten} epochs, kept {done.dead_letters_kept} dead letters; the "
        "next query may start at any epoch"
    ]


def gc_lines(summary: GcSummary) -> list[str]:
    lines = table(
        ("SINK", "EPOCHS PURGED", "POINTS PURGED", "ORPHAN WRITES", "COMPACTED", "FLOOR"),
        [
            (
                s.sink_id,
                s.epochs_purged,
                s.points_purged,
                s.orphan_writes,
                s.epochs_compacted,
                s.compacted_through,
            )
            for s in summary.sinks
        ],
    )
    verb = "would purge" if summary.dry_run else "purged"
    compacted = summary.total("epochs_compacted")
    history = summary.history_retention_s
    lines.append(
        f"gc {verb} {summary.total('epochs_purged')} epochs "
        f"({summary.total('points_purged')} staged points) past retention "
        f"{age(summary.retention_s)} and {summary.total('orphan_writes')} orphaned writes"
        + (
            f", and {'would compact' if summary.dry_run else 'compacted'} the records of "
            f"{compacted} delivered epochs past "
            f"history_retention {age(history)} (FLOOR: every epoch up to it was delivered)"
            if compacted and history is not None
            else ""
        )
        + (" (dry run: nothing was removed)" if summary.dry_run else "")
    )
    for (sink, target), why in _quarantined(summary):
        lines.append(
            f"target {target} of sink {sink} quarantined ({why}): "
            f"`twophase targets resync {target} --sink {sink}` re-delivers what is retained"
        )
    return lines


def _quarantined(summary: GcSummary) -> Iterator[tuple[tuple[str, str], str]]:
    """Each target a collection quarantined, with the bound it passed."""
    for report in summary.sinks:
        reasons = report.quarantine_reasons or ("lagging past target_max_lag",) * len(
            report.quarantined
        )
        yield from zip(report.quarantined, reasons, strict=True)


def recover_lines(report: RecoverReport) -> list[str]:
    results = report.recovered
    lines = _caught_up_lines(report)
    if not results:
        return ["nothing to recover: no PRECOMMITTED epochs", *lines]
    rows = [(r.sink_id, epoch_label(r.epoch), r.delivered, r.rejected) for r in results]
    lines = [*table(("SINK", "EPOCH", "DELIVERED", "REJECTED"), rows), *lines]
    lines.append(f"recovered {plural(len(results), 'epoch')}; no PRECOMMITTED epoch is left")
    if any(r.rejected for r in results):
        lines.append("a target rejected some points: see `twophase dead-letters`")
    return lines


def _caught_up_lines(report: RecoverReport) -> list[str]:
    """One line per lagging target recover caught up: the epochs it delivered to it."""
    by_target: dict[tuple[str, str], list[int]] = {}
    for done in report.caught_up:
        by_target.setdefault((done.sink_id, done.target), []).append(done.epoch)
    return [
        f"sink {sink}: target {target} caught up, epochs {compact_ranges(epochs)} delivered"
        for (sink, target), epochs in by_target.items()
    ]


def resend_lines(report: ResendReport, target: str | None = None) -> list[str]:
    rows = [(r.epoch, r.points_sent, r.points_rejected) for r in report.resent]
    lines = table(("EPOCH", "SENT", "REJECTED"), rows)
    sent = sum(r.points_sent for r in report.resent)
    lines.append(
        f"re-sent {plural(sent, 'point')} of {plural(len(report.resent), 'epoch')} "
        f"of sink {report.sink_id!r}" + ("" if target is None else f" to target {target!r}")
    )
    if report.skipped_aborted:
        lines.append(f"skipped aborted epochs {compact_ranges(report.skipped_aborted)}")
    return lines


def verify_lines(report: VerifyReport, target: str | None = None) -> list[str]:
    what = (
        f"sink {report.sink_id!r}, {name_epochs(report.epochs)}: "
        f"{report.points} points in {report.series} series"
    )
    held = "the target" if target is None else f"target {target!r}"
    lines = [f"note: {note}" for note in report.notes]
    if report.ok:
        return [*lines, f"OK: {held} holds exactly the staged points ({what})"]
    diffs = report.differences
    lines += table(
        ("MEASUREMENT", "TAGS", "EXPECTED", "HELD", "MISSING", "DIFFERENT", "EXTRA"),
        [
            (d.measurement, _tags(d.tags), d.points_expected, d.points_held, *_counts(d))
            for d in diffs
        ],
    )
    lines += [f"  {d.measurement},{_tags(d.tags)}: {x}" for d in diffs[:10] for x in d.examples]
    if report.unparseable:
        lines.append(f"{report.unparseable} staged lines could not be parsed")
    where = "" if target is None else f" of target {target!r}"
    lines.append(f"DIFFERENCES in {len(diffs)} series{where} ({what})")
    return lines


def verify_targets_lines(reports: Sequence[TargetVerifyReport]) -> list[str]:
    """Each target's verify, in turn, then which targets differ."""
    lines: list[str] = []
    for one in reports:
        lines += [f"target {one.target!r}:", *verify_lines(one.report, one.target), ""]
    differ = [r.target for r in reports if not r.report.ok]
    if differ:
        return [*lines, f"DIFFERENCES in {plural(len(differ), 'target')}: {', '.join(differ)}"]
    return [*lines, f"OK: every target holds exactly the staged points ({len(reports)})"]


def _counts(diff: SeriesDiff) -> tuple[int, int, int]:
    return diff.missing, diff.different, diff.extra


def _tags(tags: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in tags.items())
