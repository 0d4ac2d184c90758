"""``kill -9`` of ``joch server`` in the middle of a run, then a restart on the same data dir: the
runner kept the agent going and recorded its end, the new server re-adopts the run, and the agent
ran exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from support import ports, stop_server, wait_ready

RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"


def free_port() -> int:
    return ports.free_port()  # not an ephemeral port: see support/ports.py


def joch_server(data_dir: Path, port: int, log: Path) -> subprocess.Popen[str]:
    joch = Path(sys.executable).parent / "joch"
    # --sandbox none: the agent counts its starts in a file under the test's /tmp, which a sandbox hides.
    return subprocess.Popen([str(joch), "server", "--data-dir", str(data_dir), "--port", str(port),
                             "--sandbox", "none"],
                            stdout=log.open("a"), stderr=subprocess.STDOUT, text=True, cwd=data_dir.parent)


def run_status(base: str, name: str) -> dict[str, Any]:
    response = httpx.get(f"{base}{RUNS}/{name}", timeout=5)
    response.raise_for_status()
    status: dict[str, Any] = response.json().get("status") or {}
    return status


def test_kill_9_during_a_run_then_restart_ends_succeeded_and_the_agent_ran_once(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    code = ("import pathlib,sys,time; p=pathlib.Path(sys.argv[1]); "
            "p.write_text((p.read_text() if p.exists() else '') + 'x'); time.sleep(2); print('done')")
    manifests = [
        {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
         "spec": {"binary": sys.executable, "argsTemplate": ["-c", code, str(counter)]}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
         "spec": {"providerRef": {"name": "p"}}},
        {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "once"},
         "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "count"}}}},
    ]
    data_dir = tmp_path / "data"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    server = joch_server(data_dir, port, log)
    try:
        wait_ready(base, server)
        body = "\n---\n".join(json.dumps(m) for m in manifests)
        httpx.post(f"{base}/v1/resources/apply", content=body,
                   headers={"content-type": "application/yaml"}, timeout=10).raise_for_status()
        deadline = time.monotonic() + 20
        while run_status(base, "once").get("phase") != "Running" or not counter.exists():
            assert time.monotonic() < deadline, run_status(base, "once")
            time.sleep(0.05)
        os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        server = joch_server(data_dir, port, log)
        wait_ready(base, server)
        deadline = time.monotonic() + 30
        while (status := run_status(base, "once")).get("phase") not in ("Succeeded", "Failed", "Cancelled"):
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
    finally:
        stop_server(server)
    assert status["phase"] == "Succeeded", (status, log.read_text())
    assert counter.read_text() == "x"
    assert "Traceback" not in log.read_text()
