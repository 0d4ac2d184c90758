"""What governance costs on every write: HTTP apply throughput of today's server with
authentication, RBAC, 10 Policies of 5 rules each and the audit log, as a ratio of the server from
before issue 8 without any of them (target >= 0.70), on SQLite and on PostgreSQL, in one run; and
CEL policy evaluation time per object.

Two real ``joch server --no-controllers`` subprocesses on 127.0.0.1, each over a fresh store of
its own (a SQLite file, or a Postgres schema as ``tests/conftest.py`` makes them):

* **baseline**: the code of commit ``87397d6`` (the last commit before issue 8), extracted with
  ``git archive`` into a temporary directory and served with ``PYTHONPATH`` pointing at its
  ``src`` (checked: the subprocess imports ``joch`` from there). No authentication, no policies,
  no audit table.
* **governed**: this checkout, with ``--token-file``. The client sends the bearer token of user
  ``eddie``, bound to the built-in ``editor`` role in ``default`` by a RoleBinding (not a
  ``system:masters`` shortcut, so every request resolves the user's bindings). Ten Policies
  (five in ``default``, five in ``joch-system``) of five admission rules each select Agents, so all
  50 rules run on every Agent written; their rules read ``object``, ``request``, ``namespace`` and
  ``provider`` and evaluate to false, so the writes pass. Every object written costs an audit row
  in its transaction: afterwards the rows are counted through ``GET /v1/audit?actor=eddie``
  (and must equal the Agents written), and one Agent a rule denies proves the Policies are live.

Both servers get the same AgentProvider first (the Agents reference it). Workloads, per round and
server: single-object ``POST /apis/joch.dev/v1alpha1/namespaces/default/agents`` from 4
concurrent clients, then ``POST /v1/resources/apply`` of 100-document YAML batches from 2
clients. Rounds alternate between the servers (the order flips each round) so that load from
other processes on a shared machine hits both alike; each figure is the median over rounds, and
the ratio is governed / baseline. ``--breakdown`` adds a third server, today's code with no
authenticator and no Policies (the audit log cannot be turned off), to split the cost;
``--compare COMMIT`` adds the governed setup on another commit's code (a before/after of a change).

Policy evaluation per object is measured in-process with ``joch.policy`` directly (as
``bench/policy.py`` does): the 50 rules against one Agent with the variables converted, and the
whole admission decision (a transaction, the Policy and Environment reads, selection, evaluation).

``--profile`` runs the governed server under cProfile and prints its top functions at the end.

Run: ``.venv/bin/python bench/governance_bench.py [--quick] [--backend sqlite|postgres]
[--rounds N] [--breakdown] [--compare COMMIT] [--profile]`` (``make bench-governance``; about 1.5 minutes per backend,
``--quick`` about 40 s).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, VENV_BIN, CpuMeter, free_port, log, machine_busy, machine_facts, postgres_url, sqlite_url
from policy import SETUP, evaluation, policies

BASELINE_COMMIT = "87397d6"
POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
TARGET = 0.70
SINGLE_CLIENTS = 4
BATCH_CLIENTS = 2
BATCH_SIZE = 100
AGENTS_PATH = "/apis/joch.dev/v1alpha1/namespaces/default/agents"
APPLY_PATH = "/v1/resources/apply"
ADMIN_TOKEN = "bench-admin-token"
EDITOR_TOKEN = "bench-editor-token"
TOKENS = f'{ADMIN_TOKEN},root,1,system:masters\n{EDITOR_TOKEN},eddie,2,"devs"\n'
BINDING = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "RoleBinding",
           "metadata": {"name": "eddie-edits", "namespace": "default"},
           "roleRef": {"kind": "Role", "name": "editor"},
           "subjects": [{"kind": "User", "name": "eddie"}]}


@dataclass
class Config:
    label: str
    source: Path | None  # None: this checkout
    auth: bool
    policies: bool


@dataclass
class Rates:
    singles: list[float] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    single_meter: CpuMeter | None = None
    batch_meter: CpuMeter | None = None
    written: int = 0  # Agents written (timed and warm-up)
    single_objects: int = 0
    batch_objects: int = 0


# --- the code from before issue 8 --------------------------------------------------------------------

def extract_source(into: Path, commit: str) -> Path:
    """``git archive COMMIT src`` extracted under ``into``; returns its ``src`` (checked: a process
    with it on ``PYTHONPATH`` imports ``joch`` from there)."""
    archive = into / f"{commit}.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), commit, "src"], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / commit, filter="data")
    archive.unlink()
    src = into / commit / "src"
    probe = subprocess.run([sys.executable, "-c", "import joch; print(joch.__file__)"],
                           env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True, check=True)
    imported = Path(probe.stdout.strip()).resolve()
    if src.resolve() not in imported.parents:
        raise RuntimeError(f"a server of {commit} would import joch from {imported}, not from {src}")
    return src


# --- servers -------------------------------------------------------------------------------------------

class GovServer:
    """``joch server --no-controllers`` in a subprocess, importing ``joch`` from ``config.source``
    (``PYTHONPATH``) or this checkout."""

    def __init__(self, config: Config, store_url: str, data_dir: Path, profile_to: Path | None,
                 workers: int = 1) -> None:
        self.config = config
        self.workers = workers
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        args = ["server", "--no-controllers", "--store", store_url, "--data-dir", str(data_dir),
                "--port", str(self.port)]
        if config.auth:
            (data_dir / "tokens.csv").write_text(TOKENS)
            args += ["--token-file", str(data_dir / "tokens.csv")]
        if workers > 1:
            args += ["--workers", str(workers)]
        if profile_to is not None:  # every thread profiled; the stats are written when it stops
            cmd = [sys.executable, str(Path(__file__).resolve().parent / "_profiled_server.py"), str(profile_to), *args]
        else:
            cmd = [str(VENV_BIN / "joch"), *args]
        env = dict(os.environ)
        if config.source is not None:
            env["PYTHONPATH"] = str(config.source)
        else:
            env.pop("PYTHONPATH", None)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=data_dir, env=env)
        self.admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"} if config.auth else {}
        self.client = {"Authorization": f"Bearer {EDITOR_TOKEN}"} if config.auth else {}

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.config.label} server exited with {self.proc.returncode}:\n{self.output()}")
            with contextlib.suppress(httpx.HTTPError):
                # With --workers, /readyz answers once the first serves: wait for all of them.
                if httpx.get(f"{self.base}/readyz", timeout=1.0).status_code == 200 and (
                        self.workers == 1 or "worker processes (pids" in self.output()):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{self.config.label} server not ready after {timeout}s:\n{self.output()}")

    def setup(self) -> None:
        docs: list[dict[str, Any]] = list(SETUP)
        if self.config.auth:
            docs.append(BINDING)
        if self.config.policies:
            docs += policies()
        response = httpx.post(f"{self.base}{APPLY_PATH}", content=yaml.safe_dump_all(docs, sort_keys=False),
                              headers={**self.admin, "Content-Type": "application/yaml"}, timeout=60)
        if response.status_code != 200:
            raise RuntimeError(f"{self.config.label} setup: {response.status_code} {response.text[:500]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()


# --- load ------------------------------------------------------------------------------------------------

Request = tuple[str, str, str, int]  # path, body, content type, objects in it


def agent(name: str) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": name, "namespace": "default", "labels": {"team": "bench"}},
            "spec": {"providerRef": {"name": "codex"}}}


def single_requests(prefix: str, n: int) -> list[Request]:
    return [(AGENTS_PATH, json.dumps(agent(f"{prefix}-{i:05d}")), "application/json", 1) for i in range(n)]


def batch_requests(prefix: str, n: int) -> list[Request]:
    return [(APPLY_PATH, yaml.safe_dump_all([agent(f"{prefix}-{b:03d}-{i:03d}") for i in range(BATCH_SIZE)],
                                            sort_keys=False), "application/yaml", BATCH_SIZE) for b in range(n)]


def post_all(server: GovServer, requests: list[Request], concurrency: int, meter: CpuMeter) -> float:
    """POST every request from ``concurrency`` threads (one keep-alive ``httpx.Client`` each) with
    the server's client token; returns objects/s. Any non-2xx answer stops the benchmark."""
    lock = threading.Lock()
    queue = iter(requests)
    written = [0]
    failures: list[str] = []

    def worker() -> None:
        with httpx.Client(base_url=server.base, headers=server.client, timeout=120) as http:
            while True:
                with lock:
                    item = next(queue, None)
                if item is None or failures:
                    return
                path, body, content_type, objects = item
                response = http.post(path, content=body, headers={"Content-Type": content_type})
                with lock:
                    if response.status_code in (200, 201):
                        written[0] += objects
                    else:
                        failures.append(f"{server.config.label}: POST {path}: {response.status_code} "
                                        f"{response.text[:300]}")

    threads = [threading.Thread(target=worker, name=f"bench-http-{i}") for i in range(concurrency)]
    with meter:
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    if failures:
        raise RuntimeError(failures[0])
    return written[0] / elapsed


def audit_rows(server: GovServer) -> int:
    """Audit rows of the client user's Agents, counted page by page through ``GET /v1/audit``."""
    rows = 0
    params: dict[str, str | int] = {"actor": "eddie", "kind": "Agent", "limit": 5000}
    with httpx.Client(base_url=server.base, headers=server.admin, timeout=60) as http:
        while True:
            response = http.get("/v1/audit", params=params)
            response.raise_for_status()
            page = response.json()
            rows += len(page["items"])
            token = page.get("metadata", {}).get("continue")
            if not token:
                return rows
            params["continue"] = token


def denied_by_policy(server: GovServer) -> str:
    """Apply an Agent one of the 50 rules denies; returns the refusal's message."""
    bad = agent("tmp-3-denied")
    response = httpx.post(f"{server.base}{AGENTS_PATH}", json=bad, headers=server.client, timeout=30)
    if response.status_code < 400:
        raise RuntimeError(f"an Agent the Policies deny was accepted ({response.status_code}): are they live?")
    message: str = response.json().get("message", response.text)
    return message


# --- one backend -------------------------------------------------------------------------------------

@dataclass
class Sizes:
    rounds: int
    singles: int  # single POSTs per round and server
    batches: int  # 100-document applies per round and server


def run_backend(backend: str, configs: list[Config], sizes: Sizes, work: Path, postgres: str,
                profile: bool) -> tuple[dict[str, Rates], list[str]]:
    notes: list[str] = []
    rates = {c.label: Rates() for c in configs}
    with contextlib.ExitStack() as stack:
        servers: list[GovServer] = []
        profile_file = work / f"{backend}-governed.prof"
        for index, config in enumerate(configs):
            name = f"gov{index}"
            url = stack.enter_context(sqlite_url(work, f"{backend}-{name}") if backend == "sqlite"
                                      else postgres_url(postgres, name))
            profiled = profile and config.label == "governed"
            server = GovServer(config, url, work / f"{backend}-{name}", profile_file if profiled else None)
            stack.callback(server.stop)
            servers.append(server)
        for server in servers:
            server.wait_ready()
            server.setup()
            # warm-up, untimed: imports, caches, compiled policies, connection pools
            post_all(server, single_requests("warm", 20), SINGLE_CLIENTS, CpuMeter())
            post_all(server, batch_requests("warmb", 1), BATCH_CLIENTS, CpuMeter())
            rates[server.config.label].written += 20 + BATCH_SIZE
        for server in servers:
            r = rates[server.config.label]
            r.single_meter, r.batch_meter = CpuMeter(server.proc.pid), CpuMeter(server.proc.pid)
        for round_ in range(sizes.rounds):
            order = servers if round_ % 2 == 0 else list(reversed(servers))
            log(f"{backend} round {round_ + 1}/{sizes.rounds}: " + ", ".join(s.config.label for s in order))
            for server in order:
                r = rates[server.config.label]
                assert r.single_meter is not None and r.batch_meter is not None
                r.singles.append(post_all(server, single_requests(f"s{round_}", sizes.singles), SINGLE_CLIENTS,
                                          r.single_meter))
                r.batches.append(post_all(server, batch_requests(f"b{round_}", sizes.batches), BATCH_CLIENTS,
                                          r.batch_meter))
                r.single_objects += sizes.singles
                r.batch_objects += sizes.batches * BATCH_SIZE
                r.written += sizes.singles + sizes.batches * BATCH_SIZE
        for server in servers:
            if server.config.auth:
                counted = audit_rows(server)
                expected = rates[server.config.label].written
                verdict = "ok" if counted == expected else "MISMATCH"
                notes.append(f"{server.config.label}: audit rows of eddie's Agents via GET /v1/audit: {counted:,} "
                             f"for {expected:,} Agents written ({verdict})")
                if counted != expected:
                    raise RuntimeError(notes[-1])
            if server.config.policies:
                notes.append(f"{server.config.label}: an Agent named tmp-3-* is refused: "
                             f"{denied_by_policy(server)[:140]}")
        for server in servers:
            server.stop()
        if profile and profile_file.exists():
            out = io.StringIO()
            pstats.Stats(str(profile_file), stream=out).sort_stats("tottime").print_stats(45)
            notes.append(f"cProfile of the governed server ({backend}), by own time:\n{out.getvalue()}")
            out = io.StringIO()
            pstats.Stats(str(profile_file), stream=out).sort_stats("cumulative").print_stats("src/joch/", 40)
            notes.append(f"cProfile of the governed server ({backend}), cumulative, joch's own functions:\n"
                         f"{out.getvalue()}")
    return rates, notes


def table(backend: str, rates: dict[str, Rates], configs: list[Config], sizes: Sizes) -> list[list[str]]:
    base = rates[configs[0].label]
    rows: list[list[str]] = []
    workloads = (
        (f"HTTP POST one Agent ({SINGLE_CLIENTS} clients)", "singles", "single_meter", "single_objects"),
        (f"HTTP apply, {BATCH_SIZE}-doc batches ({BATCH_CLIENTS} clients)", "batches", "batch_meter",
         "batch_objects"),
    )
    for figure, attr, meter_attr, objects_attr in workloads:
        baseline = statistics.median(getattr(base, attr))
        for config in configs[1:]:
            r = rates[config.label]
            value = statistics.median(getattr(r, attr))
            ratio = value / baseline
            per_round = [g / b for g, b in zip(getattr(r, attr), getattr(base, attr), strict=True)]
            cpu = []
            for label in (configs[0].label, config.label):
                meter = getattr(rates[label], meter_attr)
                objects = getattr(rates[label], objects_attr)
                cpu.append(f"{meter.server / objects * 1000:.2f}" if meter and objects else "?")
            rows.append([backend, figure if config.label == "governed" else f"{figure} [{config.label}]",
                         f"{baseline:,.0f}", f"{value:,.0f}", f"{ratio:.2f}", f"{TARGET:.2f}",
                         "PASS" if ratio >= TARGET else "MISS",
                         f"rounds {min(per_round):.2f}-{max(per_round):.2f}; srv ms CPU/obj {cpu[0]} -> {cpu[1]}"])
    return rows


def print_rows(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and objects (about 40 s per backend)")
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, help="alternating rounds per backend (default 5, --quick 3)")
    parser.add_argument("--postgres", default=POSTGRES)
    parser.add_argument("--breakdown", action="store_true",
                        help="also measure today's server with no authenticator and no Policies (audit on)")
    parser.add_argument("--compare", metavar="COMMIT", action="append", default=[],
                        help="also measure the governed setup on the code of COMMIT (before/after a change); "
                             "repeatable")
    parser.add_argument("--profile", action="store_true", help="cProfile the governed server")
    parser.add_argument("--eval-reps", type=int, default=2000)
    args = parser.parse_args(argv)
    sizes = Sizes(rounds=args.rounds or (3 if args.quick else 5), singles=150 if args.quick else 300,
                  batches=4 if args.quick else 8)
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    for fact, value in machine_facts(args.postgres if "postgres" in backends else None):
        print(f"{fact}: {value}")
    busy = machine_busy(2.0)
    print(f"cores busy before the run (other processes): {busy:.2f} of {os.cpu_count()}")
    print("note: this machine is shared and loaded; objects/s swing by tens of percent between runs, so the "
          "servers' rounds alternate and the ratio of medians is the figure to read")
    all_rows: list[list[str]] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="joch-govbench-") as tmp:
        work = Path(tmp)
        log(f"extracting {BASELINE_COMMIT} (before issue 8)")
        baseline_src = extract_source(work, BASELINE_COMMIT)
        configs = [Config("baseline", baseline_src, auth=False, policies=False)]
        if args.breakdown:
            configs.append(Config("today, no auth/policies", None, auth=False, policies=False))
        for commit in args.compare:
            log(f"extracting {commit} (governed, for comparison)")
            configs.append(Config(f"governed @{commit}", extract_source(work, commit), auth=True, policies=True))
        configs.append(Config("governed", None, auth=True, policies=True))
        log(f"policy evaluation in-process, {args.eval_reps} repetitions")
        eval_rows = evaluation(work, args.eval_reps)
        for backend in backends:
            started = time.monotonic()
            rates, backend_notes = run_backend(backend, configs, sizes, work, args.postgres, args.profile)
            notes += [*backend_notes, f"{backend}: {time.monotonic() - started:.0f} s"]
            all_rows += table(backend, rates, configs, sizes)
    print(f"\n== Governance overhead: baseline = {BASELINE_COMMIT} (before issue 8: no auth, policies or audit); "
          "governed = token file + editor RoleBinding, 10 Policies x 5 rules, audit rows ==")
    print(f"median of {sizes.rounds} alternating rounds; {sizes.singles} single POSTs and "
          f"{sizes.batches} x {BATCH_SIZE}-doc applies per round and server")
    print_rows(["backend", "figure", "baseline obj/s", "governed obj/s", "ratio", "target", "result", "note"], all_rows)
    print("\n== Policy evaluation per object (in-process, joch.policy, SQLite) ==")
    for row in eval_rows:
        print(f"{row.figure}: {row.value:,.0f} µs" + (f"  ({row.note})" if row.note else ""))
    print()
    for note in notes:
        print(note)
    return 0 if all(row[6] == "PASS" for row in all_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
