"""The alert rules and the Grafana dashboard query only what the exporter exposes, and
every alert has a runbook in the README. (promtool runs them in
tests/integration/test_alert_rules.py.)"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support import REPO
from twophase.operations.exporter import metric_names

pytestmark = pytest.mark.unit

DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "twophase.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
# Prometheus's own series an alert may use besides the exporter's.
PROMETHEUS_SERIES = {"up"}
_NAME = re.compile(r"\b(twophase_[a-z0-9_]+|up)\b(?!\s*\()")


def names_in(expr: str) -> set[str]:
    """The series an expression reads (label values and functions are not names)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(_NAME.findall(without_strings))


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    for panel in panels:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_dashboard_query_names_exported_metrics() -> None:
    known = metric_names()
    exprs = list(dashboard_exprs())
    assert len(exprs) >= 10
    for title, expr in exprs:
        found = names_in(expr)
        assert found, (title, expr)
        assert found <= known, (title, sorted(found - known))


def test_the_dashboard_shows_lag_throughput_rejects_and_retries() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = set().union(*(names_in(expr) for _, expr in dashboard_exprs()))
    for name in (
        "twophase_last_committed_epoch",  # lag
        "twophase_oldest_precommitted_age_seconds",
        "twophase_points_delivered_total",  # throughput
        "twophase_points_rejected_total",  # rejects
        "twophase_promote_retries_total",  # retries
        "twophase_influx_retries_total",
    ):
        assert name in used, name
    (sink,) = dashboard["templating"]["list"]
    assert sink["name"] == "sink" and sink["multi"] and sink["includeAll"]
    assert all('sink=~"$sink"' in e for _, e in dashboard_exprs() if "{" in e and "sink" in e)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_every_alert_queries_exported_metrics() -> None:
    known = metric_names() | PROMETHEUS_SERIES
    rules = alert_rules()
    assert len(rules) == 7
    for rule in rules:
        found = names_in(rule["expr"])
        assert found and found <= known, (rule["alert"], sorted(found - known))


def test_every_alert_has_a_runbook_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["annotations"]["runbook_url"].endswith(f"README.md#runbook-{name.lower()}")
        assert f"#### Runbook: {name}\n" in readme, name
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert {"summary", "description"} <= set(rule["annotations"]), name


def test_names_in_skips_functions_and_label_values() -> None:
    expr = 'increase(twophase_points_rejected_total{phase="up"}[5m]) > 0 and up{job="x"}'
    assert names_in(expr) == {"twophase_points_rejected_total", "up"}
