"""What CEL policies cost: evaluation time per object, and HTTP apply throughput with 10 Policies of
5 rules each applying to every object, as a ratio of the same server without them (measured in
the same run). Target: ≥ 0.70.

* **Evaluation per object** (in-process): the 50 rules against one Agent, with the variables
  converted once (``joch.policy.rules.evaluate``), and the whole admission decision
  (``joch.policy.decisions.admission``: read the Policies and Environments through a transaction,
  select, evaluate) as admission runs it for a one-document apply.
* **HTTP apply**: the real ``joch server`` (a subprocess, SQLite in a fresh file) on 127.0.0.1,
  ``POST /v1/resources/apply`` with multi-document YAML batches of Agents, then single-object
  ``POST``s (one Policy read per request: the worst case). Policies: five in ``default`` and five in
  ``joch-system``, selecting Agents; their rules read ``object``, ``request``, ``namespace`` and
  ``provider`` and never fire, so both servers write the same objects. Baseline and policy servers
  alternate (``--rounds``) and the best round of each counts, which keeps a noisy neighbour on a
  shared machine from deciding the ratio.

Usage: ``python bench/policy.py [--batches 20] [--batch-size 50] [--singles 300] [--rounds 2]``
(``make bench-policy``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Row, Server, log, machine_facts, print_table, sqlite_url, workdir
from store_bench import AGENTS_PATH, APPLY_PATH, Request, http_throughput

from joch.admission.apply import apply_documents
from joch.admission.documents import load_documents
from joch.api import kinds
from joch.policy import decisions, rules
from joch.store import open_store

TARGET = 0.70
EXPRESSIONS = [
    'object.spec.providerRef.name == "forbidden-{i}"',
    'has(object.metadata.labels) && "blocked-{i}" in object.metadata.labels',
    'request.user == "blocked-{i}" && !("admins" in request.groups)',
    'namespace.environment == "frozen-{i}" || object.metadata.name.startsWith("tmp-{i}-")',
    'provider != null && !(provider.spec.binary in ["codex", "claude", "aider"])',
]


def policies() -> list[dict[str, Any]]:
    out = []
    for i in range(10):
        out.append({"apiVersion": "joch.dev/v1alpha1", "kind": "Policy",
                    "metadata": {"name": f"bench-{i}", "namespace": "default" if i < 5 else "joch-system"},
                    "spec": {"selector": {"kinds": ["Agent"]},
                             "rules": [{"name": f"rule-{j}", "expression": e.format(i=i), "message": "no"}
                                       for j, e in enumerate(EXPRESSIONS)]}})
    return out


def agent(name: str) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": name, "namespace": "default", "labels": {"team": "bench"}},
            "spec": {"providerRef": {"name": "codex"}}}


SETUP = [{"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "codex"},
          "spec": {"binary": "codex"}}]


def evaluation(work: Path, reps: int) -> list[Row]:
    with sqlite_url(work, "eval") as url:
        store = open_store(url, history=None)
        try:
            apply_documents(store, load_documents(yaml.safe_dump_all(SETUP + policies())))
            obj = {**agent("x"), "metadata": {**agent("x")["metadata"], "uid": "u", "resourceVersion": "1"}}
            with store.transaction() as tx:
                source = decisions.StoreSource(tx)
                selected = rules.select(source.compiled("default"), obj, [])
                request = rules.request_variable("ana", ["dev"], "create")
                variables = {"object": obj, "oldObject": None, "request": request,
                             "namespace": rules.namespace_variable("default", []), "environment": None,
                             "run": None, "agent": None, "implementation": None,
                             "provider": tx.get(kinds.AGENT_PROVIDER, "default", "codex")}
                assert sum(len(p.rules) for p in selected) == 50
                assert rules.evaluate(selected, "admission", variables) == []
                start = time.perf_counter()
                for _ in range(reps):
                    rules.evaluate(selected, "admission", variables)
                pure = (time.perf_counter() - start) / reps * 1e6
            start = time.perf_counter()
            for _ in range(reps):
                with store.transaction() as tx:
                    assert decisions.admission(decisions.StoreSource(tx), obj, None) == []
            whole = (time.perf_counter() - start) / reps * 1e6
        finally:
            store.close()
    return [Row("evaluate 50 rules on one Agent", pure, "µs"),
            Row("admission decision (read + select + evaluate)", whole, "µs",
                note="a transaction, 2 Policy lists, Environments, the provider, 50 rules")]


def apply_rate(work: Path, name: str, with_policies: bool, batches: int, size: int,
               singles: int) -> tuple[float, float, str, str]:
    with sqlite_url(work, name) as url:
        store = open_store(url, history=None)
        apply_documents(store, load_documents(yaml.safe_dump_all(SETUP + (policies() if with_policies else []))))
        store.close()
        with Server(url) as server:
            batch_requests: list[Request] = [
                (APPLY_PATH, yaml.safe_dump_all([agent(f"{name}-{b:03d}-{i:03d}") for i in range(size)]),
                 "application/yaml", size) for b in range(batches)]
            single_requests: list[Request] = [
                (AGENTS_PATH.format(namespace="default"), json.dumps(agent(f"{name}-single-{i:05d}")),
                 "application/json", 1) for i in range(singles)]
            batch_rate, batch_note = http_throughput(server, batch_requests, 2, 120.0)
            single_rate, single_note = http_throughput(server, single_requests, 2, 120.0)
    return batch_rate, single_rate, batch_note, single_note


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--singles", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--eval-reps", type=int, default=2000)
    args = parser.parse_args()
    for fact, value in machine_facts(None):
        print(f"{fact}: {value}")
    with workdir() as tmp:
        work = Path(tmp)
        log(f"evaluation, {args.eval_reps} repetitions")
        rows = evaluation(work, args.eval_reps)
        best: dict[bool, list[float]] = {False: [0.0, 0.0], True: [0.0, 0.0]}
        for r in range(args.rounds):
            for with_policies in (False, True):
                label = "with policies" if with_policies else "baseline"
                log(f"round {r + 1}: HTTP apply, {label}")
                batch, single, _, _ = apply_rate(work, f"r{r}{'p' if with_policies else 'b'}", with_policies,
                                                 args.batches, args.batch_size, args.singles)
                best[with_policies] = [max(best[with_policies][0], batch), max(best[with_policies][1], single)]
    base_batch, base_single = best[False]
    pol_batch, pol_single = best[True]
    rows += [
        Row(f"HTTP apply, {args.batch_size}-doc batches, no policies", base_batch, "obj/s"),
        Row(f"HTTP apply, {args.batch_size}-doc batches, 10 Policies x 5 rules", pol_batch, "obj/s",
            target=TARGET * base_batch, ceiling=base_batch, note="vs raw = ratio to the baseline above"),
        Row("HTTP POST one object, no policies", base_single, "obj/s"),
        Row("HTTP POST one object, 10 Policies x 5 rules", pol_single, "obj/s",
            target=TARGET * base_single, ceiling=base_single, note="vs raw = ratio to the baseline above"),
    ]
    print_table("CEL policies (SQLite)", rows)
    print(f"\nratio, batches: {pol_batch / base_batch:.2f}  ratio, single POSTs: {pol_single / base_single:.2f}  "
          f"(target >= {TARGET:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
