"""From inside a real agent of a real ``joch server`` on Postgres: nothing the agent can read (its
ancestors' environment and command line, every process it can see, the data dir) holds the store
URL's password; and, sandboxed, no process or file of another run either."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from e2e.test_server_crash import free_port, run_status
from integration.runtime.test_isolation import SNOOP
from joch.runtime.sandbox import sandbox_problem
from support import stop_server, wait_ready

PASSWORD = "pw-4711-not-for-agents"


def apply(base: str, *manifests: dict[str, Any]) -> None:
    body = "\n---\n".join(json.dumps(m) for m in manifests)
    httpx.post(f"{base}/v1/resources/apply", content=body, headers={"content-type": "application/yaml"},
               timeout=10).raise_for_status()


def wait_finished(base: str, name: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (status := run_status(base, name)).get("phase") not in ("Succeeded", "Failed", "Cancelled"):
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    return status


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_an_agent_finds_neither_the_store_password_nor_another_runs_secret(
        tmp_path: Path, postgres_url: str, sandbox: str) -> None:
    if sandbox == "bwrap" and (problem := sandbox_problem()) is not None:
        if os.environ.get("CI"):
            pytest.fail(f"bubblewrap is required in CI: {problem}")
        pytest.skip(problem)
    # Trust authentication ignores the password, so the URL works and still carries one to find.
    url = postgres_url.replace("postgresql://postgres@", f"postgresql://postgres:{PASSWORD}@", 1)
    assert PASSWORD in url
    store_file = tmp_path / "store-url"
    store_file.write_text(url + "\n")
    store_file.chmod(0o600)
    data_dir, port = tmp_path / "data", free_port()
    base, log = f"http://127.0.0.1:{port}", tmp_path / "server.log"
    joch = Path(sys.executable).parent / "joch"
    server = subprocess.Popen([str(joch), "server", "--store-file", str(store_file), "--data-dir", str(data_dir),
                               "--port", str(port), "--sandbox", sandbox],
                              stdout=log.open("a"), stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        wait_ready(base, server)
        secret = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "theirs"},
                  "spec": {"data": {"THEIR_TOKEN": base64.b64encode(b"their-token-13579").decode()}}}
        holder = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "holder"},
                  "spec": {"binary": sys.executable,
                           "argsTemplate": ["-c", "import time; time.sleep(4)"]}}
        snooper = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "snooper"},
                   "spec": {"binary": sys.executable,
                            "argsTemplate": ["-c", SNOOP, "{{ workspace.outputs }}/dump.json", str(data_dir)],
                            "outputArtifacts": [{"name": "dump", "path": "dump.json"}]}}
        agents = [{"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
                   "spec": {"providerRef": {"name": name}, "security": {"allowedSecrets": ["theirs"]}}}
                  for name in ("holder", "snooper")]
        apply(base, secret, holder, snooper, *agents)
        run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun"}
        apply(base, {**run, "metadata": {"name": "other"},
                     "spec": {"agentRef": {"name": "holder"}, "secrets": ["theirs"],
                              "implementation": {"inline": {"text": "hold a secret"}}}})
        deadline = time.monotonic() + 20
        while run_status(base, "other").get("phase") != "Running":
            assert time.monotonic() < deadline, run_status(base, "other")
            time.sleep(0.05)
        apply(base, {**run, "metadata": {"name": "snoop"},
                     "spec": {"agentRef": {"name": "snooper"}, "implementation": {"inline": {"text": "look"}}}})
        status = wait_finished(base, "snoop")
        assert status["phase"] == "Succeeded", (status, log.read_text())
        assert wait_finished(base, "other")["phase"] == "Succeeded"
    finally:
        stop_server(server)
    (dump_file,) = data_dir.glob("runs/*/1/outputs/dump.json")
    dump = json.loads(dump_file.read_text())
    # Unsandboxed, every process of this user is readable (the other run's agent has its secret in
    # its environment): only the sandbox keeps those out of sight, so only its dump is all checked.
    seen = json.dumps(dump if sandbox == "bwrap" else {"ancestors": dump["ancestors"], "data": dump["data"]})
    assert PASSWORD not in seen and "their-token-13579" not in seen
    assert str(store_file) not in json.dumps(dump["data"])
    if sandbox == "bwrap":
        assert dump["ancestors"] == [] and set(dump["processes"]) <= {"1/environ", "1/cmdline"}
        assert not [p for p in dump["data"] if "/runs/" in p]  # no run records, its own or another's
    else:
        # Unsandboxed, the agent sees its ancestors up to pid 1: the runner, the fork server and the
        # server itself (started with --store-file, so no password on its command line or environment).
        server_seen = [a for a in dump["ancestors"] if "--store-file" in a["cmdline"]]
        assert server_seen and all(PASSWORD not in a["environ"] + a["cmdline"] for a in dump["ancestors"])
    assert "Traceback" not in log.read_text()
