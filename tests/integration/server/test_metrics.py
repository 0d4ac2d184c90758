"""``/metrics`` of a real ``joch server`` process (and of ``joch controller --metrics-port``), read
with prometheus-client's own parser: the families exist with their types and labels, the quickstart's
demo agent running to Succeeded moves the run families and the spend, requests are counted by route
template (fifty names, one series), and who may scrape follows authentication (``system:monitoring``,
``--metrics-public``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from e2e.test_integrations import metered_demo
from support import ports, stop_server
from support.jochserver import Joch, joch_server

JOCH = Path(sys.executable).with_name("joch")
AGENTS = "/apis/joch.dev/v1alpha1/namespaces/default/agents"

# Family (as the parser names it: a counter without ``_total``) -> (type, label names).
FAMILIES: dict[str, tuple[str, set[str]]] = {
    "joch_run_phase_transitions": ("counter", {"phase", "reason"}),
    "joch_runs": ("gauge", {"phase"}),
    "joch_run_dispatch_latency_seconds": ("histogram", set()),
    "joch_run_duration_seconds": ("histogram", {"phase"}),
    "joch_spend_usd": ("counter", {"namespace", "agent"}),
    "joch_usage_tokens": ("counter", {"namespace", "agent", "type"}),
    "joch_reconcile_duration_seconds": ("histogram", {"controller"}),
    "joch_reconcile": ("counter", {"controller", "result"}),
    "joch_reconcile_errors": ("counter", {"controller"}),
    "joch_workqueue_depth": ("gauge", {"name"}),
    "joch_workqueue_adds": ("counter", {"name"}),
    "joch_workqueue_retries": ("counter", {"name"}),
    "joch_store_write_duration_seconds": ("histogram", {"backend"}),
    "joch_store_revision": ("gauge", set()),
    "joch_open_watches": ("gauge", {"kind"}),
    "joch_http_requests": ("counter", {"method", "route", "code"}),
    "joch_http_request_duration_seconds": ("histogram", {"method", "route"}),
    "joch_webhook_deliveries": ("counter", {"provider", "outcome"}),
}
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")

class Scrape:
    """One scrape, parsed: the families by name and their samples."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def samples(self, name: str) -> list[Sample]:
        """The samples named ``name`` (``x_total`` of counter ``x``, ``x_count`` of histogram ``x``)."""
        for suffix in ("", "_total", *HISTOGRAM_SUFFIXES):
            family = self.families.get(name.removesuffix(suffix)) if name.endswith(suffix) else None
            if family is not None:
                return [s for s in family.samples if s.name == name]
        return []

    def value(self, metric: str, /, **labels: str) -> float:
        return sum(s.value for s in self.samples(metric) if all(s.labels.get(k) == v for k, v in labels.items()))


def scrape(base: str, headers: dict[str, str] | None = None) -> Scrape:
    r = httpx.get(f"{base}/metrics", headers=headers or {}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version="), r.headers
    return Scrape(r.text)


@pytest.fixture(autouse=True)
def demo_agent_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``joch-demo-agent`` (installed next to ``joch``) on the servers' PATH, as the quickstart names it."""
    monkeypatch.setenv("PATH", f"{JOCH.parent}{os.pathsep}{os.environ.get('PATH', '')}")


@contextmanager
def served(tmp_path: Path, *args: str) -> Iterator[Joch]:
    """``joch server`` (no sandbox) with ``args``, and a repository for runs."""
    with joch_server(tmp_path, "none", (), *args) as joch:
        yield joch


def test_the_families_exist_and_a_demo_run_moves_the_run_metrics(tmp_path: Path) -> None:
    with served(tmp_path) as joch:
        before = scrape(joch.base)
        for name, (type_, labels) in FAMILIES.items():
            family = before.families.get(name)
            assert family is not None, f"{name} is not exposed"
            assert family.type == type_, (name, family.type)
            for sample in family.samples:
                assert set(sample.labels) - {"le"} == labels, (name, sample)
        assert before.value("joch_run_phase_transitions_total") == 0
        assert before.value("joch_store_revision") > 0
        assert {s.labels["name"] for s in before.samples("joch_workqueue_depth")} >= {"runs", "agents"}

        joch.apply(*metered_demo())
        joch.start("hello", "demo-metered")
        status = joch.wait_ended("hello")
        assert status["phase"] == "Succeeded", status
        after = scrape(joch.base)

    transitions = {(s.labels["phase"], s.labels["reason"]): s.value
                   for s in after.samples("joch_run_phase_transitions_total")}
    assert transitions.get(("Queued", "Accepted")) == 1, transitions
    assert transitions[("Running", "Starting")] == 1, transitions
    assert transitions[("Succeeded", "Completed")] == 1, transitions
    assert after.value("joch_runs", phase="Succeeded") == 1
    assert after.value("joch_runs", phase="Running") == 0
    assert after.value("joch_run_dispatch_latency_seconds_count") == 1
    assert after.value("joch_run_duration_seconds_count", phase="Succeeded") == 1
    assert after.value("joch_spend_usd_total", namespace="default", agent="demo-metered") == pytest.approx(0.42)
    tokens = {s.labels["type"] for s in after.samples("joch_usage_tokens_total") if s.labels["agent"] == "demo-metered"}
    assert tokens == {"input", "output", "cached"}
    assert after.value("joch_reconcile_total", controller="runs", result="success") > 0
    assert after.value("joch_reconcile_duration_seconds_count", controller="runs") > 0
    assert after.value("joch_workqueue_adds_total", name="runs") > 0
    assert after.value("joch_store_write_duration_seconds_count", backend="sqlite") > \
        before.value("joch_store_write_duration_seconds_count", backend="sqlite")
    assert after.value("joch_store_revision") > before.value("joch_store_revision")
    callback = "/v1/namespaces/{namespace}/agentruns/{name}/callback"
    assert after.value("joch_http_requests_total", method="POST", route=callback, code="200") == 1


def agent(name: str) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
            "spec": {"providerRef": {"name": "nobody"}}}


def test_requests_are_counted_by_route_template_with_bounded_labels(tmp_path: Path) -> None:
    names = [f"agent-{i:02d}" for i in range(50)]
    with served(tmp_path) as joch, httpx.Client(base_url=joch.base, timeout=10) as client:
        for name in names:
            assert client.post(AGENTS, json=agent(name)).status_code == 201
            assert client.get(f"{AGENTS}/{name}").status_code == 200
            assert client.get(f"{AGENTS}/{name}-missing").status_code == 404
        assert client.get(f"/no/such/{names[0]}").status_code == 404
        assert client.request("PROPFIND", AGENTS).status_code == 405
        assert client.post("/v1/webhooks/github", json={}).status_code == 400
        assert client.post("/v1/webhooks/github", json={}, headers={
            "X-GitHub-Event": "issues", "X-GitHub-Delivery": "d-1"}).status_code == 401
        with client.stream("GET", AGENTS, params={"watch": "true"}) as watching:
            assert watching.status_code == 200
            during = scrape(joch.base)
        after = wait_for(lambda: (s := scrape(joch.base)).value("joch_open_watches", kind="Agent") == 0 and s)

    named = "/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents/{name}"
    collection = "/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents"
    assert after.value("joch_http_requests_total", method="POST", route=collection, code="201") == 50
    assert after.value("joch_http_requests_total", method="GET", route=named, code="200") == 50
    assert after.value("joch_http_requests_total", method="GET", route=named, code="404") == 50
    assert after.value("joch_http_requests_total", route="unmatched", code="404") == 1
    assert after.value("joch_http_requests_total", method="OTHER", route=collection, code="405") == 1
    durations = after.samples("joch_http_request_duration_seconds_count")
    assert [s.labels["method"] for s in durations if s.labels["route"] == named] == ["GET"]
    for sample in after.samples("joch_http_requests_total"):
        assert not any(name in sample.labels["route"] for name in names), sample
        assert sample.labels["method"] in ("GET", "POST", "OTHER"), sample
    assert after.value("joch_webhook_deliveries_total", provider="github", outcome="invalid") == 1
    assert after.value("joch_webhook_deliveries_total", provider="github", outcome="refused") == 1
    assert during.value("joch_open_watches", kind="Agent") == 1


def wait_for(probe: Any, seconds: float = 10) -> Any:
    deadline = time.monotonic() + seconds
    while not (got := probe()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return got


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.csv"
    path.write_text('tok-admin-1,admin,1,"system:masters"\ntok-scraper-1,prometheus,2,"system:monitoring"\n'
                    "tok-viewer-1,viewer,3\n")
    return path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_scraping_takes_a_token_allowed_to_get_metrics(tmp_path: Path) -> None:
    with served(tmp_path, "--token-file", str(token_file(tmp_path))) as joch:
        assert httpx.get(f"{joch.base}/metrics", timeout=10).status_code == 401
        refused = httpx.get(f"{joch.base}/metrics", headers=bearer("tok-viewer-1"), timeout=10)
        assert refused.status_code == 403, refused.text
        assert 'cannot get path "/metrics"' in refused.json()["message"]
        assert "system:monitoring" in refused.json()["message"]
        scraped = scrape(joch.base, bearer("tok-scraper-1"))
        assert scrape(joch.base, bearer("tok-admin-1")).families
        # The scraper's token reads nothing else.
        assert httpx.get(f"{joch.base}{AGENTS}", headers=bearer("tok-scraper-1"), timeout=10).status_code == 403
    assert scraped.value("joch_http_requests_total", route="/metrics", code="401") == 1
    assert scraped.value("joch_http_requests_total", route="/metrics", code="403") == 1


def test_metrics_public_serves_metrics_without_a_token_and_nothing_else(tmp_path: Path) -> None:
    with served(tmp_path, "--token-file", str(token_file(tmp_path)), "--metrics-public") as joch:
        first = scrape(joch.base)
        second = scrape(joch.base)
        assert httpx.get(f"{joch.base}{AGENTS}", timeout=10).status_code == 401
        assert httpx.get(f"{joch.base}/metrics", headers={"Host": "evil.example"}, timeout=10).status_code == 400
    assert "joch_http_requests" in first.families
    assert second.value("joch_http_requests_total", method="GET", route="/metrics", code="200") == 1


@contextmanager
def joch_controller(tmp_path: Path, env: dict[str, str] | None = None) -> Iterator[Callable[[], Scrape]]:
    """``joch controller --metrics-port`` over ``tmp_path/data`` (its environment without ``JOCH_*``,
    plus ``env``); yields a function that scrapes it until its work queues are reported. Stopped
    afterwards, and fails the test if its log has a traceback."""
    port = ports.free_port()
    log = tmp_path / "controller.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
    controller = subprocess.Popen([str(JOCH), "controller", "--data-dir", str(tmp_path / "data"), "--sandbox", "none",
                                   "--metrics-port", str(port)], stdout=log.open("a"), stderr=subprocess.STDOUT,
                                  text=True, env={**environ, **(env or {})}, cwd=tmp_path)

    def scraped() -> Scrape | None:
        assert controller.poll() is None, log.read_text()
        try:
            got = Scrape(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
        except httpx.TransportError:
            return None
        return got if got.samples("joch_workqueue_depth") else None

    try:
        yield lambda: wait_for(scraped, 30)
    finally:
        stop_server(controller)
    assert "Traceback" not in log.read_text(), log.read_text()


def test_joch_controller_serves_its_metrics_on_metrics_port(tmp_path: Path) -> None:
    with joch_controller(tmp_path) as scrape_controller:
        got = scrape_controller()
    assert {s.labels["name"] for s in got.samples("joch_workqueue_depth")} >= {"runs", "agents"}
    assert got.value("joch_store_revision") > 0


def test_a_bad_metrics_port_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run([str(JOCH), "controller", "--data-dir", str(tmp_path / "data"), "--metrics-port", "70000"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0
    assert "--metrics-port must be between 1 and 65535 (got 70000)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([str(JOCH), "controller", "--data-dir", str(tmp_path / "data"), "--metrics-port",
                               str(port)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr == (f"error: cannot listen on 127.0.0.1:{port}: the address is already in use "
                           "(choose another --metrics-port)\n")
