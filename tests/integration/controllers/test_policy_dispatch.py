"""Dispatch policies in the run controller, end to end (real store, manager and runner): a rule
requiring approval for runs on ``main`` holds such a run in AwaitingApproval with an Approval that
names the rule; approving it runs it, denying it fails it with the reason; a deny rule fails the
run ``PolicyDenied``. Uses the harness of ``test_runs``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from integration.controllers import test_runs
from integration.controllers.test_runs import Env, agent, provider, script
from joch.api import kinds
from joch.api.audit import AuditEntry
from joch.api.integrations import TRIGGER_RULE
from joch.controllers.triggers import evaluate

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


# --- triggered runs (issue 10: "dispatch policies and budgets from governance apply to triggered runs")


def trigger_rule(env: Env, name: str, **run: Any) -> dict[str, Any]:
    """A manual-only TriggerRule whose run is agent ``a`` on the harness's repository."""
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": name},
            "spec": {"run": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "do it"}},
                             **on(env, "HEAD"), **run}}}


def fire(env: Env, rule: str) -> dict[str, Any]:
    """Evaluate ``rule`` as ``joch trigger fire`` does: the TriggerExecution it recorded."""
    return evaluate(env.store, env.store.get(TRIGGER_RULE, "default", rule), None, kind="manual", now=time.time())


def test_triggered_runs_meet_admission_and_dispatch_policies_and_budgets(make_env: Callable[..., Env]) -> None:
    """A triggered run is created as ``system:joch:trigger:<namespace>:<rule>``; admission Policies,
    dispatch Policies and Budgets see it as they see any run."""
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p"), policy("triggered", [
        {"name": "no-refused-rule", "expression": 'request.user == "system:joch:trigger:default:refused"',
         "message": "this rule may not start runs"},
        {"name": "denied-at-dispatch", "phase": "dispatch",
         "expression": 'request.user == "system:joch:trigger:default:denied"', "message": "not this one"},
        {"name": "held-for-a-look", "phase": "dispatch", "action": "requireApproval",
         "expression": 'request.user == "system:joch:trigger:default:held"', "message": "look first"}]),
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Budget", "metadata": {"name": "daily"},
         "spec": {"period": "day", "limitUsd": 1, "onExceed": "deny"}},
        trigger_rule(env, "fine"), trigger_rule(env, "refused"), trigger_rule(env, "denied"),
        trigger_rule(env, "held"), trigger_rule(env, "costly", budgetUsd=5))

    fine = fire(env, "fine")
    assert fine["spec"]["decision"] == "Dispatched", fine
    run = env.wait(fine["spec"]["runRef"]["name"], {"Succeeded", "Failed", "AwaitingApproval"})
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["metadata"]["annotations"][kinds.CREATED_BY] == "system:joch:trigger:default:fine"

    # Admission: the run is refused, the execution says so naming the Policy and its rule.
    refused = fire(env, "refused")
    assert (refused["spec"]["decision"], refused["spec"]["reason"]) == ("Rejected", "Invalid"), refused
    assert "triggered" in refused["spec"]["message"] and "no-refused-rule" in refused["spec"]["message"], refused
    assert not [r for r in env.store.list(kinds.AGENT_RUN).items
                if r["metadata"]["annotations"].get(kinds.CREATED_BY) == "system:joch:trigger:default:refused"]

    # Dispatch: denied, and held for an Approval naming the rule.
    denied = fire(env, "denied")
    run = env.wait(denied["spec"]["runRef"]["name"], {"Succeeded", "Failed", "AwaitingApproval"})
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "PolicyDenied"), run["status"]
    assert 'rule "denied-at-dispatch": not this one' in run["status"]["message"]
    held = fire(env, "held")
    name = held["spec"]["runRef"]["name"]
    run = env.wait(name, {"Succeeded", "Failed", "AwaitingApproval"})
    assert run["status"]["phase"] == "AwaitingApproval", run["status"]
    approval = env.store.get(kinds.APPROVAL, "default", f"{name}-dispatch")
    assert approval["spec"]["policyRef"]["rule"] == "held-for-a-look"

    # Budget: the rule's budgetUsd (5) does not fit the namespace's $1 a day.
    costly = fire(env, "costly")
    run = env.wait(costly["spec"]["runRef"]["name"], {"Succeeded", "Failed", "AwaitingApproval"})
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "BudgetExceeded"), run["status"]
    assert 'Budget "daily"' in run["status"]["message"], run["status"]
