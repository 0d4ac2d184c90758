"""CRUD on the Kubernetes routes: codes, Status bodies, preconditions, merge patch, status."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

from joch.server.testing import LiveServer, is_status
from support import provider

MERGE = {"Content-Type": "application/merge-patch+json"}




def agent(name: str, provider_name: str = "codex") -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
            "spec": {"providerRef": {"name": provider_name}}}


def ready(obj: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    return found


def test_create_get_replace_delete(server: LiveServer) -> None:
    r = server.http.post(server.path("ap"), json=provider("codex"))
    assert r.status_code == 201
    created = r.json()
    assert created["metadata"]["namespace"] == "default" and created["metadata"]["uid"]
    rv = created["metadata"]["resourceVersion"]

    got = server.http.get(server.path("ap", "codex"))
    assert got.status_code == 200 and got.json() == created

    created["spec"]["binary"] = "codex"
    r = server.http.put(server.path("ap", "codex"), json=created)
    assert r.status_code == 200
    assert r.json()["spec"]["binary"] == "codex"
    assert int(r.json()["metadata"]["resourceVersion"]) > int(rv)

    r = server.http.delete(server.path("ap", "codex"))
    assert r.status_code == 200 and r.json()["metadata"]["name"] == "codex"
    r = server.http.get(server.path("ap", "codex"))
    assert r.status_code == 404 and is_status(r.json(), 404, "NotFound")


def test_create_twice_is_409_already_exists(server: LiveServer) -> None:
    server.create(provider("codex"))
    r = server.http.post(server.path("ap"), json=provider("codex"))
    assert r.status_code == 409 and is_status(r.json(), 409, "AlreadyExists")


def test_missing_objects_are_404_for_every_verb(server: LiveServer) -> None:
    path = server.path("ap", "ghost")
    responses = [
        server.http.get(path), server.http.put(path, json=provider("ghost")),
        server.http.patch(path, content='{"spec":{}}', headers=MERGE), server.http.delete(path),
        server.http.get(path + "/status"),
    ]
    for r in responses:
        assert r.status_code == 404 and is_status(r.json(), 404, "NotFound"), r.request.method


def test_body_that_disagrees_with_the_url_is_400(server: LiveServer) -> None:
    r = server.http.post(server.path("ap", namespace="team-a"), json=provider("x", namespace="team-b"))
    assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest")
    assert "team-b" in r.json()["message"] and "team-a" in r.json()["message"]
    server.create(provider("x"))
    r = server.http.put(server.path("ap", "x"), json=provider("y"))
    assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest")
    wrong_kind = {**provider("z"), "kind": "Agent"}
    r = server.http.post(server.path("ap"), json=wrong_kind)
    assert r.status_code == 400 and "kind" in r.json()["message"]


def test_namespace_defaults_from_the_url(server: LiveServer) -> None:
    created = server.create(provider("x"), namespace="team-a")
    assert created["metadata"]["namespace"] == "team-a"
    assert server.http.get(server.path("ap", "x", namespace="team-a")).status_code == 200
    assert server.http.get(server.path("ap", "x", namespace="default")).status_code == 404


def test_bodies_must_be_json_objects(server: LiveServer) -> None:
    for content in (b"{not json", b"[1, 2]", b""):
        r = server.http.post(server.path("ap"), content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest"), content
    r = server.http.post(server.path("ap"), content=b"<x/>", headers={"Content-Type": "application/xml"})
    assert r.status_code == 415 and is_status(r.json(), 415, "UnsupportedMediaType")


def test_yaml_bodies_are_accepted_on_post_and_put(server: LiveServer) -> None:
    text = "apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata:\n  name: y\nspec:\n  binary: aider\n"
    r = server.http.post(server.path("ap"), content=text, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    r = server.http.put(server.path("ap", "y"), content=text.replace("aider", "codex"),
                        headers={"Content-Type": "application/yaml"})
    assert r.status_code == 200 and r.json()["spec"]["binary"] == "codex"


def test_invalid_objects_are_422_with_field_causes(server: LiveServer) -> None:
    bad = provider("x")
    bad["spec"] = {"binary": "", "nope": 1}
    r = server.http.post(server.path("ap"), json=bad)
    assert r.status_code == 422 and is_status(r.json(), 422, "Invalid")
    fields = {c["field"] for c in r.json()["details"]["causes"]}
    assert {"spec.binary", "spec.nope"} <= fields


def test_admission_warnings_become_warning_headers(server: LiveServer) -> None:
    r = server.http.post(server.path("agents"), json=agent("a", provider_name="missing-provider"))
    assert r.status_code == 201
    warnings = r.headers.get_list("warning")
    assert warnings and all(w.startswith('299 - "') for w in warnings)
    assert any("missing-provider" in w for w in warnings)


def test_dry_run_writes_nothing(server: LiveServer) -> None:
    r = server.http.post(server.path("ap"), json=provider("dry"), params={"dryRun": "All"})
    assert r.status_code == 201 and r.json()["metadata"]["name"] == "dry"
    assert server.http.get(server.path("ap", "dry")).status_code == 404
    r = server.http.post(server.path("ap"), json=provider("dry"), params={"dryRun": "Some"})
    assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest")


def test_two_puts_from_the_same_resource_version_one_wins(server: LiveServer) -> None:
    created = server.create(provider("race"))
    barrier = threading.Barrier(2)
    codes: list[int] = []
    bodies: list[dict[str, Any]] = []

    def put(binary: str) -> None:
        body = {**created, "spec": {"binary": binary}}
        with httpx.Client(base_url=server.url, timeout=10) as http:
            barrier.wait()
            r = http.put(server.path("ap", "race"), json=body)
        codes.append(r.status_code)
        bodies.append(r.json())

    threads = [threading.Thread(target=put, args=(b,)) for b in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200, 409]
    conflict = bodies[codes.index(409)]
    assert is_status(conflict, 409, "Conflict")
    winner = bodies[codes.index(200)]["spec"]["binary"]
    assert server.http.get(server.path("ap", "race")).json()["spec"]["binary"] == winner


def test_stale_resource_version_is_409_conflict(server: LiveServer) -> None:
    created = server.create(provider("x"))
    server.http.put(server.path("ap", "x"), json={**created, "spec": {"binary": "v2"}}).raise_for_status()
    r = server.http.put(server.path("ap", "x"), json={**created, "spec": {"binary": "v3"}})
    assert r.status_code == 409 and is_status(r.json(), 409, "Conflict")


def test_put_with_another_objects_uid_is_409(server: LiveServer) -> None:
    created = server.create(provider("x"))
    body = {**created, "metadata": {**created["metadata"], "uid": "0000-not-this-one"}, "spec": {"binary": "v2"}}
    r = server.http.put(server.path("ap", "x"), json=body)
    assert r.status_code == 409 and is_status(r.json(), 409, "Conflict")
    assert "0000-not-this-one" in r.json()["message"]
    assert server.http.get(server.path("ap", "x")).json()["spec"]["binary"] == "echo"
    del body["metadata"]["uid"], body["metadata"]["resourceVersion"]
    r = server.http.put(server.path("ap", "x"), json=body)
    assert r.status_code == 200 and r.json()["metadata"]["uid"] == created["metadata"]["uid"]


def test_a_resource_version_that_is_not_a_revision_is_422_not_409(server: LiveServer) -> None:
    created = server.create(provider("x"))
    body = {**created, "metadata": {**created["metadata"], "resourceVersion": "latest"}}
    r = server.http.put(server.path("ap", "x"), json=body)
    assert r.status_code == 422 and is_status(r.json(), 422, "Invalid")
    assert [c["field"] for c in r.json()["details"]["causes"]] == ["metadata.resourceVersion"]
    r = server.http.put(server.path("ap", "x", sub="status"), json=body)
    assert r.status_code == 422 and is_status(r.json(), 422, "Invalid")


def test_namespaces_in_the_path_must_be_dns_labels(server: LiveServer) -> None:
    for request in (server.http.get(server.path("ap", namespace="Bad_NS")),
                    server.http.get(server.path("ap", "x", namespace="Bad_NS")),
                    server.http.post(server.path("ap", namespace="Bad_NS"), json=provider("x")),
                    server.http.get("/v1/namespaces/Bad_NS/agents/x")):
        assert request.status_code == 400 and is_status(request.json(), 400, "BadRequest"), request.url
        assert request.json()["message"] == (
            'the namespace in the URL: "Bad_NS" is not a valid namespace: it must be a lowercase RFC 1123 label: '
            "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 "
            'characters (e.g. "bad-ns")')
        assert request.json()["details"]["causes"][0]["field"] == "namespace"


def test_an_empty_namespace_or_name_in_the_body_is_filled_from_the_url(server: LiveServer) -> None:
    r = server.http.post(server.path("ap", namespace="team-a"), json=provider("x", namespace=""))
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["metadata"]["namespace"] == "team-a"
    body = {**created, "metadata": {**created["metadata"], "namespace": "", "name": ""}, "spec": {"binary": "v2"}}
    r = server.http.put(server.path("ap", "x", namespace="team-a"), json=body)
    assert r.status_code == 200, r.text
    assert (r.json()["metadata"]["namespace"], r.json()["spec"]["binary"]) == ("team-a", "v2")


def test_bodies_other_than_json_or_yaml_are_415(server: LiveServer) -> None:
    created = server.create(provider("x"))
    for media in ("text/plain", "image/png", "application/x-www-form-urlencoded"):
        headers = {"Content-Type": media}
        for r in (server.http.post(server.path("ap"), content=json.dumps(provider("y")), headers=headers),
                  server.http.put(server.path("ap", "x"), content=json.dumps(created), headers=headers),
                  server.http.post("/v1/resources/apply", content=json.dumps(provider("y")), headers=headers)):
            assert r.status_code == 415 and is_status(r.json(), 415, "UnsupportedMediaType"), (media, r.url)
            assert "send application/" in r.json()["message"] and media in r.json()["message"]
    assert server.http.get(server.path("ap", "y")).status_code == 404
    r = server.http.post(server.path("ap"), content=json.dumps(provider("y")))  # no Content-Type: not a guess
    assert is_status(r.json(), 415, "UnsupportedMediaType") and "Content-Type" in r.json()["message"]
    assert server.http.get(server.path("ap", "y")).status_code == 404


def test_merge_patch_sets_and_removes_fields(server: LiveServer) -> None:
    obj = provider("p", labels={"team": "a", "tier": "x"})
    obj["spec"]["argsTemplate"] = ["--yes"]
    server.create(obj)
    patch = '{"metadata":{"labels":{"tier":null,"env":"dev"}},"spec":{"binary":"codex"}}'
    r = server.http.patch(server.path("ap", "p"), content=patch, headers=MERGE)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["metadata"]["labels"] == {"team": "a", "env": "dev"}
    assert body["spec"]["binary"] == "codex" and body["spec"]["argsTemplate"] == ["--yes"]


def test_other_patch_types_are_415_naming_merge_patch(server: LiveServer) -> None:
    server.create(provider("p"))
    # application/apply-patch+yaml is server-side apply (test_kubectl_ssa.py), json-patch+json is RFC 6902
    for media in ("application/strategic-merge-patch+json", "application/json"):
        r = server.http.patch(server.path("ap", "p"), content="{}", headers={"Content-Type": media})
        assert r.status_code == 415 and is_status(r.json(), 415, "UnsupportedMediaType"), media
        assert "application/merge-patch+json" in r.json()["message"]


def test_status_subresource_writes_only_status(server: LiveServer) -> None:
    created = server.create(provider("s"))
    status = {"conditions": [{"type": "Ready", "status": "True", "reason": "Checked"}]}
    sneaky = {**created, "spec": {"binary": "changed-through-status"}, "status": status}
    r = server.http.put(server.path("ap", "s", sub="status"), json=sneaky)
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["binary"] == "echo"
    assert ready(r.json())["reason"] == "Checked"

    current = server.http.get(server.path("ap", "s")).json()
    spec_put = {**current, "spec": {"binary": "codex"}, "status": {"conditions": []}}
    r = server.http.put(server.path("ap", "s"), json=spec_put)
    assert r.status_code == 200
    assert r.json()["spec"]["binary"] == "codex"
    assert ready(r.json())["reason"] == "Checked"

    got = server.http.get(server.path("ap", "s", sub="status")).json()
    assert ready(got)["reason"] == "Checked" and got["spec"]["binary"] == "codex"


def test_status_merge_patch_and_its_conflict_precondition(server: LiveServer) -> None:
    created = server.create(provider("s"))
    patch = '{"spec":{"binary":"ignored"},"status":{"conditions":[{"type":"Ready","status":"False"}]}}'
    r = server.http.patch(server.path("ap", "s", sub="status"), content=patch, headers=MERGE)
    assert r.status_code == 200, r.text
    assert ready(r.json())["status"] == "False"
    assert r.json()["spec"]["binary"] == "echo"
    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "status": {}}
    r = server.http.patch(server.path("ap", "s", sub="status"), content=json.dumps(stale), headers=MERGE)
    assert r.status_code == 409 and is_status(r.json(), 409, "Conflict")


def test_invalid_status_is_422(server: LiveServer) -> None:
    created = server.create(provider("s"))
    r = server.http.put(server.path("ap", "s", sub="status"),
                        json={**created, "status": {"conditions": [{"type": "Ready", "status": "Maybe"}]}})
    assert r.status_code == 422 and is_status(r.json(), 422, "Invalid")


def test_delete_with_finalizers_returns_object_with_deletion_timestamp(server: LiveServer) -> None:
    obj = provider("f")
    obj["metadata"]["finalizers"] = ["joch.dev/cleanup"]
    server.create(obj)
    r = server.http.delete(server.path("ap", "f"))
    assert r.status_code == 200 and r.json()["metadata"]["deletionTimestamp"]
    held = server.http.get(server.path("ap", "f")).json()
    assert held["metadata"]["deletionTimestamp"]
    r = server.http.patch(server.path("ap", "f"), content='{"metadata":{"finalizers":null}}', headers=MERGE)
    assert r.status_code == 200, r.text
    assert server.http.get(server.path("ap", "f")).status_code == 404


def test_delete_preconditions_and_dry_run(server: LiveServer) -> None:
    server.create(provider("d"))
    r = server.http.request("DELETE", server.path("ap", "d"), params={"dryRun": "All"})
    assert r.status_code == 200 and server.http.get(server.path("ap", "d")).status_code == 200
    r = server.http.request("DELETE", server.path("ap", "d"),
                            json={"kind": "DeleteOptions", "preconditions": {"uid": "not-the-uid"}})
    assert r.status_code == 409 and is_status(r.json(), 409, "Conflict")
    assert server.http.get(server.path("ap", "d")).status_code == 200


def test_agent_runs_reject_unknown_agents(server: LiveServer) -> None:
    run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r1"},
           "spec": {"agentRef": {"name": "nobody"}, "implementation": {"inline": {"text": "fix it"}}}}
    r = server.http.post(server.path("agentruns"), json=run)
    assert r.status_code == 422 and is_status(r.json(), 422, "Invalid")
    assert any(c["field"] == "spec.agentRef.name" for c in r.json()["details"]["causes"])


def test_a_new_run_is_pending_from_its_first_write(server: LiveServer) -> None:
    # Defaulted at admission, as the apiserver does for a Pod: no reader sees a run without a phase.
    assert server.http.post(server.path("ag"), json=agent("coder")).status_code == 201
    run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r1"},
           "spec": {"agentRef": {"name": "coder"}, "implementation": {"inline": {"text": "do it"}}},
           "status": {"phase": "Succeeded"}}  # a client cannot skip the phase machine
    r = server.http.post(server.path("runs"), json=run)
    assert r.status_code == 201, r.text
    assert r.json()["status"] == {"phase": "Pending"}
    assert server.http.get(server.path("runs", "r1")).json()["status"] == {"phase": "Pending"}
    rows = server.http.get(server.path("runs"), headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    assert rows.json()["rows"][0]["cells"][2] == "Pending"
