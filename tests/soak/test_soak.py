"""The short soak, for CI: four sinks, one fault of every kind, overlapping, one of them
longer than the jobs' retry deadlines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak.schedule import KINDS
from tests.soak.soak import Plan, Soak, write_report


@pytest.mark.full  # each kind of fault alone is in the default run's e2e tests
@pytest.mark.timeout(900)
def test_four_sinks_stay_exact_under_every_kind_of_fault(tmp_path: Path) -> None:
    plan = Plan(
        seed=6,  # its long outage (a TCP reset for 26.8 s) lands while the sinks are busy
        events_per_sink=2_400,
        faults=len(KINDS),
        span_s=40.0,
        work=tmp_path,
        files_per_sink=10,
        feed_every_s=4.0,
        finish_timeout_s=420.0,
    )
    soak = Soak(plan)
    report = soak.run()
    print(report.table())
    write_report(report, tmp_path / "soak.json")
    assert sum(report.faults_done.values()) + sum(report.faults_skipped.values()) == len(KINDS)
    assert any("outlasts the retry deadlines" in fault for fault in report.faults_planned)
    assert report.exact, report.sinks
    assert report.stale_chunks_after_gc == 0 and report.gc_runs > report.gc_failures
    assert not soak.secrets_in_cli_output()
