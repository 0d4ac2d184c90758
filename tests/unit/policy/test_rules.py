"""Policies compiled once, narrowed by their selectors, and failing closed."""

from __future__ import annotations

from typing import Any

from joch.policy import rules


def policy(name: str, *rule_list: dict[str, Any], namespace: str = "default", uid: str = "",
           **selector: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Policy",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
                         "resourceVersion": "1"},
            "spec": {"selector": selector, "rules": list(rule_list)}}


def rule(name: str, expression: str, action: str = "deny", phase: str = "admission", message: str = "no") -> dict[
        str, Any]:
    return {"name": name, "expression": expression, "action": action, "phase": phase, "message": message}


def obj(kind: str = "Agent", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": "x", "namespace": "default", "labels": labels or {}}}


def env(name: str, *namespaces: str) -> dict[str, Any]:
    return {"kind": "Environment", "metadata": {"name": name}, "spec": {"namespaces": list(namespaces)}}


def test_selectors_narrow_by_kind_labels_and_environment() -> None:
    policies = [
        policy("any", rule("r", "true")),
        policy("agents", rule("r", "true"), kinds=["ag"]),  # a short name selects its kind
        policy("runs", rule("r", "true"), kinds=["AgentRun"]),
        policy("team-a", rule("r", "true"), matchLabels={"team": "a"}),
        policy("prod", rule("r", "true"), environments=["prod"]),
        policy("dev", rule("r", "true"), environments=["dev"]),
    ]
    envs = rules.environments_of("default", [env("prod", "default", "other"), env("dev", "sandbox")])
    assert [e["metadata"]["name"] for e in envs] == ["prod"]
    chosen = rules.applicable(policies, obj("Agent", {"team": "a"}), envs)
    assert sorted(p.name for p in chosen) == ["agents", "any", "prod", "team-a"]
    chosen = rules.applicable(policies, obj("AgentRun", {"team": "b"}), [])
    assert sorted(p.name for p in chosen) == ["any", "runs"]


def test_joch_system_policies_come_first() -> None:
    chosen = rules.applicable([policy("b", rule("r", "true")),
                               policy("a", rule("r", "true"), namespace=rules.SYSTEM_NAMESPACE)], obj(), [])
    assert [p.ref for p in chosen] == ["joch-system/a", "default/b"]


def test_evaluate_reports_what_fired_per_phase() -> None:
    compiled = [rules.compiled(policy("p", rule("deny-it", 'object.kind == "Agent"', message="agents are out"),
                                      rule("fine", "false"), rule("warn-it", "true", action="warn"),
                                      rule("later", "true", phase="dispatch", action="requireApproval"),
                                      uid="u-fired"))]
    fired = rules.evaluate(compiled, "admission", {"object": obj()})
    assert [(o.rule.name, o.action) for o in fired] == [("deny-it", "deny"), ("warn-it", "warn")]
    assert fired[0].reason == 'Policy default/p rule "deny-it": agents are out'
    fired = rules.evaluate(compiled, "dispatch", {"object": obj()})
    assert [(o.rule.name, o.action) for o in fired] == [("later", "requireApproval")]


def test_a_failing_rule_fails_closed_and_says_why() -> None:
    compiled = [rules.compiled(policy("p", rule("boom", "object.spec.missing == 1", message="m"),
                                      rule("int", "1 + 1", action="requireApproval", phase="dispatch"),
                                      rule("soft", "object.spec.missing == 1", action="warn"), uid="u-fail"))]
    fired = rules.evaluate(compiled, "admission", {"object": {**obj(), "spec": {}}})
    assert [(o.rule.name, o.action, o.failed) for o in fired] == [("boom", "deny", True), ("soft", "warn", True)]
    assert "no such key: missing" in fired[0].message and fired[0].message.startswith("m (")
    fired = rules.evaluate(compiled, "dispatch", {"object": obj()})
    assert fired[0].action == "deny" and "must evaluate to true or false" in fired[0].message


def test_compiled_policies_are_cached_by_uid_and_resource_version() -> None:
    first = policy("cached", rule("r", "true"), uid="u-1")
    assert rules.compiled(first) is rules.compiled(dict(first))
    changed = {**first, "metadata": {**first["metadata"], "resourceVersion": "2"},
               "spec": {"rules": [rule("r", "false")]}}
    assert rules.compiled(changed) is not rules.compiled(first)
    assert rules.evaluate([rules.compiled(changed)], "admission", {"object": obj()}) == []


def test_only_the_fields_rules_read_are_handed_to_cel_and_the_answers_do_not_change() -> None:
    agent = {"kind": "Agent", "metadata": {"name": "coder", "namespace": "default", "labels": {"team": "a"}},
             "spec": {"providerRef": {"name": "codex"}, "env": [{"name": "A", "value": "1"}]}}
    cases = {
        'object.metadata.name.startsWith("co")': True,  # a method call is not a field
        "has(object.metadata.labels) && object.metadata.labels.size() == 1": True,
        'has(object.spec.missing) || object.spec.env.exists(e, e.name == "A")': True,
        'object.metadata.labels["team"] == "a"': True,
        'object["spec"].providerRef.name == "codex"': True,  # read whole
        "object.spec == {}": False,
        'object.kind == "Agent" && object != null': True,  # a bare use: whole
    }
    for i, (expression, expected) in enumerate(cases.items()):
        compiled = rules.compiled(policy(f"prune-{i}", rule("r", expression), uid=f"u-prune-{i}"))
        fired = rules.evaluate([compiled], "admission", {"object": agent})
        assert (fired != []) is expected, expression
        assert not any(o.failed for o in fired), fired[0].message
