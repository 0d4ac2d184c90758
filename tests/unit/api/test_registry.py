from __future__ import annotations

import pytest
from pydantic import BaseModel

from joch.api import REGISTRY, errors
from joch.api.kinds import AGENT, AGENT_RUN
from joch.api.registry import KindInfo, Registry


@pytest.mark.parametrize("name", ["Agent", "agent", "agents", "ag", "agents.joch.dev", "agent.joch.dev"])
def test_resolve_like_kubectl(name: str) -> None:
    assert REGISTRY.resolve(name) is AGENT


@pytest.mark.parametrize("name", ["run", "agentruns", "AgentRun", "agentruns.runtime.joch.dev"])
def test_resolve_agent_run(name: str) -> None:
    assert REGISTRY.resolve(name) is AGENT_RUN


def test_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(errors.NotFound, match=r'resource type "widgets".*agents'):
        REGISTRY.resolve("widgets")


def test_for_object_suggests_the_right_api_version() -> None:
    with pytest.raises(errors.NotFound, match=r"did you mean apiVersion: joch\.dev/v1alpha1"):
        REGISTRY.for_object("v1", "Agent")


def test_the_issue_kinds_are_registered() -> None:
    assert {(k.group, k.kind) for k in REGISTRY} >= {
        ("joch.dev", "Agent"), ("joch.dev", "AgentProvider"), ("joch.dev", "ImplementationSpec"),
        ("joch.dev", "Policy"), ("runtime.joch.dev", "AgentRun"), ("runtime.joch.dev", "Approval"),
        ("ops.joch.dev", "Secret"), ("ops.joch.dev", "Event"),
    }


def test_registering_twice_fails() -> None:
    registry = Registry()
    registry.register(AGENT)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(AGENT)


def test_a_new_kind_is_one_declaration() -> None:
    registry = Registry()
    info = registry.register(KindInfo(group="example.dev", version="v1", kind="Widget", plural="widgets",
                                      spec_model=AGENT.spec_model, status_model=AGENT.status_model,
                                      short_names=("wd",)))
    assert registry.resolve("wd") is info and info.resource == "widgets.example.dev"
    assert registry.for_route("example.dev", "v1", "widgets") is info


def test_a_kind_with_sensitive_fields_must_keep_only_its_latest_change() -> None:
    from joch.api.kinds import LEASE, SECRET, SecretSpec, SecretStatus

    assert (SECRET.history, SECRET.sensitive, LEASE.history, AGENT.history) == (
        "latest", ("spec.data",), "latest", "full")
    with pytest.raises(ValueError, match="Vault has sensitive fields, so its history must be 'latest'"):
        KindInfo(group="x.dev", version="v1", kind="Vault", plural="vaults", spec_model=SecretSpec,
                 status_model=SecretStatus, sensitive=("spec.data",))


def test_a_kind_may_keep_its_fields_at_the_top_level_like_a_kubernetes_role_binding() -> None:
    from joch.api.kinds import ROLE_BINDING, SECRET, RoleBindingSpec

    assert (ROLE_BINDING.body, ROLE_BINDING.status_model, AGENT.body) == ("top", None, "spec")
    assert ROLE_BINDING.top_level == ("apiVersion", "kind", "metadata", "roleRef", "subjects")
    assert AGENT.top_level == ("apiVersion", "kind", "metadata", "spec", "status")
    obj = {"apiVersion": "a", "kind": "k", "metadata": {}, "roleRef": {"name": "x"}, "status": {}}
    assert ROLE_BINDING.body_of(obj) == {"roleRef": {"name": "x"}}
    assert AGENT.body_of({"spec": {"a": 1}, "roleRef": {}}) == {"a": 1} and AGENT.body_of({}) is None
    assert ROLE_BINDING.with_body({"kind": "k"}, {"roleRef": {}}) == {"kind": "k", "roleRef": {}}
    assert AGENT.with_body({"kind": "k"}, {"a": 1}) == {"kind": "k", "spec": {"a": 1}}
    with pytest.raises(ValueError, match="keeps its fields under spec, so it needs a status_model"):
        KindInfo(group="x.dev", version="v1", kind="Bare", plural="bares", spec_model=RoleBindingSpec,
                 status_model=None)

    class Clash(BaseModel):
        metadata: dict[str, str] = {}
        spec: dict[str, str] = {}

    with pytest.raises(ValueError, match=r"cannot have the top-level field\(s\) metadata, spec"):
        KindInfo(group="x.dev", version="v1", kind="Odd", plural="odds", spec_model=Clash, status_model=None,
                 body="top")
    assert SECRET.body == "spec"
