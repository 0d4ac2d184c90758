"""How fast Joch turns AgentRuns into processes, against a plain loop doing the same work.

The agent is ``/bin/true``, so what is measured is Joch's own cost: admission, the controller's
transitions (each a store write and a watch event), the scheduler, the runtime starting ``joch
runner``, the runner's checkout (a ``git clone --shared`` of a cached mirror), the spawn, the record, the
artifacts (``changes.patch``) and the cleanup.

* **Baseline** — in this process, a loop that for each run takes the same workspace code the
  runner uses (``joch.runtime.workspace.prepare``: lock and fetch the mirror, ``git clone
  --shared``), spawns ``/bin/true`` there, waits for it and removes the checkout. Serial, no store, no
  HTTP: the floor for one run at a time.
* **Dispatch latency** — on an idle ``joch server`` (a subprocess, SQLite in a fresh data dir), one
  run at a time: from just before the client's ``POST`` to the moment the runner spawned the agent
  (``started_at`` in the runner's durable record). Target: p50 ≤ 100 ms.
* **Throughput** — N runs created in one request; from just before it until the last runner
  recorded its end. Runs may overlap up to ``--max-concurrent-runs``. Target: ≥ 50 % of the
  baseline's runs/second.

Usage: ``python bench/run_bench.py [--runs 60] [--latency-runs 30] [--max-concurrent-runs 4]``
(``make bench-runs``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, VENV_BIN, Row, free_port, log, machine_facts, percentile, print_table

from joch.runtime import workspace
from joch.runtime.base import GitSource
from joch.runtime.local import LocalRuntime

RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"
TERMINAL = {"Succeeded", "Failed", "Cancelled"}


def make_repo(where: Path) -> Path:
    repo = where / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=repo, check=True)
    for i in range(20):
        (repo / f"file{i}.txt").write_text(f"line {i}\n" * 50)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], cwd=repo, check=True)
    return repo


def baseline(repo: Path, work: Path, runs: int) -> tuple[float, list[float]]:
    cache = work / "mirrors"
    git = GitSource(url=str(repo))
    workspace.remove(cache=cache, git=git, root=work / "warm")  # nothing to remove; imports warm
    latencies: list[float] = []
    started = time.perf_counter()
    for i in range(runs):
        t0 = time.perf_counter()
        root = work / "ws" / str(i)
        checkout = workspace.prepare(cache=cache, git=git, root=root)
        proc = subprocess.Popen(["/bin/true"], cwd=checkout.path)
        latencies.append(time.perf_counter() - t0)
        proc.wait()
        workspace.remove(cache=cache, git=git, root=root)
    return runs / (time.perf_counter() - started), latencies


class JochServer:
    def __init__(self, data_dir: Path, max_runs: int) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.log = (data_dir.parent / "server.log").open("wb")
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "joch"), "server", "--data-dir", str(data_dir), "--port", str(self.port),
             "--max-concurrent-runs", str(max_runs)],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"joch server did not start; see {data_dir.parent / 'server.log'}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def manifests(repo: Path) -> str:
    return "\n---\n".join(json.dumps(doc) for doc in [
        {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "true"},
         "spec": {"binary": "/bin/true"}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "true"},
         "spec": {"providerRef": {"name": "true"}}},
    ])


def run_doc(repo: Path, name: str) -> dict[str, Any]:
    return {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
            "spec": {"agentRef": {"name": "true"}, "implementation": {"inline": {"text": "nothing"}},
                     "execution": {"coordinates": {"git": {"url": str(repo)}}}}}


def wait_all(client: httpx.Client, names: set[str], timeout: float) -> dict[str, dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(names):
        items = client.get(RUNS, params={"labelSelector": "bench=runs"}).json()["items"]
        for item in items:
            status = item.get("status") or {}
            if item["metadata"]["name"] in names and status.get("phase") in TERMINAL:
                done[item["metadata"]["name"]] = status
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(names) - len(done)} runs did not finish in {timeout:.0f}s")
        time.sleep(0.02)
    return done


def records(data_dir: Path, statuses: dict[str, dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """(agent started, runner finished) per run, epoch seconds, from the runners' records."""
    runtime = LocalRuntime(data_dir)
    try:
        out = {}
        for name, status in statuses.items():
            state = runtime.status(status["runtimeRef"])
            if state.started_at is None or state.finished_at is None:
                raise RuntimeError(f"run {name}: no start/end in the runner record ({state})")
            out[name] = (state.started_at, state.finished_at)
        return out
    finally:
        runtime.close()


def joch_figures(repo: Path, work: Path, runs: int, latency_runs: int, max_runs: int) -> dict[str, Any]:
    data_dir = work / "data"
    data_dir.mkdir()
    server = JochServer(data_dir, max_runs)
    try:
        with httpx.Client(base_url=server.base, timeout=30) as client:
            client.post("/v1/resources/apply", content=manifests(repo),
                        headers={"content-type": "application/yaml"}).raise_for_status()
            # Warm-up: the first run clones the mirror.
            warm = run_doc(repo, "warm-up")
            warm["metadata"]["labels"] = {"bench": "runs"}
            client.post(RUNS, json=warm).raise_for_status()
            wait_all(client, {"warm-up"}, 60)

            log(f"dispatch latency: {latency_runs} runs, one at a time")
            created: dict[str, float] = {}
            for i in range(latency_runs):
                name = f"lat-{i}"
                doc = run_doc(repo, name)
                doc["metadata"]["labels"] = {"bench": "runs"}
                created[name] = time.time()
                client.post(RUNS, json=doc).raise_for_status()
                wait_all(client, {name}, 60)
            lat_status = wait_all(client, set(created), 60)
            lat_records = records(data_dir, lat_status)
            dispatch = [start - created[name] for name, (start, _) in lat_records.items()]
            failed = [n for n, s in lat_status.items() if s.get("phase") != "Succeeded"]

            log(f"throughput: {runs} runs created in one request, --max-concurrent-runs {max_runs}")
            docs = []
            for i in range(runs):
                doc = run_doc(repo, f"tp-{i}")
                doc["metadata"]["labels"] = {"bench": "runs"}
                docs.append(json.dumps(doc))
            t0 = time.time()
            client.post("/v1/resources/create", content="\n---\n".join(docs),
                        headers={"content-type": "application/yaml"}).raise_for_status()
            tp_status = wait_all(client, {f"tp-{i}" for i in range(runs)}, 300)
            recs = records(data_dir, tp_status)
            elapsed = max(end for _, end in recs.values()) - t0
            queued_dispatch = [start - t0 for start, _ in recs.values()]
            failed += [n for n, s in tp_status.items() if s.get("phase") != "Succeeded"]
    finally:
        server.stop()
    return {"dispatch": dispatch, "throughput": runs / elapsed, "elapsed": elapsed,
            "queued_dispatch": queued_dispatch, "failed": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--latency-runs", type=int, default=30)
    parser.add_argument("--max-concurrent-runs", type=int, default=4)
    args = parser.parse_args(argv)
    print("== machine ==")
    for name, value in machine_facts(None):
        print(f"  {name}: {value}")
    with tempfile.TemporaryDirectory(prefix="joch-run-bench-") as tmp:
        work = Path(tmp)
        repo = make_repo(work)
        log(f"baseline: {args.runs} serial prepare + spawn /bin/true + remove")
        base_rate, base_lat = baseline(repo, work / "baseline", args.runs)
        figures = joch_figures(repo, work, args.runs, args.latency_runs, args.max_concurrent_runs)
    ms = 1000.0
    rows = [
        Row("plain loop: runs/s (serial)", base_rate, "runs/s"),
        Row("plain loop: start latency p50", percentile(base_lat, 50) * ms, "ms", higher_is_better=False),
        Row("joch: runs/s", figures["throughput"], "runs/s", target=base_rate * 0.5, ceiling=base_rate,
            note=f"{args.runs} runs in {figures['elapsed']:.2f}s, --max-concurrent-runs {args.max_concurrent_runs}"),
        Row("joch: dispatch p50 (idle)", percentile(figures["dispatch"], 50) * ms, "ms", target=100,
            higher_is_better=False, note="created -> agent process started"),
        Row("joch: dispatch p99 (idle)", percentile(figures["dispatch"], 99) * ms, "ms", higher_is_better=False),
        Row("joch: dispatch p50 (burst)", percentile(figures["queued_dispatch"], 50) * ms, "ms",
            higher_is_better=False, note="includes waiting for a slot"),
    ]
    print_table("agent runs (the 'vs raw' column is the ratio to the plain loop)", rows)
    if figures["failed"]:
        print(f"\n{len(figures['failed'])} runs did not succeed: {sorted(figures['failed'])[:5]}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
