"""promtool checks the alert rules and runs their unit tests (every alert, firing and not)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

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
    assert "SUCCESS: 7 rules found" in done.stdout


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
