"""``joch.api.openapi``: each kind's schema is structural, accepts every example manifest, and its
extra rules (list types, patterns, CEL) reject what admission rejects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from joch.api import REGISTRY, kinds
from joch.api.openapi import PRESERVE, field, kind_schema, type_name
from joch.api.registry import KindInfo
from support.schemas import structural_problems, violations

EXAMPLES = Path(__file__).parents[3] / "examples"


@pytest.mark.parametrize("info", list(REGISTRY), ids=lambda info: info.key)
def test_every_kind_schema_is_structural(info: KindInfo) -> None:
    assert structural_problems(kind_schema(info)) == []


def test_fields_keep_their_types_enums_defaults_and_descriptions() -> None:
    agent = kind_schema(kinds.AGENT)
    assert agent["required"] == ["spec"]
    assert field(agent, ["spec", "providerRef", "name"]) == {"type": "string", "minLength": 1}
    assert "AgentProvider" in field(agent, ["spec", "providerRef"])["description"]  # from the reference
    runtime_type = field(agent, ["spec", "runtime", "type"])
    assert runtime_type["enum"][:2] == ["local", "kubernetes"] and runtime_type["default"] == "local"
    assert field(agent, ["spec", "description"]) == {"type": "string", "nullable": True}
    assert field(agent, ["spec", "defaults", "budgetUsd"]) == {"type": "number", "minimum": 0, "nullable": True}
    network = field(agent, ["spec", "security", "network"])
    assert network["description"].startswith("The agent's network in the sandbox")  # the model's docstring
    assert type_name(field(agent, ["spec", "env"])) == "[]Object"
    assert type_name(field(agent, ["spec", "defaults", "parameters"])) == "map[string]string"
    assert field(agent, ["status", "conditions", "status"])["enum"] == ["True", "False", "Unknown"]


def test_only_free_form_fields_and_mixed_unions_preserve_unknown_fields() -> None:
    def preserved(node: dict[str, Any], path: str) -> list[str]:
        out = [path] if node.get(PRESERVE) else []
        for name, sub in node.get("properties", {}).items():
            out += preserved(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            out += preserved(node["items"], f"{path}[]")
        return out

    assert set(preserved(kind_schema(kinds.AGENT), "")) == {
        ".spec.runtime.config",  # dict[str, Any]
        ".spec.resources.cpu",  # a string or a number
    }
    assert preserved(kind_schema(kinds.AGENT_PROVIDER), "") == [
        ".spec.argsTemplate[]", ".spec.workload.resources.cpu", ".spec.workload.volumes[]"]


def test_a_body_top_kind_has_its_fields_at_the_top_and_no_spec() -> None:
    schema = kind_schema(kinds.ROLE_BINDING)
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "roleRef", "subjects"}
    assert schema["required"] == ["roleRef"]
    assert field(schema, ["roleRef", "name"])["enum"] == ["viewer", "editor", "approver", "admin"]


def _examples() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if isinstance(doc, dict) and "kind" in doc:
                out.append((f"{path.relative_to(EXAMPLES)}#{i}", doc))
    return out


@pytest.mark.parametrize(("where", "doc"), _examples(), ids=[w for w, _ in _examples()])
def test_every_example_manifest_satisfies_its_schema(where: str, doc: dict[str, Any]) -> None:
    info = REGISTRY.for_object(doc["apiVersion"], doc["kind"])
    assert violations(kind_schema(info), doc) == [], where


def _agent(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
            "spec": {"providerRef": {"name": "p"}, **spec}}


def _provider(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
            "spec": {"binary": "echo", **spec}}


def _example(kind: str, name: str, **spec: Any) -> dict[str, Any]:
    """An example manifest of ``examples/integrations/github.yaml`` with ``spec`` keys replaced (None: removed)."""
    doc = next(d for _, d in _examples() if d["kind"] == kind and d["metadata"]["name"] == name)
    merged = {k: v for k, v in {**doc["spec"], **spec}.items() if v is not None}
    return {**doc, "spec": merged}


REJECTED = {
    "github source without github": _example("ImplementationSource", "acme-web", github=None),
    "linear source with github": _example(
        "ImplementationSource", "acme-web", provider="linear",
        linear={"teamKey": "ENG", "auth": {"apiKeySecretRef": {"name": "l", "key": "k"}}}),
    "trigger rule with two triggers": _example("TriggerRule", "demo-on-label", schedule={"cron": "0 * * * *"}),
    "issue trigger without sourceRef": _example("TriggerRule", "demo-on-label", sourceRef=None),

    "network allow without mode limited": _agent(security={"network": {"mode": "on", "allow": ["a.example"]}}),
    "env name with =": _agent(env=[{"name": "A=B", "value": "x"}]),
    "artifact named changes.patch": _provider(outputArtifacts=[{"name": "changes.patch", "path": "x"}]),
    "artifact name with a slash": _provider(outputArtifacts=[{"name": "a/b", "path": "x"}]),
    "duplicate artifact names": _provider(outputArtifacts=[{"name": "a", "path": "x"}, {"name": "a", "path": "y"}]),
    "duplicate parameters": _provider(parameters=[{"name": "a"}, {"name": "a"}]),
    "parameter name with a dash": _provider(parameters=[{"name": "base-url"}]),
    "requireApproval at admission": {
        "apiVersion": "joch.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "p"},
        "spec": {"rules": [{"name": "r", "expression": "true", "action": "requireApproval"}]}},
    "duplicate policy rule names": {
        "apiVersion": "joch.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "p"},
        "spec": {"rules": [{"name": "r", "expression": "true"}, {"name": "r", "expression": "false"}]}},
    "duplicate environment namespaces": {
        "apiVersion": "ops.joch.dev/v1alpha1", "kind": "Environment", "metadata": {"name": "prod"},
        "spec": {"namespaces": ["a", "a"]}},
    "duplicate subjects": {
        "apiVersion": "ops.joch.dev/v1alpha1", "kind": "RoleBinding", "metadata": {"name": "b"},
        "roleRef": {"name": "viewer"},
        "subjects": [{"kind": "User", "name": "u"}, {"kind": "User", "name": "u"}]},
}


@pytest.mark.parametrize("case", list(REJECTED))
def test_the_schema_rejects_what_admission_rejects(case: str) -> None:
    doc = REJECTED[case]
    info = REGISTRY.for_object(doc["apiVersion"], doc["kind"])
    body = info.body_of(doc)
    problems = list(info.spec_model.model_validate(body).problems())  # type: ignore[attr-defined]
    assert problems, f"admission accepts {case}: the schema must not reject it"
    assert violations(kind_schema(info), doc), case


@pytest.mark.parametrize("case", ["network allow with mode limited", "distinct names"])
def test_the_rules_accept_what_admission_accepts(case: str) -> None:
    doc = (_agent(security={"network": {"mode": "limited", "allow": ["a.example:443"]}})
           if case == "network allow with mode limited" else
           _provider(parameters=[{"name": "a"}, {"name": "b"}],
                     outputArtifacts=[{"name": "a.txt", "path": "x"}, {"name": "b", "path": "y"}]))
    info = REGISTRY.for_object(doc["apiVersion"], doc["kind"])
    assert list(info.spec_model.model_validate(info.body_of(doc)).problems()) == []  # type: ignore[attr-defined]
    assert violations(kind_schema(info), doc) == []
