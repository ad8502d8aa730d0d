"""The alert rules and the Grafana dashboard query only what the exporter exposes (the
dashboard only what the metrics reference lists, too), and every alert's runbook_url
leads to its page of the documentation site (docs/operations/runbooks/<alert>.md).
(promtool runs the rules in tests/integration/test_alert_rules.py.)"""

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
RUNBOOKS = REPO / "docs" / "operations" / "runbooks"
MKDOCS = REPO / "mkdocs.yml"
# Every runbook_url: the base (external label `twophase_docs`, else `docs`), then the page's
# address on the site: operations/runbooks/<alert>/ (docs/operations/runbooks/<alert>.md).
RUNBOOK_URL = re.compile(
    r'^\{\{ or \$externalLabels\.twophase_docs "docs" \}\}'
    r"/operations/runbooks/(?P<page>[a-z]+)/$"
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


def reference_names() -> set[str]:
    """The metrics the generated metrics reference lists (docs/operations/metrics.md)."""
    from scripts import docs_reference

    return set(re.findall(r"^\| `(twophase_[a-z0-9_]+)", docs_reference.metrics(), flags=re.M))


def test_every_metric_the_dashboard_queries_is_in_the_metrics_reference() -> None:
    listed = reference_names()
    assert len(listed) >= 20
    for title, expr in dashboard_exprs():
        # A histogram's samples (_bucket, _sum, _count) are listed under its own name.
        unlisted = {
            name
            for name in names_in(expr)
            if name not in listed and re.sub(r"_(bucket|sum|count)$", "", name) not in listed
        }
        assert unlisted == set(), (title, sorted(unlisted))


def test_the_dashboard_shows_lag_throughput_rejects_and_retries() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = set().union(*(names_in(expr) for _, expr in dashboard_exprs()))
    for name in (
        "twophase_last_committed_epoch",  # lag
        "twophase_oldest_precommitted_age_seconds",
        "twophase_points_delivered_total",  # throughput
        "twophase_points_rejected_total",  # rejects
        "twophase_promote_retries_total",  # retries
        "twophase_target_retries_total",
        "twophase_target_lag_epochs",  # targets
        "twophase_target_lag_seconds",
        "twophase_target_lag_bytes",  # a target's backlog
        "twophase_target_state",
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
    assert len(rules) == 11
    for rule in rules:
        found = names_in(rule["expr"])
        assert found and found <= known, (rule["alert"], sorted(found - known))


def runbook_title(page: str) -> str | None:
    """The H1 of a runbook page, or None when there is no such page."""
    path = RUNBOOKS / f"{page}.md"
    if not path.is_file():
        return None
    first = path.read_text().splitlines()[0]
    return first.removeprefix("# ").strip() if first.startswith("# ") else None


def test_every_alert_links_to_its_runbook_page() -> None:
    for rule in alert_rules():
        name = rule["alert"]
        url = RUNBOOK_URL.match(rule["annotations"]["runbook_url"])
        assert url, (name, rule["annotations"]["runbook_url"])
        assert url["page"] == name.lower(), name  # stable: the alert's own name
        assert runbook_title(url["page"]) == name, (name, "no page of that name")
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert {"summary", "description"} <= set(rule["annotations"]), name


def test_every_runbook_page_is_an_alert_in_the_sites_navigation() -> None:
    alerts = {rule["alert"] for rule in alert_rules()}
    pages = {runbook_title(p.stem) for p in RUNBOOKS.glob("*.md")}
    assert pages == alerts
    nav = MKDOCS.read_text()
    for name in alerts:
        assert f"{name}: operations/runbooks/{name.lower()}.md" in nav, name


def test_the_runbook_urls_promtool_expects_resolve_in_the_repository() -> None:
    """alerts_test.yml pins each rendered runbook_url without external labels (promtool
    checks it): the base is then `docs`, and the page is a file of a checkout."""
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    expected = [
        (case["alertname"], alert["exp_annotations"]["runbook_url"])
        for test in tests
        for case in test["alert_rule_test"]
        for alert in case["exp_alerts"]
    ]
    assert {name for name, _ in expected} == {rule["alert"] for rule in alert_rules()}
    for name, url in expected:
        assert url == f"docs/operations/runbooks/{name.lower()}/", url
        assert (REPO / (url.rstrip("/") + ".md")).is_file(), url


def test_the_alerts_page_links_each_runbook() -> None:
    from scripts import docs_reference

    page = docs_reference.expand((REPO / "docs" / "operations" / "alerts.md").read_text())
    linked = set(re.findall(r"\]\(runbooks/(\w+)\.md\)", page))
    assert {rule["alert"].lower() for rule in alert_rules()} <= linked
    assert all((RUNBOOKS / f"{name}.md").is_file() for name in linked)


def test_compose_prometheus_sets_the_runbook_base() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    base = config["global"]["external_labels"]["twophase_docs"]
    assert base and not base.endswith("/")
    assert (REPO / base / "operations" / "runbooks").is_dir() or "://" in base


def test_names_in_skips_functions_and_label_values() -> None:
    expr = 'increase(twophase_points_rejected_total{phase="up"}[5m]) > 0 and up{job="x"}'
    assert names_in(expr) == {"twophase_points_rejected_total", "up"}
