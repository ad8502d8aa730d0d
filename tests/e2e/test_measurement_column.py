"""Several measurements from one DataFrame (``measurement_column``) with real Spark: the
job's ``--measurement-per-metric`` writes each aggregate as a measurement of its own,
and after a SIGKILL of the whole driver at a protocol step and a restart from the
checkpoint, every measurement holds exactly the aggregates computed without Spark.

The default run kills the driver once, mid-promotion (two job starts); ``--full``
kills it at every crash point a job reaches, as the single-measurement job's sweep
does (``test_exactly_once.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.session_metrics import MEASUREMENT, METRICS, VALUE_FIELD
from tests.e2e.chain import (
    Chain,
    crash_and_recover,
    kill_at_every_point,
)
from tests.e2e.harness import (
    EXACT_FIELDS,
    MALFORMED,
    SINK,
    SINKS,
    Key,
    Target,
    assert_exact,
    feed,
    influx_stats,
    mismatches,
    run_job,
    wait_exact,
)
from tests.support import influx_rows
from twophase.config import TargetConfig

FLAG = "--measurement-per-metric"


def per_metric(influx: TargetConfig) -> dict[Key, dict[str, Any]]:
    """The exact aggregates (events and byte sums), each read from its own measurement:
    key -> {metric: value}, as ``influx_stats`` reads them from one measurement."""
    stats: dict[Key, dict[str, Any]] = {}
    for metric in EXACT_FIELDS:
        for time_ns, tags, fields in influx_rows(influx, f"{MEASUREMENT}_{metric}"):
            tag = dict(tags)
            key = (time_ns // 1_000_000_000, tag["stream_id"], tag["isp"])
            point = stats.setdefault(key, {})
            assert metric not in point, f"two {metric} points for {key}"
            point[metric] = dict(fields)[VALUE_FIELD]
    return stats


class MetricChain(Chain):
    """The job with ``--measurement-per-metric``, restarted across crashes."""

    extra_args = (FLAG,)

    def wait_exact(self) -> None:
        wait_exact(self.job, self.target, self.fed, MALFORMED, read=per_metric)

    def assert_exact(self) -> None:
        assert_exact(self.target, self.fed, MALFORMED, read=per_metric)


def check_measurements(influx: TargetConfig) -> None:
    """One measurement per metric, no other; the approximate one has every key too."""
    assert influx_stats(influx) == {}  # nothing under the single-measurement name
    keys = set(per_metric(influx))
    users = {
        (time_ns // 1_000_000_000, dict(tags)["stream_id"], dict(tags)["isp"])
        for time_ns, tags, _ in influx_rows(influx, f"{MEASUREMENT}_users")
    }
    assert keys and users == keys
    for metric in METRICS:
        for _, tags, fields in influx_rows(influx, f"{MEASUREMENT}_{metric}")[:5]:
            assert dict(fields).keys() == {VALUE_FIELD}, metric
            assert dict(tags).keys() == {"stream_id", "isp"}, metric


def test_several_measurements_are_exact_after_a_sigkill_mid_promotion(
    target: Target, work: Path, event_files: list[Path]
) -> None:
    chain = MetricChain(target, work, event_files)
    chain.feed(2)
    chain.wait_exact()
    # Several InfluxDB requests per epoch (5 points each): killed after the first, the
    # epoch's measurements stand half written until the restart's recovery.
    crash_and_recover(chain, "promote_batch")
    check_measurements(target.influx)
    for sink in SINKS:
        assert {e["state"] for e in chain.epochs()[sink]} == {"COMMITTED"}, sink
    chain.job.kill()


@pytest.mark.timeout(2400)
@pytest.mark.full
def test_several_measurements_are_exact_after_a_sigkill_at_every_crash_point(
    target: Target, work: Path, event_files: list[Path]
) -> None:
    chain = MetricChain(
        target,
        work,
        event_files,
        TWOPHASE_GC_INTERVAL="1s",  # in_gc: the automatic GC, purging at once
        TWOPHASE_RETENTION="0s",
    )
    chain.feed(2)
    chain.wait_exact()
    kill_at_every_point(chain)
    check_measurements(target.influx)
    for sink in SINKS:
        assert {e["state"] for e in chain.epochs()[sink]} == {"COMMITTED"}, sink
    chain.job.kill()


@pytest.mark.full
def test_the_data_source_writes_several_measurements_too(
    target: Target, work: Path, event_files: list[Path]
) -> None:
    # The twophase format (complete mode) with the job's flag: the sink's option
    # rather than the foreachBatch writer's argument.
    files = event_files[:4]
    feed(work / "input", files)
    job = run_job(
        target,
        work / "input",
        work / "checkpoint",
        SINK,
        work / "logs",
        max_files=2,
        stats_writer="data-source",
        extra_args=[FLAG],
    )
    assert job.returncode == 0, job.tail()
    assert mismatches(target.influx, files, per_metric) == []
    check_measurements(target.influx)
