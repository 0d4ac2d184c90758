"""The writeBack phase: rules that see a WriteIntent (``object``) and its run, selected by either."""

from __future__ import annotations

from typing import Any

from joch.api import kinds
from joch.api.registry import KindInfo
from joch.policy import decisions, rules
from joch.store.base import Obj


class Dicts:
    """A ``decisions.Source`` over lists of objects (what ``joch policy test`` does with its files)."""

    def __init__(self, *objs: Obj) -> None:
        self.objs = list(objs)
        self.activation = None

    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj | None:
        return next((o for o in self.list(kind, namespace) if o["metadata"]["name"] == name), None)

    def list(self, kind: KindInfo, namespace: str | None) -> list[Obj]:
        return [o for o in self.objs if o.get("kind") == kind.kind
                and (namespace is None or o["metadata"].get("namespace") == namespace)]


def policy(name: str, *rule_list: dict[str, Any], **selector: Any) -> Obj:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Policy",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-wb-{name}", "resourceVersion": "1"},
            "spec": {"selector": selector, "rules": list(rule_list)}}


def rule(name: str, expression: str, action: str, phase: str = "writeBack") -> dict[str, Any]:
    return {"name": name, "expression": expression, "action": action, "phase": phase, "message": f"{name} says so"}


RUN: Obj = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": "r1", "namespace": "default", "labels": {"team": "a"},
                         "annotations": {kinds.CREATED_BY: "alice"}},
            "spec": {"agentRef": {"name": "coder"}, "implementation": {"inline": {"text": "x"}}}}
AGENT: Obj = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "coder", "namespace": "default"},
              "spec": {"providerRef": {"name": "p"}}}


def intent(kind: str) -> Obj:
    return {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "WriteIntent",
            "metadata": {"name": f"r1-{kind}", "namespace": "default", "labels": {"joch.dev/run": "r1"}},
            "spec": {"type": kind, "runRef": {"name": "r1"}, "target": {"provider": "github", "owner": "acme"}}}


def test_write_back_rules_see_the_intent_and_its_run() -> None:
    source = Dicts(AGENT, policy("gate", rule("prs", 'object.spec.type == "pullRequest" && agent.metadata.name == '
                                                     '"coder" && request.user == "alice"', "requireApproval"),
                                 rule("acme", 'object.spec.target.owner == "other"', "deny"),
                                 rule("not-now", "true", "deny", phase="dispatch")))
    fired = decisions.write_back(source, intent("pullRequest"), RUN)
    assert [(o.rule.name, o.action) for o in fired] == [("prs", "requireApproval")]
    assert fired[0].reason == 'Policy default/gate rule "prs": prs says so'
    assert decisions.write_back(source, intent("comment"), RUN) == []
    # the dispatch rule of the same Policy still fires at dispatch only
    assert [o.rule.name for o in decisions.dispatch(source, RUN)] == ["not-now"]


def test_a_policy_selects_by_the_intent_or_by_its_run() -> None:
    source = Dicts(policy("runs", rule("by-run", "true", "warn"), kinds=["AgentRun"], matchLabels={"team": "a"}),
                   policy("intents", rule("by-intent", "true", "warn"), kinds=["WriteIntent"]),
                   policy("team-b", rule("elsewhere", "true", "deny"), matchLabels={"team": "b"}))
    fired = decisions.write_back(source, intent("comment"), RUN)
    assert sorted(o.rule.name for o in fired) == ["by-intent", "by-run"]


def test_each_phase_keeps_its_own_rules() -> None:
    compiled = rules.compiled(policy("three", rule("a", "true", "deny", "admission"),
                                     rule("d", "true", "deny", "dispatch"), rule("w", "object.x", "warn")))
    assert [r.name for r in compiled.phase("admission")] == ["a"]
    assert [r.name for r in compiled.phase("dispatch")] == ["d"]
    assert [r.name for r in compiled.phase("writeBack")] == ["w"]
    assert compiled.reads("writeBack") == frozenset({"object"})
