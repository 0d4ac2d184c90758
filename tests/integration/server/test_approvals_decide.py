"""``POST /v1/namespaces/{ns}/approvals/{name}/decide`` over a real server and store."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from joch.api import kinds
from joch.server.testing import LiveServer, is_status
from support import provider

DECIDE = "/v1/namespaces/default/approvals/{}/decide"


def approval(server: LiveServer, name: str = "gate", **status: Any) -> dict[str, Any]:
    server.create(provider("p"))
    server.create({"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
                   "spec": {"providerRef": {"name": "p"}}})
    server.create({"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r"},
                   "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}}}})
    created = server.create({"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "Approval",
                             "metadata": {"name": name}, "spec": {"runRef": {"name": "r"}}})
    if status:
        created = server.store.update_status(kinds.APPROVAL, {**created, "status": status})
    return created


def decide(server: LiveServer, name: str, body: Any, **headers: str) -> Any:
    return server.http.post(DECIDE.format(name), json=body, headers=headers or None)


def test_approve_writes_the_decision_with_defaults(server: LiveServer) -> None:
    approval(server, phase="Pending")
    r = decide(server, "gate", {"decision": "approve"})
    assert r.status_code == 200, r.text
    status = r.json()["status"]
    assert status["phase"] == "Approved" and status["decidedBy"] == "system:anonymous"  # --auth none
    assert status["decidedAt"].endswith("Z") and "reason" not in status
    stored = server.store.get(kinds.APPROVAL, "default", "gate")
    assert stored["status"] == status
    assert stored["metadata"]["resourceVersion"] == r.json()["metadata"]["resourceVersion"]


def test_deny_with_why_on_an_approval_no_controller_has_seen(server: LiveServer) -> None:
    approval(server)  # no status at all yet: Pending in all but name
    r = decide(server, "gate", {"decision": "deny", "reason": "not on a Friday"})
    assert r.status_code == 200, r.text
    status = r.json()["status"]
    assert (status["phase"], status["decidedBy"], status["reason"]) == ("Denied", "system:anonymous",
                                                                        "not on a Friday")


def test_a_second_decision_is_a_409_naming_the_first(server: LiveServer) -> None:
    approval(server, phase="Pending")
    assert decide(server, "gate", {"decision": "approve"}).status_code == 200
    again = decide(server, "gate", {"decision": "deny"})
    assert is_status(again.json(), 409, "Conflict")
    message = again.json()["message"]
    assert message.startswith('approval "gate" was already approved by system:anonymous at ')
    assert message.endswith("; a decision cannot be changed")
    assert server.store.get(kinds.APPROVAL, "default", "gate")["status"]["phase"] == "Approved"


def test_an_expired_approval_cannot_be_decided(server: LiveServer) -> None:
    approval(server, phase="Expired")
    r = decide(server, "gate", {"decision": "approve"})
    assert is_status(r.json(), 409, "Conflict")
    assert r.json()["message"] == 'approval "gate" expired; it can no longer be decided'


def test_concurrent_decisions_one_wins(server: LiveServer) -> None:
    approval(server, phase="Pending")
    barrier = threading.Barrier(6)
    codes: list[int] = []

    def one(decision: str) -> None:
        barrier.wait()
        codes.append(decide(server, "gate", {"decision": decision}).status_code)

    threads = [threading.Thread(target=one, args=("approve" if i % 2 else "deny",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(codes) == [200, 409, 409, 409, 409, 409]


@pytest.mark.parametrize(("body", "field", "reason"), [
    ({"decision": "maybe"}, "decision", "FieldValueNotSupported"),
    ({"decision": {}}, "decision", "FieldValueNotSupported"),  # unhashable: once a 500
    ({"decision": []}, "decision", "FieldValueNotSupported"),
    ({}, "decision", "FieldValueRequired"),
    ({"decision": "approve", "reason": 3}, "reason", "FieldValueInvalid"),
    ({"decision": "approve", "decidedBy": ["x"]}, "decidedBy", "FieldValueInvalid"),
    ({"decision": "approve", "comment": "typo"}, "comment", "FieldValueNotSupported"),
])
def test_a_bad_decision_is_a_422_naming_the_field(server: LiveServer, body: Any, field: str, reason: str) -> None:
    approval(server, phase="Pending")
    r = decide(server, "gate", body)
    assert is_status(r.json(), 422, "Invalid"), r.text
    causes = r.json()["details"]["causes"]
    assert [(c["field"], c["reason"]) for c in causes] == [(field, reason)]
    assert server.store.get(kinds.APPROVAL, "default", "gate")["status"]["phase"] == "Pending"


def test_an_unsupported_value_lists_the_supported_ones(server: LiveServer) -> None:
    approval(server, phase="Pending")
    message = decide(server, "gate", {"decision": "yes"}).json()["message"]
    assert message == ('invalid decision for approval "gate": [decision: Unsupported value: "yes": supported '
                       'values: "approve", "deny"]')


def test_unknown_approval_wrong_body_and_wrong_media_type(server: LiveServer) -> None:
    assert is_status(decide(server, "ghost", {"decision": "approve"}).json(), 404, "NotFound")
    approval(server, phase="Pending")
    not_object = server.http.post(DECIDE.format("gate"), content=b"[1]", headers={"Content-Type": "application/json"})
    assert not_object.status_code == 400
    yaml = server.http.post(DECIDE.format("gate"), content=b"decision: approve",
                            headers={"Content-Type": "application/yaml"})
    assert is_status(yaml.json(), 415, "UnsupportedMediaType")
    bad_ns = server.http.post("/v1/namespaces/Bad_NS/approvals/gate/decide", json={"decision": "approve"})
    assert is_status(bad_ns.json(), 400, "BadRequest")


def test_v1_reads_one_approval_and_one_execution(server: LiveServer) -> None:
    approval(server, phase="Pending")
    assert server.http.get("/v1/namespaces/default/approvals/gate").json()["spec"]["runRef"] == {"name": "r"}
    assert server.http.get("/v1/namespaces/default/executions/r").json()["kind"] == "AgentRun"
    assert is_status(server.http.get("/v1/namespaces/default/executions/ghost").json(), 404, "NotFound")



def test_decided_by_and_reason_are_single_bounded_lines(server: LiveServer) -> None:
    approval(server, phase="Pending")
    for body, field in (({"decision": "approve", "decidedBy": "ana\nNormal Succeeded forged"}, "decidedBy"),
                        ({"decision": "deny", "reason": "x" * 2000}, "reason")):
        response = decide(server, "gate", body)
        assert response.status_code == 422, response.text
        assert [c["field"] for c in response.json()["details"]["causes"]] == [field]
    assert (server.store.get(kinds.APPROVAL, "default", "gate")["status"] or {}).get("phase") == "Pending"
