"""The alert rules and the Grafana dashboard query only what the exporter exposes, and
every alert's runbook_url leads to its section of docs/runbooks.md. (promtool runs the
rules in tests/integration/test_alert_rules.py.)"""

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
ALERT_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
# Every runbook_url: the base (external label `twophase_docs`, else `docs`), the page, a section.
RUNBOOK_URL = re.compile(
    r'^\{\{ or \$externalLabels\.twophase_docs "docs" \}\}/runbooks\.md#(?P<anchor>[-\w]+)$'
)
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
    assert len(rules) == 10
    for rule in rules:
        found = names_in(rule["expr"])
        assert found and found <= known, (rule["alert"], sorted(found - known))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: its text as shown, in lower case, without
    punctuation, spaces as hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)  # inline code shows its text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link shows its text
    text = text.replace("*", "").strip().lower()  # emphasis markers are not shown
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> dict[str, str]:
    """Anchor -> heading text of every ATX heading outside code fences; a repeated anchor
    gets -1, -2... as on GitHub."""
    found: dict[str, str] = {}
    fence = None
    for line in markdown.splitlines():
        opening = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if opening and (fence is None or opening.group(1).startswith(fence)):
            fence = None if fence else opening.group(1)
            continue
        heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$", line)
        if fence is None and heading:
            base = anchor = github_anchor(heading.group(1))
            for n in range(1, 100):
                if anchor not in found:
                    break
                anchor = f"{base}-{n}"
            found[anchor] = heading.group(1)
    return found


def test_github_anchor_follows_githubs_rules() -> None:
    assert github_anchor("TwophaseStoreUnreachable") == "twophasestoreunreachable"
    assert github_anchor("Lanes: several connections at once") == (
        "lanes-several-connections-at-once"
    )
    assert github_anchor("The job: `jobs/session_metrics.py`") == "the-job-jobssession_metricspy"
    assert github_anchor("Operations: metrics, alerts, a dashboard") == (
        "operations-metrics-alerts-a-dashboard"
    )
    text = "# A\n```\n# not a heading\n```\n## A\n### B ##\n"
    assert anchors(text) == {"a": "A", "a-1": "A", "b": "B"}


def test_every_alert_links_to_its_runbook_section() -> None:
    sections = anchors(RUNBOOKS.read_text())
    for rule in alert_rules():
        name = rule["alert"]
        url = RUNBOOK_URL.match(rule["annotations"]["runbook_url"])
        assert url, (name, rule["annotations"]["runbook_url"])
        assert url["anchor"] == name.lower(), name  # stable: the alert's own name
        assert sections.get(url["anchor"]) == name, (name, sorted(sections))
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert {"summary", "description"} <= set(rule["annotations"]), name


def test_every_runbook_section_is_an_alert() -> None:
    alerts = {rule["alert"] for rule in alert_rules()}
    runbooks = {h for h in anchors(RUNBOOKS.read_text()).values() if h.startswith("Twophase")}
    assert runbooks == alerts


def test_the_runbook_urls_promtool_expects_resolve_in_the_repository() -> None:
    """alerts_test.yml pins each rendered runbook_url without external labels (promtool
    checks it): the base is then `docs`, and the path and anchor exist in a checkout."""
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    expected = [
        (case["alertname"], alert["exp_annotations"]["runbook_url"])
        for test in tests
        for case in test["alert_rule_test"]
        for alert in case["exp_alerts"]
    ]
    assert {name for name, _ in expected} == {rule["alert"] for rule in alert_rules()}
    for name, url in expected:
        path, _, anchor = url.partition("#")
        assert (REPO / path).is_file(), url
        assert anchors((REPO / path).read_text()).get(anchor) == name, url


def test_the_readme_links_each_runbook() -> None:
    readme = (REPO / "README.md").read_text()
    sections = anchors(RUNBOOKS.read_text())
    linked = set(re.findall(r"\]\(docs/runbooks\.md#([-\w]+)\)", readme))
    assert linked <= set(sections), sorted(linked - set(sections))
    assert {rule["alert"].lower() for rule in alert_rules()} <= linked


def test_compose_prometheus_sets_the_runbook_base() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    base = config["global"]["external_labels"]["twophase_docs"]
    assert base and not base.endswith("/")
    assert (REPO / base / "runbooks.md").is_file() or "://" in base


def test_names_in_skips_functions_and_label_values() -> None:
    expr = 'increase(twophase_points_rejected_total{phase="up"}[5m]) > 0 and up{job="x"}'
    assert names_in(expr) == {"twophase_points_rejected_total", "up"}
