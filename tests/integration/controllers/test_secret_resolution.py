"""Each Secret resolved into a run is recorded through ``Store.audit`` (its name and the run, never a
value), read from the store at dispatch (``reveal``); one refused as not allowed is recorded denied.
A real controller manager, a real local runtime and a real SQLite store encrypting with a key ring,
whose ``audit`` also keeps what it was given so the test can read it (the audit log itself is
another section's)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from integration.controllers.test_runs import Env, agent, provider, repo, script, start
from joch.api.audit import AuditEntry, AuditQuery
from joch.store import KeyRing
from joch.store.sealing import new_key
from joch.store.sql import SqlStore
from joch.store.sqlite import SqliteBackend

__all__ = ["repo"]  # the fixture, used by the test below


class Recording(SqlStore):
    def __init__(self, path: Path) -> None:
        super().__init__(SqliteBackend(path), history=None, keys=KeyRing([new_key()], source="test ring"))
        self.entries: list[AuditEntry] = []

    def audit(self, entry: AuditEntry) -> None:
        self.entries.append(entry)
        super().audit(entry)


def test_each_secret_resolved_into_a_run_is_audited_without_its_value(tmp_path: Path, repo: Path) -> None:
    store = Recording(tmp_path / "joch.db")
    runtime, manager = start(store, tmp_path / "data")
    env = Env(store, runtime, manager, tmp_path / "data", repo, tmp_path)
    try:
        out = env.tmp / "seen"
        code = "import os,pathlib,sys; pathlib.Path(sys.argv[1]).write_text(os.environ['TOKEN'] + os.environ['API'])"
        env.apply(
            {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "tok"},
             "spec": {"stringData": {"TOKEN": "value-one-4242"}}},
            {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "keys"},
             "spec": {"data": {"api": base64.b64encode(b"value-two-4343").decode()}}},
            provider("p", [*script(code), str(out)], secretEnv=[{"name": "API", "secretRef": {"name": "keys",
                                                                                             "key": "api"}}]),
            provider("q", script("pass")),
            agent("a", "p", security={"allowedSecrets": ["tok", "keys"]}),
            agent("b", "q"),
        )
        denied = env.create_run("denied", agent="b", secrets=["tok"])
        assert env.wait(denied, {"Failed", "Succeeded"})["status"]["reason"] == "SecretNotAllowed"
        name = env.create_run("fix", secrets=["tok"])
        run = env.wait(name, {"Failed", "Succeeded"})
        assert run["status"]["phase"] == "Succeeded", run["status"]
        assert out.read_text() == "value-one-4242value-two-4343"
        # What the audit log kept, oldest first (a spy would also see attempts that were retried).
        resolved = list(reversed(store.audit_events(AuditQuery(verb="resolve")).items))
    finally:
        manager.stop()
        runtime.close()
        store.close()
    assert [(e.kind, e.namespace, e.name, e.decision) for e in resolved] == [
        ("Secret", "default", "tok", "denied"),
        ("Secret", "default", "keys", "allowed"), ("Secret", "default", "tok", "allowed")]
    assert resolved[0].reason == "not allowed for Agent b: AgentRun default/denied fails SecretNotAllowed"
    resolved = resolved[1:]
    assert resolved[0].reason == "resolved into AgentRun default/fix for Agent a"
    assert resolved[0].actor == "system:joch:controller"
    shown = json.dumps([e.__dict__ for e in store.entries], default=str)
    assert "value-one" not in shown and "value-two" not in shown
    assert "dmFsdWUtdHdv" not in shown  # nor its base64
