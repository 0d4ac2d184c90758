"""Authentication with a token file and authorization by RoleBindings, over a real server and store."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from joch.api import errors, kinds
from joch.server import ServerOptions
from joch.server.app import create_app
from joch.server.auth.options import AuthOptions
from joch.server.testing import LiveServer, is_status, live_server
from joch.store import Store
from support import provider

TOKENS = f"""\
# token,user,uid,"groups"
admin-token,alice,u1,"system:masters"
viewer-token,victor,u2
editor-token,eddie,u3,"devs,people"
approver-token,april,u4
global-token,gwen,u5
nobody-token,nora,u6
sha256:{hashlib.sha256(b"hashed-token").hexdigest()},hugo,u7,devs
"""
BINDINGS = """\
apiVersion: ops.joch.dev/v1alpha1
kind: RoleBinding
metadata: {name: viewers, namespace: default}
roleRef: {apiGroup: ops.joch.dev, kind: Role, name: viewer}
subjects:
- {kind: User, name: victor, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: ops.joch.dev/v1alpha1
kind: RoleBinding
metadata: {name: devs, namespace: default}
roleRef: {kind: Role, name: editor}
subjects: [{kind: Group, name: devs}]
---
apiVersion: ops.joch.dev/v1alpha1
kind: RoleBinding
metadata: {name: approvers, namespace: default}
roleRef: {kind: Role, name: approver}
subjects: [{kind: User, name: april}]
---
apiVersion: ops.joch.dev/v1alpha1
kind: RoleBinding
metadata: {name: global-viewers, namespace: joch-system}
roleRef: {kind: Role, name: viewer}
subjects: [{kind: User, name: gwen}]
"""
AGENT = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
         "spec": {"providerRef": {"name": "p"}}}
RUN = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r"},
       "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}}}}
APPROVAL = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "Approval", "metadata": {"name": "gate"},
            "spec": {"runRef": {"name": "r"}}}
YAML = {"Content-Type": "application/yaml"}


@dataclass
class AuthServer:
    server: LiveServer
    tokens: Path

    def as_(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.server.url, headers=headers, timeout=10)

    def apply(self, token: str, manifests: str, **params: str) -> httpx.Response:
        with self.as_(token) as http:
            return http.post("/v1/resources/apply", content=manifests, headers=YAML, params=params)


@pytest.fixture
def auth_store(store: Store) -> Store:
    """Both backends: RoleBindings are read through the store contract (list, current_revision)."""
    return store


def start(store: Store, tokens: Path) -> Iterator[AuthServer]:
    tokens.write_text(TOKENS)
    options = ServerOptions(auth=AuthOptions(token_file=tokens, token_file_check_seconds=0.05))
    with live_server(store, options) as server:
        running = AuthServer(server, tokens)
        assert running.apply("admin-token", BINDINGS).status_code == 200
        yield running


@pytest.fixture
def auth(auth_store: Store, tmp_path: Path) -> Iterator[AuthServer]:
    yield from start(auth_store, tmp_path / "tokens.csv")


def objects(*objs: dict[str, Any]) -> str:
    return yaml.safe_dump_all(list(objs))


def test_no_token_unknown_and_malformed_tokens_get_the_same_401(auth: AuthServer) -> None:
    bodies = []
    for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Bearer a.b.c"},
                    {"Authorization": "Basic YWxpY2U6c2VjcmV0"}, {"Authorization": "Bearer"}):
        r = httpx.get(f"{auth.server.url}/apis/joch.dev/v1alpha1/namespaces/default/agents", headers=headers)
        assert r.status_code == 401 and is_status(r.json(), 401, "Unauthorized")
        assert r.headers["audit-id"]
        bodies.append(r.content)
    assert len(set(bodies)) == 1
    assert json.loads(bodies[0])["message"] == "Unauthorized"


def test_health_version_webhooks_and_the_run_callback_need_no_token(auth: AuthServer) -> None:
    url = auth.server.url
    for path in ("/healthz", "/readyz", "/version"):
        assert httpx.get(url + path).status_code == 200, path
    # past authentication: the webhook routes verify their deliveries' signatures themselves (a delivery
    # without GitHub's headers is the route's 400, not the middleware's 401)
    webhook = httpx.post(url + "/v1/webhooks/github", json={})
    assert webhook.status_code == 400 and "X-GitHub-Delivery" in webhook.json()["message"]
    callback = httpx.post(url + "/v1/namespaces/default/agentruns/r/callback", json={})
    assert callback.status_code == 401 and "JOCH_RUN_TOKEN" in callback.json()["message"]  # the route's own check
    assert httpx.get(url + "/v1/namespaces/default/agentruns/r/callback").status_code == 401
    assert httpx.post(url + "/v1/namespaces/default/agentruns/r/callback/x", json={}).status_code == 401


def test_every_user_may_discover_and_ask_who_they_are(auth: AuthServer) -> None:
    with auth.as_("nobody-token") as nora:
        assert nora.get("/apis").status_code == 200
        assert nora.get("/apis/joch.dev/v1alpha1").status_code == 200
        assert nora.get("/openapi.json").status_code == 200
        assert nora.get("/v1/whoami").json() == {"username": "nora", "uid": "u6",
                                                 "groups": ["system:authenticated"]}
        review = nora.post("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                           json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert review.status_code == 201 and review.json()["status"]["userInfo"]["username"] == "nora"
        r = nora.get("/apis/joch.dev/v1alpha1/namespaces/default/agents")
        assert is_status(r.json(), 403, "Forbidden")
    with auth.as_("hashed-token") as hugo:  # the file holds only the token's sha256
        assert hugo.get("/v1/whoami").json()["groups"] == ["devs", "system:authenticated"]


def test_a_viewer_reads_but_applying_is_a_403_naming_verb_resource_and_namespace(auth: AuthServer) -> None:
    assert auth.apply("admin-token", objects(provider("p"))).status_code == 200
    with auth.as_("viewer-token") as victor:
        assert victor.get("/apis/joch.dev/v1alpha1/namespaces/default/agentproviders/p").status_code == 200
        assert victor.get("/v1/namespaces/default/agents").status_code == 200
        r = victor.post("/apis/joch.dev/v1alpha1/namespaces/default/agents", json=AGENT)
        body = r.json()
        assert is_status(body, 403, "Forbidden") and r.headers["audit-id"]
        assert body["message"].startswith('agents.joch.dev is forbidden: User "victor" cannot create resource '
                                          '"agents" in API group "joch.dev" in the namespace "default": that takes '
                                          "role editor or admin")
        assert body["details"] == {"kind": "agents", "group": "joch.dev"}
        secrets = victor.get("/apis/ops.joch.dev/v1alpha1/namespaces/default/secrets")
        assert is_status(secrets.json(), 403, "Forbidden") and "that takes role admin" in secrets.json()["message"]
    applied = auth.apply("viewer-token", objects(AGENT))
    assert is_status(applied.json(), 403, "Forbidden")
    assert 'User "victor" cannot create resource "agents"' in applied.json()["message"]
    assert applied.json()["message"].startswith("documents[0] (Agent/a in request body")


def test_an_editor_writes_and_cancels_runs_but_decides_no_approval_and_writes_no_status(auth: AuthServer) -> None:
    assert auth.apply("editor-token", objects(provider("p"), AGENT, RUN)).status_code == 200
    assert auth.apply("admin-token", objects(APPROVAL)).status_code == 200
    run_path = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns/r"
    merge = {"Content-Type": "application/merge-patch+json"}
    with auth.as_("editor-token") as eddie:
        assert eddie.patch(run_path, content=json.dumps({"spec": {"cancel": True}}), headers=merge).status_code == 200
        forged = eddie.patch(f"{run_path}/status", content=json.dumps({"status": {"phase": "Succeeded"}}),
                             headers=merge)
        assert is_status(forged.json(), 403, "Forbidden")
        assert 'cannot patch resource "agentruns/status" in API group "runtime.joch.dev"' in forged.json()["message"]
        decided = eddie.post("/v1/namespaces/default/approvals/gate/decide", json={"decision": "approve"})
        assert is_status(decided.json(), 403, "Forbidden")
        assert decided.json()["message"].startswith('approvals.runtime.joch.dev "gate" is forbidden: User "eddie" '
                                                    'cannot update resource "approvals/decide"')
    with auth.as_("approver-token") as april:
        assert april.post("/v1/namespaces/default/approvals/gate/decide",
                          json={"decision": "approve"}).status_code == 200
        assert is_status(april.post("/v1/namespaces/default/executions", json=RUN).json(), 403, "Forbidden")
    with auth.as_("admin-token") as alice:
        fixed = alice.patch(f"{run_path}/status", content=json.dumps({"status": {"reason": "x"}}), headers=merge)
        assert fixed.status_code == 200
    assert auth.server.store.get(kinds.AGENT_RUN, "default", "r")["status"].get("phase") != "Succeeded"


def test_a_binding_in_joch_system_applies_in_every_namespace_and_cluster_wide(auth: AuthServer) -> None:
    team_a = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    assert auth.apply("admin-token", objects(team_a, provider("p", namespace="team-a"))).status_code == 200
    with auth.as_("global-token") as gwen, auth.as_("viewer-token") as victor:
        assert gwen.get("/apis/joch.dev/v1alpha1/namespaces/team-a/agentproviders/p").status_code == 200
        listed = gwen.get("/apis/joch.dev/v1alpha1/agentproviders")
        assert listed.status_code == 200 and [i["metadata"]["name"] for i in listed.json()["items"]] == ["p"]
        assert victor.get("/apis/joch.dev/v1alpha1/namespaces/default/agentproviders").status_code == 200
        elsewhere = victor.get("/apis/joch.dev/v1alpha1/namespaces/team-a/agentproviders")
        assert 'in the namespace "team-a"' in elsewhere.json()["message"]
        everywhere = victor.get("/apis/joch.dev/v1alpha1/agentproviders")
        assert is_status(everywhere.json(), 403, "Forbidden")
        assert 'cannot list resource "agentproviders" in API group "joch.dev" at the cluster scope' in (
            everywhere.json()["message"])
        # the SSE watch across kinds and namespaces, and the audit log of every namespace
        assert victor.get("/v1/resources/watch", params={"kind": "secrets", "namespace": "default"}).status_code == 403
        assert victor.get("/v1/audit", params={"namespace": "default"}).status_code == 403
        assert gwen.get("/v1/audit").status_code == 403
    with auth.as_("admin-token") as alice:
        assert alice.get("/v1/audit").status_code == 200


def test_a_new_binding_grants_at_once_and_a_deleted_one_stops_granting(auth: AuthServer) -> None:
    binding = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "RoleBinding",
               "metadata": {"name": "nora", "namespace": "default"},
               "roleRef": {"kind": "Role", "name": "viewer"}, "subjects": [{"kind": "User", "name": "nora"}]}
    path = "/apis/joch.dev/v1alpha1/namespaces/default/agents"
    with auth.as_("nobody-token") as nora, auth.as_("admin-token") as alice:
        assert nora.get(path).status_code == 403
        bindings = "/apis/ops.joch.dev/v1alpha1/namespaces/default/rolebindings"
        assert alice.post(bindings, json=binding).status_code == 201
        assert nora.get(path).status_code == 200  # no wait: a denial re-reads changed bindings
        assert alice.delete(f"{bindings}/nora").status_code == 200
        deadline = time.monotonic() + 5
        while nora.get(path).status_code == 200:
            assert time.monotonic() < deadline, "a deleted binding still grants after its cache time"
            time.sleep(0.1)


def test_a_team_subject_binds_the_teams_members_and_groups_as_they_are_now(auth: AuthServer) -> None:
    team = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Team", "metadata": {"name": "platform"},
            "spec": {"members": ["nora"], "groups": []}}
    binding = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "RoleBinding",
               "metadata": {"name": "platform-edits", "namespace": "default"},
               "roleRef": {"kind": "Role", "name": "editor"},
               "subjects": [{"kind": "Team", "name": "platform", "apiGroup": "ops.joch.dev"}]}
    path = "/apis/joch.dev/v1alpha1/namespaces/default/agentproviders"
    with auth.as_("nobody-token") as nora, auth.as_("approver-token") as april, auth.as_("admin-token") as alice:
        assert alice.post(BINDINGS_PATH, json=binding).status_code == 201
        assert nora.post(path, json=provider("by-nora")).status_code == 403  # no such Team yet: nobody
        assert alice.post("/apis/ops.joch.dev/v1alpha1/teams", json=team).status_code == 201
        assert nora.post(path, json=provider("by-nora")).status_code == 201  # a member
        assert april.post(path, json=provider("by-april")).status_code == 403
        team_path = "/apis/ops.joch.dev/v1alpha1/teams/platform"
        patched = alice.patch(team_path, json={"spec": {"members": ["april"]}},
                              headers={"Content-Type": "application/merge-patch+json"})
        assert patched.status_code == 200, patched.text
        assert april.post(path, json=provider("by-april")).status_code == 201  # a member now, at once
        deadline = time.monotonic() + 5
        while nora.post(path, json=provider("by-nora-2")).status_code != 403:
            assert time.monotonic() < deadline, "a member removed from the Team still edits"
            time.sleep(0.1)


BINDINGS_PATH = "/apis/ops.joch.dev/v1alpha1/namespaces/default/rolebindings"
K8S_SHAPED = """\
apiVersion: ops.joch.dev/v1alpha1
kind: RoleBinding
metadata: {name: nora-edits, namespace: default}
roleRef: {apiGroup: ops.joch.dev, kind: Role, name: editor}
subjects:
- {kind: User, name: nora, apiGroup: rbac.authorization.k8s.io}
- {kind: Group, name: nobody-in-particular}
"""


def test_a_role_binding_in_the_kubernetes_shape_grants_its_role_and_round_trips(auth: AuthServer) -> None:
    agents = "/apis/joch.dev/v1alpha1/namespaces/default/agents"
    with auth.as_("nobody-token") as nora, auth.as_("admin-token") as alice:
        assert nora.post(agents, json=AGENT).status_code == 403
        applied = auth.apply("admin-token", K8S_SHAPED)
        assert applied.status_code == 200, applied.text
        assert nora.post(agents, json=AGENT).status_code == 201  # editor, from the top-level roleRef
        got = alice.get(f"{BINDINGS_PATH}/nora-edits").json()
        assert "spec" not in got and "status" not in got
        assert got["roleRef"] == {"apiGroup": "ops.joch.dev", "kind": "Role", "name": "editor"}
        assert [s["name"] for s in got["subjects"]] == ["nora", "nobody-in-particular"]
        # kubectl get -o yaml, then apply it back: unchanged, nothing written
        again = auth.apply("admin-token", yaml.safe_dump(got))
        assert again.json()["items"][0]["action"] == "unchanged", again.text
        assert alice.get(f"{BINDINGS_PATH}/nora-edits").json()["metadata"] == got["metadata"]
        # a change of the top-level fields is a spec change: configured, generation bumped
        changed = auth.apply("admin-token", K8S_SHAPED.replace("name: editor", "name: viewer"))
        assert changed.json()["items"][0]["action"] == "configured"
        now = alice.get(f"{BINDINGS_PATH}/nora-edits").json()
        assert now["metadata"]["generation"] == got["metadata"]["generation"] + 1
        assert now["roleRef"]["name"] == "viewer"
        deadline = time.monotonic() + 5
        while nora.delete(f"{agents}/a").status_code != 403:  # a viewer now; the cache may lag a moment
            assert time.monotonic() < deadline, "the binding's new role was never applied"
            nora.post(agents, json=AGENT)
            time.sleep(0.1)
        table = alice.get(BINDINGS_PATH, headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
        rows = {r["cells"][0]: r["cells"][1:3] for r in table.json()["rows"]}
        assert rows["nora-edits"] == ["viewer", "nora,nobody-in-particular"]
        assert alice.get(f"{BINDINGS_PATH}/nora-edits/status").status_code == 404  # no status subresource


def test_a_role_binding_naming_an_unknown_role_is_a_422_at_role_ref_name(auth: AuthServer) -> None:
    bad = auth.apply("admin-token", K8S_SHAPED.replace("name: editor", "name: owner"))
    assert is_status(bad.json(), 422, "Invalid")
    causes = {c["field"]: c["message"] for c in bad.json()["details"]["causes"]}
    field = next(f for f in causes if f.endswith("roleRef.name"))
    assert field.endswith("(RoleBinding/nora-edits in request body:1).roleRef.name"), causes  # not spec.roleRef
    assert all(role in causes[field] for role in kinds.BUILTIN_ROLES), causes
    with auth.as_("admin-token") as alice:
        created = alice.post(BINDINGS_PATH, json=yaml.safe_load(K8S_SHAPED.replace("editor", "owner")))
    assert is_status(created.json(), 422, "Invalid")
    assert created.json()["details"]["causes"][0]["field"] == "roleRef.name"
    assert created.json()["message"].startswith('RoleBinding.ops.joch.dev "nora-edits" is invalid: roleRef.name: ')
    with auth.as_("admin-token") as alice:
        assert alice.get(f"{BINDINGS_PATH}/nora-edits").status_code == 404  # nothing written


def test_a_role_binding_under_spec_or_with_a_misspelt_key_is_refused_naming_the_fix(auth: AuthServer) -> None:
    binding = yaml.safe_load(K8S_SHAPED)
    nested = {**binding, "spec": {"roleRef": binding.pop("roleRef"), "subjects": binding.pop("subjects")}}
    with auth.as_("admin-token") as alice:
        refused = alice.post(BINDINGS_PATH, json=nested)
        assert is_status(refused.json(), 422, "Invalid")
        causes = {c["field"]: c["message"] for c in refused.json()["details"]["causes"]}
        assert "move them out of spec" in causes["spec"] and "roleRef, subjects" in causes["spec"], causes
        misspelt = {**yaml.safe_load(K8S_SHAPED), "subject": []}
        refused = alice.post(BINDINGS_PATH, json=misspelt)
        causes = {c["field"]: c["message"] for c in refused.json()["details"]["causes"]}
        assert causes["subject"] == 'unknown field "subject"; did you mean "subjects"?'
        with_status = {**yaml.safe_load(K8S_SHAPED), "status": {}}
        assert alice.post(BINDINGS_PATH, json=with_status).status_code == 422
        assert alice.get(f"{BINDINGS_PATH}/nora-edits").status_code == 404


def test_the_openapi_and_discovery_show_a_role_binding_as_kubernetes_does(auth: AuthServer) -> None:
    with auth.as_("admin-token") as alice:
        schema = alice.get("/openapi.json").json()
        shape = schema["components"]["schemas"]["RoleBinding"]["properties"]
        assert {"apiVersion", "kind", "metadata", "roleRef", "subjects"} == set(shape)
        resources = alice.get("/apis/ops.joch.dev/v1alpha1").json()["resources"]
        names = {r["name"] for r in resources}
        assert "rolebindings" in names and "rolebindings/status" not in names and "secrets/status" in names


def test_a_batch_apply_with_one_forbidden_document_writes_nothing(auth: AuthServer) -> None:
    secret = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "s"},
              "spec": {"stringData": {"TOKEN": "x"}}}
    r = auth.apply("editor-token", objects(provider("p"), secret))
    assert is_status(r.json(), 403, "Forbidden")
    assert r.json()["message"].startswith('documents[1] (Secret/s in request body:8): secrets.ops.joch.dev "s" '
                                          'is forbidden: User "eddie" cannot create resource "secrets"')
    with pytest.raises(errors.NotFound):
        auth.server.store.get(kinds.AGENT_PROVIDER, "default", "p")
    # a document for another namespace is authorized there
    other = auth.apply("editor-token", objects(provider("p", namespace="team-a")))
    assert 'in the namespace "team-a"' in other.json()["message"]
    created = httpx.post(f"{auth.server.url}/v1/resources/create", content=objects(provider("q")),
                         headers={**YAML, "Authorization": "Bearer viewer-token"})
    assert 'User "victor" cannot create resource "agentproviders"' in created.json()["message"]
    assert auth.apply("editor-token", objects(provider("p"))).status_code == 200


def test_self_subject_access_reviews_answer_per_role(auth: AuthServer) -> None:
    def can(token: str, **attributes: str) -> dict[str, Any]:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"namespace": "default", **attributes}}}
        with auth.as_(token) as http:
            r = http.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json=review)
        assert r.status_code == 201, r.text
        status: dict[str, Any] = r.json()["status"]
        return status

    create_agents = {"verb": "create", "group": "joch.dev", "resource": "agents"}
    decide = {"verb": "update", "group": "runtime.joch.dev", "resource": "approvals", "subresource": "decide"}
    assert can("viewer-token", **create_agents)["allowed"] is False
    assert 'cannot create resource "agents"' in can("viewer-token", **create_agents)["reason"]
    assert can("editor-token", **create_agents) == {"allowed": True,
                                                    "reason": 'RoleBinding "default/devs" grants role editor'}
    assert can("editor-token", **decide)["allowed"] is False
    assert can("approver-token", **decide)["allowed"] is True
    assert can("admin-token", verb="get", resource="secrets")["allowed"] is True
    assert can("global-token", verb="list", resource="agents", namespace="team-z")["allowed"] is True
    with auth.as_("viewer-token") as victor:
        bad = victor.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json={"spec": {}})
        assert is_status(bad.json(), 400, "BadRequest")


def test_token_file_edits_are_picked_up_and_a_broken_edit_keeps_the_old_tokens(
    auth: AuthServer, caplog: pytest.LogCaptureFixture,
) -> None:
    def status(token: str) -> int:
        with auth.as_(token) as http:
            return http.get("/v1/whoami").status_code

    def eventually(token: str, code: int) -> None:
        deadline = time.monotonic() + 5
        while status(token) != code:
            assert time.monotonic() < deadline, f"{token} did not get {code}"
            time.sleep(0.05)

    assert status("new-token") == 401
    auth.tokens.write_text(TOKENS.replace("nobody-token,nora,u6\n", "new-token,nina,u8\n"))
    eventually("new-token", 200)
    eventually("nobody-token", 401)
    with caplog.at_level(logging.ERROR, logger="joch.server.auth"):
        auth.tokens.write_text(TOKENS + "just-a-token\n")
        deadline = time.monotonic() + 5
        while not caplog.records:
            assert status("new-token") == 200  # requests check the file; the tokens read before stay in force
            assert time.monotonic() < deadline, "the broken token file was not reported"
            time.sleep(0.05)
    assert "line 9 has 1 field(s)" in caplog.records[0].getMessage()
    assert status("new-token") == 200 and len(caplog.records) == 1  # reported once, not at every check


def test_a_malformed_token_file_stops_the_server_naming_the_line(auth_store: Store, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.csv"
    tokens.write_text('good,alice,1\nbad,"unterminated,1\n')
    with pytest.raises(errors.BadRequest, match="line 2 has 2 field"):
        create_app(auth_store, options=ServerOptions(auth=AuthOptions(token_file=tokens)))
    tokens.write_text("sha256:abc,alice,1\n")
    with pytest.raises(errors.BadRequest, match=r"line 1: a sha256: token must be followed by the 64 hex digits"):
        create_app(auth_store, options=ServerOptions(auth=AuthOptions(token_file=tokens)))
