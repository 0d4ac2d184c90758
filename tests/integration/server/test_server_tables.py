"""Kubernetes Table output over HTTP: what ``kubectl get`` asks for and receives."""

from __future__ import annotations

from typing import Any

from joch.server.testing import LiveServer, is_status, ndjson
from support import provider

KUBECTL = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,"
                     "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"}


def agent(name: str) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
            "spec": {"providerRef": {"name": "echo"}}}


def _ready(server: LiveServer, name: str) -> None:
    current = server.http.get(server.path("agents", name)).json()
    current["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "Compiled",
                                         "lastTransitionTime": "2025-01-01T00:00:00Z"}]}
    server.http.put(server.path("agents", name, sub="status"), json=current).raise_for_status()


def test_a_list_is_a_table_of_the_kind_s_columns(server: LiveServer) -> None:
    server.create(agent("coder"))
    server.create(agent("bare"))
    _ready(server, "coder")
    r = server.http.get(server.path("agents"), headers=KUBECTL)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    table = r.json()
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert set(table) == {"kind", "apiVersion", "metadata", "columnDefinitions", "rows"}
    assert [(d["name"], d["type"], d["format"], d["priority"]) for d in table["columnDefinitions"]] == [
        ("NAME", "string", "name", 0), ("PROVIDER", "string", "", 0), ("READY", "string", "", 0),
        ("RUNTIME", "string", "", 1), ("AGE", "date", "", 0)]
    assert all(d["description"] for d in table["columnDefinitions"])
    cells = {r["cells"][0]: r["cells"] for r in table["rows"]}
    assert cells["coder"][:4] == ["coder", "echo", "True", "local"]
    assert cells["bare"][:4] == ["bare", "echo", "<none>", "local"]
    assert all(c[4].endswith("s") for c in cells.values())  # just created: an age in seconds, not a date
    row = table["rows"][0]
    assert row["object"]["kind"] == "PartialObjectMetadata" and row["object"]["apiVersion"] == "meta.k8s.io/v1"
    assert row["object"]["metadata"]["namespace"] == "default" and "spec" not in row["object"]
    listed = server.http.get(server.path("agents")).json()
    assert table["metadata"]["resourceVersion"] == listed["metadata"]["resourceVersion"]


def test_plain_json_stays_the_default(server: LiveServer) -> None:
    server.create(agent("coder"))
    for headers in ({}, {"Accept": "application/json"}, {"Accept": "*/*"},
                    {"Accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"}):
        body = server.http.get(server.path("agents"), headers=headers).json()
        assert body["kind"] == "AgentList", headers
        assert server.http.get(server.path("agents", "coder"), headers=headers).json()["kind"] == "Agent"


def test_v1beta1_tables_and_include_object(server: LiveServer) -> None:
    created = server.create(agent("coder"))
    beta = {"Accept": "application/json;as=Table;v=v1beta1;g=meta.k8s.io"}
    one = server.http.get(server.path("agents", "coder"), headers=beta).json()
    assert one["apiVersion"] == "meta.k8s.io/v1beta1" and [r["cells"][0] for r in one["rows"]] == ["coder"]
    assert one["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert one["rows"][0]["object"]["apiVersion"] == "meta.k8s.io/v1beta1"
    full = server.http.get(server.path("agents", "coder"), headers=KUBECTL, params={"includeObject": "Object"})
    assert full.json()["rows"][0]["object"] == created
    bare = server.http.get(server.path("agents"), headers=KUBECTL, params={"includeObject": "None"}).json()
    assert "object" not in bare["rows"][0]
    bad = server.http.get(server.path("agents"), headers=KUBECTL, params={"includeObject": "All"})
    assert bad.status_code == 400 and is_status(bad.json(), 400, "BadRequest")
    missing = server.http.get(server.path("agents", "nope"), headers=KUBECTL)
    assert missing.status_code == 404 and is_status(missing.json(), 404, "NotFound")


def test_all_namespaces_and_paged_tables_keep_the_list_metadata(server: LiveServer) -> None:
    for i in range(3):
        server.create(provider(f"p{i}"), namespace=f"team-{i}")
    everywhere = server.http.get(server.path("ap", namespace=None), headers=KUBECTL).json()
    assert [(r["object"]["metadata"]["namespace"], r["cells"][:2]) for r in everywhere["rows"]] == [
        ("team-0", ["p0", "echo"]), ("team-1", ["p1", "echo"]), ("team-2", ["p2", "echo"])]
    page = server.http.get(server.path("ap", namespace=None), headers=KUBECTL, params={"limit": 2}).json()
    assert len(page["rows"]) == 2 and page["metadata"]["continue"]
    rest = server.http.get(server.path("ap", namespace=None), headers=KUBECTL,
                           params={"limit": 2, "continue": page["metadata"]["continue"]}).json()
    assert [r["cells"][0] for r in rest["rows"]] == ["p2"] and "continue" not in rest["metadata"]
    empty = server.http.get(server.path("ap", namespace="nobody"), headers=KUBECTL).json()
    assert empty["rows"] == [] and empty["columnDefinitions"][0]["name"] == "NAME"


def test_a_watch_as_table_sends_one_row_per_event_and_the_columns_once(server: LiveServer) -> None:
    server.create(provider("seed"), namespace="elsewhere")  # so the start revision is not 0 ("now")
    start = server.http.get(server.path("ap")).json()["metadata"]["resourceVersion"]
    server.create(provider("a"))
    server.create(provider("b", binary="/bin/b"))
    server.http.delete(server.path("ap", "a")).raise_for_status()
    params = {"watch": "1", "resourceVersion": start, "timeoutSeconds": "1"}
    with server.http.stream("GET", server.path("ap"), params=params, headers=KUBECTL) as r:
        events = list(ndjson(r))
    assert [(e["type"], e["object"]["kind"], [row["cells"][:2] for row in e["object"]["rows"]]) for e in events] == [
        ("ADDED", "Table", [["a", "echo"]]), ("ADDED", "Table", [["b", "/bin/b"]]),
        ("DELETED", "Table", [["a", "echo"]])]
    assert [d["name"] for d in events[0]["object"]["columnDefinitions"]] == ["NAME", "BINARY", "AGE"]
    assert [e["object"]["columnDefinitions"] for e in events[1:]] == [[], []]
    assert events[0]["object"]["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


def test_a_table_watch_keeps_errors_as_status(server: LiveServer) -> None:
    server.create(provider("a"))
    start = int(server.http.get(server.path("ap")).json()["metadata"]["resourceVersion"])
    server.create(provider("b"))
    server.create(provider("c"))
    server.store.compact(start + 2)
    params = {"watch": "1", "resourceVersion": str(start), "timeoutSeconds": "5"}
    with server.http.stream("GET", server.path("ap"), params=params, headers=KUBECTL) as r:
        events = list(ndjson(r))
    assert len(events) == 1 and events[0]["type"] == "ERROR" and is_status(events[0]["object"], 410, "Expired")
