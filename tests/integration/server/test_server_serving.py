"""``serve``: a real process that opens the store, applies manifests, serves, and stops on SIGINT."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from support import wait_ready

PROVIDER = """\
apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata:
  name: codex
spec:
  binary: codex
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def launch(store_url: str, port: int, manifests: Path) -> subprocess.Popen[str]:
    code = ("import sys; from joch.server import serve; "
            "serve(store_url=sys.argv[1], port=int(sys.argv[2]), apply_paths=[sys.argv[3]])")
    return subprocess.Popen([sys.executable, "-c", code, store_url, str(port), str(manifests)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_serve_applies_manifests_then_serves_until_interrupted(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "a-provider.yaml").write_text(PROVIDER)
    (tmp_path / "b-agent.yaml").write_text(
        "apiVersion: joch.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: fixer\nspec:\n"
        "  providerRef: {name: codex}\n")
    (tmp_path / "notes.txt").write_text("not a manifest")
    port = free_port()
    proc = launch(store_url, port, tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc)
        agent = httpx.get(f"{base}/apis/joch.dev/v1alpha1/namespaces/default/agents/fixer")
        assert agent.status_code == 200 and agent.json()["spec"]["providerRef"] == {"name": "codex"}
        assert httpx.request("WATCH", f"{base}/v1/resources", params={"timeoutSeconds": "1"}).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
    assert "agentprovider.joch.dev/codex created" in stderr and "agent.joch.dev/fixer created" in stderr


def test_serve_refuses_to_start_when_a_manifest_is_invalid(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(PROVIDER.replace("binary: codex", "binary: ''"))
    port = free_port()
    proc = launch(store_url, port, tmp_path)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "Invalid: 1 of 1 document is invalid; nothing was applied" in stderr
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_deeply_nested_yaml_is_400_and_the_server_lives_on(store_url: str, tmp_path: Path) -> None:
    # A real `serve` process: libyaml's composer used to take it down with SIGSEGV on this body.
    port = free_port()
    proc = launch(store_url, port, tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc)
        for text in ("a: " + "[" * 100_000, "a:\n" + "- " * 100_000 + "x"):
            r = httpx.post(f"{base}/v1/resources/apply", content=text,
                           headers={"Content-Type": "application/yaml"}, timeout=30)
            assert r.status_code == 400, r.text[:500]
            assert r.json()["message"].startswith("request body: documents[0] (line ")
            assert "nest more than 64 levels deep" in r.json()["message"]
        assert httpx.get(f"{base}/readyz").status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
