"""The issue's budget scenario through a real ``joch server`` process and the real ``joch`` CLI: the
server hands its own URL (from ``--host``/``--port``) to the agents, an agent reports tokens that a
Model prices at $0.80, a run reserving $0.50 against a $1-a-day Budget is refused with both figures,
and ``joch get runs``, ``joch get budgets`` and ``joch cost`` show the spend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from support import ports, stop_server, wait_ready

RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"
JOCH = Path(sys.executable).with_name("joch")
AGENT = """
import json, os, urllib.request
url = os.environ['JOCH_API_URL'] + '/v1/namespaces/default/agentruns/' + os.environ['JOCH_RUN_NAME'] + '/callback'
body = {'events': [{'id': 'turn-1', 'model': 'gpt-test', 'inputTokens': 40000, 'cachedTokens': 0,
                    'outputTokens': 75000}]}
request = urllib.request.Request(url, data=json.dumps(body).encode(), method='POST', headers={
    'Content-Type': 'application/json', 'Authorization': 'Bearer ' + os.environ['JOCH_RUN_TOKEN']})
print(urllib.request.urlopen(request, timeout=10).read().decode())
"""


def free_port() -> int:
    return ports.free_port()  # not an ephemeral port: see support/ports.py


def joch(base: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
    env["JOCH_SERVER"] = base
    done = subprocess.run([str(JOCH), *args], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_status(base: str, name: str) -> dict[str, Any]:
    response = httpx.get(f"{base}{RUNS}/{name}", timeout=5)
    response.raise_for_status()
    status: dict[str, Any] = response.json().get("status") or {}
    return status


def wait_ended(base: str, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while (status := run_status(base, name)).get("phase") not in ("Succeeded", "Failed", "Cancelled"):
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    return status


def run(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
            "spec": {"agentRef": {"name": "coder"}, "implementation": {"inline": {"text": "spend"}}, **spec}}


def test_a_budget_of_a_dollar_a_day_refuses_a_run_reserving_50_cents_after_one_reported_80(tmp_path: Path) -> None:
    manifests = [
        {"apiVersion": "model.joch.dev/v1alpha1", "kind": "Model", "metadata": {"name": "gpt-test"},
         "spec": {"provider": "openai", "modelId": "gpt-test-2026",
                  "pricing": {"inputPerMillionUsd": 5.0, "outputPerMillionUsd": 8.0}}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "python"},
         "spec": {"binary": sys.executable, "argsTemplate": ["-c", AGENT]}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "coder"},
         "spec": {"providerRef": {"name": "python"}, "modelRoute": "gpt-test"}},
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Budget", "metadata": {"name": "daily"},
         "spec": {"period": "day", "limitUsd": 1, "onExceed": "deny"}},
    ]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data_dir = tmp_path / "data"
    log = tmp_path / "server.log"
    server = subprocess.Popen([str(JOCH), "server", "--data-dir", str(data_dir), "--port", str(port),
                               "--sandbox", "none"], stdout=log.open("a"), stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(base, server)
        body = "\n---\n".join(json.dumps(m) for m in manifests)
        httpx.post(f"{base}/v1/resources/apply", content=body, headers={"content-type": "application/yaml"},
                   timeout=10).raise_for_status()
        httpx.post(f"{base}{RUNS}", json=run("first"), timeout=10).raise_for_status()
        first = wait_ended(base, "first")
        assert first["phase"] == "Succeeded", (first, log.read_text())
        assert first["costUsd"] == 0.8  # 40k input at $5/M + 75k output at $8/M
        httpx.post(f"{base}{RUNS}", json=run("second", budgetUsd=0.5), timeout=10).raise_for_status()
        second = wait_ended(base, "second")
        assert (second["phase"], second["reason"]) == ("Failed", "BudgetExceeded")
        assert "limit $1.00 per day" in second["message"]
        assert "spent $0.80" in second["message"] and "this run reserves $0.50" in second["message"]

        runs = joch(base, "get", "runs").splitlines()
        assert runs[0].split()[:4] == ["NAME", "AGENT", "PHASE", "COST"]
        assert runs[1].split()[:4] == ["first", "coder", "Succeeded", "0.8"]
        deadline = time.monotonic() + 10
        while (budgets := joch(base, "get", "budgets").splitlines())[1].split()[1] != "0.8":
            assert time.monotonic() < deadline, budgets
            time.sleep(0.2)
        assert budgets[0].split()[:5] == ["NAME", "SPEND", "LIMIT", "REMAINING", "PERIOD"]
        assert budgets[1].split()[:5] == ["daily", "0.8", "1", "0.2", "day"]
        report = json.loads(joch(base, "cost", "--by", "agent", "--since", "1d", "-o", "json"))
        assert [(i["agent"], i["costUsd"], i["runs"]) for i in report["items"]] == [("coder", 0.8, 1)]
        table = joch(base, "cost", "-A", "--by", "model")
        assert "gpt-test" in table and "$0.80" in table and "TOTAL" in table
    finally:
        stop_server(server)
