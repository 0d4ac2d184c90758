"""A hostile user against a real server with a token file: each test is an attack that once worked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.server.test_server_auth import AuthServer, start
from joch.store import Store


@pytest.fixture
def auth(store: Store, tmp_path: Path) -> Iterator[AuthServer]:
    yield from start(store, tmp_path / "tokens.csv")


AGENT_YAML = """\
apiVersion: joch.dev/v1alpha1
kind: Agent
metadata: {name: a, namespace: default}
spec: {providerRef: {name: p}}
"""
RUN_OF_A = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r"},
            "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}}}}


def watch_body(auth: AuthServer, token: str, query: str) -> tuple[int, bytes]:
    with auth.as_(token) as http, http.stream("GET", f"/v1/resources/watch?{query}&timeoutSeconds=1") as r:
        return r.status_code, r.read()


@pytest.mark.parametrize("query", [
    "kind=Agent&kind=",  # authorized as a watch of Agents, served as a watch of every kind
    "kind=Agent&kind=RoleBinding",
    "kind=Agent&namespace=default&namespace=",  # authorized in default, served in every namespace
    "kind=Agent&namespace=default&namespace=joch-system",
])
def test_a_repeated_query_parameter_is_authorized_as_the_route_reads_it(auth: AuthServer, query: str) -> None:
    # victor views namespace default only; the RoleBindings in default and joch-system are not his to watch.
    code, body = watch_body(auth, "viewer-token", query)
    assert code == 403, body
    assert b"event:" not in body


FREE_MODEL = """\
apiVersion: model.joch.dev/v1alpha1
kind: Model
metadata: {name: gpt, namespace: default}
spec: {provider: openai, modelId: gpt-5, pricing: {inputPerMillionUsd: 0, outputPerMillionUsd: 0}}
"""


def test_an_editor_cannot_price_models_to_slip_under_a_budget(auth: AuthServer) -> None:
    # Spend is priced from the Model found in the run's namespace before joch-system's: an editor who
    # could write one there would meter every run at $0, and no Budget would ever stop them.
    response = auth.apply("editor-token", FREE_MODEL)
    assert response.status_code == 403, response.text
    assert "models" in response.json()["message"]
    with auth.as_("editor-token") as http:
        assert http.get("/apis/model.joch.dev/v1alpha1/namespaces/default/models").status_code == 200
    assert auth.apply("admin-token", FREE_MODEL).status_code == 200


@pytest.mark.parametrize("field", ["stringData", "data"])
def test_a_secret_value_with_a_nul_character_is_refused_without_quoting_it(auth: AuthServer, field: str) -> None:
    secret = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret",
              "metadata": {"name": "s", "namespace": "default"},
              "spec": {field: {"password": "hunter2-\u0000-SUPERSECRET"}}}
    with auth.as_("admin-token") as http:
        for response in (
            http.post("/v1/resources/apply", json=secret),
            http.post("/apis/ops.joch.dev/v1alpha1/namespaces/default/secrets", json=secret),
        ):
            assert response.status_code == 422, response.text
            assert "NUL" in response.text and f"spec.{field}.password" in response.text
            assert "SUPERSECRET" not in response.text and "hunter2" not in response.text


def test_an_editor_cannot_make_their_approval_the_runs_own_by_a_later_edit(auth: AuthServer) -> None:
    approvals = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/approvals"
    with auth.as_("editor-token") as http:
        assert auth.apply("editor-token", AGENT_YAML).status_code == 200
        run = http.post("/v1/namespaces/default/executions", json=RUN_OF_A)
        assert run.status_code == 201, run.text
        mine = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "Approval", "metadata": {"name": "r-dispatch"},
                "spec": {"runRef": {"name": "r"}}}
        assert http.post(approvals, json=mine).status_code == 201
        ref = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "name": "r",
               "uid": run.json()["metadata"]["uid"], "controller": True}
        patched = http.patch(f"{approvals}/r-dispatch", json={"metadata": {"ownerReferences": [ref]}},
                             headers={"Content-Type": "application/merge-patch+json"})
        assert patched.status_code == 422, patched.text
        assert "metadata.ownerReferences[0].controller" in patched.text
        stored = http.get(f"{approvals}/r-dispatch").json()
        assert not stored["metadata"].get("ownerReferences")
        # Keeping what it has (none) and editing the rest is fine.
        assert http.patch(f"{approvals}/r-dispatch", json={"metadata": {"labels": {"x": "y"}}},
                          headers={"Content-Type": "application/merge-patch+json"}).status_code == 200


FORGED_EVENT = """\
apiVersion: ops.joch.dev/v1alpha1
kind: Event
metadata: {name: forged, namespace: default}
spec:
  involvedObject: {apiVersion: runtime.joch.dev/v1alpha1, kind: AgentRun, name: r, namespace: default}
  reason: Approved
  message: approval r-dispatch approved by april
  source: {component: joch-run-controller}
"""


def test_an_editor_cannot_forge_or_remove_the_events_joch_writes(auth: AuthServer) -> None:
    # Events are what Joch's controllers and admission say happened (an approval, a policy warning,
    # a budget stop): as in Kubernetes' edit role, editors read them and do not write them.
    response = auth.apply("editor-token", FORGED_EVENT)
    assert response.status_code == 403, response.text
    assert auth.apply("admin-token", FORGED_EVENT).status_code == 200
    events = "/apis/ops.joch.dev/v1alpha1/namespaces/default/events"
    with auth.as_("editor-token") as http:
        assert http.delete(f"{events}/forged").status_code == 403
        assert http.get(f"{events}/forged").status_code == 200


WRITE_INTENT_YAML = """\
apiVersion: runtime.joch.dev/v1alpha1
kind: WriteIntent
metadata: {name: r-comment, namespace: default}
spec:
  runRef: {name: r}
  runUid: u
  type: comment
  body: hello
  target: {provider: github, sourceRef: {name: gh}, owner: victim, repo: secret, number: 1}
"""
EXECUTION_YAML = """\
apiVersion: runtime.joch.dev/v1alpha1
kind: TriggerExecution
metadata: {name: r, namespace: default}
spec: {ruleRef: {name: on-label}, decision: Dispatched, runRef: {name: r}, dedupeKey: k,
       evaluatedAt: "2026-01-01T00:00:00Z", event: {kind: issue, item: "github:victim/secret#1"}}
"""


@pytest.mark.parametrize(("doc", "plural"), [(WRITE_INTENT_YAML, "writeintents"),
                                             (EXECUTION_YAML, "triggerexecutions")])
def test_an_editor_cannot_write_what_write_back_trusts(auth: AuthServer, doc: str, plural: str) -> None:
    # A WriteIntent is sent with the source's token wherever its target says; a TriggerExecution names
    # the issue a triggered run writes back to. Only Joch's controllers (and admins) write them.
    response = auth.apply("editor-token", doc)
    assert response.status_code == 403, response.text
    assert plural in response.json()["message"]
    with auth.as_("editor-token") as http:
        assert http.get(f"/apis/runtime.joch.dev/v1alpha1/namespaces/default/{plural}").status_code == 200
