"""Pure logic of the metrics: the exporter's families and histogram, the driver's labels,
and how corrections are named."""

from __future__ import annotations

import argparse
import contextlib

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from twophase.cli.parser import _epoch
from twophase.errors import (
    BadPointsError,
    StagingUnavailableError,
    TargetAuthError,
    TransientWriteError,
)
from twophase.influx.classify import Target, classify_status
from twophase.operations.exporter import (
    DURATION_BUCKETS,
    SinkRow,
    StoreCollector,
    _Durations,
    _Sample,
    metric_names,
    sink_families,
    target_families,
)
from twophase.protocol.ledger.target_ledger import TargetState
from twophase.targets.metering import (
    METRICS,
    REGISTRY,
    RESPONSES,
    MeteredWriter,
    retry_reason,
    status_class,
)
from twophase.wording import epoch_label, name_epochs

pytestmark = pytest.mark.unit


def test_durations_are_a_cumulative_histogram() -> None:
    d = _Durations()
    for epoch, seconds in ((3, 0.04), (4, 0.3), (5, 7.0), (6, 5000.0)):
        d.observe(epoch, seconds)
    buckets = dict(d.buckets())
    assert buckets["0.05"] == 1 and buckets["0.5"] == 2 and buckets["10.0"] == 3
    assert buckets["1800.0"] == 3 and buckets["+Inf"] == 4
    assert d.seen == 6 and d.sum == pytest.approx(5007.34)
    assert len(d.buckets()) == len(DURATION_BUCKETS) + 1


def _row(**changes: object) -> SinkRow:
    values: dict[str, object] = {name: 0 for name in SinkRow.__dataclass_fields__}
    values.update(sink_id="s", last_decided_epoch=None, last_committed_epoch=None)
    values.update(last_commit_at=None, run_state=None, oldest_precommitted_age_s=0.0)
    values.update(changes)
    return SinkRow(**values)  # type: ignore[arg-type]


def _exposed(
    rows: list[SinkRow], targets: tuple[TargetState, ...] = ()
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    class One:
        def collect(self):  # type: ignore[no-untyped-def]
            yield from sink_families(rows, {})
            yield from target_families(targets)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_sink_that_never_decided_has_no_epoch_gauges_and_run_state_none() -> None:
    got = _exposed([_row()])
    names = {name for name, _ in got}
    assert "twophase_last_decided_epoch" not in names
    assert "twophase_last_commit_timestamp_seconds" not in names
    assert got[("twophase_run_state", (("sink", "s"), ("state", "none")))] == 1
    assert got[("twophase_run_state", (("sink", "s"), ("state", "live")))] == 0


def test_pending_dead_letters_are_rejected_minus_requeued() -> None:
    got = _exposed([_row(points_rejected_promote=7, points_requeued=5, points_rejected_stage=2)])
    assert got[("twophase_dead_letters", (("phase", "promote"), ("sink", "s")))] == 2
    assert got[("twophase_dead_letters", (("phase", "stage"), ("sink", "s")))] == 2
    assert got[("twophase_points_rejected_total", (("phase", "promote"), ("sink", "s")))] == 7


def test_every_metric_has_a_description() -> None:
    """The metrics reference shows each family's description as its meaning."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Sample())
    families = [*registry.collect(), *REGISTRY.collect()]
    assert len(families) >= 20
    assert [f.name for f in families if not f.documentation.strip()] == []


def test_the_request_metrics_are_served_under_their_former_names_too() -> None:
    """Dashboards and alerts that name ``twophase_influx_*`` keep their series until
    the former names go: the same samples, described as deprecated."""
    RESPONSES.labels(target="former", status_class="5xx").inc(3)
    scraped = {
        f.name: f for f in text_string_to_metric_families(generate_latest(REGISTRY).decode())
    }
    current = scraped["twophase_target_responses"]
    former = scraped["twophase_influx_responses"]
    assert "Deprecated" in former.documentation and "0.12.0" in former.documentation
    assert [(s.name.replace("influx", "target", 1), s.labels, s.value) for s in former.samples] == [
        (s.name, s.labels, s.value) for s in current.samples
    ]
    assert {"former": 3.0}.items() <= {
        s.labels["target"]: s.value for s in former.samples if s.name.endswith("_total")
    }.items()
    names = {n for n in scraped if n.startswith("twophase_influx_") and "_created" not in n}
    assert names == {m._name.replace("target", "influx", 1) for m in METRICS}


class _DownStore:
    """A staging store that cannot be reached."""

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        raise StagingUnavailableError("down")


def test_a_scrape_of_a_store_that_is_down_describes_what_it_shows() -> None:
    families = list(StoreCollector(_DownStore(), 60.0).collect())  # type: ignore[arg-type]
    shown = {f.name: (f.documentation, [s.value for s in f.samples]) for f in families}
    assert shown["twophase_store_up"][1] == [0.0]
    assert set(shown) == {
        "twophase_store_up",
        "twophase_scrape_duration_seconds",
        "twophase_store_reads",
    }
    assert all(documentation.strip() for documentation, _ in shown.values())


def test_names_and_labels_follow_prometheus_conventions() -> None:
    names = metric_names()
    assert all(name.startswith("twophase_") for name in names)
    assert "twophase_points_delivered_total" in names
    got = _exposed([_row(last_decided_epoch=12, last_commit_at=1.0, run_state="live")])
    labels = {name for _, pairs in got for name, _ in pairs}
    assert labels == {"sink", "state", "phase", "le"}  # bounded: never an epoch or a run id


def test_each_target_has_its_lag_and_one_state() -> None:
    quarantined = TargetState("s", "b", "quarantined", None, 0, 3, 90.5, 4096, 0, None, None, None)
    live = TargetState("s", "a", "live", 7, 0, 0, None, 0, None, None, None, None)
    got = _exposed([_row()], (quarantined, live))
    a, b = (("sink", "s"), ("target", "a")), (("sink", "s"), ("target", "b"))
    assert got[("twophase_target_lag_epochs", b)] == 3
    assert got[("twophase_target_lag_seconds", b)] == 90.5
    assert got[("twophase_target_lag_seconds", a)] == 0  # nothing lacking
    assert got[("twophase_target_lag_bytes", b)] == 4096
    assert got[("twophase_target_delivered_epoch", a)] == 7
    assert ("twophase_target_delivered_epoch", b) not in got  # nothing delivered yet
    b_states = {
        dict(pairs)["state"]: v
        for (name, pairs), v in got.items()
        if name == "twophase_target_state" and ("target", "b") in pairs
    }
    assert b_states == {"live": 0, "lagging": 0, "quarantined": 1}
    assert {name for name, _ in got} <= metric_names()


def test_the_driver_labels_each_request_with_its_target() -> None:
    class Fine:
        def write(self, body: bytes, gzipped: bool = False) -> None:
            return None

        def close(self) -> None:
            return None

    def sent(target: str) -> float:
        return (
            REGISTRY.get_sample_value("twophase_target_sent_bytes_total", {"target": target}) or 0.0
        )

    before = sent("unit-b"), sent("default")
    MeteredWriter(Fine(), "unit-b").write(b"m v=1 1")  # type: ignore[arg-type]
    MeteredWriter(Fine()).write(b"m v=1 12")  # type: ignore[arg-type]
    assert (sent("unit-b") - before[0], sent("default") - before[1]) == (7, 8)
    ok = {"target": "unit-b", "status_class": "2xx"}
    assert REGISTRY.get_sample_value("twophase_target_responses_total", ok) >= 1


TARGET = Target("v1", "http://influx:8086", "db")


def test_a_metered_writer_counts_every_request_by_its_answer_and_no_class_it_never_saw() -> None:
    class Flaky:
        def __init__(self) -> None:
            self.errors: list[Exception | None] = [None, classify_status(503, b"", None, TARGET)]

        def write(self, body: bytes, gzipped: bool = False) -> None:
            error = self.errors.pop(0) if self.errors else None
            if error is not None:
                raise error

    def value(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"target": "unit-c", **labels})

    writer = MeteredWriter(Flaky(), "unit-c")  # type: ignore[arg-type]
    for _ in range(3):
        with contextlib.suppress(TransientWriteError):  # counted all the same
            writer.write(b"m v=1 1", gzipped=True)
    responses = "twophase_target_responses_total"
    assert value(responses, status_class="2xx") == 2
    assert value(responses, status_class="5xx") == 1
    assert value(responses, status_class="4xx") is None  # no series before its first answer
    assert value("twophase_target_request_duration_seconds_count") == 3
    assert value("twophase_target_sent_bytes_total") == 21


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (None, "2xx"),
        (classify_status(400, b'{"error":"partial write"}', None, TARGET), "4xx"),
        (classify_status(401, b"", None, TARGET), "4xx"),
        (classify_status(503, b"", None, TARGET), "5xx"),
        (TransientWriteError("connection refused"), "transport"),
        (BadPointsError("made up here", "x"), "transport"),
    ],
)
def test_status_class(error: Exception | None, expected: str) -> None:
    assert status_class(error) == expected


def test_retry_reason() -> None:
    assert retry_reason(TransientWriteError("slow down", status=429)) == "throttled"
    assert retry_reason(TransientWriteError("down", status=503)) == "unavailable"
    assert retry_reason(TransientWriteError("refused")) == "transport"
    assert retry_reason(TargetAuthError("no")) == "transport"


def test_corrections_are_named_cn() -> None:
    assert epoch_label(-3) == "c3" and epoch_label(7) == "7"
    assert name_epochs([-1]) == "epoch c1"
    assert name_epochs([4, 0, 1, 2, -2, -1]) == "epochs 0-2, 4, c1, c2"
    assert _epoch("c3") == -3 and _epoch("12") == 12
    for bad in ("-1", "c0", "c", "x3", "3.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            _epoch(bad)
