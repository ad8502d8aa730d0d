"""promtool checks the alert rules and runs their unit tests (every alert, firing and not);
a real Prometheus builds each runbook_url from its external label `twophase_docs`."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit import PrometheusServer, ServiceError
from devkit.ports import free_port
from tests.support import REPO

pytestmark = pytest.mark.integration

RULES = REPO / "deploy" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed: `scripts/dev.sh setup` installs Prometheus")
    return subprocess.run(
        [binary, *args], cwd=RULES, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_rules_are_valid() -> None:
    done = promtool("check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 11 rules found" in done.stdout


def test_the_scrape_configuration_the_metrics_page_shows_is_valid() -> None:
    # docs/operations/metrics.md includes this file as it is; its rule file is alerts.yml.
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout
    page = (RULES.parents[1] / "docs" / "operations" / "metrics.md").read_text()
    assert '--8<-- "deploy/prometheus/prometheus.yml"' in page


def test_every_alert_fires_and_stays_quiet_as_its_tests_say() -> None:
    done = promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_firing_and_a_quiet_test() -> None:
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())["groups"][0]["rules"]
    tests = yaml.safe_load((RULES / "alerts_test.yml").read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    for alert in (rule["alert"] for rule in rules):
        outcomes = {bool(c["exp_alerts"]) for c in cases if c["alertname"] == alert}
        assert outcomes == {True, False}, alert


def test_prometheus_builds_the_runbook_url_from_its_external_label(tmp_path: Path) -> None:
    """promtool 2.42 sets no external labels (alerts_test.yml pins the `docs` base), so a
    real Prometheus with `twophase_docs` set scrapes an exporter that is not there: the
    pending TwophaseExporterDown links to the label's base."""
    base = "https://docs.example.org/twophase/v0.2.0/docs"
    for attempt in range(3):  # another process may grab the free port before Prometheus binds
        server = PrometheusServer(
            tmp_path / f"prometheus-{attempt}",
            free_port(),
            scrape_targets=[f"127.0.0.1:{free_port()}"],  # nothing listens there
            rule_files=[RULES / "alerts.yml"],
            external_labels={"twophase_docs": base},
        )
        try:
            server.start()
            break
        except ServiceError:
            server.kill()
    else:
        pytest.fail("prometheus did not start on three free ports")
    try:
        down: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while not down and time.monotonic() < deadline:
            time.sleep(0.5)
            alerts = server.alerts()
            down = [a for a in alerts if a["labels"]["alertname"] == "TwophaseExporterDown"]
        assert down, "TwophaseExporterDown never became pending"
        page = f"{base}/operations/runbooks/twophaseexporterdown/"
        assert down[0]["annotations"]["runbook_url"] == page
    finally:
        server.stop()
