"""The short soak, for CI: four sinks, one fault of every kind, overlapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak.schedule import KINDS
from tests.soak.soak import Plan, Soak, write_report


@pytest.mark.timeout(900)
def test_four_sinks_stay_exact_under_every_kind_of_fault(tmp_path: Path) -> None:
    plan = Plan(
        seed=5,
        events_per_sink=2_400,
        faults=len(KINDS),
        span_s=50.0,
        work=tmp_path,
        files_per_sink=8,
        feed_every_s=4.0,
        finish_timeout_s=420.0,
    )
    soak = Soak(plan)
    report = soak.run()
    print(report.table())
    write_report(report, tmp_path / "soak.json")
    assert sum(report.faults_done.values()) + sum(report.faults_skipped.values()) == len(KINDS)
    assert report.exact, report.sinks
    assert not soak.secrets_in_cli_output()
