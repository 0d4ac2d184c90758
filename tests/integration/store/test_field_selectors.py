"""Field selectors beyond name and namespace (``status.phase``, ``spec.agentRef.name``: the fields
of a kind's columns), in lists and watches, on SQLite and Postgres. A watch on a field that changes
sees objects enter (ADDED) and leave (DELETED) the selection, as a Kubernetes watch does."""

from __future__ import annotations

from typing import Any

import pytest

from joch.api import errors
from joch.api.kinds import AGENT, AGENT_RUN
from joch.store import ListOptions, Store, WatchOptions
from joch.store.base import Watch


def run(name: str, agent: str = "coder") -> dict[str, Any]:
    return {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"agentRef": {"name": agent}, "implementation": {"text": "x"},
                     "repository": {"url": "https://example.com/r.git"}}}


def phase(store: Store, name: str, value: str) -> None:
    current = store.get(AGENT_RUN, "default", name)
    store.update_status(AGENT_RUN, {**current, "status": {**(current.get("status") or {}), "phase": value}})


def names(store: Store, selector: str) -> list[str]:
    listing = store.list(AGENT_RUN, ListOptions(namespace="default", field_selector=selector))
    return [o["metadata"]["name"] for o in listing.items]


def events(w: Watch, count: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(count):
        event = w.get(timeout=5)
        assert event is not None, f"expected {count} events, got {out}"
        out.append((event.type, event.object["metadata"]["name"]))
    assert w.get(timeout=0.3) is None
    return out


def test_lists_select_on_status_and_spec_fields(store: Store) -> None:
    for name, agent in (("a", "coder"), ("b", "coder"), ("c", "reviewer")):
        store.create(AGENT_RUN, run(name, agent))
    phase(store, "a", "Running")
    assert names(store, "status.phase=Running") == ["a"]
    assert names(store, "status.phase!=Running") == ["b", "c"]
    assert names(store, "spec.agentRef.name=coder,status.phase!=Running") == ["b"]
    assert names(store, "spec.agentRef.name==reviewer,metadata.name=c") == ["c"]
    assert names(store, "status.reason=") == ["a", "b", "c"]  # missing compares as empty
    limited = store.list(AGENT_RUN, ListOptions(namespace="default", field_selector="spec.agentRef.name=coder",
                                                limit=1))
    assert [o["metadata"]["name"] for o in limited.items] == ["a"] and limited.continue_token


def test_an_unsupported_field_names_the_supported_ones(store: Store) -> None:
    with pytest.raises(errors.BadRequest, match=r"field label not supported for agentruns: spec\.implementation"):
        names(store, "spec.implementation=x")
    with pytest.raises(errors.BadRequest, match=r"supported: metadata\.name, metadata\.namespace, spec\.providerRef"):
        store.list(AGENT, ListOptions(field_selector="status.phase=x"))


def test_a_fresh_watch_sees_objects_enter_and_leave_the_selection(store: Store) -> None:
    store.create(AGENT_RUN, run("a"))
    store.create(AGENT_RUN, run("b"))
    phase(store, "a", "Running")
    with store.watch(AGENT_RUN, WatchOptions(namespace="default", field_selector="status.phase=Running")) as w:
        assert events(w, 1) == [("ADDED", "a")]
        phase(store, "b", "Running")  # enters
        phase(store, "a", "Succeeded")  # leaves
        phase(store, "a", "Failed")  # stays out: nothing
        store.delete(AGENT_RUN, "default", "a")  # was out: nothing
        store.delete(AGENT_RUN, "default", "b")  # was in
        assert events(w, 3) == [("ADDED", "b"), ("DELETED", "a"), ("DELETED", "b")]


def test_a_watch_from_a_revision_reports_leaving_once(store: Store) -> None:
    store.create(AGENT_RUN, run("a"))
    phase(store, "a", "Running")
    rv = str(store.current_revision())
    with store.watch(AGENT_RUN, WatchOptions(namespace="default", field_selector="status.phase=Running",
                                             resource_version=rv)) as w:
        phase(store, "a", "Succeeded")  # the consumer listed it Running: it leaves
        phase(store, "a", "Failed")
        store.create(AGENT_RUN, run("c"))  # created outside the selection: nothing
        phase(store, "c", "Running")
        assert events(w, 2) == [("DELETED", "a"), ("ADDED", "c")]
