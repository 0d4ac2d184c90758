"""Hostile or malformed input answered with a 4xx Status naming the field, never a 500: bodies of
the wrong shape on every route that takes one, NUL characters in paths and strings (which
PostgreSQL text cannot hold), lone surrogates in keys, DeleteOptions of the wrong types."""

from __future__ import annotations

from typing import Any

import pytest

from joch.api import REGISTRY
from joch.server.testing import LiveServer, is_status
from support import provider

MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


def causes(body: dict[str, Any]) -> list[str]:
    return [c["field"] for c in body.get("details", {}).get("causes", [])]


@pytest.mark.parametrize("body", [
    {"metadata": [None]}, {"metadata": "x"}, {"metadata": {"resourceVersion": 5}}, {"metadata": {"name": ["x"]}},
    {"apiVersion": 1}, {"kind": {}},
])
def test_a_body_of_the_wrong_shape_is_422_on_every_kind_and_route(server: LiveServer, body: dict[str, Any]) -> None:
    (field,) = [f"{key}.{next(iter(value))}" if isinstance(value, dict) and value else key
                for key, value in body.items()]
    for info in REGISTRY:
        item = server.path(info.plural, "x")
        routes = [("PUT", item, None), ("PATCH", item, MERGE_PATCH), ("POST", server.path(info.plural), None)]
        if info.status_model is not None:  # a RoleBinding has no status subresource
            routes += [("PUT", f"{item}/status", None), ("PATCH", f"{item}/status", MERGE_PATCH)]
        for method, path, headers in routes:
            r = server.http.request(method, path, json=body, headers=headers)
            assert r.status_code == 422 and is_status(r.json(), 422, "Invalid"), (method, path, r.text)
            assert causes(r.json()) == [field], (method, path, r.text)
            assert r.json()["message"].startswith(f"the request body is invalid: {field}: expected a ")


def test_a_yaml_body_of_the_wrong_shape_names_the_yaml_trap(server: LiveServer) -> None:
    r = server.http.put(server.path("ap", "p", sub="status"), content=b"metadata:\n  name: yes\n",
                        headers={"Content-Type": "application/yaml"})
    assert is_status(r.json(), 422, "Invalid") and causes(r.json()) == ["metadata.name"]
    assert "YAML 1.1 reads unquoted on/off/yes/no as booleans" in r.json()["message"]


def test_delete_options_of_the_wrong_types_are_400(server: LiveServer) -> None:
    server.create(provider("p"))
    for options in ({"dryRun": 5}, {"dryRun": "All"}, {"dryRun": [1]}, {"preconditions": {"uid": {}}},
                    {"preconditions": []}, {"metadata": []}):
        r = server.http.request("DELETE", server.path("ap", "p"), json=options)
        assert r.status_code in (400, 422) and r.json()["kind"] == "Status", (options, r.text)
    r = server.http.request("DELETE", server.path("ap", "p"), json={"dryRun": ["All"]})
    assert r.status_code == 200 and server.http.get(server.path("ap", "p")).status_code == 200
    stale = server.http.request("DELETE", server.path("ap", "p"), json={"preconditions": {"resourceVersion": "999"}})
    assert is_status(stale.json(), 409, "Conflict")


def test_nul_in_a_path_is_404_on_every_route(server: LiveServer) -> None:
    server.create(provider("p"))
    for path in ("/v1/namespaces/default/agents/a%00b", server.path("agents", "a%00b"),
                 server.path("agents", "a%00b", sub="status"), "/v1/namespaces/default/executions/a%00b/log",
                 server.path("agentruns", "r", sub="artifacts/a%00b"), "/apis/joch.dev%00/v1alpha1",
                 "/v1/namespaces/default/agents/a%00b/manifest", server.path("ap", namespace="a%00b")):
        r = server.http.get(path)
        assert is_status(r.json(), 404, "NotFound"), (path, r.text)
        assert "\\u0000" in r.json()["message"], r.text
    for method in ("PUT", "PATCH", "DELETE"):
        r = server.http.request(method, server.path("ap", "p%00"), json=provider("p"), headers=MERGE_PATCH)
        assert is_status(r.json(), 404, "NotFound"), (method, r.text)
    assert server.http.get(server.path("ap", "p")).status_code == 200


def test_nul_in_any_stored_string_is_422_naming_the_field(server: LiveServer) -> None:
    server.create(provider("p"))
    run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r"},
           "spec": {"agentRef": {"name": "a\u0000b"}, "implementation": {"inline": {"text": "x"}}}}
    r = server.http.post(server.path("agentruns"), json=run)
    assert is_status(r.json(), 422, "Invalid") and causes(r.json()) == ["spec.agentRef.name"], r.text
    assert r.json()["details"]["causes"][0]["message"] == (
        '"a\\u0000b" contains a NUL character (\\u0000), which cannot be stored; remove it')
    named = provider("a\u0000b")
    r = server.http.post("/v1/resources/apply", json=named)
    assert is_status(r.json(), 422, "Invalid") and causes(r.json()) == ["documents[0] (AgentProvider/a\u0000b in "
                                                                        "request body).metadata.name"], r.text
    noted = provider("q")
    noted["metadata"]["annotations"] = {"note": "x\u0000", "k\u0000": "v"}
    r = server.http.post(server.path("ap"), json=noted)
    assert is_status(r.json(), 422, "Invalid"), r.text
    assert set(causes(r.json())) == {"metadata.annotations.note", "metadata.annotations[k\\u0000]"}
    r = server.http.put(server.path("ap", "p", sub="status"), json={"status": {"conditions": [
        {"type": "Ready", "status": "True", "message": "\u0000"}]}})
    assert is_status(r.json(), 422, "Invalid") and causes(r.json()) == ["status.conditions[0].message"], r.text
    listed = server.http.get(server.path("ap"), params={"fieldSelector": "metadata.name=a\u0000b"})
    assert listed.status_code == 200 and listed.json()["items"] == []
    assert [o["metadata"]["name"] for o in server.http.get(server.path("ap")).json()["items"]] == ["p"]


def test_a_lone_surrogate_in_a_key_is_400_not_500(server: LiveServer) -> None:
    body = b'{"apiVersion":"joch.dev/v1alpha1","kind":"ImplementationSpec","metadata":{"name":"s"},' \
           b'"spec":{"\\udc00":1}}'
    for path in (server.path("impl"), "/v1/resources/apply"):
        r = server.http.post(path, content=body, headers={"Content-Type": "application/json"})
        assert is_status(r.json(), 400, "BadRequest"), r.text
        assert causes(r.json())[0].endswith("spec[\\udc00]")
