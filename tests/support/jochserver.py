"""A real ``joch server`` process for the end-to-end agent tests (tests/e2e/test_agents_*.py): a
repository with one commit for the runs to change, the server's PATH finding the installed agent
CLIs (``scripts/agent-clis``), and ``Joch``, a small client applying manifests and following runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from support import ports, stop_server, wait_ready
from support.agents import agent_bin_dir

JOCH = Path(sys.executable).with_name("joch")
RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"


def free_port() -> int:
    return ports.free_port()  # not an ephemeral port: see support/ports.py


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          capture_output=True, text=True, check=True, timeout=30)
    return done.stdout


@dataclass
class Joch:
    base: str
    log: Path
    repo: Path

    def apply(self, *documents: str | dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        body = "\n---\n".join(d if isinstance(d, str) else json.dumps(d) for d in documents)
        r = httpx.post(f"{self.base}/v1/resources/apply", content=body,
                       headers={"content-type": "application/yaml", **(headers or {})}, timeout=30)
        assert r.status_code == 200, r.text
        return r

    def start(self, name: str, agent: str, text: str = "Create hello.txt.") -> None:
        run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
               "spec": {"agentRef": {"name": agent}, "implementation": {"inline": {"text": text}},
                        "execution": {"coordinates": {"git": {"url": str(self.repo)}}}}}
        r = httpx.post(f"{self.base}{RUNS}", json=run, timeout=60)
        assert r.status_code in (200, 201), r.text

    def run(self, name: str) -> dict[str, Any]:
        r = httpx.get(f"{self.base}{RUNS}/{name}", timeout=60)
        r.raise_for_status()
        run: dict[str, Any] = r.json()
        return run

    def wait_ended(self, name: str, seconds: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while (status := self.run(name).get("status") or {}).get("phase") not in ("Succeeded", "Failed", "Cancelled"):
            assert time.monotonic() < deadline, (status, self.log.read_text()[-3000:])
            time.sleep(0.2)
        return status

    def artifact(self, name: str, artifact: str) -> str:
        r = httpx.get(f"{self.base}{RUNS}/{name}/artifacts/{artifact}", timeout=60)
        assert r.status_code == 200, (artifact, r.text)
        return r.text

    def logs(self, name: str) -> str:
        r = httpx.get(f"{self.base}{RUNS}/{name}/log", timeout=60)
        return r.text if r.status_code == 200 else f"(no logs: {r.status_code})"


def repository(path: Path) -> Path:
    """A git repository at ``path`` with one commit (a README.md) on ``main``."""
    path.mkdir()
    git(path, "init", "--quiet", "--initial-branch", "main")
    (path / "README.md").write_text("# a repository\n")
    git(path, "add", "README.md")
    git(path, "commit", "--quiet", "-m", "first")
    return path


@contextmanager
def joch_server(
    tmp_path: Path, sandbox: str, drop_env: tuple[str, ...], *args: str, env: dict[str, str] | None = None,
) -> Iterator[Joch]:
    """A ``joch server`` with ``--sandbox sandbox`` and ``args``, its environment without ``JOCH_*``
    and the variables starting with ``drop_env`` (plus ``env``), and a repository in
    ``tmp_path/repo``; fails the test if the server's log has a traceback."""
    repo = repository(tmp_path / "repo")
    port = free_port()
    log = tmp_path / "server.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("JOCH_", *drop_env))}
    environ["PATH"] = f"{agent_bin_dir()}{os.pathsep}{environ.get('PATH', '')}"
    server = subprocess.Popen([str(JOCH), "server", "--data-dir", str(tmp_path / "data"), "--port", str(port),
                               "--sandbox", sandbox, *args], stdout=log.open("a"), stderr=subprocess.STDOUT,
                              text=True, env={**environ, **(env or {})}, cwd=tmp_path)
    joch = Joch(f"http://127.0.0.1:{port}", log, repo)
    try:
        wait_ready(joch.base, server)
        yield joch
    finally:
        stop_server(server)
    assert "Traceback" not in log.read_text(), log.read_text()
