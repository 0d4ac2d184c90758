"""Lists (paging, selectors, all namespaces) and Kubernetes watch streams."""

from __future__ import annotations

import time
from typing import Any

import httpx

from joch.server import ServerOptions
from joch.server.testing import LiveServer, is_status, ndjson
from support import provider


def test_list_shape_and_paging(server: LiveServer) -> None:
    for i in range(5):
        server.create(provider(f"p{i}"))
    r = server.http.get(server.path("ap"), params={"limit": 2})
    body = r.json()
    assert body["kind"] == "AgentProviderList" and body["apiVersion"] == "joch.dev/v1alpha1"
    assert len(body["items"]) == 2 and body["metadata"]["continue"]
    assert "remainingItemCount" not in body["metadata"]  # optional; not counted (see store.sql.list)
    assert int(body["metadata"]["resourceVersion"]) >= 5
    names = [i["metadata"]["name"] for i in body["items"]]
    token = body["metadata"]["continue"]
    while token:
        page = server.http.get(server.path("ap"), params={"limit": 2, "continue": token}).json()
        names += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
    assert names == [f"p{i}" for i in range(5)]
    everything = server.http.get(server.path("ap")).json()
    assert "continue" not in everything["metadata"] and len(everything["items"]) == 5


def test_label_and_field_selectors(server: LiveServer) -> None:
    server.create(provider("a", labels={"team": "x", "tier": "web"}))
    server.create(provider("b", labels={"team": "y"}))
    server.create(provider("c"))

    def names(**params: str) -> list[str]:
        r = server.http.get(server.path("ap"), params=params)
        assert r.status_code == 200, r.text
        return sorted(i["metadata"]["name"] for i in r.json()["items"])

    assert names(labelSelector="team=x") == ["a"]
    assert names(labelSelector="team") == ["a", "b"]
    assert names(labelSelector="!team") == ["c"]
    assert names(labelSelector="team in (x,y),tier!=web") == ["b"]
    assert names(fieldSelector="metadata.name=b") == ["b"]
    r = server.http.get(server.path("ap"), params={"labelSelector": "team in x"})
    assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest")


def test_cluster_wide_list_spans_namespaces(server: LiveServer) -> None:
    server.create(provider("a"), namespace="team-a")
    server.create(provider("b"), namespace="team-b")
    body = server.http.get(server.path("ap", namespace=None)).json()
    assert sorted((i["metadata"]["namespace"], i["metadata"]["name"]) for i in body["items"]) == [
        ("team-a", "a"), ("team-b", "b")]
    only_a = server.http.get(server.path("ap", namespace="team-a")).json()
    assert [i["metadata"]["name"] for i in only_a["items"]] == ["a"]


def _history(server: LiveServer) -> int:
    """Create a, update a, create b, delete a; returns the revision before the first of those
    (never 0, which would mean "current state" rather than "after revision 0")."""
    server.create(provider("seed"), namespace="elsewhere")
    start = int(server.http.get(server.path("ap")).json()["metadata"]["resourceVersion"])
    a = server.create(provider("a"))
    server.http.put(server.path("ap", "a"), json={**a, "spec": {"binary": "v2"}}).raise_for_status()
    server.create(provider("b"))
    server.http.delete(server.path("ap", "a")).raise_for_status()
    return start


def _watch(server: LiveServer, path: str | None = None, **params: Any) -> list[dict[str, Any]]:
    with server.http.stream("GET", path or server.path("ap"), params={"watch": "1", **params}) as r:
        assert r.status_code == 200
        return list(ndjson(r))


def test_watch_from_an_old_revision_replays_in_order_and_ends_at_timeout(server: LiveServer) -> None:
    start = _history(server)
    began = time.monotonic()
    events = _watch(server, resourceVersion=str(start), timeoutSeconds=1)
    elapsed = time.monotonic() - began
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"), ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    revisions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert revisions == sorted(revisions) and len(set(revisions)) == 4
    assert 0.9 <= elapsed < 5


def test_watch_without_a_revision_lists_then_follows(server: LiveServer) -> None:
    server.create(provider("old"))
    with server.http.stream("GET", server.path("ap"), params={"watch": "true", "timeoutSeconds": "3"}) as r:
        lines = ndjson(r)
        first = next(lines)
        assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "old")
        server.create(provider("new"))
        second = next(lines)
        assert (second["type"], second["object"]["metadata"]["name"]) == ("ADDED", "new")


def test_watch_honours_selectors_and_namespace(server: LiveServer) -> None:
    start = int(server.http.get(server.path("ap")).json()["metadata"]["resourceVersion"])
    server.create(provider("x", labels={"app": "x"}))
    server.create(provider("y"))
    server.create(provider("z", labels={"app": "x"}), namespace="other")
    events = _watch(server, resourceVersion=str(start), labelSelector="app=x", timeoutSeconds=1)
    assert [e["object"]["metadata"]["name"] for e in events] == ["x"]
    everywhere = _watch(server, server.path("ap", namespace=None), resourceVersion=str(start), timeoutSeconds=1)
    assert [e["object"]["metadata"]["name"] for e in everywhere] == ["x", "y", "z"]


def test_watch_from_a_compacted_revision_is_an_expired_error_event(server: LiveServer) -> None:
    start = _history(server)
    server.store.compact(start + 3)
    events = _watch(server, resourceVersion=str(start), timeoutSeconds=5)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert is_status(events[0]["object"], 410, "Expired")


def test_watch_from_a_compacted_revision_can_be_a_plain_410(
    server_with: Any, server: LiveServer
) -> None:
    plain: LiveServer = server_with(ServerOptions(watch_expired="status"))
    start = _history(server)
    server.store.compact(start + 3)
    r = plain.http.get(plain.path("ap"), params={"watch": "1", "resourceVersion": str(start)})
    assert r.status_code == 410 and is_status(r.json(), 410, "Expired")


def test_watch_bookmarks(server: LiveServer) -> None:
    server.create(provider("a"))
    rv = server.http.get(server.path("ap")).json()["metadata"]["resourceVersion"]
    events = _watch(server, resourceVersion=rv, allowWatchBookmarks="true", timeoutSeconds=2)
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks, events
    obj = bookmarks[0]["object"]
    assert obj["kind"] == "AgentProvider" and obj["apiVersion"] == "joch.dev/v1alpha1"
    assert int(obj["metadata"]["resourceVersion"]) >= int(rv)
    assert not [e for e in _watch(server, resourceVersion=rv, timeoutSeconds=1) if e["type"] == "BOOKMARK"]


def test_invalid_watch_revision_is_400(server: LiveServer) -> None:
    r = server.http.get(server.path("ap"), params={"watch": "1", "resourceVersion": "yesterday"})
    assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest")


def test_client_disconnect_closes_the_store_watch(server: LiveServer) -> None:
    closed: list[bool] = []
    original = server.store.watch

    def recording_watch(*args: Any, **kwargs: Any) -> Any:
        watch = original(*args, **kwargs)
        close = watch.close

        def record() -> None:
            closed.append(True)
            close()

        watch.close = record  # type: ignore[method-assign]
        return watch

    server.store.watch = recording_watch  # type: ignore[method-assign]
    with httpx.Client(base_url=server.url, timeout=10) as http, http.stream(
        "GET", server.path("ap"), params={"watch": "1"}
    ) as r:
        assert r.status_code == 200
    deadline = time.monotonic() + 5
    while not closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert closed
