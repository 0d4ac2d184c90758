"""``/metrics`` of several ``joch server`` processes sharing one ``PROMETHEUS_MULTIPROC_DIR``, as
``joch server --workers N``' workers do: two real servers on one SQLite file (the second without
controllers), each scrape the sum over both (requests, open watches), the controllers' readings
(runs by phase, work queue depths) seen through the server that has none, the store's revision
once, no family twice in either format, and a process that exited forgotten by its gauges but not
by its counters (``metrics.process_exited``, what the supervisor calls)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from integration.server.test_metrics import FAMILIES, agent, joch_controller, scrape, wait_for
from joch.telemetry import metrics
from support import ports, stop_server, wait_ready

JOCH = Path(sys.executable).with_name("joch")
AGENTS = "/apis/joch.dev/v1alpha1/namespaces/default/agents"
COLLECTION = "/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents"


@contextmanager
def server(tmp_path: Path, name: str, multiproc: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``joch server`` on the data directory ``tmp_path/data`` with ``PROMETHEUS_MULTIPROC_DIR=multiproc``."""
    port = ports.free_port()
    log = tmp_path / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(multiproc)
    proc = subprocess.Popen([str(JOCH), "server", "--data-dir", str(tmp_path / "data"), "--port", str(port),
                             "--sandbox", "none", *args], stdout=log.open("a"), stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, seconds=60)  # two servers starting at once on a busy machine
        yield base, proc
    finally:
        stop_server(proc)
    assert "Traceback" not in log.read_text(), log.read_text()


@contextmanager
def two_servers(tmp_path: Path) -> Iterator[tuple[str, str, subprocess.Popen[str], Path]]:
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    with ExitStack() as stack:
        first, _ = stack.enter_context(server(tmp_path, "first", multiproc))
        second, proc = stack.enter_context(server(tmp_path, "second", multiproc, "--no-controllers"))
        yield first, second, proc, multiproc


def exposition_is_valid(base: str) -> None:
    """Each family once in the text format and in OpenMetrics (which the parser checks strictly), no
    ``_created`` series, and not one process's own ``process_*`` families."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    types = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE "))
    assert [name for name, n in types.items() if n > 1] == [], text
    assert not any(name.startswith(("process_", "python_")) for name in types), sorted(types)
    open_text = httpx.get(f"{base}/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=10)
    assert open_text.headers["content-type"].startswith("application/openmetrics-text"), open_text.headers
    families = list(openmetrics_families(open_text.text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), names
    assert not [s for f in families for s in f.samples if s.name.endswith("_created")]


def test_each_scrape_is_the_sum_over_the_processes(tmp_path: Path) -> None:
    with two_servers(tmp_path) as (first, second, _, _), \
            httpx.Client(base_url=first, timeout=10) as one, httpx.Client(base_url=second, timeout=10) as other:
        for i in range(3):
            assert one.post(AGENTS, json=agent(f"one-{i}")).status_code == 201
        for i in range(2):
            assert other.post(AGENTS, json=agent(f"other-{i}")).status_code == 201
        with other.stream("GET", AGENTS, params={"watch": "true"}) as watching:
            assert watching.status_code == 200
            during = [scrape(first), scrape(second)]
        # The controllers run in the first server only; their readings reach the second's scrape.
        seen = wait_for(lambda: (s := scrape(second)).samples("joch_workqueue_depth") and s.samples("joch_runs") and s)
        after = [wait_for(lambda b=base: (s := scrape(b)).value("joch_open_watches", kind="Agent") == 0 and s)
                 for base in (first, second)]
        exposition_is_valid(first)
        exposition_is_valid(second)

    for got in during:
        assert got.value("joch_http_requests_total", method="POST", route=COLLECTION, code="201") == 5
        assert got.value("joch_http_request_duration_seconds_count", method="POST", route=COLLECTION) == 5
        assert got.value("joch_open_watches", kind="Agent") == 1
        assert len(got.samples("joch_open_watches")) == 1, got.samples("joch_open_watches")  # no pid label
        revision = got.samples("joch_store_revision")
        assert len(revision) == 1 and revision[0].value > 0, revision  # read by the scraping process alone
        assert got.value("joch_store_write_duration_seconds_count", backend="sqlite") >= 5
        for name, (type_, labels) in FAMILIES.items():
            family = got.families.get(name)
            assert family is not None, f"{name} is not exposed"
            assert family.type == type_, (name, family.type)
            for sample in family.samples:
                assert set(sample.labels) - {"le"} == labels, (name, sample)
    assert {s.labels["name"] for s in seen.samples("joch_workqueue_depth")} >= {"runs", "agents"}
    assert {s.labels["phase"] for s in seen.samples("joch_runs")} >= {"Pending", "Running", "Succeeded"}
    assert seen.value("joch_runs") == 0
    for got in after:
        assert got.value("joch_http_requests_total", method="POST", route=COLLECTION, code="201") == 5
        assert got.value("joch_http_requests_total", method="GET", route=COLLECTION, code="200") == 1


def test_an_exited_process_leaves_the_gauges_and_stays_in_the_counters(tmp_path: Path) -> None:
    with two_servers(tmp_path) as (first, second, proc, multiproc):
        watching = httpx.Client(base_url=second, timeout=10)
        try:
            assert watching.post(AGENTS, json=agent("gone")).status_code == 201
            with watching.stream("GET", AGENTS, params={"watch": "true"}) as watch:
                assert watch.status_code == 200
                wait_for(lambda: scrape(first).value("joch_open_watches", kind="Agent") == 1)
                os.kill(proc.pid, signal.SIGKILL)  # no chance to close its watch or mark itself
                proc.wait(10)
        except httpx.TransportError:
            pass
        finally:
            watching.close()
        stale = scrape(first)
        metrics.process_exited(proc.pid, str(multiproc))
        fresh = scrape(first)
        metrics.process_exited(proc.pid, str(multiproc))  # twice (the supervisor and a restart) is harmless
        exposition_is_valid(first)

    assert stale.value("joch_open_watches", kind="Agent") == 1  # until someone says the process is gone
    assert fresh.value("joch_open_watches", kind="Agent") == 0
    assert fresh.value("joch_http_requests_total", method="POST", route=COLLECTION, code="201") == 1


def test_a_cleanly_stopped_process_marks_itself(tmp_path: Path) -> None:
    multiproc = tmp_path / "prometheus"
    with server(tmp_path, "only", multiproc) as (base, proc):  # the directory is made when missing
        assert scrape(base).samples("joch_store_revision")
        pid = proc.pid
        live = wait_for(lambda: sorted(p.name for p in multiproc.glob(f"gauge_live*_{pid}.db")))
    assert live, live
    assert not list(multiproc.glob(f"gauge_live*_{pid}.db"))
    assert list(multiproc.glob(f"counter_{pid}.db"))


def test_process_exited_is_nothing_without_multiprocess_files(tmp_path: Path) -> None:
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    assert metrics.MULTIPROCESS_DIR is None
    assert metrics.registry() is metrics.REGISTRY
    metrics.process_exited(os.getpid())  # nothing to forget, nothing raised


def test_joch_controller_scrapes_the_sum_too(tmp_path: Path) -> None:
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    with joch_controller(tmp_path, {"PROMETHEUS_MULTIPROC_DIR": str(multiproc)}) as scrape_controller, \
            server(tmp_path, "web", multiproc, "--no-controllers") as (base, _):
        assert httpx.post(f"{base}{AGENTS}", json=agent("seen"), timeout=10).status_code == 201
        got = scrape_controller()
        web = wait_for(lambda: (s := scrape(base)).samples("joch_workqueue_depth") and s)
    assert got.value("joch_http_requests_total", method="POST", route=COLLECTION, code="201") == 1
    assert {s.labels["name"] for s in web.samples("joch_workqueue_depth")} >= {"runs", "agents"}
    assert len(got.samples("joch_store_revision")) == 1
