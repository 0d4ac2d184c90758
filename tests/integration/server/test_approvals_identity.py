"""Who decides, who asked and who created: identities come from the authenticated user, never from a
request body (issue 8, items 1 and 6). Over a real server and store with token authentication
(``support.users``: one bearer token per user)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from joch.api import kinds
from joch.server.testing import LiveServer, is_status, live_server
from joch.store import Store
from support import provider
from support.users import as_user, users_server

DECIDE = "/v1/namespaces/default/approvals/{}/decide"
CAROL, DAVE, ERIN = as_user("carol"), as_user("dave"), as_user("erin")


@pytest.fixture
def server(store: Store) -> Iterator[LiveServer]:
    with users_server(store) as running:
        yield running


def post(server: LiveServer, obj: dict[str, Any], headers: dict[str, str]) -> Any:
    info = kinds.REGISTRY.for_object(obj["apiVersion"], obj["kind"])
    return server.http.post(server.path(info.plural), json=obj, headers=headers)


def run_by(server: LiveServer, user: dict[str, str], name: str = "r", **metadata: Any) -> dict[str, Any]:
    server.create(provider("p"))
    server.create({"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
                   "spec": {"providerRef": {"name": "p"}}})
    r = post(server, {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
                      "metadata": {"name": name, **metadata},
                      "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}}}}, user)
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def approval_obj(name: str = "gate", run: str = "r", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "Approval", "metadata": {"name": name},
            "spec": {"runRef": {"name": run}, **spec}}


def approval_by(server: LiveServer, user: dict[str, str], name: str = "gate", **spec: Any) -> dict[str, Any]:
    r = post(server, approval_obj(name, **spec), user)
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def decide(server: LiveServer, name: str, body: dict[str, Any], user: dict[str, str]) -> Any:
    return server.http.post(DECIDE.format(name), json=body, headers=user)


def status_of(server: LiveServer, name: str = "gate") -> dict[str, Any]:
    out: dict[str, Any] = server.store.get(kinds.APPROVAL, "default", name).get("status") or {}
    return out


# --- deciding ----------------------------------------------------------------------------------

def test_decided_by_is_the_authenticated_user(server: LiveServer) -> None:
    run_by(server, CAROL)
    approval_by(server, CAROL)
    r = decide(server, "gate", {"decision": "approve", "reason": "ok"}, DAVE)
    assert r.status_code == 200, r.text
    assert (r.json()["status"]["decidedBy"], r.json()["status"]["reason"]) == ("dave", "ok")
    assert status_of(server)["decidedBy"] == "dave"


def test_a_body_decided_by_naming_someone_else_is_refused(server: LiveServer) -> None:
    run_by(server, CAROL)
    approval_by(server, CAROL)
    forged = decide(server, "gate", {"decision": "approve", "decidedBy": "erin"}, DAVE)
    assert is_status(forged.json(), 422, "Invalid"), forged.text
    [cause] = forged.json()["details"]["causes"]
    assert (cause["field"], cause["reason"]) == ("decidedBy", "FieldValueForbidden")
    assert '"dave"' in cause["message"] and '"erin"' in cause["message"]
    assert status_of(server).get("phase") in (None, "Pending")  # nothing written
    own = decide(server, "gate", {"decision": "deny", "decidedBy": "dave"}, DAVE)  # redundant, accepted
    assert own.status_code == 200 and own.json()["status"]["decidedBy"] == "dave"


def test_anonymous_callers_cannot_name_a_decider_either(store: Store) -> None:
    with live_server(store) as anonymous:  # --auth none: every caller is system:anonymous
        run_by(anonymous, {})
        approval_by(anonymous, {})
        r = anonymous.http.post(DECIDE.format("gate"), json={"decision": "approve", "decidedBy": "carol"})
        assert is_status(r.json(), 422, "Invalid")
        r = anonymous.http.post(DECIDE.format("gate"), json={"decision": "approve"})
        assert r.json()["status"]["decidedBy"] == "system:anonymous"


def test_separation_of_duties_bars_the_run_creator_and_the_requester(server: LiveServer) -> None:
    run_by(server, CAROL)
    approval_by(server, ERIN, separationOfDuties=True, policyRef={"name": "prod", "rule": "main-needs-review"})
    own = decide(server, "gate", {"decision": "approve"}, CAROL)
    assert is_status(own.json(), 403, "Forbidden"), own.text
    message = own.json()["message"]
    assert "separationOfDuties" in message and 'Policy "prod" rule "main-needs-review"' in message
    assert 'user "carol" created run "r"' in message
    requester = decide(server, "gate", {"decision": "approve"}, ERIN)
    assert is_status(requester.json(), 403, "Forbidden")
    assert 'user "erin" requested approval "gate"' in requester.json()["message"]
    assert status_of(server).get("phase") in (None, "Pending")
    other = decide(server, "gate", {"decision": "approve"}, DAVE)
    assert other.status_code == 200 and other.json()["status"]["decidedBy"] == "dave"


def test_without_separation_of_duties_the_creator_may_decide(server: LiveServer) -> None:
    run_by(server, CAROL)
    approval_by(server, CAROL)
    assert decide(server, "gate", {"decision": "approve"}, CAROL).status_code == 200


def test_an_approval_past_its_expiry_cannot_be_decided(server: LiveServer) -> None:
    run_by(server, CAROL)
    approval_by(server, CAROL, expiresAt="2020-01-01T00:00:00Z")
    r = decide(server, "gate", {"decision": "approve"}, DAVE)
    assert is_status(r.json(), 409, "Conflict")
    assert r.json()["message"] == 'approval "gate" expired at 2020-01-01T00:00:00Z; it can no longer be decided'
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    approval_by(server, CAROL, name="later", action="release", expiresAt=later)
    assert decide(server, "later", {"decision": "approve"}, DAVE).status_code == 200


def test_expires_at_must_be_rfc3339(server: LiveServer) -> None:
    run_by(server, CAROL)
    r = post(server, approval_obj(expiresAt="tomorrow"), CAROL)
    assert is_status(r.json(), 422, "Invalid")
    [cause] = r.json()["details"]["causes"]
    assert cause["field"] == "spec.expiresAt" and "RFC 3339" in cause["message"]


# --- requestedBy and the run's creator ------------------------------------------------------------

def test_requested_by_is_the_creating_user_whatever_the_body_says(server: LiveServer) -> None:
    run_by(server, CAROL)
    created = approval_by(server, ERIN, requestedBy="carol")
    assert created["spec"]["requestedBy"] == "erin"


def test_joch_controllers_may_name_the_requester_and_the_creator(server: LiveServer) -> None:
    controller = as_user("system:joch:controller", "system:joch:controllers")
    run = run_by(server, controller, annotations={kinds.CREATED_BY: "carol"})
    assert run["metadata"]["annotations"][kinds.CREATED_BY] == "carol"
    assert approval_by(server, controller, requestedBy="carol")["spec"]["requestedBy"] == "carol"
    unnamed = approval_by(server, controller, name="other", action="release")
    assert unnamed["spec"]["requestedBy"] == "system:joch:controller"


def test_an_approval_made_through_the_api_cannot_claim_to_be_the_runs_own(server: LiveServer) -> None:
    run = run_by(server, CAROL)
    obj = approval_obj("r-dispatch")
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
                                           "name": "r", "uid": run["metadata"]["uid"], "controller": True}]
    r = post(server, obj, CAROL)
    assert is_status(r.json(), 422, "Invalid"), r.text
    assert [c["field"] for c in r.json()["details"]["causes"]] == ["metadata.ownerReferences[0].controller"]
    obj["metadata"]["ownerReferences"][0]["controller"] = False  # owned (deleted with the run) is fine
    assert post(server, obj, CAROL).status_code == 201


def test_an_approvals_spec_cannot_change(server: LiveServer) -> None:
    run_by(server, CAROL)
    approval_by(server, ERIN, separationOfDuties=True)
    path = server.path("approvals", "gate")
    patch = server.http.patch(path, json={"spec": {"separationOfDuties": False, "requestedBy": "dave"}},
                              headers={**CAROL, "Content-Type": "application/merge-patch+json"})
    assert is_status(patch.json(), 422, "Invalid"), patch.text
    assert [c["field"] for c in patch.json()["details"]["causes"]] == ["spec.separationOfDuties"]
    stored = server.store.get(kinds.APPROVAL, "default", "gate")["spec"]
    assert (stored["separationOfDuties"], stored["requestedBy"]) == (True, "erin")
    # the same spec again (as `joch apply` of the same file sends it, without requestedBy) is fine
    again = server.http.put(path, json={**approval_obj(separationOfDuties=True)}, headers=CAROL)
    assert again.status_code == 200, again.text
    assert again.json()["spec"]["requestedBy"] == "erin"


def test_the_run_creator_is_recorded_from_the_user_on_create(server: LiveServer) -> None:
    run = run_by(server, CAROL, annotations={kinds.CREATED_BY: "mallory", "note": "kept"})
    assert run["metadata"]["annotations"] == {kinds.CREATED_BY: "carol", "note": "kept"}


def test_the_run_creator_cannot_be_changed_or_removed(server: LiveServer) -> None:
    run_by(server, CAROL)
    path = server.path("agentruns", "r")
    patch = server.http.patch(path, json={"metadata": {"annotations": {kinds.CREATED_BY: "mallory"}}},
                              headers={**ERIN, "Content-Type": "application/merge-patch+json"})
    assert patch.status_code == 200, patch.text
    assert patch.json()["metadata"]["annotations"][kinds.CREATED_BY] == "carol"
    removed = server.http.patch(path, json={"metadata": {"annotations": {kinds.CREATED_BY: None}}},
                                headers={**ERIN, "Content-Type": "application/merge-patch+json"})
    assert removed.json()["metadata"]["annotations"][kinds.CREATED_BY] == "carol"
    current = server.http.get(path).json()
    current["metadata"]["annotations"] = {kinds.CREATED_BY: "erin"}
    put = server.http.put(path, json=current, headers=ERIN)
    assert put.status_code == 200, put.text
    assert server.store.get(kinds.AGENT_RUN, "default", "r")["metadata"]["annotations"][kinds.CREATED_BY] == "carol"


def test_apply_records_the_creator_too(server: LiveServer) -> None:
    server.create(provider("p"))
    server.create({"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
                   "spec": {"providerRef": {"name": "p"}}})
    doc = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
           "metadata": {"name": "applied", "annotations": {kinds.CREATED_BY: "mallory"}},
           "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}}}}
    r = server.http.post("/v1/resources/apply", json=doc, headers=CAROL)
    assert r.status_code == 200, r.text
    stored = server.store.get(kinds.AGENT_RUN, "default", "applied")
    assert stored["metadata"]["annotations"][kinds.CREATED_BY] == "carol"


# --- one Approval per (run, action) -----------------------------------------------------------------

def test_a_second_approval_of_the_same_action_on_a_run_is_rejected(server: LiveServer) -> None:
    run_by(server, CAROL)
    approval_by(server, CAROL, name="first")
    second = post(server, approval_obj("second"), CAROL)
    assert is_status(second.json(), 422, "Invalid"), second.text
    [cause] = second.json()["details"]["causes"]
    assert (cause["field"], cause["reason"]) == ("spec.action", "FieldValueDuplicate")
    assert 'Approval "first"' in cause["message"] and '"dispatch" on run "r"' in cause["message"]
    assert approval_by(server, CAROL, name="third", action="write-back")["spec"]["action"] == "write-back"


def test_two_approvals_of_one_action_in_one_batch_are_rejected(server: LiveServer) -> None:
    run_by(server, CAROL)
    text = "\n---\n".join(f"""
apiVersion: runtime.joch.dev/v1alpha1
kind: Approval
metadata: {{name: {name}}}
spec: {{runRef: {{name: r}}, action: release}}""" for name in ("one", "two"))
    r = server.http.post("/v1/resources/apply", content=text, headers={**CAROL, "Content-Type": "application/yaml"})
    assert r.status_code == 422, r.text
    causes = r.json()["details"]["causes"]
    assert [c["reason"] for c in causes] == ["FieldValueDuplicate"]
    assert "same action on the same run" in causes[0]["message"]
    assert server.http.get(server.path("approvals")).json()["items"] == []
