"""``serve``: a real process that opens the store, applies manifests, serves, and stops on SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from support import ports, wait_ready

PROVIDER = """\
apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata:
  name: codex
spec:
  binary: codex
"""


def free_port() -> int:
    return ports.free_port()  # not an ephemeral port: see support/ports.py


def launch(store_url: str, port: int, manifests: Path, *, missing: bool = False) -> subprocess.Popen[str]:
    how = "apply_missing_paths" if missing else "apply_paths"
    # The Secret key ring as joch server has it: a key file generated once, next to the manifests.
    code = ("import pathlib, sys; from joch.server import serve; from joch.store.sealing import load_ring; "
            "keys = load_ring(key_file=None, env_value=None, data_dir=pathlib.Path(sys.argv[3]).parent / 'keys')[0]; "
            f"serve(store_url=sys.argv[1], port=int(sys.argv[2]), {how}=[sys.argv[3]], secret_keys=keys)")
    return subprocess.Popen([sys.executable, "-c", code, store_url, str(port), str(manifests)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
    return stderr


AGENT = "apiVersion: joch.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: fixer\nspec:\n  providerRef: {name: codex}\n"
RUN = """\
apiVersion: runtime.joch.dev/v1alpha1
kind: AgentRun
metadata: {name: r1}
spec:
  agentRef: {name: fixer}
  implementation: {inline: {text: Fix it.}}
  execution: {coordinates: {git: {url: ..}}}
"""


def test_apply_missing_creates_what_is_missing_and_keeps_edits_across_restarts(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "a-provider.yaml").write_text(PROVIDER)
    (tmp_path / "b-agent.yaml").write_text(AGENT)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    agent_path = f"{base}/apis/joch.dev/v1alpha1/namespaces/default/agents/fixer"
    proc = launch(store_url, port, tmp_path, missing=True)
    try:
        wait_ready(base, proc)
        edited = httpx.patch(agent_path, json={"spec": {"description": "edited by hand"}},
                             headers={"Content-Type": "application/merge-patch+json"})
        assert edited.status_code == 200, edited.text
    finally:
        first = stop(proc)
    assert "agentprovider.joch.dev/codex created" in first and "agent.joch.dev/fixer created" in first
    (tmp_path / "c-other.yaml").write_text(PROVIDER.replace("name: codex", "name: other"))
    proc = launch(store_url, port, tmp_path, missing=True)
    try:
        wait_ready(base, proc)
        assert httpx.get(agent_path).json()["spec"]["description"] == "edited by hand"  # not reverted
    finally:
        second = stop(proc)
    assert "agent.joch.dev/fixer exists; left as it is (--apply-missing creates only missing objects)" in second
    assert "agentprovider.joch.dev/other created" in second and "fixer created" not in second


def test_apply_missing_refuses_an_invalid_manifest_even_if_its_object_exists(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "a-provider.yaml").write_text(PROVIDER)
    port = free_port()
    stop(launch_ready(store_url, port, tmp_path))
    (tmp_path / "a-provider.yaml").write_text(PROVIDER.replace("binary: codex", "binary: ''"))
    proc = launch(store_url, port, tmp_path, missing=True)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "1 of 1 document is invalid" in stderr


def launch_ready(store_url: str, port: int, manifests: Path) -> subprocess.Popen[str]:
    proc = launch(store_url, port, manifests, missing=True)
    wait_ready(f"http://127.0.0.1:{port}", proc)
    return proc


def test_a_relative_repository_path_is_resolved_against_the_manifests_directory(
    store_url: str, tmp_path: Path,
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "a.yaml").write_text(PROVIDER + "---\n" + AGENT + "---\n" + RUN)
    port = free_port()
    proc = launch(store_url, port, Path(os.path.relpath(manifests)))  # the server's cwd is not tmp_path
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc)
        run = httpx.get(f"{base}/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns/r1").json()
        assert run["spec"]["execution"]["coordinates"]["git"]["url"] == str(tmp_path.resolve())
    finally:
        stop(proc)


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


def test_watch_is_served_on_a_connection_that_other_requests_use_too(store_url: str, tmp_path: Path) -> None:
    """The server parses with httptools, which refuses the seed's custom ``WATCH`` method: such a
    request is handed to h11 between requests, first on a connection or after others on it."""
    (tmp_path / "a-provider.yaml").write_text(PROVIDER)
    port = free_port()
    proc = launch(store_url, port, tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc)
        with httpx.Client(base_url=base) as http:
            for _ in range(2):  # GET, WATCH, GET, WATCH on one keep-alive connection
                assert http.get("/apis/joch.dev/v1alpha1/namespaces/default/agentproviders/codex").status_code == 200
                watched = http.request("WATCH", "/v1/resources", params={"timeoutSeconds": "1"})
                assert watched.status_code == 200 and "codex" in watched.text
        with socket.create_connection(("127.0.0.1", port)) as raw:  # WATCH first, its method in two pieces
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw.sendall(b"WA")
            time.sleep(0.2)
            raw.sendall(b"TCH /v1/resources?timeoutSeconds=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Connection: close\r\n\r\n")
            answer = b""
            while chunk := raw.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and b"codex" in answer
    finally:
        stop(proc)


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


def test_serve_always_encrypts_secrets_so_it_needs_a_key_ring(sqlite_url: str) -> None:
    from joch.server import serve

    with pytest.raises(ValueError, match="key ring"):
        serve(store_url=sqlite_url, port=free_port())
