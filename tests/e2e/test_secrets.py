"""Secrets through a real ``joch server`` process (SQLite in its data dir): the key file it
generates (mode 0600), a run of an agent that does not allow the Secret failing
``SecretNotAllowed``, an allowed run whose agent gets the value in its environment while its log
shows ``***``, no value in any answer, Event or file of the data dir (the database and its WAL
included), a restart with the wrong key refused at once naming the key, and a rotation."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from e2e.test_isolation import apply, wait_finished
from e2e.test_server_crash import RUNS, free_port
from joch.store.sealing import KEY_FILE_NAME, KeyRing, new_key, write_key_file
from support import stop_server, wait_ready

VALUE = "sk-live-5551234-e2e"
FORMS = (VALUE, base64.b64encode(VALUE.encode()).decode())
JOCH = Path(sys.executable).parent / "joch"
# The agent writes what it got where the test can read it, and prints it (the log must hide it).
AGENT = ("import os,pathlib,sys; v=os.environ.get('TOKEN','<unset>'); pathlib.Path(sys.argv[1]).write_text(v); "
         "print('the token is', v)")


def start(data_dir: Path, port: int, log: Path, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "JOCH_SECRET_KEY"}
    return subprocess.Popen([str(JOCH), "server", "--data-dir", str(data_dir), "--port", str(port),
                             "--sandbox", "none", *extra],
                            stdout=log.open("a"), stderr=subprocess.STDOUT, text=True, cwd=data_dir.parent, env=env)


def manifests(seen: Path) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "creds"},
         "spec": {"stringData": {"TOKEN": VALUE}}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "py"},
         "spec": {"binary": sys.executable, "argsTemplate": ["-c", AGENT, str(seen)]}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "trusted"},
         "spec": {"providerRef": {"name": "py"}, "security": {"allowedSecrets": ["creds"]}}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "untrusted"},
         "spec": {"providerRef": {"name": "py"}}},
    ]


def run(name: str, agent: str) -> dict[str, Any]:
    return {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
            "spec": {"agentRef": {"name": agent}, "secrets": ["creds"],
                     "implementation": {"inline": {"text": "use the token"}}}}


def test_secrets_through_a_real_server(tmp_path: Path) -> None:
    data_dir, port, log = tmp_path / "data", free_port(), tmp_path / "server.log"
    base = f"http://127.0.0.1:{port}"
    seen = tmp_path / "seen-by-agent"
    answers: list[str] = []
    server = start(data_dir, port, log)
    try:
        wait_ready(base, server)
        key_file = data_dir / KEY_FILE_NAME
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        apply(base, *manifests(seen))
        apply(base, run("denied", "untrusted"))
        denied = wait_finished(base, "denied")
        assert (denied["phase"], denied["reason"]) == ("Failed", "SecretNotAllowed"), denied
        assert not seen.exists()
        apply(base, run("allowed", "trusted"))
        allowed = wait_finished(base, "allowed")
        assert allowed["phase"] == "Succeeded", (allowed, log.read_text())
        assert seen.read_text() == VALUE  # the agent's environment had it
        agent_log = httpx.get(f"{base}{RUNS}/allowed/log", timeout=10)
        assert agent_log.status_code == 200 and "the token is ***" in agent_log.text, agent_log.text
        for path in (f"{RUNS}/allowed", f"{RUNS}/denied", "/apis/ops.joch.dev/v1alpha1/events",
                     "/apis/ops.joch.dev/v1alpha1/namespaces/default/secrets/creds",
                     "/apis/ops.joch.dev/v1alpha1/secrets"):
            response = httpx.get(f"{base}{path}", timeout=10)
            assert response.status_code == 200, response.text
            answers.append(response.text)
        answers.append(agent_log.text)
        deleted = httpx.delete(f"{base}/apis/ops.joch.dev/v1alpha1/namespaces/default/secrets/creds", timeout=10)
        assert deleted.status_code == 200
        answers.append(deleted.text)
        apply(base, manifests(seen)[0])  # back, for the restarts below
    finally:
        stop_server(server)
    shown = "\n".join(answers)
    assert not [form for form in FORMS if form in shown]
    # Nothing in the data dir holds it: not the database nor its WAL, not a run's files or log.
    leaked = [str(p) for p in data_dir.rglob("*") if p.is_file() and any(f.encode() in p.read_bytes() for f in FORMS)]
    assert leaked == []
    assert "Traceback" not in log.read_text()

    # The wrong key: the server says so at start, naming the key file and the key the data needs.
    wrong = tmp_path / "wrong.key"
    write_key_file(wrong, [new_key()])
    refused = start(data_dir, free_port(), tmp_path / "refused.log", "--secret-key-file", str(wrong))
    assert refused.wait(30) != 0
    said = (tmp_path / "refused.log").read_text()
    needed = KeyRing.from_file(key_file).primary.id
    assert str(wrong) in said and needed in said and "Traceback" not in said, said

    # Rotation: a new key first in the file, the Secret re-encrypted, and the server starts with it.
    rotated = subprocess.run([str(JOCH), "admin", "rotate-secret-key", "--data-dir", str(data_dir)],
                             capture_output=True, text=True, timeout=60, check=False)
    assert rotated.returncode == 0 and "re-encrypted 1 Secret " in rotated.stdout, rotated
    ring = KeyRing.from_file(key_file)
    assert ring.ids[1] == needed and len(ring.ids) == 2 and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    port = free_port()
    server = start(data_dir, port, log, "--secret-key-file", str(key_file))
    try:
        wait_ready(f"http://127.0.0.1:{port}", server)
        got = httpx.get(f"http://127.0.0.1:{port}/apis/ops.joch.dev/v1alpha1/namespaces/default/secrets/creds")
        assert got.json()["status"]["keys"] == [{"name": "TOKEN", "size": len(VALUE)}]
        assert json.dumps(got.json()).find(FORMS[1]) == -1
    finally:
        stop_server(server)
