"""Compare what the staging store says was delivered with what InfluxDB holds (``verify``).

The expected state is rebuilt from the retained staged lines of COMMITTED
epochs, in epoch and promotion order, as InfluxDB applies writes: a point is
(measurement, tag set, timestamp); a later write of the same point replaces
the values of the fields it names and keeps the others. Lines InfluxDB
refused (promote-phase dead letters) are left out. Later retained epochs that
rewrite a verified point (update output mode) update its expected values, so
verifying an old epoch does not report the newer values as differences.

InfluxDB is read back through InfluxQL on the 1.x ``/query`` API (``epoch=ns``),
one measurement and time window at a time, ``GROUP BY *``. Per series
(measurement + tag set) it reports expected points that are *missing*, points
whose expected field values *differ*, and *extra* points: points InfluxDB
holds in the series' verified time span at a timestamp no verified epoch
staged (a duplicate from an at-least-once writer, or a point written by an
epoch outside the verified range). Fields InfluxDB holds beyond the expected
ones are not differences (earlier epochs or other writers may add fields).

The command: [`verify`][twophase.operations.verify.verify] checks each target
of the configuration (or the ones named), on the epochs it is owed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from twophase.config import InfluxConfig, TwoPhaseConfig
from twophase.errors import LineProtocolError, StateError
from twophase.influx.api import make_writer, resolve_api
from twophase.model import EpochPlan, EpochState
from twophase.operations.hooks import SILENT, Hooks
from twophase.operations.hooks import Progress as OperationProgress
from twophase.operations.store import stored_states
from twophase.operations.targets import target_config
from twophase.points.lineproto import FieldValue, Tags, parse_line
from twophase.protocol.reader import StagedReader
from twophase.protocol.targets import TargetState
from twophase.store.database import Database
from twophase.store.views import EpochInfo, EpochRange, Views
from twophase.wording import epochs_are

Series = tuple[str, Tags]
Points = dict[Series, dict[int, dict[str, FieldValue]]]
Query = Callable[[str], list[dict[str, Any]]]

WINDOW_POINTS = 10_000  # expected timestamps per InfluxDB query (bounds the response)
MAX_EXAMPLES = 3

# -- the expected state -------------------------------------------------------------------


@dataclass
class Expected:
    """The points InfluxDB should hold, built line by line (mutable while building)."""

    points: Points = field(default_factory=dict)
    unparseable: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, lines: Iterable[str], only_known: bool = False) -> int:
        """Apply lines in order; with ``only_known`` only to points already expected."""
        count = 0
        for line in lines:
            count += 1
            try:
                point = parse_line(line)
                if point.time_ns is None:
                    raise LineProtocolError("no timestamp (cannot be compared)")
            except LineProtocolError as exc:
                self.unparseable += 1
                if len(self.examples) < MAX_EXAMPLES:
                    self.examples.append(f"{exc}: {line[:200]}")
                continue
            series = (point.measurement, point.tags)
            if only_known:
                known = self.points.get(series, {}).get(point.time_ns)
                if known is not None:
                    known.update(point.fields)
                continue
            self.points.setdefault(series, {}).setdefault(point.time_ns, {}).update(point.fields)
        return count

    def size(self) -> int:
        return sum(len(times) for times in self.points.values())


@dataclass(frozen=True)
class Window:
    """One InfluxDB query: a measurement between two timestamps (inclusive, ns)."""

    measurement: str
    start: int
    end: int


def windows(points: Points, per_query: int = WINDOW_POINTS) -> list[Window]:
    """Contiguous time windows per measurement, each holding at most ``per_query``
    expected timestamps, together covering every series' whole verified span."""
    stamps: dict[str, set[int]] = {}
    for (measurement, _), times in points.items():
        stamps.setdefault(measurement, set()).update(times)
    found = []
    for measurement in sorted(stamps):
        ordered = sorted(stamps[measurement])
        starts = ordered[::per_query]
        ends = [later - 1 for later in starts[1:]] + [ordered[-1]]
        found += [Window(measurement, a, b) for a, b in zip(starts, ends, strict=True)]
    return found


def quote_ident(name: str) -> str:
    """An InfluxQL double-quoted identifier (names are data, never query syntax)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def window_query(window: Window, retention_policy: str | None) -> str:
    source = quote_ident(window.measurement)
    if retention_policy:
        source = f"{quote_ident(retention_policy)}.{source}"
    # InfluxQL, not SQL: the names are quoted identifiers and the bounds integers.
    where = f"time >= {int(window.start)} AND time <= {int(window.end)}"
    return f"SELECT * FROM {source} WHERE {where} GROUP BY *"  # noqa: S608


def actual_points(
    series_list: Iterable[dict[str, Any]],
) -> Iterator[tuple[Series, int, dict[str, Any]]]:
    """(series, time, fields) of InfluxDB's answer; empty tags and null fields are absent."""
    for series in series_list:
        tags = tuple(sorted((k, v) for k, v in (series.get("tags") or {}).items() if v != ""))
        columns = series["columns"][1:]
        for row in series.get("values") or []:
            values = {c: v for c, v in zip(columns, row[1:], strict=True) if v is not None}
            yield (series["name"], tags), int(row[0]), values


# -- comparison ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SeriesDiff:
    """One series whose points in InfluxDB are not the expected ones."""

    measurement: str
    tags: dict[str, str]
    points_expected: int
    points_influx: int  # InfluxDB's points in the series' verified time span
    missing: int
    different: int
    extra: int
    examples: tuple[str, ...]


def same_value(expected: FieldValue, actual: Any) -> bool:
    """Equal as InfluxDB returns it: JSON has no float/int distinction (5.0 comes back as 5),
    but a bool is never a number."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    return bool(expected == actual)


def compare_series(
    series: Series, want: dict[int, dict[str, FieldValue]], have: dict[int, dict[str, Any]]
) -> SeriesDiff | None:
    """The differences of one series, or None when InfluxDB holds exactly what is expected."""
    low, high = min(want), max(want)
    span = {t: v for t, v in have.items() if low <= t <= high}
    examples: list[str] = []
    missing = different = 0
    for stamp in sorted(want):
        fields = want[stamp]
        got = span.get(stamp)
        if got is None:
            missing += 1
            _example(examples, f"{when(stamp)}: missing in InfluxDB")
            continue
        wrong = [k for k, v in fields.items() if not (k in got and same_value(v, got[k]))]
        if wrong:
            different += 1
            key = wrong[0]
            _example(
                examples,
                f"{when(stamp)}: field {key!r} expected {fields[key]!r}, "
                f"InfluxDB has {got.get(key)!r}",
            )
    extra = sorted(t for t in span if t not in want)
    for stamp in extra[:MAX_EXAMPLES]:
        _example(examples, f"{when(stamp)}: extra point in InfluxDB, not staged")
    if not (missing or different or extra):
        return None
    measurement, tags = series
    return SeriesDiff(
        measurement,
        dict(tags),
        len(want),
        len(span),
        missing,
        different,
        len(extra),
        tuple(examples),
    )


def when(stamp: int) -> str:
    """A nanosecond timestamp for people, exact: ``2023-11-14T22:13:20.000000001Z``."""
    seconds, nanos = divmod(stamp, 1_000_000_000)
    moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=seconds)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{nanos:09d}Z"


def _example(examples: list[str], text: str) -> None:
    if len(examples) < MAX_EXAMPLES:
        examples.append(text)


def compare(expected: Points, actual: Points) -> list[SeriesDiff]:
    diffs = (compare_series(s, want, actual.get(s, {})) for s, want in sorted(expected.items()))
    return [d for d in diffs if d is not None]


@dataclass(frozen=True)
class VerifyReport:
    sink_id: str
    epochs: tuple[int, ...]
    points: int
    series: int
    unparseable: int
    differences: tuple[SeriesDiff, ...]
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.differences and not self.unparseable


def fetch(
    query: Query,
    window_list: Sequence[Window],
    points: Points,
    retention_policy: str | None,
    on_window: Callable[[Window], None] | None = None,
) -> Points:
    """InfluxDB's points of the expected series in the windows (other series are ignored)."""
    actual: Points = {}
    for window in window_list:
        for series, stamp, values in actual_points(query(window_query(window, retention_policy))):
            if series in points:
                actual.setdefault(series, {})[stamp] = values
        if on_window is not None:
            on_window(window)
    return actual


# -- what to verify, read from the staging store -------------------------------------------


def choose_epochs(sink_id: str, epochs: Sequence[EpochInfo]) -> tuple[list[int], list[str]]:
    """The epochs that can be verified (COMMITTED, retained) and notes on the others."""
    chosen = [e.epoch for e in epochs if e.state == EpochState.COMMITTED and e.purged_at is None]
    notes = []
    for what, numbers in (
        (
            "PRECOMMITTED (not delivered yet; run `twophase recover`)",
            [e.epoch for e in epochs if e.state == EpochState.PRECOMMITTED],
        ),
        (
            "past retention (staged points purged)",
            [
                e.epoch
                for e in epochs
                if e.state == EpochState.COMMITTED and e.purged_at is not None
            ],
        ),
        ("ABORTED (never delivered)", [e.epoch for e in epochs if e.state == EpochState.ABORTED]),
    ):
        if numbers:
            notes.append(f"not verified: {epochs_are(numbers)} {what}")
    if not chosen:
        raise StateError(f"sink {sink_id!r}: nothing to verify; " + "; ".join(notes))
    return chosen, notes


def staged_lines(
    reader: StagedReader, plan: EpochPlan, rejected: Container[tuple[str, int]]
) -> Iterator[str]:
    """An epoch's lines in promotion order, without those InfluxDB refused."""
    for write_id, seq, line in reader.lines(plan):
        if (write_id, seq) not in rejected:
            yield line


Progress = Callable[[str, str, int, int], None]  # (phase, unit, done, total), done cumulative


class Verifier:
    """Rebuilds the expected state of a sink's epochs and compares it with InfluxDB."""

    def __init__(
        self,
        views: Views,
        reader: StagedReader,
        query: Query,
        retention_policy: str | None = None,
        target: str = "",
    ):
        self._views = views
        self._reader = reader
        self._query = query
        self._rp = retention_policy
        self._target = target  # the target verified: its letters, and those naming none

    def verify(
        self, sink_id: str, selection: Sequence[EpochInfo], progress: Progress | None = None
    ) -> VerifyReport:
        """Compare the COMMITTED, retained epochs of ``selection`` (in increasing order)."""
        report = progress or (lambda *_: None)
        chosen, notes = choose_epochs(sink_id, selection)
        expected = self._expected(sink_id, selection, chosen, notes, report)
        planned = windows(expected.points)
        fetched = 0

        def on_window(_: Window) -> None:
            nonlocal fetched
            fetched += 1
            report("query InfluxDB", "queries", fetched, len(planned))

        actual = fetch(self._query, planned, expected.points, self._rp, on_window)
        return VerifyReport(
            sink_id=sink_id,
            epochs=tuple(chosen),
            points=expected.size(),
            series=len(expected.points),
            unparseable=expected.unparseable,
            differences=tuple(compare(expected.points, actual)),
            notes=tuple(notes + [f"unparseable staged line: {x}" for x in expected.examples]),
        )

    def _expected(
        self,
        sink_id: str,
        selection: Sequence[EpochInfo],
        chosen: list[int],
        notes: list[str],
        report: Progress,
    ) -> Expected:
        """The chosen epochs' points, then updated by the later retained epochs that
        rewrote them (they decide what InfluxDB holds); notes what cannot be known."""
        # Spark epochs after the selection's last (corrections, numbered below 0, are
        # verified when selected: a correction only carries points its epochs lacked).
        last = max(e.epoch for e in selection)
        later = [e for e in self._views.epochs(sink_id, EpochRange(first=last + 1)) if e.epoch >= 0]
        pending = [e.epoch for e in later if e.state == EpochState.PRECOMMITTED]
        if pending:
            notes.append(
                f"{epochs_are(pending)} PRECOMMITTED: points they rewrite may "
                "differ until `twophase recover` delivers them"
            )
        rewriting = [e for e in later if e.state == EpochState.COMMITTED and e.purged_at is None]
        by_epoch = {e.epoch: e for e in [*selection, *rewriting]}
        order = [(n, False) for n in chosen] + [(e.epoch, True) for e in rewriting]
        total = sum(by_epoch[n].points_staged for n, _ in order)
        rejected = self._reader.rejected_at_promote(sink_id, list(by_epoch), self._target)
        expected, done = Expected(), 0
        for number, only_known in order:
            plan = self._reader.plan(sink_id, number)
            done += expected.add(staged_lines(self._reader, plan, rejected), only_known)
            report("read staged points", "points", done, total)
        return expected


# -- the command ----------------------------------------------------------------


@dataclass(frozen=True)
class TargetVerifyReport:
    """``verify`` of one target of the sink."""

    target: str
    report: VerifyReport


def verify(
    config: TwoPhaseConfig,
    sink_id: str,
    selection: EpochRange | None = None,
    hooks: Hooks = SILENT,
    targets: Sequence[str] | None = None,
) -> tuple[TargetVerifyReport, ...]:
    """Compare what the store says was delivered with what each target holds (read
    back through its writer's ``read``, InfluxQL): each of ``targets`` (default:
    every configured target) in turn, in configured order. A target is verified on
    the epochs it is owed (from the one it was added at); those it still lacks
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
                hooks.progress(OperationProgress(label + step, unit, done, total))

            verifier = Verifier(views, StagedReader(db), query, policy, name)
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
