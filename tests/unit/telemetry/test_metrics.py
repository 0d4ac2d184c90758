"""The metric helpers of ``joch.telemetry.metrics``: bounded label values, families read at scrape
time, the HTTP children kept per (method, route, code), and the run controller's phase hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from joch.controllers.runs import observe_phase
from joch.telemetry import metrics


@pytest.mark.parametrize(("reason", "label"), [
    ("Completed", "Completed"), ("RunnerLost", "RunnerLost"), ("BudgetExceeded", "BudgetExceeded"),
    ("run-42 failed at 10:03", "Other"), ("", "Other"), (None, "Other"), ("x" * 80, "Other"),
    ("A" + "b" * 70, "Other"),
])
def test_reasons_are_camel_case_words_or_other(reason: object, label: str) -> None:
    assert metrics.reason_label(reason) == label


def test_past_a_hundred_reasons_new_ones_are_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_reasons", set())
    words = [f"Reason{chr(65 + i // 26)}{chr(97 + i % 26)}" for i in range(metrics.MAX_REASONS + 5)]
    labels = [metrics.reason_label(word) for word in words]
    assert labels[: metrics.MAX_REASONS] == words[: metrics.MAX_REASONS]
    assert labels[metrics.MAX_REASONS:] == ["Other"] * 5
    assert metrics.reason_label(words[0]) == words[0]  # one seen before keeps its series


def test_phases_are_the_run_phases_or_other() -> None:
    assert metrics.phase_label("Running") == "Running"
    assert metrics.phase_label("Exploded") == "Other"
    counts = metrics.count_phases(["Running", "Running", None, "Exploded"])
    assert counts[("Running",)] == 2 and counts[("Pending",)] == 1 and counts[("Other",)] == 1
    assert counts[("Succeeded",)] == 0  # every phase is a series, so a dashboard sees a zero, not a gap


def test_a_callback_sums_its_owners_and_skips_one_that_fails() -> None:
    registry = CollectorRegistry()
    depth = metrics.Callback("joch_test_depth", "Test.", ("name",), registry=registry)
    first, second, broken = object(), object(), object()
    depth.track(first, lambda: {("a",): 1.0})
    depth.track(second, lambda: {("a",): 2.0, ("b",): 5.0})

    def fails() -> metrics.Sample:
        raise RuntimeError("the store is closed")

    depth.track(broken, fails)
    assert registry.get_sample_value("joch_test_depth", {"name": "a"}) == 3
    assert registry.get_sample_value("joch_test_depth", {"name": "b"}) == 5
    depth.untrack(second)
    depth.track(first, lambda: {("a",): 7.0})  # an owner's new reading replaces its old one
    assert registry.get_sample_value("joch_test_depth", {"name": "a"}) == 7
    assert registry.get_sample_value("joch_test_depth", {"name": "b"}) is None
    assert b"# TYPE joch_test_depth gauge" in generate_latest(registry)


def test_http_children_are_kept_and_unknown_methods_are_other() -> None:
    http = metrics.HTTP()
    route = "/test/{name}"
    for method in ("GET", "GET", "BREW", "MKCOL"):
        http.observe(method, route, 200, 0.01)
    assert REGISTRY.get_sample_value("joch_http_requests_total", {"method": "GET", "route": route, "code": "200"}) == 2
    assert REGISTRY.get_sample_value("joch_http_requests_total", {"method": "OTHER", "route": route,
                                                                   "code": "200"}) == 2
    assert REGISTRY.get_sample_value("joch_http_request_duration_seconds_count", {"method": "GET",
                                                                                   "route": route}) == 2
    assert len(http._counters) == 2


def run(phase: str | None, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "r", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": phase, **status} if phase else {}}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_phase_change_counts_once_with_its_latency_and_duration() -> None:
    created = 1767225600.0  # 2026-01-01T00:00:00Z
    transitions = sample("joch_run_phase_transitions_total", phase="Running", reason="Starting")
    dispatched = sample("joch_run_dispatch_latency_seconds_count")
    dispatch_sum = sample("joch_run_dispatch_latency_seconds_sum")
    observe_phase(run("Queued", attempt=1), run("Running", reason="Starting", attempt=1), created + 2.5)
    observe_phase(run("Running", reason="Starting"), run("Running", reason="Started"), created + 3)  # same phase
    assert sample("joch_run_phase_transitions_total", phase="Running", reason="Starting") == transitions + 1
    assert sample("joch_run_dispatch_latency_seconds_count") == dispatched + 1
    assert sample("joch_run_dispatch_latency_seconds_sum") == pytest.approx(dispatch_sum + 2.5)

    observe_phase(run("Queued", attempt=2), run("Running", reason="Starting", attempt=2), created + 60)
    assert sample("joch_run_dispatch_latency_seconds_count") == dispatched + 1  # a retry is not a dispatch

    durations = sample("joch_run_duration_seconds_count", phase="Failed")
    total = sample("joch_run_duration_seconds_sum", phase="Failed")
    observe_phase(run("Running"), run("Failed", reason="RunnerLost", startedAt="2026-01-01T00:00:10Z",
                                      finishedAt="2026-01-01T00:01:10Z"), created + 70)
    assert sample("joch_run_duration_seconds_count", phase="Failed") == durations + 1
    assert sample("joch_run_duration_seconds_sum", phase="Failed") == pytest.approx(total + 60)


MULTIPROCESS_PROBE = """
import json, os, sys
from prometheus_client import generate_latest
from joch.telemetry import metrics

depth = metrics.WORKQUEUE_DEPTH
owner = object()
depth.track(owner, lambda: {("runs",): 3.0, ("agents",): 1.0})
metrics.STORE_REVISION.track(owner, lambda: {(): 42.0})
metrics.OPEN_WATCHES.labels("Agent").inc()
metrics.HTTP().observe("GET", "/probe", 200, 0.01)
registry = metrics.registry()
def value(metric, **labels):
    return registry.get_sample_value(metric, labels)
out = {"depth": value("joch_workqueue_depth", name="runs"), "revision": value("joch_store_revision"),
       "watches": value("joch_open_watches", kind="Agent"),
       "requests": value("joch_http_requests_total", method="GET", route="/probe", code="200"),
       "default": registry is metrics.REGISTRY,
       "text": generate_latest(registry).decode()}
depth.untrack(owner)
out["untracked"] = value("joch_workqueue_depth", name="runs")
json.dump(out, sys.stdout)
"""


def probe(directory: str) -> dict[str, Any]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
    done = subprocess.run([sys.executable, "-c", MULTIPROCESS_PROBE], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_with_multiprocess_files_a_scrape_sums_the_processes(tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"  # made by the import when missing
    first = probe(str(directory))
    assert first["default"] is False
    assert (first["depth"], first["revision"], first["watches"], first["requests"]) == (3, 42, 1, 1)
    assert first["untracked"] == 0  # an owner gone leaves a 0, not its last reading
    second = probe(str(directory))
    # The first process exited cleanly: its live gauges went with it, its counters stay in the sum;
    # the revision is the scraping process's own reading, never a sum.
    assert (second["depth"], second["revision"], second["watches"], second["requests"]) == (3, 42, 1, 2)
    for text in (first["text"], second["text"]):
        types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
        assert len(types) == len(set(types)), types
        # A family no process has a sample of is there, empty, as in one process's scrape.
        assert "# TYPE joch_webhook_deliveries_total counter" in text and "joch_webhook_deliveries_total{" not in text
        assert "process_cpu_seconds_total" not in text and "_created" not in text
