"""Policies at admission, against the real store (SQLite and Postgres): compiled when applied,
selected by namespace, kind, labels and environment, denying atomically and warning with an Event."""

from __future__ import annotations

import json
from typing import Any

import pytest

from joch.admission.apply import apply_documents, create_object, patch_object
from joch.admission.documents import load_documents
from joch.api import errors, kinds
from joch.api.audit import AuditEntry
from joch.api.identity import RequestContext, UserInfo, acting_as
from joch.api.namespaces import NAMESPACE, namespace_object
from joch.store import Store

BINARIES = """\
apiVersion: joch.dev/v1alpha1
kind: Policy
metadata:
  name: allowed-binaries
  namespace: joch-system
spec:
  selector:
    kinds: [Agent]
  rules:
  - name: binary-allow-list
    expression: provider != null && !(provider.spec.binary in ["codex", "claude"])
    message: the agent's provider runs a binary that is not on the allow-list (codex, claude)
"""

AGENT_FILE = """\
apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata: {name: shady}
spec: {binary: /usr/local/bin/shady}
---
apiVersion: joch.dev/v1alpha1
kind: ImplementationSpec
metadata: {name: fix}
spec: {text: fix it}
---
apiVersion: joch.dev/v1alpha1
kind: Agent
metadata: {name: coder}
spec:
  providerRef: {name: shady}
"""


def apply(store: Store, text: str, source: str = "-", **kw: Any) -> Any:
    return apply_documents(store, load_documents(text, source), **kw)


def doc(kind: str, name: str, spec: dict[str, Any], *, namespace: str | None = None,
        labels: dict[str, str] | None = None, api: str = "joch.dev/v1alpha1") -> str:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = labels
    return json.dumps({"apiVersion": api, "kind": kind, "metadata": meta, "spec": spec})


def refusal(store: Store, text: str) -> str:
    """The causes' messages of the Invalid that applying ``text`` raises."""
    with pytest.raises(errors.Invalid) as caught:
        apply(store, text)
    return "; ".join(c.message for c in caught.value.causes)


def names(store: Store, kind: Any, namespace: str | None = None) -> list[str]:
    return sorted(o["metadata"]["name"] for o in store.list(kind).items
                  if namespace is None or o["metadata"].get("namespace") == namespace)


def policy(name: str, rules: list[dict[str, Any]], *, namespace: str = "default", **spec: Any) -> str:
    return doc("Policy", name, {"rules": rules, **spec}, namespace=namespace)


# --- compiling -----------------------------------------------------------------------------------

def test_a_rule_that_does_not_compile_rejects_the_policy_naming_rule_line_and_column(store: Store) -> None:
    text = """\
apiVersion: joch.dev/v1alpha1
kind: Policy
metadata: {name: broken}
spec:
  rules:
  - name: fine
    expression: object.kind == "Agent"
  - name: typo
    expression: |-
      object.kind == "Agent" &&
        objct.spec.binary == "x"
"""
    with pytest.raises(errors.Invalid) as caught:
        apply(store, text, "policy.yaml")
    [cause] = caught.value.causes
    assert cause.field == "documents[0] (Policy/broken in policy.yaml:1).spec.rules[1].expression"
    assert cause.message.startswith('rule "typo" does not compile: line 2, column 3: undeclared reference to "objct"')
    assert names(store, kinds.POLICY) == []


def test_a_syntax_error_is_reported_at_its_position(store: Store) -> None:
    with pytest.raises(errors.Invalid) as caught:
        apply(store, policy("p", [{"name": "r", "expression": 'object.spec.binary in ["a",'}]))
    assert 'rule "r" does not compile: line 1, column 28: Syntax error' in caught.value.causes[0].message


def test_require_approval_at_admission_is_refused(store: Store) -> None:
    with pytest.raises(errors.Invalid) as caught:
        apply(store, policy("p", [{"name": "r", "expression": "true", "action": "requireApproval"}]))
    [cause] = caught.value.causes
    assert cause.field.endswith("spec.rules[0].action")
    assert "requireApproval only applies when a run is dispatched" in cause.message
    assert "phase: dispatch" in cause.message


# --- the scenario --------------------------------------------------------------------------

def test_an_agent_whose_provider_binary_is_not_allowed_is_refused_and_nothing_of_the_file_is_written(
        store: Store) -> None:
    apply(store, BINARIES)
    with pytest.raises(errors.Invalid) as caught:
        apply(store, AGENT_FILE, "agent.yaml")
    exc = caught.value
    assert exc.message == "1 of 3 documents is invalid; nothing was applied"
    [cause] = exc.causes
    assert cause.field == "documents[2] (Agent/coder in agent.yaml:11)"
    assert cause.message == ('Policy joch-system/allowed-binaries rule "binary-allow-list" denied the request: the '
                             "agent's provider runs a binary that is not on the allow-list (codex, claude)")
    assert exc.code == 422
    assert names(store, kinds.AGENT_PROVIDER) == [] and names(store, kinds.IMPLEMENTATION_SPEC) == []
    assert names(store, kinds.AGENT) == [] and names(store, kinds.EVENT) == []
    # With an allowed binary, the same file applies.
    result = apply(store, AGENT_FILE.replace("/usr/local/bin/shady", "codex"), "agent.yaml")
    assert [i.action for i in result.items] == ["created", "created", "created"]


def test_a_policy_in_the_same_batch_applies_to_the_batch(store: Store) -> None:
    with pytest.raises(errors.Invalid) as caught:
        apply(store, BINARIES + "---\n" + AGENT_FILE)
    assert "binary-allow-list" in caught.value.causes[0].message
    assert names(store, kinds.POLICY) == [] and names(store, kinds.AGENT) == []


def test_a_denial_is_audited_after_the_rollback(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    apply(store, BINARIES)
    audited: list[tuple[AuditEntry, int]] = []
    # The audit backend is another section's; what this one owes is the call, outside the rolled-back
    # transaction: record what reaches the store, with the revision it sees (nothing was written).
    monkeypatch.setattr(store, "audit", lambda entry: audited.append((entry, store.current_revision())))
    before = store.current_revision()
    with acting_as(RequestContext(user=UserInfo("mallory", ("dev",)), verb="create")), pytest.raises(errors.Invalid):
        apply(store, AGENT_FILE)
    [(entry, revision)] = audited
    assert revision == before
    assert (entry.verb, entry.kind, entry.namespace, entry.name, entry.decision) == (
        "create", "Agent", "default", "coder", "denied")
    assert entry.reason.startswith('Policy joch-system/allowed-binaries rule "binary-allow-list": the agent')


# --- which policies apply ------------------------------------------------------------------------

def namespaces(store: Store, *names: str) -> None:
    """Create the namespaces a test writes into (``default`` and ``joch-system`` exist already)."""
    for name in names:
        store.create(NAMESPACE, namespace_object(name))


def test_namespace_policies_apply_in_their_namespace_only_and_joch_system_everywhere(store: Store) -> None:
    namespaces(store, "team-a", "team-b", "anything")
    deny_all = [{"name": "no-specs", "expression": "true", "message": "frozen"}]
    apply(store, policy("freeze", deny_all, namespace="team-a", selector={"kinds": ["ImplementationSpec"]}))
    apply(store, doc("ImplementationSpec", "ok", {"text": "x"}, namespace="team-b"))
    assert "Policy team-a/freeze" in refusal(store, doc("ImplementationSpec", "no", {"text": "x"}, namespace="team-a"))
    apply(store, policy("global", [{"name": "label", "expression": '!has(object.metadata.labels)',
                                    "message": "label it"}], namespace="joch-system",
                        selector={"kinds": ["ImplementationSpec"]}))
    for namespace in ("team-b", "default", "anything"):
        said = refusal(store, doc("ImplementationSpec", "n", {"text": "x"}, namespace=namespace))
        assert 'Policy joch-system/global rule "label" denied the request: label it' in said
    apply(store, doc("ImplementationSpec", "n", {"text": "x"}, namespace="team-b", labels={"a": "b"}))


def test_selectors_narrow_by_kind_labels_and_environment(store: Store) -> None:
    namespaces(store, "shop-prod", "shop-dev")
    apply(store, "\n---\n".join([
        doc("Environment", "prod", {"namespaces": ["shop-prod"]}, api="ops.joch.dev/v1alpha1"),
        doc("Environment", "dev", {"namespaces": ["shop-dev"]}, api="ops.joch.dev/v1alpha1"),
        policy("prod-only", [{"name": "r", "expression": 'namespace.environment == "prod" && environment.metadata.name'
                                                         ' == "prod"', "message": "prod"}],
               namespace="joch-system", selector={"environments": ["prod"], "kinds": ["ImplementationSpec"],
                                                  "matchLabels": {"tier": "critical"}}),
    ]))
    critical = {"tier": "critical"}
    apply(store, doc("ImplementationSpec", "a", {"text": "x"}, namespace="shop-dev", labels=critical))
    apply(store, doc("ImplementationSpec", "b", {"text": "x"}, namespace="shop-prod", labels={"tier": "low"}))
    apply(store, doc("AgentProvider", "c", {"binary": "x"}, namespace="shop-prod", labels=critical))
    said = refusal(store, doc("ImplementationSpec", "d", {"text": "x"}, namespace="shop-prod", labels=critical))
    assert said == 'Policy joch-system/prod-only rule "r" denied the request: prod'


def test_rules_see_old_object_and_request(store: Store) -> None:
    apply(store, policy("guard", [
        {"name": "no-text-change", "expression": "oldObject != null && oldObject.spec.text != object.spec.text && "
                                                 '!("leads" in request.groups)', "message": "only leads change text"},
        {"name": "creator", "expression": 'request.verb == "create" && request.user == "bot"', "message": "no bots"},
    ], selector={"kinds": ["ImplementationSpec"]}))
    with acting_as(RequestContext(user=UserInfo("ana", ("dev",)))):
        apply(store, doc("ImplementationSpec", "s", {"text": "one"}))
        with pytest.raises(errors.Invalid, match="only leads change text"):
            patch_object(store, kinds.IMPLEMENTATION_SPEC, "default", "s", {"spec": {"text": "two"}})
    with acting_as(RequestContext(user=UserInfo("lee", ("leads",)))):
        patch_object(store, kinds.IMPLEMENTATION_SPEC, "default", "s", {"spec": {"text": "two"}})
    with acting_as(RequestContext(user=UserInfo("bot"))), pytest.raises(errors.Invalid, match="no bots"):
        create_object(store, kinds.IMPLEMENTATION_SPEC, json.loads(doc("ImplementationSpec", "t", {"text": "x"})),
                      namespace="default")


def test_a_rule_that_fails_at_runtime_denies_with_the_error(store: Store) -> None:
    apply(store, policy("fragile", [{"name": "r", "expression": 'object.spec.summary == "x"', "message": "m"}],
                        selector={"kinds": ["ImplementationSpec"]}))
    with pytest.raises(errors.Invalid) as caught:
        apply(store, doc("ImplementationSpec", "s", {"text": "x"}))
    said = caught.value.causes[0].message
    assert 'rule "r" denied the request: m (the expression failed: no such key: summary)' in said


# --- warnings ------------------------------------------------------------------------------------

def test_warn_is_a_warning_and_an_event_on_the_object(store: Store) -> None:
    apply(store, policy("hygiene", [{"name": "labels", "action": "warn", "expression": "!has(object.metadata.labels)",
                                     "message": "label your agents"}], selector={"kinds": ["AgentProvider"]}))
    result = apply(store, doc("AgentProvider", "p", {"binary": "codex"}))
    assert result.warnings() == ['agentprovider.joch.dev/p: Policy default/hygiene rule "labels": label your agents']
    [event] = store.list(kinds.EVENT).items
    provider = store.get(kinds.AGENT_PROVIDER, "default", "p")
    assert event["spec"]["involvedObject"]["uid"] == provider["metadata"]["uid"]
    assert (event["spec"]["type"], event["spec"]["reason"]) == ("Warning", "PolicyWarning")
    assert "label your agents" in event["spec"]["message"]
    # Unchanged on re-apply: nothing written, nothing evaluated.
    assert apply(store, doc("AgentProvider", "p", {"binary": "codex"})).warnings() == []
    # A dry run warns and writes no Event.
    dry = apply(store, doc("AgentProvider", "q", {"binary": "codex"}), dry_run=True)
    assert len(dry.warnings()) == 1 and len(store.list(kinds.EVENT).items) == 1


def test_a_warning_about_a_cluster_scoped_object_is_an_event_in_default(store: Store) -> None:
    apply(store, policy("envs", [{"name": "empty", "action": "warn", "expression": "!has(object.spec.namespaces)",
                                  "message": "an Environment without namespaces selects nothing"}],
                        namespace="joch-system", selector={"kinds": ["Environment"]}))
    result = apply(store, doc("Environment", "qa", {}, api="ops.joch.dev/v1alpha1"))
    assert "an Environment without namespaces selects nothing" in result.warnings()[0]
    [event] = store.list(kinds.EVENT).items
    assert event["metadata"]["namespace"] == "default" and event["spec"]["involvedObject"]["name"] == "qa"


@pytest.mark.parametrize(("expression", "field"), [
    ('object.spec.binary == "/bin/sh"', "spec.binary"),
    # the most specific field read that the object holds; a guard on the kind does not win
    ('object.kind == "AgentProvider" && has(object.spec) && object.spec.binary.startsWith("/bin/")', "spec.binary"),
    # read but not held: the object itself
    ('!has(object.metadata.labels) || object.metadata.labels["x"] == ""', ""),
    ('provider == null && object.spec.binary != ""', "spec.binary"),
    ("object != null", ""),  # the whole object: no field
])
def test_a_denial_names_the_field_its_rule_reads(store: Store, expression: str, field: str) -> None:
    apply(store, policy("p", [{"name": "r", "expression": expression, "message": "no"}],
                        selector={"kinds": ["AgentProvider"]}))
    with pytest.raises(errors.Invalid) as caught:
        apply(store, doc("AgentProvider", "sh", {"binary": "/bin/sh"}), "p.yaml")
    [cause] = caught.value.causes
    assert cause.field == "documents[0] (AgentProvider/sh in p.yaml)" + (f".{field}" if field else "")
    assert cause.reason == "FieldValueForbidden"
