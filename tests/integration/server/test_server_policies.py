"""Policies over HTTP: a denial is a 422 ``Status`` naming policy, rule and message (the Kubernetes
routes and /v1/resources/apply alike), a warning is a ``Warning: 299`` header; the Team and
Environment kinds are served cluster-scoped."""

from __future__ import annotations

from typing import Any

from joch.api import kinds
from joch.server.testing import LiveServer

YAML = {"Content-Type": "application/yaml"}
POLICY = """\
apiVersion: joch.dev/v1alpha1
kind: Policy
metadata: {name: providers, namespace: joch-system}
spec:
  selector: {kinds: [AgentProvider]}
  rules:
  - name: allow-list
    expression: '!(object.spec.binary in ["codex", "claude"])'
    message: only codex and claude may run
  - name: labels
    action: warn
    expression: '!has(object.metadata.labels)'
    message: label your providers
"""


def apply(server: LiveServer, text: str) -> Any:
    return server.http.post("/v1/resources/apply", content=text, headers=YAML)


def provider(name: str, binary: str) -> str:
    return (f"apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {{name: {name}}}\n"
            f"spec: {{binary: {binary}}}\n")


def test_a_denied_apply_is_a_422_status_and_writes_nothing(server: LiveServer) -> None:
    assert apply(server, POLICY).status_code == 200
    r = apply(server, provider("fine", "codex") + "---\n" + provider("bad", "/bin/sh"))
    assert r.status_code == 422, r.text
    status = r.json()
    assert status["kind"] == "Status" and status["reason"] == "Invalid"
    assert status["message"] == "1 of 2 documents is invalid; nothing was applied"
    [cause] = status["details"]["causes"]
    assert cause["message"] == ('Policy joch-system/providers rule "allow-list" denied the request: '
                                "only codex and claude may run")
    assert server.store.list(kinds.AGENT_PROVIDER).items == []


def test_the_kubernetes_routes_deny_and_warn_too(server: LiveServer) -> None:
    assert apply(server, POLICY).status_code == 200
    body = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
            "spec": {"binary": "/bin/sh"}}
    r = server.http.post(server.path("ap"), json=body)
    assert r.status_code == 422 and 'rule "allow-list" denied the request' in r.json()["message"]
    r = server.http.post(server.path("ap"), json={**body, "spec": {"binary": "codex"}})
    assert r.status_code == 201
    [warning] = r.headers.get_list("warning")
    assert warning.startswith("299 - ") and 'Policy joch-system/providers rule \\"labels\\"' in warning
    r = server.http.patch(server.path("ap", "p"), json={"spec": {"binary": "/bin/sh"}},
                          headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 422 and "only codex and claude may run" in r.json()["message"]
    events = server.store.list(kinds.EVENT).items
    assert [e["spec"]["reason"] for e in events] == ["PolicyWarning"]


def test_an_applied_warning_is_a_warning_header(server: LiveServer) -> None:
    assert apply(server, POLICY).status_code == 200
    r = apply(server, provider("p", "claude"))
    assert r.status_code == 200
    assert any("label your providers" in h for h in r.headers.get_list("warning"))


def test_teams_and_environments_are_cluster_scoped(server: LiveServer) -> None:
    env = "apiVersion: ops.joch.dev/v1alpha1\nkind: Environment\nmetadata: {name: prod}\nspec: {namespaces: [shop]}\n"
    team = ("apiVersion: ops.joch.dev/v1alpha1\nkind: Team\nmetadata: {name: shop}\n"
            "spec: {members: [ana], groups: [shop-devs], namespaces: [shop]}\n")
    assert apply(server, env + "---\n" + team).status_code == 200
    got = server.http.get("/apis/ops.joch.dev/v1alpha1/environments/prod").json()
    assert got["spec"]["namespaces"] == ["shop"] and "namespace" not in got["metadata"]
    got = server.http.get("/apis/ops.joch.dev/v1alpha1/teams/shop").json()
    assert got["spec"]["members"] == ["ana"]
    dup = env.replace("[shop]", "[shop, shop]").replace("prod", "prod2")
    r = apply(server, dup)
    assert r.status_code == 422 and "duplicate namespace" in r.text


def test_the_causes_of_a_rejected_apply_carry_the_line_of_their_field(server: LiveServer) -> None:
    assert apply(server, POLICY).status_code == 200
    text = provider("fine", "codex") + "---\n" + provider("bad", "/bin/sh").replace("spec: {", "spec:\n  {")
    r = apply(server, text)
    assert r.status_code == 422, r.text
    [document] = r.json()["details"]["documents"]
    [cause] = document["causes"]
    # The denial names the field the rule reads, so the console shows it at that line.
    assert (cause["field"], cause["line"], cause["column"], cause["exact"]) == ("spec.binary", 10, 4, True)
    assert text.splitlines()[9] == "  {binary: /bin/sh}"
    r = apply(server, provider("ok", "codex") + "---\n" + provider("typo", "codex").replace("binary", "binnary"))
    [document] = r.json()["details"]["documents"]
    # the unknown field is where it is written; the missing one at the spec that lacks it
    assert sorted((c["field"], c["line"], c["exact"]) for c in document["causes"]) == [
        ("spec.binary", 9, False), ("spec.binnary", 9, True)]


def test_a_yaml_syntax_error_names_its_line_and_column_in_the_details(server: LiveServer) -> None:
    r = apply(server, provider("fine", "codex") + "---\nkind: AgentProvider\nmetadata:\n  name: a: b\n")
    assert r.status_code == 400
    status = r.json()
    assert (status["details"]["line"], status["details"]["column"]) == (8, 10)
    assert "invalid YAML at line 8, column 10: mapping values are not allowed" in status["message"]
