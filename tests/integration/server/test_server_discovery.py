"""Discovery, version, health and OpenAPI: what kubectl and client libraries read first."""

from __future__ import annotations

from typing import Any

from joch.api import REGISTRY
from joch.server.testing import LiveServer, is_status


def test_core_api_lists_v1_with_namespaces_and_events(server: LiveServer) -> None:
    body = server.http.get("/api").json()
    assert body["kind"] == "APIVersions" and body["versions"] == ["v1"]
    core = server.http.get("/api/v1").json()
    assert core["kind"] == "APIResourceList" and core["groupVersion"] == "v1"
    by_name = {r["name"]: r for r in core["resources"]}
    assert by_name["namespaces"]["namespaced"] is False and by_name["namespaces"]["shortNames"] == ["ns"]
    assert by_name["events"]["verbs"] == ["get", "list", "watch"]


def test_group_list_has_every_registered_group_with_a_preferred_version(server: LiveServer) -> None:
    body = server.http.get("/apis").json()
    assert body["kind"] == "APIGroupList"
    groups = {g["name"]: g for g in body["groups"]}
    # every kind's group, and the self-review groups kubectl auth whoami and can-i use
    # (the core group "" is /api, not /apis; events.k8s.io is the Events view)
    assert set(groups) == ({info.group for info in REGISTRY} - {""}) | {"authentication.k8s.io",
                                                                         "authorization.k8s.io", "events.k8s.io"}
    joch = groups["joch.dev"]
    assert joch["preferredVersion"] == {"groupVersion": "joch.dev/v1alpha1", "version": "v1alpha1"}
    assert joch["versions"] == [joch["preferredVersion"]]
    assert server.http.get("/apis/runtime.joch.dev").json()["name"] == "runtime.joch.dev"


def test_resource_list_describes_each_kind_and_its_status_subresource(server: LiveServer) -> None:
    body = server.http.get("/apis/joch.dev/v1alpha1").json()
    assert body["kind"] == "APIResourceList" and body["groupVersion"] == "joch.dev/v1alpha1"
    by_name: dict[str, Any] = {r["name"]: r for r in body["resources"]}
    agents = by_name["agents"]
    assert agents == {
        "name": "agents", "singularName": "agent", "namespaced": True, "kind": "Agent",
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        "shortNames": ["ag"], "categories": ["all"],
    }
    assert by_name["agents/status"]["verbs"] == ["get", "patch", "update"]
    assert by_name["agents/status"]["kind"] == "Agent"
    expected = {i.plural for i in REGISTRY if i.group == "joch.dev"}
    assert {n for n in by_name if "/" not in n} == expected


def test_unknown_group_and_version_are_404_status(server: LiveServer) -> None:
    for path in ("/apis/nope.dev", "/apis/joch.dev/v9"):
        r = server.http.get(path)
        assert r.status_code == 404 and is_status(r.json(), 404, "NotFound"), path


def test_openapi_v2_describes_every_kind_and_is_empty_protobuf_for_kubectl(server: LiveServer) -> None:
    # kubectl reads v2 (protobuf only) to validate on the client when v3 does not settle it: an
    # empty Document makes it leave validation to the server.
    protobuf = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
    pb = server.http.get("/openapi/v2", headers={"Accept": protobuf})
    assert pb.status_code == 200 and pb.content == b""
    doc = server.http.get("/openapi/v2").json()
    assert doc["swagger"] == "2.0" and doc["paths"] == {}
    agent = doc["definitions"]["dev.joch.v1alpha1.Agent"]
    assert agent["x-kubernetes-group-version-kind"] == [{"group": "joch.dev", "version": "v1alpha1", "kind": "Agent"}]
    assert agent["properties"]["spec"]["properties"]["providerRef"]["required"] == ["name"]
    assert "nullable" not in str(doc)  # no Swagger 2.0 spelling
    assert len([d for d in doc["definitions"] if not d.endswith("List")]) == len(list(REGISTRY))


def test_version(server: LiveServer) -> None:
    body = server.http.get("/version").json()
    assert body["major"] == "1" and body["minor"] == "37" and body["gitVersion"].startswith("v1.37.0+joch.0.1")
    assert body["jochVersion"].startswith("v0.1")


def test_healthz_and_readyz(server: LiveServer) -> None:
    assert server.http.get("/healthz").json() == {"ok": True}
    ready = server.http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ok"] is True


def test_openapi_documents_every_kind_with_its_schema(server: LiveServer) -> None:
    doc = server.http.get("/openapi.json").json()
    paths = doc["paths"]
    ns_agents = "/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents"
    assert set(paths[ns_agents]) == {"get", "post", "delete"}
    assert set(paths[ns_agents + "/{name}"]) == {"get", "put", "patch", "delete"}
    assert set(paths[ns_agents + "/{name}/status"]) == {"get", "put", "patch"}
    assert "get" in paths["/apis/joch.dev/v1alpha1/agents"]
    for info in REGISTRY:
        base = f"/apis/{info.group}/{info.version}" if info.group else f"/api/{info.version}"
        namespaced = f"{base}/namespaces/{{namespace}}/{info.plural}"
        cluster = f"{base}/{info.plural}"
        assert cluster in paths  # a cluster-scoped kind's collection, or a namespaced kind's across namespaces
        assert (namespaced in paths) is info.namespaced, info.kind
    for path in ("/v1/resources/apply", "/v1/namespaces/{namespace}/agents", "/v1/resources/watch"):
        assert path in paths
    params = {p["name"] for p in paths[ns_agents]["get"]["parameters"]}
    assert {"namespace", "labelSelector", "limit", "continue", "watch", "resourceVersion"} <= params
    schemas = doc["components"]["schemas"]
    assert "providerRef" in _resolve(doc, schemas["Agent"]["properties"]["spec"])["properties"]
    _assert_refs_resolve(doc, doc)


def _resolve(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return _resolve(doc, doc["components"]["schemas"][name])
    if "anyOf" in node:
        return _resolve(doc, next(n for n in node["anyOf"] if n.get("type") != "null"))
    return node


def _assert_refs_resolve(doc: dict[str, Any], node: Any) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            assert ref.startswith("#/components/schemas/"), ref
            assert ref.rsplit("/", 1)[-1] in doc["components"]["schemas"], ref
        for value in node.values():
            _assert_refs_resolve(doc, value)
    elif isinstance(node, list):
        for value in node:
            _assert_refs_resolve(doc, value)


def test_openapi_describes_what_each_route_sends(server: LiveServer) -> None:
    """Watches are not lists, streams are not JSON, discovery has 404s, and FastAPI's own 422
    validation body (which the server never sends: it answers 400 Status) is gone."""
    doc = server.http.get("/openapi.json").json()
    paths, schemas = doc["paths"], doc["components"]["schemas"]
    listed = paths["/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents"]["get"]["responses"]["200"]
    assert listed["content"]["application/json"]["schema"]["anyOf"] == [
        {"$ref": "#/components/schemas/AgentList"}, {"$ref": "#/components/schemas/WatchEvent"},
        {"$ref": "#/components/schemas/Table"}]
    assert schemas["WatchEvent"]["properties"]["type"]["enum"] == ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]
    v1_list = paths["/v1/namespaces/{namespace}/executions"]["get"]["responses"]["200"]["content"]["application/json"]
    assert {"$ref": "#/components/schemas/WatchEvent"} in v1_list["schema"]["anyOf"]
    sse = paths["/v1/resources/watch"]["get"]["responses"]["200"]["content"]
    assert list(sse) == ["text/event-stream"] and "Last-Event-ID" in sse["text/event-stream"]["schema"]["description"]
    log = paths["/v1/namespaces/{namespace}/executions/{name}/log"]["get"]["responses"]
    assert list(log["200"]["content"]) == ["text/plain; charset=utf-8"] and "503" in log
    status = {"$ref": "#/components/schemas/Status"}
    for path in ("/apis/{group}", "/apis/{group}/{version}"):
        responses = paths[path]["get"]["responses"]
        assert responses["404"]["content"]["application/json"]["schema"] == status, path
        assert "422" not in responses and responses["400"]["content"]["application/json"]["schema"] == status
    assert "HTTPValidationError" not in schemas and "HTTPValidationError" not in str(paths)
    create = paths["/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents"]["post"]["responses"]
    assert "413" in create and "413" not in listed
    r = server.http.get("/apis/nothing.example")
    assert is_status(r.json(), 404, "NotFound")


def test_the_documented_server_sent_event_schema_fits_the_events_sent(server: LiveServer) -> None:
    # Before OpenAPI 3.2 a text/event-stream schema describes one event (schemathesis checks it so,
    # but only when its generated request happens to get an event: a new store's Namespaces give one).
    import jsonschema

    from joch.server.testing import sse_events

    doc = server.http.get("/openapi.json").json()
    schema = doc["paths"]["/v1/resources/watch"]["get"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    with server.http.stream("GET", "/v1/resources/watch") as stream:
        event = next(e for e in sse_events(stream) if "comment" not in e)
    assert event["event"] == "ADDED", event
    jsonschema.validate(event, schema)
