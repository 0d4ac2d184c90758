"""Governance in the browser: an approver approves a waiting run from the inbox and the run goes on;
a viewer sees the inbox without buttons and the server refuses the decision anyway; a Policy's
denial shows at the offending line of the apply page."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from e2e.console.conftest import ARTIFACTS, Console, sign_in

RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"
APPROVALS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/approvals"
GATE = {"apiVersion": "joch.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "gate", "namespace": "default"},
        "spec": {"selector": {"kinds": ["AgentRun"]}, "rules": [
            {"name": "gated-runs", "phase": "dispatch", "action": "requireApproval",
             "expression": 'run.metadata.name.startsWith("gated-")',
             "message": "gated runs need a second pair of eyes"}]}}
NO_SHELL = {"apiVersion": "joch.dev/v1alpha1", "kind": "Policy",
            "metadata": {"name": "no-shell", "namespace": "default"},
            "spec": {"selector": {"kinds": ["AgentProvider"]}, "rules": [
                {"name": "no-shell", "phase": "admission", "action": "deny",
                 "expression": 'object.spec.binary == "/bin/sh"', "message": "providers may not run a shell"}]}}
TWO_PROVIDERS = """\
apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata:
  name: fine
spec:
  binary: joch-demo-agent
---
# the second one runs a shell, which the Policy denies
apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata:
  name: shell
spec:
  binary: /bin/sh
"""
SHELL_LINE = 14  # "  binary: /bin/sh"


def eventually(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return found


def gated_run(console: Console, name: str) -> dict[str, Any]:
    """A run the gate Policy holds for approval, and its pending Approval."""
    assert console.apply(GATE).status_code == 200
    run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
           "spec": {"agentRef": {"name": "demo"}, "implementationRef": {"name": "hello-readme"},
                    "execution": {"coordinates": {"git": {"url": str(console.repo)}}}}}
    with console.api("editor") as client:
        r = client.post(RUNS, json=run)
        assert r.status_code == 201, r.text

        def pending() -> dict[str, Any] | None:
            items = client.get(APPROVALS).json()["items"]
            return next((a for a in items if a["spec"]["runRef"]["name"] == name), None)

        approval: dict[str, Any] = eventually(pending, f"an Approval for {name}")
    return approval


def phase(console: Console, name: str) -> str | None:
    with console.api() as client:
        found: str | None = (client.get(f"{RUNS}/{name}").json().get("status") or {}).get("phase")
        return found


def test_an_approver_approves_a_waiting_run_with_a_reason_and_it_runs(console: Console, page: Any) -> None:
    approval = gated_run(console, "gated-approve")
    assert eventually(lambda: phase(console, "gated-approve") == "AwaitingApproval", "AwaitingApproval")
    sign_in(page, console, "approver")
    page.goto(f"{console.base}/console/#/approvals")
    row = page.locator("tr", has_text="gated-approve")
    row.locator("text=Pending").wait_for()
    assert "gated runs need a second pair of eyes" in row.inner_text() or "gate" in row.inner_text()
    row.get_by_role("button", name="Approve run gated-approve").click()
    dialog = page.locator("dialog[open]")
    dialog.get_by_label("Reason").fill("looked at the diff")
    dialog.get_by_role("button", name="Approve").click()
    # The inbox follows the decision live, and the run goes on to the end.
    row.locator("[data-phase=Approved]").wait_for()
    assert "approver — looked at the diff" in row.inner_text()
    with console.api() as client:
        decided = client.get(f"{APPROVALS}/{approval['metadata']['name']}").json()["status"]
    assert (decided["phase"], decided["decidedBy"], decided["reason"]) == ("Approved", "approver", "looked at the diff")
    assert eventually(lambda: phase(console, "gated-approve") in ("Succeeded", "Failed"), "the run to end")
    assert phase(console, "gated-approve") == "Succeeded"


def test_a_viewer_sees_no_approve_button_and_the_server_refuses_the_decision(console: Console, page: Any) -> None:
    approval = gated_run(console, "gated-viewer")
    sign_in(page, console, "viewer")
    page.goto(f"{console.base}/console/#/approvals")
    row = page.locator("tr", has_text="gated-viewer")
    row.locator("text=awaiting an approver").wait_for()
    assert row.get_by_role("button").count() == 0
    assert page.get_by_role("button", name="Approve run gated-viewer").count() == 0
    name = approval["metadata"]["name"]
    with console.api("viewer") as client:
        r = client.post(f"/v1/namespaces/default/approvals/{name}/decide", json={"decision": "approve"})
        assert r.status_code == 403, r.text
        assert r.json()["reason"] == "Forbidden"
        assert (client.get(f"{APPROVALS}/{name}").json().get("status") or {}).get("phase") == "Pending"


@pytest.mark.phone
def test_on_a_phone_the_approve_button_is_in_view_without_scrolling(console: Console, page: Any) -> None:
    gated_run(console, "gated-phone")
    sign_in(page, console, "approver")
    page.goto(f"{console.base}/console/#/approvals")
    button = page.get_by_role("button", name="Approve run gated-phone")
    button.wait_for()
    box = button.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390


def test_a_policy_denial_is_shown_at_the_offending_line_of_the_apply_page(console: Console, page: Any) -> None:
    assert console.apply(NO_SHELL).status_code == 200
    assert TWO_PROVIDERS.splitlines()[SHELL_LINE - 1] == "  binary: /bin/sh"
    sign_in(page, console, "editor")
    page.goto(f"{console.base}/console/#/apply")
    editor = page.get_by_label("Manifests (YAML or JSON)")
    editor.fill(TWO_PROVIDERS)
    page.get_by_role("button", name="Dry run").click()
    marker = page.locator("[data-diagnostic-line]")
    marker.wait_for()
    assert marker.count() == 1 and marker.get_attribute("data-diagnostic-line") == str(SHELL_LINE)
    assert 'rule "no-shell" denied the request: providers may not run a shell' in marker.get_attribute("title")
    note = page.locator(f"[data-note-line='{SHELL_LINE}']")
    assert "providers may not run a shell" in note.inner_text()
    # The note sits beside the line: its top is the line's.
    box, first = note.bounding_box(), page.locator(".gov-gutter > div").first.bounding_box()
    assert box is not None and first is not None
    assert abs(box["y"] - (first["y"] + (SHELL_LINE - 1) * first["height"])) < 2
    report = page.locator(".gov-diagnostics").inner_text()
    assert f"line {SHELL_LINE}" in report and "documents[1] AgentProvider/shell spec.binary" in report
    assert page.get_by_role("button", name="Apply", exact=True).is_disabled()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "apply-policy-diagnostic.png"), full_page=True)
    # Fixed, the dry run passes and Apply writes both.
    editor.fill(TWO_PROVIDERS.replace("/bin/sh", "joch-demo-agent"))
    assert page.locator("[data-diagnostic-line]").count() == 0
    page.get_by_role("button", name="Dry run").click()
    page.locator("text=The dry run passed").wait_for()
    page.get_by_role("button", name="Apply", exact=True).click()
    page.locator("text=agentprovider.joch.dev/shell created").wait_for()
    with console.api() as client:
        assert client.get("/apis/joch.dev/v1alpha1/namespaces/default/agentproviders/shell").status_code == 200


def test_the_inbox_lists_every_waiting_approval_and_pages_the_decided_ones(console: Console, page: Any) -> None:
    # One Approval per run and action: 27 runs the gate holds, and five Approvals of other actions on each.
    assert console.apply(GATE).status_code == 200
    runs = [{"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
             "metadata": {"name": f"gated-paged-{i:02d}"},
             "spec": {"agentRef": {"name": "demo"}, "implementationRef": {"name": "hello-readme"},
                      "execution": {"coordinates": {"git": {"url": str(console.repo)}}}}} for i in range(27)]
    actions = ("tool-use", "secret-access", "write-back", "release", "escalation")
    approvals = [{"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "Approval",
                  "metadata": {"name": f"{run['metadata']['name']}-{action}"},
                  "spec": {"runRef": {"name": run["metadata"]["name"]}, "action": action}} for run in runs
                 for action in actions]
    applied = console.apply(*runs, *approvals)
    assert applied.status_code == 200, applied.text[:2000]
    decided, waiting = approvals[:130], approvals[130:]
    with console.api() as client:
        for doc in decided:
            path = f"{APPROVALS}/{doc['metadata']['name']}"
            current = client.get(path).json()
            status = {"phase": "Denied", "decidedBy": "someone", "reason": "decided long ago"}
            r = client.put(f"{path}/status", json={**current, "status": status})
            assert r.status_code == 200, r.text
    sign_in(page, console, "approver")
    page.goto(f"{console.base}/console/#/approvals")
    # Every waiting one is listed (their names sort after most decided ones), with its buttons.
    def row(doc: dict[str, Any]) -> Any:
        return page.locator("tr").filter(has_text=doc["spec"]["runRef"]["name"]).filter(has_text=doc["spec"]["action"])

    for doc in waiting:
        row(doc).get_by_role("button", name="Approve").wait_for()
    more = page.locator("#more-approvals")
    more.wait_for()
    shown = page.locator("tr", has_text="decided long ago").count()
    assert 90 <= shown < 130, shown  # the first page of 100 decided ones (earlier tests' among them)
    more.click()
    eventually(lambda: page.locator("tr", has_text="decided long ago").count() == 130, "the next page of decisions")
    assert page.locator("#more-approvals").count() == 0
    page.locator("#show-decided").uncheck()
    eventually(lambda: page.locator("tr", has_text="decided long ago").count() == 0, "only the waiting ones")
    for doc in waiting:
        assert row(doc).count() == 1
