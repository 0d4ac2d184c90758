"""Dispatch policies in the run controller, end to end (real store, manager and runner): a rule
requiring approval for runs on ``main`` holds such a run in AwaitingApproval with an Approval that
names the rule; approving it runs it, denying it fails it with the reason; a deny rule fails the
run ``PolicyDenied``. Uses the harness of ``test_runs``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from integration.controllers import test_runs
from integration.controllers.test_runs import Env, agent, provider, script
from joch.api import kinds
from joch.api.audit import AuditEntry

# The run controller harness (a store, a manager and local runners over a git repository).
make_env = test_runs.make_env
repo = test_runs.repo


def policy(name: str, rules: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Policy", "metadata": {"name": name},
            "spec": {"selector": {"kinds": ["AgentRun"]}, "rules": rules, **spec}}


MAIN_NEEDS_APPROVAL = policy("main-ref", [{
    "name": "main-needs-approval", "phase": "dispatch", "action": "requireApproval",
    "expression": 'has(run.spec.execution) && run.spec.execution.coordinates.git.ref == "main"',
    "message": "runs on main need a second pair of eyes"}], separationOfDuties=True)


def on(env: Env, ref: str) -> dict[str, Any]:
    return {"execution": {"coordinates": {"git": {"url": str(env.repo), "ref": ref}}}}


def test_a_run_on_main_waits_for_the_approval_the_policy_asked_for(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p"), MAIN_NEEDS_APPROVAL)
    name = env.create_run(**on(env, "main"))
    run = env.wait(name, {"AwaitingApproval", "Succeeded", "Failed"})
    assert run["status"]["phase"] == "AwaitingApproval"
    assert 'Policy default/main-ref rule "main-needs-approval" requires approval' in run["status"]["message"]
    approval = env.store.get(kinds.APPROVAL, "default", f"{name}-dispatch")
    spec = approval["spec"]
    assert spec["action"] == "dispatch" and spec["runRef"] == {"name": name}
    assert spec["policyRef"] == {"namespace": "default", "name": "main-ref", "rule": "main-needs-approval"}
    assert spec["separationOfDuties"] is True
    assert spec["reason"] == ('Policy default/main-ref rule "main-needs-approval" requires approval: runs on main '
                              "need a second pair of eyes")
    assert approval["status"]["phase"] == "Pending"
    env.store.update_status(kinds.APPROVAL, {**approval, "status": {"phase": "Approved", "decidedBy": "ana"}})
    assert env.wait(name, {"Succeeded", "Failed"})["status"]["phase"] == "Succeeded"

    # A run on another ref is not held.
    other = env.create_run(**on(env, "HEAD"))
    assert env.wait(other, {"Succeeded", "Failed", "AwaitingApproval"})["status"]["phase"] == "Succeeded"

    denied = env.create_run(**on(env, "main"))
    env.wait(denied, {"AwaitingApproval"})
    approval = env.store.get(kinds.APPROVAL, "default", f"{denied}-dispatch")
    env.store.update_status(kinds.APPROVAL, {**approval, "status": {"phase": "Denied", "decidedBy": "bo",
                                                                    "reason": "not on a Friday"}})
    run = env.wait(denied, {"Failed", "Succeeded"})
    assert run["status"]["reason"] == "ApprovalDenied"
    assert "bo" in run["status"]["message"] and "not on a Friday" in run["status"]["message"]


def test_an_agent_requiring_approval_and_a_policy_share_one_approval(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p", requiresApproval=True), MAIN_NEEDS_APPROVAL)
    name = env.create_run(**on(env, "main"))
    env.wait(name, {"AwaitingApproval"})
    approvals = [a for a in env.store.list(kinds.APPROVAL).items if a["spec"]["runRef"]["name"] == name]
    assert len(approvals) == 1 and approvals[0]["spec"]["policyRef"]["rule"] == "main-needs-approval"


def test_a_dispatch_deny_fails_the_run_policy_denied(make_env: Callable[..., Env],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env()
    audited: list[AuditEntry] = []
    # The audit backend is another section's; what this one owes is the call.
    monkeypatch.setattr(env.store, "audit", audited.append)
    env.apply(provider("p", script("pass")), agent("a", "p"), policy("no-secrets", [{
        "name": "no-secret-runs", "phase": "dispatch",
        "expression": "has(run.spec.secrets) && size(run.spec.secrets) > 0 || "
                      'agent.spec.providerRef.name == "p" && provider.spec.binary != "" && '
                      'implementation.text == "forbidden"',
        "message": "this work is not for agents"}]))
    name = env.create_run(text="forbidden")
    run = env.wait(name, {"Failed", "Succeeded", "AwaitingApproval"})
    assert run["status"]["phase"] == "Failed" and run["status"]["reason"] == "PolicyDenied"
    assert run["status"]["message"] == ('denied by Policy default/no-secrets rule "no-secret-runs": this work is '
                                        "not for agents")
    assert ("PolicyDenied", run["status"]["message"]) in env.events(name)
    [entry] = audited
    assert (entry.verb, entry.kind, entry.name, entry.decision) == ("dispatch", "AgentRun", name, "denied")
    assert entry.reason == 'Policy default/no-secrets rule "no-secret-runs": this work is not for agents'
    fine = env.create_run(text="allowed")
    assert env.wait(fine, {"Failed", "Succeeded"})["status"]["phase"] == "Succeeded"


def test_a_dispatch_warning_is_an_event_and_the_run_goes_on(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p"), policy("heads-up", [{
        "name": "creator", "phase": "dispatch", "action": "warn", "expression": 'request.user == ""',
        "message": "nobody recorded as creator"}]))
    name = env.create_run()
    assert env.wait(name, {"Failed", "Succeeded"})["status"]["phase"] == "Succeeded"
    assert any(reason == "PolicyWarning" and "nobody recorded" in message for reason, message in env.events(name))
    assert json.dumps(env.run(name))  # the run itself is untouched by the warning
