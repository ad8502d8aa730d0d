"""The Prometheus exporter of the staging store: every sink's state, read on each scrape.

``twophase metrics serve`` runs it (on ``exporter_host``:``exporter_port``, loopback unless
told; https and mutual TLS with the ``exporter_tls_*`` settings,
[`twophase.serving`][twophase.serving]);
[`StoreCollector`][twophase.operations.exporter.StoreCollector] embeds it in any
``prometheus_client`` registry, and [`start`][twophase.operations.exporter.start] serves it
from a thread of the calling process.

A read of the store costs three indexed queries, whatever the history's
length: one row per sink (the running totals the ledger keeps in
``twophase_sinks``, the owning run through its primary key, the PRECOMMITTED
epochs through their partial index), the epochs committed since the previous
read (primary key range), and every sink's targets (the one server of a sink
with one is its target ``default``), each with its backlog (the COMMITTED
epochs it lacks: an index range past its cursor, per target). Each stays so
under the generic plans of the pool's prepared statements (no state given as
a parameter where a partial index needs its value). A read answers the
scrapes of the next ``exporter_cache`` seconds (5 by default): concurrent
scrapes, or several Prometheus servers, cost one read
(``twophase_store_reads_total`` counts them).
Counters are the store's own totals, so they survive exporter restarts; the
commit-duration histogram is the exporter's (Prometheus treats its restart
as a counter reset, as for any process). When the store
cannot be read, the scrape still answers, with ``twophase_store_up 0`` and
no per-sink series.

Labels: ``sink`` (bounded by the sinks one deploys), ``target`` (the named
servers of a sink: ``default`` for its one), ``state``, ``phase``. Never an
epoch number or a run id: those are unbounded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import psycopg
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from twophase.config import ExporterConfig, default
from twophase.errors import TwoPhaseError
from twophase.model import EpochState
from twophase.operations.store_only import stored_states
from twophase.protocol.ledger.target_ledger import LAGGING, LIVE, QUARANTINED, TargetState
from twophase.serving import Served, serve
from twophase.store.database import Database
from twophase.store.views import CLI_RUN_PREFIX, LIVE_WINDOW_S, OWNER_RUN_SQL, OWNER_STATE_SQL
from twophase.targets import metering

log = logging.getLogger("twophase.operations.exporter")

DEFAULT_PORT: int = default("exporter_port")
RUN_STATES = ("live", "ended", "unknown", "none")
TARGET_STATES = (LIVE, LAGGING, QUARANTINED)
# Decide -> committed: from a loopback epoch (tens of ms) to a target outage (many minutes).
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
RECENT_EPOCHS = 100  # committed epochs a new exporter puts in the histogram at its first scrape
MAX_NEW_EPOCHS = 10_000  # per sink and scrape; more committed between two scrapes are not timed

_SINKS_SQL = f"""
SELECT s.sink_id, s.last_decided_epoch, s.last_committed_epoch,
       extract(epoch FROM s.last_committed_at)::float8, {OWNER_STATE_SQL},
       p.n, COALESCE(extract(epoch FROM now() - p.since)::float8, 0),
       s.epochs_committed, s.epochs_aborted, s.points_staged, s.points_delivered,
       s.points_rejected_stage, s.points_rejected_promote, s.points_requeued,
       s.replays_detected, s.promote_attempts, s.promote_retries, s.fenced_attempts,
       s.staged_bytes
FROM twophase_sinks s {OWNER_RUN_SQL}
CROSS JOIN LATERAL (SELECT count(*) AS n, min(decided_at) AS since
    FROM twophase_epochs e WHERE e.state = 'PRECOMMITTED' AND e.sink_id = s.sink_id) p
ORDER BY s.sink_id
"""  # noqa: S608 - constant fragments; every value is a parameter
# The state is written out, not a parameter: the partial index of PRECOMMITTED epochs
# serves only a query whose state it can see, which a generic plan's parameter is not
# (the pool's prepared statements run generic plans): else every epoch of every sink
# would be read at each scrape.

# Epochs committed above each sink's last seen one (NULL: a sink new to this exporter,
# which takes only its RECENT_EPOCHS last ones). Corrections (negative epochs) are left out.
_COMMITTED_SQL = """
SELECT l.sink_id, c.epoch, c.seconds
FROM unnest(%(sinks)s::text[], %(seen)s::bigint[]) AS l(sink_id, seen)
CROSS JOIN LATERAL (
    SELECT e.epoch, extract(epoch FROM e.committed_at - e.decided_at)::float8 AS seconds
    FROM twophase_epochs e
    WHERE e.sink_id = l.sink_id AND e.epoch > COALESCE(l.seen, -1) AND e.state = %(done)s
    ORDER BY e.epoch DESC
    LIMIT CASE WHEN l.seen IS NULL THEN %(recent)s ELSE %(most)s END) c
"""


@dataclass(frozen=True)
class SinkRow:
    """One sink's line of a scrape (the columns of ``_SINKS_SQL``)."""

    sink_id: str
    last_decided_epoch: int | None
    last_committed_epoch: int | None
    last_commit_at: float | None
    run_state: str | None
    precommitted: int
    oldest_precommitted_age_s: float
    epochs_committed: int
    epochs_aborted: int
    points_staged: int
    points_delivered: int
    points_rejected_stage: int
    points_rejected_promote: int
    points_requeued: int
    replays_detected: int
    promote_attempts: int
    promote_retries: int
    fenced_attempts: int
    staged_bytes: int


@dataclass
class _Durations:
    """One sink's commit-duration histogram, cumulative since this exporter started."""

    seen: int | None = None
    counts: list[int] = field(default_factory=lambda: [0] * len(DURATION_BUCKETS))
    total: int = 0
    sum: float = 0.0

    def observe(self, epoch: int, seconds: float) -> None:
        self.seen = epoch if self.seen is None else max(self.seen, epoch)
        self.total += 1
        self.sum += seconds
        for i, bound in enumerate(DURATION_BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1

    def buckets(self) -> list[tuple[str, float]]:
        pairs = zip(DURATION_BUCKETS, self.counts, strict=True)
        bounds = [(repr(float(b)), float(c)) for b, c in pairs]
        return [*bounds, ("+Inf", float(self.total))]


class StoreCollector(Collector):
    """Collects the store's metrics on each scrape (register it in a registry).

    Thread-safe: reads are serialised (the histogram's state is shared). A read
    answers every scrape of the ``cache_s`` seconds after it (0: each scrape
    reads); scrapes that arrive while one reads wait for it and share it.
    ``live_window_s`` decides when a silent run counts as ``unknown`` rather
    than ``live``, as for ``twophase status``.
    """

    def __init__(
        self,
        db: Database,
        live_window_s: float,
        cache_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        self._window = live_window_s
        self._cache_s = cache_s
        self._clock = clock
        self._durations: dict[str, _Durations] = {}
        self._lock = threading.Lock()
        self._answer: tuple[float, list[Metric]] | None = None
        self._reads = 0

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self._answer is None or self._clock() - self._answer[0] >= self._cache_s:
                families = self._scrape()
                self._answer = (self._clock(), families)
            families = self._answer[1]
        yield from families

    def _scrape(self) -> list[Metric]:
        """One read of the store, as metric families."""
        started = time.perf_counter()
        self._reads += 1
        try:
            rows = self._read()
            targets = stored_states(self._db)
        except (TwoPhaseError, psycopg.Error) as exc:
            log.warning("scrape: cannot read the staging store: %s", exc)
            rows = None
        families: list[Metric] = [_store_up_family(rows is not None)]
        if rows is not None:
            families += [*sink_families(rows, self._durations), *target_families(targets)]
        took = _scrape_duration_family(time.perf_counter() - started)
        return [*families, took, _reads_family(self._reads)]

    def _read(self) -> list[SinkRow]:
        params = {
            "window": self._window,
            "cli": CLI_RUN_PREFIX,
            "cli_len": len(CLI_RUN_PREFIX),
        }
        with self._db.transaction() as cur:
            cur.execute(_SINKS_SQL, params)
            rows = [SinkRow(*row) for row in cur.fetchall()]
            sinks = [row.sink_id for row in rows]
            seen = [self._durations.get(sink, _Durations()).seen for sink in sinks]
            cur.execute(
                _COMMITTED_SQL,
                {
                    "sinks": sinks,
                    "seen": seen,
                    "done": EpochState.COMMITTED,
                    "recent": RECENT_EPOCHS,
                    "most": MAX_NEW_EPOCHS,
                },
            )
            for sink, epoch, seconds in cur.fetchall():
                self._durations.setdefault(sink, _Durations()).observe(epoch, seconds)
        for gone in set(self._durations) - set(sinks):  # a sink deleted from the store
            del self._durations[gone]
        return rows


def _store_up_family(up: bool) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "twophase_store_up", "1 when the last scrape read the staging store, else 0."
    )
    family.add_metric([], 1.0 if up else 0.0)
    return family


def _scrape_duration_family(seconds: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "twophase_scrape_duration_seconds", "How long reading the staging store took."
    )
    family.add_metric([], seconds)
    return family


def _reads_family(reads: float) -> CounterMetricFamily:
    reads_total = CounterMetricFamily(
        "twophase_store_reads",
        "Reads of the staging store by this exporter; a scrape within exporter_cache of the"
        " last read is answered from it.",
    )
    reads_total.add_metric([], reads)
    return reads_total


def _gauge(name: str, doc: str, labels: Sequence[str] = ("sink",)) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: Sequence[str] = ("sink",)) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


def sink_families(rows: Iterable[SinkRow], durations: dict[str, _Durations]) -> Iterator[Metric]:
    """The per-sink metric families of one scrape."""
    rows = list(rows)
    yield from _state_families(rows)
    yield from _total_families(rows)
    hist = HistogramMetricFamily(
        "twophase_commit_duration_seconds",
        "Decide -> committed duration of the sink's epochs (since this exporter started,"
        f" beginning with the last {RECENT_EPOCHS} epochs).",
        labels=["sink"],
    )
    for row in rows:
        d = durations.get(row.sink_id, _Durations())
        hist.add_metric([row.sink_id], d.buckets(), d.sum)
    yield hist


def _state_families(rows: list[SinkRow]) -> Iterator[Metric]:
    epochs = _gauge("twophase_epochs", "Epochs in the store by state.", ("sink", "state"))
    decided = _gauge("twophase_last_decided_epoch", "The sink's last decided (Spark) epoch.")
    committed = _gauge("twophase_last_committed_epoch", "The sink's last committed (Spark) epoch.")
    oldest = _gauge(
        "twophase_oldest_precommitted_age_seconds",
        "Age of the oldest PRECOMMITTED epoch (0 when none is): promotion is behind.",
    )
    last_commit = _gauge(
        "twophase_last_commit_timestamp_seconds", "Unix time of the sink's last commit."
    )
    run = _gauge(
        "twophase_run_state",
        "1 for the state of the run owning the sink (live, ended, unknown: silent past the"
        " live window without an end; none: no Spark run owns it).",
        ("sink", "state"),
    )
    staged = _gauge(
        "twophase_staged_bytes",
        "Bytes of staged line protocol the sink retains now, as stored (gzip members with"
        " compression = gzip): its decided epochs' that GC has not purged yet (nor an"
        " abort removed).",
    )
    for r in rows:
        s = r.sink_id
        epochs.add_metric([s, "precommitted"], r.precommitted)
        epochs.add_metric([s, "committed"], r.epochs_committed)
        epochs.add_metric([s, "aborted"], r.epochs_aborted)
        if r.last_decided_epoch is not None:
            decided.add_metric([s], r.last_decided_epoch)
        if r.last_committed_epoch is not None:
            committed.add_metric([s], r.last_committed_epoch)
        if r.last_commit_at is not None:
            last_commit.add_metric([s], r.last_commit_at)
        oldest.add_metric([s], r.oldest_precommitted_age_s)
        for state in RUN_STATES:
            run.add_metric([s, state], float((r.run_state or "none") == state))
        staged.add_metric([s], r.staged_bytes)
    yield from (epochs, decided, committed, oldest, last_commit, run, staged)


def _total_families(rows: list[SinkRow]) -> Iterator[Metric]:
    staged = _counter("twophase_points_staged", "Points staged by decided epochs.")
    delivered = _counter(
        "twophase_points_delivered",
        "Points acknowledged as epochs committed (by the first target holding each epoch).",
    )
    rejected = _counter(
        "twophase_points_rejected",
        "Dead letters as they arose: rows that never became points (stage) and points"
        " a target refused (promote).",
        ("sink", "phase"),
    )
    requeued = _counter("twophase_points_requeued", "Dead letters requeued as corrections.")
    pending = _gauge(
        "twophase_dead_letters", "Dead letters not requeued, by phase.", ("sink", "phase")
    )
    replays = _counter("twophase_replays_detected", "Spark replays of decided epochs detected.")
    attempts = _counter("twophase_promote_attempts", "Promotion attempts of epochs.")
    retries = _counter("twophase_promote_retries", "Promotion attempts after an epoch's first.")
    fenced = _counter(
        "twophase_fenced_attempts", "Steps refused to a run fenced by a newer one (I5)."
    )
    for r in rows:
        s = r.sink_id
        staged.add_metric([s], r.points_staged)
        delivered.add_metric([s], r.points_delivered)
        rejected.add_metric([s, "stage"], r.points_rejected_stage)
        rejected.add_metric([s, "promote"], r.points_rejected_promote)
        requeued.add_metric([s], r.points_requeued)
        pending.add_metric([s, "stage"], r.points_rejected_stage)
        pending.add_metric([s, "promote"], r.points_rejected_promote - r.points_requeued)
        replays.add_metric([s], r.replays_detected)
        attempts.add_metric([s], r.promote_attempts)
        retries.add_metric([s], r.promote_retries)
        fenced.add_metric([s], r.fenced_attempts)
    yield from (staged, delivered, rejected, requeued, pending, replays, attempts, retries, fenced)


def target_families(states: Iterable[TargetState]) -> Iterator[Metric]:
    """The per-target metric families of one scrape (every sink's targets)."""
    labels = ("sink", "target")
    lag_epochs = _gauge(
        "twophase_target_lag_epochs",
        "COMMITTED epochs of the sink the target is owed and does not hold yet.",
        labels,
    )
    lag_seconds = _gauge(
        "twophase_target_lag_seconds",
        "Age of the oldest COMMITTED epoch the target lacks, since its commit (0: none).",
        labels,
    )
    lag_bytes = _gauge(
        "twophase_target_lag_bytes",
        "Staged bytes (as stored) of the COMMITTED epochs the target lacks: its backlog,"
        " which target_max_backlog_bytes bounds.",
        labels,
    )
    state = _gauge(
        "twophase_target_state",
        "1 for the target's state: live, lagging (the catch-up delivers its backlog),"
        " quarantined (behind longer than target_max_lag, or by more than"
        " target_max_backlog_bytes: `twophase targets resync`).",
        ("sink", "target", "state"),
    )
    delivered = _gauge(
        "twophase_target_delivered_epoch",
        "The last epoch delivered to the target in epoch order (it holds every COMMITTED"
        " epoch it is owed up to it).",
        labels,
    )
    for t in states:
        names = [t.sink_id, t.target]
        lag_epochs.add_metric(names, t.lag_epochs)
        lag_seconds.add_metric(names, t.lag_seconds or 0.0)
        lag_bytes.add_metric(names, t.lag_bytes)
        for name in TARGET_STATES:
            state.add_metric([*names, name], float(t.state == name))
        if t.delivered_epoch is not None:
            delivered.add_metric(names, t.delivered_epoch)
    yield from (lag_epochs, lag_seconds, lag_bytes, state, delivered)


@dataclass(frozen=True)
class Exporter:
    """A running exporter: its registry, and the HTTP(S) server serving it."""

    registry: CollectorRegistry
    served: Served
    db: Database

    @property
    def port(self) -> int:
        return self.served.port

    @property
    def url(self) -> str:
        """Where Prometheus scrapes it (``https://`` with TLS)."""
        return self.served.url

    def close(self) -> None:
        self.served.close()
        self.db.close()


def start(
    db: Database,
    port: int | None = None,
    host: str | None = None,
    live_window_s: float = LIVE_WINDOW_S,
    *,
    config: ExporterConfig | None = None,
) -> Exporter:
    """Serve the store's metrics from a daemon thread as ``config`` says (default: the
    settings' defaults: 127.0.0.1:9464, plain http, a read answers 5 s of scrapes);
    ``port`` (0: any free) and ``host`` replace its own. ConfigError when it cannot
    listen there or its TLS files do not work."""
    config = config or ExporterConfig()
    endpoint = replace(
        config.endpoint,
        port=config.port if port is None else port,
        host=config.host if host is None else host,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(db, live_window_s, config.cache_s))
    return Exporter(registry, serve(registry, endpoint), db)


def metric_names() -> frozenset[str]:
    """Every sample name the exporter and the driver's endpoint expose (with their
    ``_total``/``_bucket``/``_sum``/``_count`` suffixes): what dashboards and alerts
    may query."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Sample())
    names = {s.name for family in registry.collect() for s in family.samples}
    for family in metering.REGISTRY.collect():
        # Labelled metrics show no sample before their first use: their names by type.
        names |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}
    return frozenset(names)


# The samples of each metric type, after the family's name.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


class _Sample(Collector):
    """One made-up sink, so that every family shows its samples' names."""

    def collect(self) -> Iterator[Metric]:
        row = SinkRow("example", 1, 1, 1.0, "live", *([0] * 14))
        durations = {"example": _Durations()}
        yield from sink_families([row], durations)
        target = TargetState("example", "a", LIVE, 1, 0, 0, None, 0, None, None, None, None)
        yield from target_families([target])
        yield _reads_family(0)
        yield _store_up_family(False)
        yield _scrape_duration_family(0.0)
