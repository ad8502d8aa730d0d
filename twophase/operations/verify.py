"""Compare what the staging store says was delivered with what a target holds (``verify``).

The expected state is rebuilt from the retained staged lines of COMMITTED
epochs, in epoch and promotion order, as a target applies writes: a point is
(measurement, tag set, timestamp); a later write of the same point replaces
the values of the fields it names and keeps the others. Lines the target
refused (promote-phase dead letters) are left out. Later retained epochs that
rewrite a verified point (update output mode) update its expected values, so
verifying an old epoch does not report the newer values as differences.

A target is read back through its kind's read-back
([`Readback`][twophase.targets.contract.Readback]: InfluxDB through InfluxQL on the 1.x
``/query`` API, PostgreSQL through SQL), one measurement and time window at a time,
its answer streamed a chunk at a time and compared as it comes; times are compared at
the finest the target keeps (a microsecond for PostgreSQL). Per series
(measurement + tag set) it reports expected points that are *missing*, points
whose expected field values *differ*, and *extra* points: points the target
holds in the series' verified time span at a timestamp no verified epoch
staged (a duplicate from an at-least-once writer, or a point written by an
epoch outside the verified range). Fields the target holds beyond the expected
ones are not differences (earlier epochs or other writers may add fields).

Memory is bounded: the expected state of a selection of more than ``PASS_POINTS``
points is built and compared in passes, each holding the series whose hash falls in
its share (every point of a series in the same pass, so each pass gives exactly what
one pass over everything would). A pass reads every verified epoch's staged lines
again, one epoch at a time through a server-side cursor (with that epoch's dead
letters), and queries the target's windows of its own points; nothing holds more than
one pass's expected points and one chunk of an answer. Only a single series larger
than a pass makes a pass larger.

The command: [`verify`][twophase.operations.verify.verify] checks each target
of the configuration (or the ones named), on the epochs it is owed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from twophase.config import TargetConfig, TwoPhaseConfig
from twophase.deprecation import warn_deprecated
from twophase.errors import LineProtocolError, StateError
from twophase.model import EpochPlan, EpochState
from twophase.operations.hooks import SILENT, Hooks
from twophase.operations.hooks import Progress as OperationProgress
from twophase.operations.store_only import stored_states
from twophase.operations.target_choice import target_config
from twophase.points.lineproto import FieldValue, Tags, parse_line
from twophase.protocol.deliver.reader import StagedReader
from twophase.protocol.ledger.target_ledger import TargetState
from twophase.store.database import Database
from twophase.store.views import EpochInfo, EpochRange, Views
from twophase.targets import Readback, kind_of, make_readback
from twophase.wording import epochs_are

Series = tuple[str, Tags]
Points = dict[Series, dict[int, dict[str, FieldValue]]]

WINDOW_POINTS = 10_000  # expected timestamps per read-back query (bounds the response)
# Expected points one pass holds (its memory: docs/concepts/scaling.md); a larger
# selection is verified in passes over shares of its series.
PASS_POINTS = 200_000
MAX_EXAMPLES = 3


@dataclass(frozen=True)
class Share:
    """The series one pass verifies: those whose hash is ``index`` modulo ``of``. The
    hash is Python's: the same for a series within the process, whatever the order
    its tags were written in (a series is its parsed measurement and sorted tags)."""

    index: int = 0
    of: int = 1

    def holds(self, series: Series) -> bool:
        return self.of == 1 or hash(series) % self.of == self.index


EVERY_SERIES = Share()

# -- the expected state -------------------------------------------------------------------


@dataclass
class Expected:
    """The points the target should hold, built line by line (mutable while building):
    those of the series in ``share`` (a pass's). Unparseable lines are counted by the
    first share only, so that passes add up to one count."""

    points: Points = field(default_factory=dict)
    unparseable: int = 0
    examples: list[str] = field(default_factory=list)
    share: Share = EVERY_SERIES
    resolution_ns: int = 1  # the finest time the target keeps: times are compared floored

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
                if self.share.index == 0:
                    self.unparseable += 1
                    if len(self.examples) < MAX_EXAMPLES:
                        self.examples.append(f"{exc}: {line[:200]}")
                continue
            series = (point.measurement, point.tags)
            if not self.share.holds(series):
                continue
            stamp = point.time_ns - point.time_ns % self.resolution_ns
            if only_known:
                known = self.points.get(series, {}).get(stamp)
                if known is not None:
                    known.update(point.fields)
                continue
            self.points.setdefault(series, {}).setdefault(stamp, {}).update(point.fields)
        return count

    def size(self) -> int:
        return sum(len(times) for times in self.points.values())


@dataclass(frozen=True)
class Window:
    """One read-back query: a measurement between two timestamps (inclusive, ns)."""

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


def actual_points(
    series_list: Iterable[dict[str, Any]],
) -> Iterator[tuple[Series, int, dict[str, Any]]]:
    """(series, time, fields) of a read-back's answer; empty tags and null fields are absent."""
    for series in series_list:
        tags = tuple(sorted((k, v) for k, v in (series.get("tags") or {}).items() if v != ""))
        columns = series["columns"][1:]
        for row in series.get("values") or []:
            values = {c: v for c, v in zip(columns, row[1:], strict=True) if v is not None}
            yield (series["name"], tags), int(row[0]), values


# -- comparison ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SeriesDiff:
    """One series whose points in the target are not the expected ones."""

    measurement: str
    tags: dict[str, str]
    points_expected: int
    points_held: int  # the target's points in the series' verified span
    missing: int
    different: int
    extra: int
    examples: tuple[str, ...]

    @property
    def points_influx(self) -> int:
        """Former name of ``points_held``."""
        warn_deprecated("SeriesDiff.points_influx", "SeriesDiff.points_held", stacklevel=2)
        return self.points_held

    def as_json(self) -> dict[str, Any]:
        """The diff as ``verify --json`` prints it: the fields, and ``points_held`` once
        more under its former key ``points_influx`` until former names go."""
        return {**asdict(self), "points_influx": self.points_held}


def same_value(expected: FieldValue, actual: Any) -> bool:
    """Equal as a target returns it: InfluxDB's JSON has no float/int distinction (5.0
    comes back as 5), but a bool is never a number."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    return bool(expected == actual)


class SeriesCheck:
    """One series compared as the target's points come (in time order, as it answers):
    what is expected of it is consumed as each point is seen."""

    def __init__(self, want: dict[int, dict[str, FieldValue]]) -> None:
        self._left = want  # the expected points not seen yet
        self._expected = len(want)
        self._low, self._high = min(want), max(want)
        self._held = self._different = self._extra = 0
        self._wrong: list[tuple[int, str]] = []  # the first differences, by time
        self._extras: list[int] = []  # the first extra points' times

    def see(self, stamp: int, values: dict[str, Any]) -> None:
        """One of the target's points of the series (points outside its verified span are
        not its concern)."""
        if not self._low <= stamp <= self._high:
            return
        self._held += 1
        fields = self._left.pop(stamp, None)
        if fields is None:
            self._extra += 1
            if len(self._extras) < MAX_EXAMPLES:
                self._extras.append(stamp)
            return
        wrong = [k for k, v in fields.items() if not (k in values and same_value(v, values[k]))]
        if wrong:
            self._different += 1
            if len(self._wrong) < MAX_EXAMPLES:
                key = wrong[0]
                self._wrong.append(
                    (
                        stamp,
                        f"{when(stamp)}: field {key!r} expected {fields[key]!r}, "
                        f"the target has {values.get(key)!r}",
                    )
                )

    def diff(self, series: Series) -> SeriesDiff | None:
        """The differences once every point was seen, or None when there are none."""
        missing = len(self._left)
        if not (missing or self._different or self._extra):
            return None
        unseen = heapq.nsmallest(MAX_EXAMPLES, self._left)
        found = sorted([*self._wrong, *((t, f"{when(t)}: missing in the target") for t in unseen)])
        examples = [text for _, text in found[:MAX_EXAMPLES]]
        for stamp in sorted(self._extras):
            _example(examples, f"{when(stamp)}: extra point in the target, not staged")
        measurement, tags = series
        return SeriesDiff(
            measurement,
            dict(tags),
            self._expected,
            self._held,
            missing,
            self._different,
            self._extra,
            tuple(examples),
        )


def compare_series(
    series: Series, want: dict[int, dict[str, FieldValue]], have: dict[int, dict[str, Any]]
) -> SeriesDiff | None:
    """The differences of one series, or None when the target holds exactly what is
    expected."""
    check = SeriesCheck(dict(want))
    for stamp in sorted(have):
        check.see(stamp, have[stamp])
    return check.diff(series)


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


class Comparison:
    """One pass's comparison: the target's points, as its answers stream, against the
    expected ones (which it consumes); other series are ignored."""

    def __init__(self, expected: Points) -> None:
        self._checks = {series: SeriesCheck(want) for series, want in expected.items()}

    def see(self, series_list: Iterable[dict[str, Any]]) -> None:
        """Points of one answer, a series (or a chunk of one) at a time."""
        checks = self._checks
        for series, stamp, values in actual_points(series_list):
            check = checks.get(series)
            if check is not None:
                check.see(stamp, values)

    def differences(self) -> list[SeriesDiff]:
        diffs = (check.diff(series) for series, check in sorted(self._checks.items()))
        return [d for d in diffs if d is not None]


def read_back(
    readback: Readback,
    window_list: Sequence[Window],
    comparison: Comparison,
    on_window: Callable[[Window], None] | None = None,
) -> None:
    """Stream the target's answer for each window into ``comparison``."""
    for window in window_list:
        comparison.see(readback.window(window.measurement, window.start, window.end))
        if on_window is not None:
            on_window(window)


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
    """An epoch's lines in promotion order, without those the target refused."""
    for write_id, seq, line in reader.lines(plan):
        if (write_id, seq) not in rejected:
            yield line


Progress = Callable[[str, str, int, int], None]  # (phase, unit, done, total), done cumulative


@dataclass(frozen=True)
class _Reading:
    """What a verify reads from the staging store, in order: each epoch and whether it
    only updates points already expected (a later epoch that rewrote them)."""

    order: tuple[tuple[int, bool], ...]
    points: int  # staged points of the chosen epochs: what the passes share
    staged: int  # staged points of every epoch read: a pass's progress total


class Verifier:
    """Rebuilds the expected state of a sink's epochs and compares it with a target, in
    passes of at most about ``pass_points`` expected points (see the module)."""

    def __init__(
        self,
        views: Views,
        reader: StagedReader,
        readback: Readback,
        target: str = "",
        pass_points: int = PASS_POINTS,
        resolution_ns: int = 1,
    ):
        self._views = views
        self._reader = reader
        self._readback = readback
        self._target = target  # the target verified: its letters, and those naming none
        self._pass_points = pass_points
        self._resolution_ns = resolution_ns  # the target kind's finest time

    def verify(
        self, sink_id: str, selection: Sequence[EpochInfo], progress: Progress | None = None
    ) -> VerifyReport:
        """Compare the COMMITTED, retained epochs of ``selection`` (in increasing order)."""
        report = progress or (lambda *_: None)
        chosen, notes = choose_epochs(sink_id, selection)
        reading = self._reading(sink_id, selection, chosen, notes)
        passes = max(1, -(-reading.points // self._pass_points))
        differences: list[SeriesDiff] = []
        points = series = unparseable = 0
        for index in range(passes):
            label = f" (pass {index + 1} of {passes})" if passes > 1 else ""
            expected = self._expected(sink_id, reading, Share(index, passes), label, report)
            points, series = points + expected.size(), series + len(expected.points)
            unparseable += expected.unparseable  # the first pass's: each line once
            notes += [f"unparseable staged line: {x}" for x in expected.examples]
            differences += self._compare(expected, label, report)
            del expected  # before the next pass builds its own
        return VerifyReport(
            sink_id=sink_id,
            epochs=tuple(chosen),
            points=points,
            series=series,
            unparseable=unparseable,
            differences=tuple(
                sorted(differences, key=lambda d: (d.measurement, sorted(d.tags.items())))
            ),
            notes=tuple(notes),
        )

    def _reading(
        self, sink_id: str, selection: Sequence[EpochInfo], chosen: list[int], notes: list[str]
    ) -> _Reading:
        """The chosen epochs, then the later retained epochs that rewrote their points
        (they decide what the target holds); notes what cannot be known."""
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
        return _Reading(
            tuple(order),
            sum(by_epoch[n].points_staged for n in chosen),
            sum(by_epoch[n].points_staged for n, _ in order),
        )

    def _expected(
        self, sink_id: str, reading: _Reading, share: Share, label: str, report: Progress
    ) -> Expected:
        """The expected points of the share's series: every epoch read in order, one at
        a time, without the lines the target refused (that epoch's letters)."""
        expected, done = Expected(share=share, resolution_ns=self._resolution_ns), 0
        for number, only_known in reading.order:
            plan = self._reader.plan(sink_id, number)
            rejected = self._reader.rejected_at_promote(sink_id, [number], self._target)
            done += expected.add(staged_lines(self._reader, plan, rejected), only_known)
            report("read staged points" + label, "points", done, reading.staged)
        return expected

    def _compare(self, expected: Expected, label: str, report: Progress) -> list[SeriesDiff]:
        """The target's answers for the pass's windows, streamed into its comparison."""
        planned = windows(expected.points)
        comparison = Comparison(expected.points)
        fetched = 0

        def on_window(_: Window) -> None:
            nonlocal fetched
            fetched += 1
            report("query the target" + label, "queries", fetched, len(planned))

        read_back(self._readback, planned, comparison, on_window)
        return comparison.differences()


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
    back through its kind's read-back): each of ``targets`` (default:
    every configured target) in turn, in configured order. A target is verified on
    the epochs it is owed (from the one it was added at); those it still lacks
    (lagging, quarantined) are verified too, reported missing, with a note."""
    if targets is None:
        chosen = list(config.target.named_targets())
    else:
        chosen = [target_config(config.target, name) for name in targets]
    with contextlib.ExitStack() as opened:
        readbacks = [(t.name, *_readback(t.config, opened)) for t in chosen]
        return _verify_each(config, sink_id, selection, hooks, readbacks)


def _verify_each(
    config: TwoPhaseConfig,
    sink_id: str,
    selection: EpochRange | None,
    hooks: Hooks,
    readbacks: Sequence[tuple[str, Readback, int]],
) -> tuple[TargetVerifyReport, ...]:
    with Database(config.staging) as db:
        views = Views(db)
        views.require_sink(sink_id)
        epochs = views.select_epochs(sink_id, selection or EpochRange())
        rows = {s.target: s for s in stored_states(db, sink_id)}
        reports = []
        for name, readback, resolution_ns in readbacks:
            owed, notes = _owed(sink_id, name, epochs, rows.get(name))
            label = f"{name}: " if len(readbacks) > 1 else ""

            def progress(step: str, unit: str, done: int, total: int, label: str = label) -> None:
                hooks.progress(OperationProgress(label + step, unit, done, total))

            verifier = Verifier(
                views, StagedReader(db), readback, name, resolution_ns=resolution_ns
            )
            report = verifier.verify(sink_id, owed, progress)
            report = dataclasses.replace(report, notes=(*notes, *report.notes))
            reports.append(TargetVerifyReport(name, report))
    return tuple(reports)


def _readback(target: TargetConfig, opened: contextlib.ExitStack) -> tuple[Readback, int]:
    """How verify reads one target back (its kind's read-back, probed: PermanentError at
    once for a store that cannot be read), and the finest time the target keeps."""
    readback = make_readback(target)
    opened.callback(readback.close)
    readback.probe()  # fails fast: unsupported, or unreachable
    return readback, kind_of(target).time_resolution_ns


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
