"""The Grafana dashboard shipped with the chart (``charts/agents/dashboards/joch.json``): it parses,
every query reads families ``/metrics`` exposes (the ones ``tests/integration/server/test_metrics.py``
scrapes from a real server) and groups by labels they have, and ``dashboards.enabled`` renders it
into a ConfigMap Grafana's sidecar picks up."""

from __future__ import annotations

import json
import re
from typing import Any

from integration.server.test_metrics import FAMILIES, HISTOGRAM_SUFFIXES
from support.helmchart import CHART, NAMESPACE, only

DASHBOARD = CHART / "dashboards" / "joch.json"
METRIC = re.compile(r"\bjoch_[a-z_]+\b")
GROUPING = re.compile(r"\bby \(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")


def exposed() -> dict[str, set[str]]:
    """Each sample name ``/metrics`` may carry, with the labels it has."""
    names: dict[str, set[str]] = {}
    for family, (type_, labels) in FAMILIES.items():
        if type_ == "counter":
            names[f"{family}_total"] = labels
        elif type_ == "histogram":
            for suffix in HISTOGRAM_SUFFIXES:
                names[f"{family}{suffix}"] = labels | ({"le"} if suffix == "_bucket" else set())
        else:
            names[family] = labels
    return names


def expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_the_dashboard_parses_and_every_query_reads_exposed_families_by_their_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "Joch"
    names = exposed()
    queried: set[str] = set()
    for title, expr in expressions():
        metrics = set(METRIC.findall(expr))
        assert metrics, f"{title}: {expr} reads no joch_ metric"
        unknown = metrics - set(names)
        assert not unknown, f"{title}: {expr} reads {unknown}, which /metrics does not expose"
        labels = set().union(*(names[m] for m in metrics)) | {"job", "instance"}
        grouped = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",")}
        matched = {m.split("=")[0].strip().rstrip("!~") for group in MATCHERS.findall(expr)
                   for m in group.split(",") if "=" in m}
        assert grouped | matched <= labels, f"{title}: {expr} uses labels {(grouped | matched) - labels}"
        queried |= metrics
    shown = {family for family in FAMILIES if any(name.startswith(family) for name in queried)}
    assert shown == set(FAMILIES), f"families no panel shows: {set(FAMILIES) - shown}"


def test_dashboards_enabled_renders_the_dashboard_into_a_sidecar_configmap(render: Any) -> None:
    assert not [d for d in render() if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]
    docs = render({"dashboards": {"enabled": True, "annotations": {"grafana_folder": "Joch"}}})
    config = only(docs, "ConfigMap")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config["metadata"]["annotations"] == {"grafana_folder": "Joch"}
    assert config["metadata"]["namespace"] == NAMESPACE
    assert json.loads(config["data"]["joch.json"]) == json.loads(DASHBOARD.read_text())
    elsewhere = render({"dashboards": {"enabled": True, "namespace": "monitoring"}})
    assert only(elsewhere, "ConfigMap")["metadata"]["namespace"] == "monitoring"


def test_metrics_public_passes_the_flag(render: Any) -> None:
    def args(values: dict[str, Any]) -> list[str]:
        deployment = only(render(values), "Deployment")
        return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--metrics-public" not in args({})
    assert "--metrics-public" in args({"metrics": {"public": True}})
