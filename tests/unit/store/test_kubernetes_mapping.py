"""The Kubernetes store's pure parts: which resource holds a kind, Status → error, NUL selectors."""

from __future__ import annotations

from pathlib import Path

import pytest

from joch.api import errors
from joch.api.kinds import AGENT, ENVIRONMENT, LEASE
from joch.store.kubernetes.api import status_error
from joch.store.kubernetes.resources import mapping
from joch.store.kubernetes.store import _selector_without_nul


def test_a_joch_kind_is_its_crd_and_the_lease_a_coordination_lease() -> None:
    agent = mapping(AGENT)
    assert (agent.api_version, agent.crd) == ("joch.dev/v1alpha1", "the CRD agents.joch.dev")
    assert agent.status is not None and not agent.translated
    assert mapping(ENVIRONMENT).resource._api_info.resource.group == "ops.joch.dev"  # type: ignore[attr-defined]
    lease = mapping(LEASE)
    assert lease.api_version == "coordination.k8s.io/v1" and lease.status is None
    wire = lease.outgoing({"apiVersion": LEASE.api_version, "kind": "Lease", "metadata": {"name": "l"},
                           "spec": {"holderIdentity": "me"}, "status": {}})
    assert wire["apiVersion"] == "coordination.k8s.io/v1" and "status" not in wire
    assert lease.incoming(dict(wire))["apiVersion"] == "ops.joch.dev/v1alpha1"


@pytest.mark.parametrize(("status", "code", "error", "text"), [
    ({"reason": "AlreadyExists", "message": 'agents.joch.dev "a" already exists'}, 409, errors.AlreadyExists,
     "already exists"),
    ({"reason": "Conflict", "message": "the object has been modified"}, 409, errors.Conflict, "modified"),
    ({"reason": "Expired", "message": "too old resource version: 1 (5)"}, 410, errors.Gone, "too old"),
    ({"reason": "Gone", "message": "too old resource version"}, 410, errors.Gone, "too old"),
    ({"reason": "NotFound", "message": 'agents.joch.dev "a" not found', "details": {"name": "a"}}, 404,
     errors.NotFound, "not found"),
    ({"reason": "NotFound", "message": "the server could not find the requested resource"}, 404, errors.NotFound,
     "install the CRDs"),
    ({"reason": "Timeout", "message": "Too large resource version: 99, current: 5"}, 504, errors.BadRequest,
     "Too large"),
    ({}, 422, errors.Invalid, "Invalid"),
])
def test_a_kubernetes_status_becomes_the_joch_error(status: dict[str, object], code: int,
                                                    error: type[errors.JochError], text: str) -> None:
    got = status_error(status, code, "the CRD agents.joch.dev")
    assert type(got) is error and text in got.message


def test_field_selectors_naming_nul_match_nothing_or_everything() -> None:
    assert _selector_without_nul("metadata.name=a") == ("metadata.name=a", True)
    assert _selector_without_nul("metadata.name=a\x00b") == (None, False)
    assert _selector_without_nul("metadata.name!=a\x00b") == (None, True)
    assert _selector_without_nul("metadata.namespace=x,metadata.name!=a\x00b") == ("metadata.namespace=x", True)


@pytest.mark.parametrize("name", ["a\x00b", "a/b", "../agents", "x?watch=1", "a#b", "%2e", ".", ".."])
def test_a_name_that_would_change_the_url_names_nothing(tmp_path: Path, name: str) -> None:
    """No request is made for it (the server here is unreachable): it is simply not found."""
    from joch.store.kubernetes import KubernetesStore
    from support.kubecluster import kubeconfig

    store = KubernetesStore(f"kubernetes://?kubeconfig={kubeconfig('http://127.0.0.1:9', tmp_path / 'k')}")
    try:
        with pytest.raises(errors.NotFound):
            store.get(AGENT, "default", name)
        with pytest.raises(errors.NotFound):
            store.delete(AGENT, name, "a")
    finally:
        store.close()


def test_a_watch_of_several_streams_hands_out_events_in_revision_order() -> None:
    import asyncio

    from joch.store.base import WatchEvent
    from joch.store.kubernetes.watching import KubeWatch

    def event(revision: int) -> WatchEvent:
        return WatchEvent("ADDED", {"metadata": {"resourceVersion": str(revision)}}, revision)

    w = KubeWatch(buffer_events=100, merge_window=0.05)
    for revision in (5, 3, 4):  # three streams, delivered out of order within the window
        w.push(event(revision))
    assert [e.revision for e in (w.get(timeout=1), w.get(timeout=1), w.get(timeout=1)) if e] == [3, 4, 5]
    w.push(event(9))
    w.push(event(8))

    async def two() -> list[int]:
        got = [await w.aget(timeout=1), await w.aget(timeout=1)]
        return [e.revision for e in got if e]

    assert asyncio.run(two()) == [8, 9]
    assert w.get(timeout=0.1) is None
    w.close()
