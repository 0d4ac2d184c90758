"""The seed's /v1 routes: atomic apply, agents/executions/approvals, Server-Sent Events."""

from __future__ import annotations

import json
from typing import Any

from joch.server.testing import LiveServer, is_status, sse_events
from support import provider

YAML = {"Content-Type": "application/yaml"}
MANIFESTS = """\
apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata:
  name: codex
spec:
  binary: codex
---
apiVersion: joch.dev/v1alpha1
kind: Agent
metadata:
  name: fixer
  labels: {team: core}
spec:
  providerRef: {name: codex}
"""




def apply(server: LiveServer, text: str, **params: str) -> Any:
    return server.http.post("/v1/resources/apply", content=text, headers=YAML, params=params)


def test_apply_creates_then_reports_unchanged_then_configured(server: LiveServer) -> None:
    r = apply(server, MANIFESTS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kind"] == "ApplyResult"
    assert [(i["index"], i["kind"], i["name"], i["action"]) for i in body["items"]] == [
        (0, "AgentProvider", "codex", "created"), (1, "Agent", "fixer", "created")]
    first = body["items"][0]
    assert first["apiVersion"] == "joch.dev/v1alpha1" and first["namespace"] == "default"
    assert first["resourceVersion"] and first["warnings"] == []
    assert len(body["lines"]) == 2 and "created" in body["lines"][0]

    again = apply(server, MANIFESTS).json()
    assert [i["action"] for i in again["items"]] == ["unchanged", "unchanged"]
    changed = apply(server, MANIFESTS.replace("binary: codex", "binary: codex2")).json()
    assert [i["action"] for i in changed["items"]] == ["configured", "unchanged"]
    got = server.http.get(server.path("ap", "codex")).json()
    assert got["spec"]["binary"] == "codex2"


def test_an_apply_with_many_warnings_keeps_its_headers_readable(server: LiveServer) -> None:
    # 1,000 agents applied before their providers: one warning each. As 1,000 Warning headers (200 KB)
    # the answer was unreadable to httpx (the CLI; it reads at most 100 KiB of headers at once), which
    # reported the committed apply as a server that did not answer. The headers are bounded as the
    # apiserver bounds them; the body still lists every warning.
    from joch.cli.client import Client

    text = "".join(f"---\napiVersion: joch.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a{i}}}\n"
                   f"spec: {{providerRef: {{name: provider-of-agent-{i}}}}}\n" for i in range(1000))
    client = Client(base_url=server.url, on_warning=lambda _: None)
    try:
        body = client.request("POST", "/v1/resources/apply", content=text, content_type="application/yaml",
                              warnings=False)
    finally:
        client.close()
    assert [len(item["warnings"]) for item in body["items"]] == [1] * 1000
    headers = apply(server, text).headers.get_list("warning")
    assert sum(len(h) + len("Warning: \r\n") for h in headers) <= 8 * 1024
    assert "provider-of-agent-0" in headers[0]
    assert headers[-1].endswith(' more warnings left out of the headers"')
    assert int(headers[-1].split()[2].strip('"')) == 1000 - (len(headers) - 1)


def test_apply_is_all_or_nothing_and_names_the_bad_document(server: LiveServer) -> None:
    bad = MANIFESTS + "---\napiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata:\n  name: broken\n" \
        "spec:\n  binary: ''\n"
    r = apply(server, bad)
    assert r.status_code == 422 and is_status(r.json(), 422, "Invalid")
    assert "documents[2]" in json.dumps(r.json())
    assert server.http.get(server.path("ap", "codex")).status_code == 404
    assert server.http.get(server.path("agents", "fixer")).status_code == 404


def test_apply_namespace_parameter_fills_and_guards_namespaces(server: LiveServer) -> None:
    r = apply(server, MANIFESTS, namespace="team-a")
    assert r.status_code == 200 and {i["namespace"] for i in r.json()["items"]} == {"team-a"}
    assert server.http.get(server.path("agents", "fixer", namespace="team-a")).status_code == 200
    assert server.http.get(server.path("agents", "fixer")).status_code == 404
    elsewhere = MANIFESTS.replace("name: codex\n", "name: codex\n  namespace: team-b\n")
    r = apply(server, elsewhere, namespace="team-a")
    assert r.status_code == 422
    causes = r.json()["details"]["causes"]
    assert any(c["field"].endswith("metadata.namespace") and 'does not match the namespace "team-a"' in c["message"]
               for c in causes)


def test_apply_dry_run_writes_nothing(server: LiveServer) -> None:
    r = apply(server, MANIFESTS, dryRun="All")
    assert r.status_code == 200 and r.json()["dryRun"] is True
    assert [i["action"] for i in r.json()["items"]] == ["created", "created"]
    assert server.http.get(server.path("agents", "fixer")).status_code == 404


def test_apply_accepts_json_and_rejects_unparseable_text(server: LiveServer) -> None:
    r = server.http.post("/v1/resources/apply", json={"kind": "List", "items": [provider("j")]})
    assert r.status_code == 200, r.text
    assert r.json()["items"][0]["name"] == "j"
    for text in ("kind: [unclosed", "", "---\n---\n"):
        r = apply(server, text)
        assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest"), text


def create(server: LiveServer, text: str, **params: str) -> Any:
    return server.http.post("/v1/resources/create", content=text, headers=YAML, params=params)


RUN_TEMPLATE = """\
apiVersion: runtime.joch.dev/v1alpha1
kind: AgentRun
metadata:
  generateName: fix-
spec:
  agentRef: {name: fixer}
  implementation: {inline: {text: fix it}}
"""


def test_create_makes_every_document_or_nothing(server: LiveServer) -> None:
    r = create(server, MANIFESTS + "---\n" + RUN_TEMPLATE + "---\n" + RUN_TEMPLATE, namespace="team-a")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["kind"] == "ApplyResult" and body["dryRun"] is False
    assert [i["action"] for i in body["items"]] == ["created"] * 4
    assert {i["namespace"] for i in body["items"]} == {"team-a"}
    runs = [i["name"] for i in body["items"][2:]]
    assert len(set(runs)) == 2 and all(name.startswith("fix-") for name in runs)
    assert body["lines"][0] == "agentprovider.joch.dev/codex created"

    extra = MANIFESTS.replace("name: fixer", "name: other")  # codex exists in team-a: nothing is created
    r = create(server, extra, namespace="team-a")
    assert r.status_code == 409 and is_status(r.json(), 409, "AlreadyExists")
    assert r.json()["message"].startswith("documents[0] (AgentProvider/codex in request body:1): ")
    assert "nothing was written" in r.json()["message"]
    assert server.http.get(server.path("agents", "other", namespace="team-a")).status_code == 404

    r = create(server, MANIFESTS, dryRun="All")
    assert r.status_code == 201 and r.json()["dryRun"] is True
    assert server.http.get(server.path("ap", "codex")).status_code == 404
    r = create(server, MANIFESTS.replace("binary: codex", "binary: ''"))
    assert r.status_code == 422 and r.json()["message"] == "1 of 2 documents is invalid; nothing was created"
    r = create(server, MANIFESTS, namespace="Team_A")
    assert r.status_code == 400 and r.json()["details"]["causes"][0]["field"] == "namespace"


def test_apply_of_stale_get_output_is_409_and_writes_nothing(server: LiveServer) -> None:
    apply(server, MANIFESTS).raise_for_status()
    got = server.http.get(server.path("agents", "fixer")).json()
    assert apply(server, json.dumps(got)).json()["items"][0]["action"] == "unchanged"
    server.http.patch(server.path("agents", "fixer"), content='{"metadata":{"labels":{"team":"theirs"}}}',
                      headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
    mine = {**got, "metadata": {**got["metadata"], "labels": {"team": "mine"}}}
    r = server.http.post("/v1/resources/apply", json=mine)
    assert r.status_code == 409 and is_status(r.json(), 409, "Conflict")
    assert r.json()["message"].startswith("documents[0] (Agent/fixer in request body): the object has been "
                                          "modified since resourceVersion ")
    assert server.http.get(server.path("agents", "fixer")).json()["metadata"]["labels"] == {"team": "theirs"}


def test_agents_executions_and_approvals(server: LiveServer) -> None:
    apply(server, MANIFESTS).raise_for_status()
    agents = server.http.get("/v1/namespaces/default/agents").json()
    assert agents["kind"] == "AgentList" and [a["metadata"]["name"] for a in agents["items"]] == ["fixer"]
    assert server.http.get("/v1/namespaces/default/agents", params={"labelSelector": "team=other"}).json()[
        "items"] == []
    assert server.http.get("/v1/namespaces/default/agents/fixer").json()["spec"]["providerRef"] == {
        "name": "codex"}
    r = server.http.get("/v1/namespaces/default/agents/nobody")
    assert r.status_code == 404 and is_status(r.json(), 404, "NotFound")

    run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r1"},
           "spec": {"agentRef": {"name": "fixer"}, "implementation": {"inline": {"text": "fix the bug"}}}}
    r = server.http.post("/v1/namespaces/default/executions", json=run)
    assert r.status_code == 201, r.text
    runs = server.http.get("/v1/namespaces/default/executions").json()
    assert runs["kind"] == "AgentRunList" and [i["metadata"]["name"] for i in runs["items"]] == ["r1"]
    approvals = server.http.get("/v1/namespaces/default/approvals").json()
    assert approvals["kind"] == "ApprovalList" and approvals["items"] == []


def test_sse_delivers_events_with_ids(server: LiveServer) -> None:
    params = {"kind": "agentproviders", "timeoutSeconds": "5"}
    with server.http.stream("GET", "/v1/resources/watch", params=params) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
        created = server.create(provider("live"))
        event = next(e for e in sse_events(r) if "event" in e)
    assert event["event"] == "ADDED"
    assert event["id"] == created["metadata"]["resourceVersion"]
    assert json.loads(event["data"])["metadata"]["name"] == "live"


def test_sse_without_a_kind_starts_with_every_current_object(server: LiveServer) -> None:
    server.create(provider("a"))
    server.create(provider("b"), namespace="elsewhere")
    server.create({"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "x"},
                   "spec": {"providerRef": {"name": "a"}}})
    for params in ({"timeoutSeconds": "1"}, {"resourceVersion": "0", "timeoutSeconds": "1"}):
        with server.http.stream("GET", "/v1/resources/watch", params=params) as r:
            events = [e for e in sse_events(r) if "event" in e and json.loads(e["data"])["kind"] != "Namespace"]
        assert sorted((e["event"], json.loads(e["data"])["kind"], json.loads(e["data"])["metadata"]["name"])
                      for e in events) == [("ADDED", "Agent", "x"), ("ADDED", "AgentProvider", "a"),
                                           ("ADDED", "AgentProvider", "b")], params
    elsewhere = {"namespace": "elsewhere", "timeoutSeconds": "1"}
    with server.http.stream("GET", "/v1/resources/watch", params=elsewhere) as r:
        assert [json.loads(e["data"])["metadata"]["name"] for e in sse_events(r) if "event" in e] == ["b"]


def test_sse_watch_method_resumes_from_last_event_id_and_sends_heartbeats(server: LiveServer) -> None:
    server.create(provider("seed"), namespace="elsewhere")  # revision 0 would mean "from now"
    before = int(server.http.get(server.path("ap")).json()["metadata"]["resourceVersion"])
    a = server.create(provider("a"))
    server.create(provider("b"))
    headers = {"Last-Event-ID": a["metadata"]["resourceVersion"]}
    with server.http.stream("WATCH", "/v1/resources", params={"timeoutSeconds": "1"}, headers=headers) as r:
        assert r.status_code == 200
        events = list(sse_events(r))
    changes = [e for e in events if "event" in e]
    assert [(e["event"], json.loads(e["data"])["metadata"]["name"]) for e in changes] == [("ADDED", "b")]
    assert {"comment": "heartbeat"} in events
    with server.http.stream("GET", "/v1/resources/watch",
                            params={"resourceVersion": str(before), "timeoutSeconds": "1"}) as r:
        replayed = [e for e in sse_events(r) if "event" in e]
    assert [json.loads(e["data"])["metadata"]["name"] for e in replayed] == ["a", "b"]
    ids = [int(e["id"]) for e in replayed]
    assert ids == sorted(ids)


def test_sse_from_a_compacted_revision_is_410(server: LiveServer) -> None:
    server.create(provider("seed"), namespace="elsewhere")
    start = int(server.http.get(server.path("ap")).json()["metadata"]["resourceVersion"])
    for name in ("a", "b", "c"):
        server.create(provider(name))
    server.store.compact(start + 2)
    r = server.http.get("/v1/resources/watch", params={"resourceVersion": str(start), "timeoutSeconds": "2"})
    assert r.status_code == 410 and is_status(r.json(), 410, "Expired")


def test_sse_unknown_kind_is_404(server: LiveServer) -> None:
    r = server.http.get("/v1/resources/watch", params={"kind": "gizmos"})
    assert r.status_code == 404 and is_status(r.json(), 404, "NotFound")
