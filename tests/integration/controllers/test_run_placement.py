"""Where a run goes (``controllers.placements``): a runtime type the server does not have, and a
service account the Agent does not allow, end the run at once naming the field and the fix."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from joch.admission.apply import apply_documents
from joch.admission.documents import load_documents
from joch.api import kinds
from joch.controllers.assembly import build_controllers
from joch.controllers.manager import Manager
from joch.controllers.options import ControllerOptions
from joch.runtime.local import LocalRuntime
from joch.store import Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'joch.db'}")
    options = ControllerOptions(data_dir=tmp_path / "data", leader_election=False, grace_seconds=1.0,
                                resync_period=2.0)
    runtime = LocalRuntime(tmp_path / "data")
    manager = Manager(opened, build_controllers(opened, runtime, options), options)
    manager.start()
    assert manager.wait_started(10)
    yield opened
    manager.stop()
    runtime.close()
    opened.close()


def apply(store: Store, *docs: dict[str, Any]) -> None:
    apply_documents(store, load_documents("\n---\n".join(json.dumps(d) for d in docs)), dry_run=False)


def ended(store: Store, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        status: dict[str, Any] = store.get(kinds.AGENT_RUN, "default", name).get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed", "Cancelled"):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def docs(name: str, runtime: dict[str, Any], security: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": name},
         "spec": {"binary": sys.executable, "argsTemplate": ["-c", "pass"]}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
         "spec": {"providerRef": {"name": name}, "runtime": runtime, "security": security or {}}},
        {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
         "spec": {"agentRef": {"name": name}, "implementation": {"inline": {"text": "x"}}}},
    ]


def test_a_runtime_the_server_does_not_have_fails_the_run_saying_how_to_get_it(store: Store) -> None:
    apply(store, *docs("kube", {"type": "kubernetes"}))
    status = ended(store, "kube")
    assert (status["phase"], status["reason"]) == ("Failed", "RuntimeUnavailable"), status
    assert 'runtime.type "kubernetes"' in status["message"] and "--kube-config" in status["message"]
    # The run's own runtime.type wins over its Agent's.
    run = docs("own", {"type": "local"})
    run[2]["spec"]["runtime"] = {"type": "kubernetes"}
    apply(store, *run)
    assert ended(store, "own")["reason"] == "RuntimeUnavailable"


def test_a_service_account_the_agent_does_not_allow_fails_the_run(store: Store) -> None:
    apply(store, *docs("sa", {"type": "local", "config": {"serviceAccountName": "cluster-admin"}},
                       {"allowedServiceAccounts": ["builder"]}))
    status = ended(store, "sa")
    assert (status["phase"], status["reason"]) == ("Failed", "ServiceAccountNotAllowed"), status
    assert '"cluster-admin"' in status["message"] and "allowedServiceAccounts (builder)" in status["message"]


def test_a_local_agent_still_runs_locally(store: Store) -> None:
    apply(store, *docs("here", {"type": "local"}))
    status = ended(store, "here")
    assert status["phase"] == "Succeeded" and status["runtimeRef"]["type"] == "local", status
