"""Deleting a namespace: ``joch.store.namespaces.terminate`` and the namespace controller that
finishes a deletion finalizers held back, under the real manager."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from joch.api import REGISTRY, errors
from joch.api.kinds import AGENT_PROVIDER
from joch.api.namespaces import NAMESPACE, namespace_object
from joch.controllers.manager import Manager
from joch.controllers.namespaces import NamespaceController
from joch.controllers.options import ControllerOptions
from joch.store import Store, open_store
from joch.store.namespaces import terminate


def provider(name: str, *, finalizers: list[str] | None = None) -> dict[str, object]:
    metadata: dict[str, object] = {"name": name, "namespace": "team-x"}
    if finalizers:
        metadata["finalizers"] = finalizers
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": metadata,
            "spec": {"binary": "echo"}}


def test_every_store_starts_with_default_and_joch_system(store: Store) -> None:
    names = sorted(o["metadata"]["name"] for o in store.list(NAMESPACE).items)
    assert names == ["default", "joch-system"]
    assert all(o["status"]["phase"] == "Active" for o in store.list(NAMESPACE).items)


def test_terminate_never_deletes_default_or_joch_system(store: Store) -> None:
    for name in ("default", "joch-system"):
        with pytest.raises(errors.Forbidden, match="may not be deleted"):
            terminate(store, name, REGISTRY)
    assert sorted(o["metadata"]["name"] for o in store.list(NAMESPACE).items) == ["default", "joch-system"]


def test_terminate_deletes_the_contents_then_the_namespace(store: Store) -> None:
    store.create(NAMESPACE, namespace_object("team-x"))
    store.create(AGENT_PROVIDER, provider("a"))
    _, gone = terminate(store, "team-x", REGISTRY)
    assert gone
    with pytest.raises(errors.NotFound):
        store.get(NAMESPACE, None, "team-x")
    assert store.list(AGENT_PROVIDER).items == []


def test_the_controller_finishes_once_finalizers_are_gone(store: Store, tmp_path: Path) -> None:
    store.create(NAMESPACE, namespace_object("team-x"))
    store.create(AGENT_PROVIDER, provider("held", finalizers=["example.com/cleanup"]))
    namespace, gone = terminate(store, "team-x", REGISTRY)
    assert not gone and namespace["status"]["phase"] == "Terminating"
    options = ControllerOptions(data_dir=tmp_path, leader_election=False, resync_period=60.0)
    manager = Manager(store, [NamespaceController()], options)
    manager.start()
    try:
        assert manager.wait_started(10)
        held = store.get(AGENT_PROVIDER, "team-x", "held")
        store.update(AGENT_PROVIDER, {**held, "metadata": {**held["metadata"], "finalizers": []}})
        deadline = time.monotonic() + 8
        while any(o["metadata"]["name"] == "team-x" for o in store.list(NAMESPACE).items):
            assert time.monotonic() < deadline, "the namespace controller did not finish the deletion"
            time.sleep(0.1)
    finally:
        manager.stop()


def test_an_existing_store_gets_a_namespace_for_every_namespace_its_objects_use(store_url: str) -> None:
    older = open_store(store_url)
    try:  # as a Joch before Namespaces wrote it: objects in namespaces nobody created
        older.create(AGENT_PROVIDER, provider("legacy"))
        with pytest.raises(errors.NotFound):
            older.get(NAMESPACE, None, "team-x")
        revision = older.current_revision()
    finally:
        older.close()
    reopened = open_store(store_url)
    try:
        assert reopened.get(NAMESPACE, None, "team-x")["status"]["phase"] == "Active"
        assert reopened.current_revision() == revision + 1
    finally:
        reopened.close()
    again = open_store(store_url)
    try:
        assert again.current_revision() == revision + 1  # nothing missing: nothing written
    finally:
        again.close()
