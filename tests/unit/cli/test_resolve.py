"""Kind names resolve like kubectl's, from the server's discovery documents."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest

from joch.api import REGISTRY, errors
from joch.cli import resolve

# The shape Kubernetes (and joch server) answer at /apis/{group}/{version}, subresources included.
WIDGETS: dict[str, Any] = {
    "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "example.com/v2",
    "resources": [
        {"name": "widgets", "singularName": "widget", "namespaced": False, "kind": "Widget",
         "shortNames": ["wd"], "verbs": ["get", "list"]},
        {"name": "widgets/status", "singularName": "", "namespaced": False, "kind": "Widget"},
        {"name": "agents", "namespaced": True, "kind": "Agent"},
    ],
}


def joch_documents() -> list[dict[str, Any]]:
    """Discovery documents for the local registry, in the Kubernetes shape (the integration tests
    check the CLI against the real server's)."""
    by_group_version: dict[str, list[dict[str, Any]]] = {}
    for info in REGISTRY:
        by_group_version.setdefault(info.api_version, []).append(
            {"name": info.plural, "singularName": info.singular, "namespaced": info.namespaced,
             "kind": info.kind, "shortNames": list(info.short_names),
             "categories": list(info.categories)})
    return [{"kind": "APIResourceList", "groupVersion": gv, "resources": resources}
            for gv, resources in by_group_version.items()]


@pytest.fixture
def discovery() -> resolve.Discovery:
    return resolve.Discovery.from_documents([*joch_documents(), WIDGETS])


@pytest.mark.parametrize("name", ["agents", "agent", "Agent", "AGENTS", "ag", "agents.joch.dev",
                                  "agent.joch.dev", "Agent.joch.dev", "agents.v1alpha1.joch.dev"])
def test_every_kubectl_spelling_resolves(discovery: resolve.Discovery, name: str) -> None:
    rt = discovery.resolve(name)
    assert (rt.group, rt.kind, rt.plural) == ("joch.dev", "Agent", "agents")


def test_short_names_and_singular_names(discovery: resolve.Discovery) -> None:
    assert discovery.resolve("run").kind == "AgentRun"
    assert discovery.resolve("ap").kind == "AgentProvider"
    assert discovery.resolve("wd").plural == "widgets"
    assert discovery.resolve("ev").qualified_plural == "events.ops.joch.dev"


def test_the_first_group_wins_an_ambiguous_name_and_a_group_picks_the_other(discovery: resolve.Discovery) -> None:
    assert discovery.resolve("agents").group == "joch.dev"
    assert discovery.resolve("agents.example.com").group == "example.com"


def test_subresources_are_not_resource_types(discovery: resolve.Discovery) -> None:
    assert all("/" not in rt.plural for rt in discovery)
    with pytest.raises(errors.NotFound):
        discovery.resolve("widgets/status")


def test_unknown_names_are_not_found_with_a_hint(discovery: resolve.Discovery) -> None:
    with pytest.raises(errors.NotFound, match=r"resource type \"gizmos\" \(see `joch api-resources`\)"):
        discovery.resolve("gizmos")


@pytest.mark.parametrize(("typed", "meant"), [("agnets", "agents"), ("Agnet", "agent"), ("widgts", "widgets")])
def test_a_misspelt_resource_type_gets_a_did_you_mean(discovery: resolve.Discovery, typed: str, meant: str) -> None:
    with pytest.raises(errors.NotFound) as caught:
        discovery.resolve(typed)
    assert caught.value.message == (f'the server doesn\'t have a resource type "{typed}"; did you mean "{meant}"? '
                                    "(see `joch api-resources`)")
    with pytest.raises(errors.NotFound, match=f'did you mean "{meant}"'):
        discovery.resolve_many(f"ap,{typed}")


def test_a_misspelt_kind_in_a_manifest_gets_a_did_you_mean(discovery: resolve.Discovery) -> None:
    with pytest.raises(errors.NotFound) as caught:
        discovery.for_object("joch.dev/v1alpha1", "Agnet")
    assert caught.value.message == ('no matches for kind "Agnet" in version "joch.dev/v1alpha1"; '
                                    "did you mean kind: Agent?")


def test_for_object_matches_api_version_and_kind(discovery: resolve.Discovery) -> None:
    assert discovery.for_object("joch.dev/v1alpha1", "Agent").plural == "agents"
    with pytest.raises(errors.NotFound, match=r"serves Agent in example.com/v2, joch.dev/v1alpha1"):
        discovery.for_object("joch.dev/v9", "Agent")


def test_paths_follow_the_kubernetes_layout(discovery: resolve.Discovery) -> None:
    agents = discovery.resolve("agents")
    assert agents.path(namespace="dev") == "/apis/joch.dev/v1alpha1/namespaces/dev/agents"
    assert agents.path(namespace="dev", name="x") == "/apis/joch.dev/v1alpha1/namespaces/dev/agents/x"
    assert agents.path(namespace=None) == "/apis/joch.dev/v1alpha1/agents"
    widgets = discovery.resolve("widgets")
    assert widgets.path(namespace="ignored", name="w") == "/apis/example.com/v2/widgets/w"
    assert agents.qualified_kind == "agent.joch.dev"


class FakeServer:
    def __init__(self) -> None:
        self.calls: list[str] = []
        named = [d for d in joch_documents() if "/" in d["groupVersion"]]  # the core group (v1) is /api
        self.documents = {f"/apis/{d['groupVersion']}": d for d in named}
        groups = [{"name": gv.split("/")[0], "preferredVersion": {"groupVersion": gv},
                   "versions": [{"groupVersion": gv}]} for gv in (d["groupVersion"] for d in named)]
        self.documents["/apis"] = {"kind": "APIGroupList", "groups": groups}
        self.documents["/api"] = {"kind": "APIVersions", "versions": ["v1"]}
        self.documents["/api/v1"] = next(d for d in joch_documents() if d["groupVersion"] == "v1")

    def get_object(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        self.calls.append(path)
        return self.documents[path]


def test_discover_walks_the_preferred_version_of_every_group() -> None:
    server = FakeServer()
    found = resolve.discover(server)
    named_groups = {i.group for i in REGISTRY if i.group}
    assert server.calls[0] == "/apis" and len(server.calls) == 1 + len(named_groups) + 2
    assert server.calls[-2:] == ["/api", "/api/v1"]  # the core group last: Namespaces
    assert {rt.kind for rt in found} == {i.kind for i in REGISTRY}


def test_names_are_escaped_and_names_that_would_address_another_url_are_refused(
    discovery: resolve.Discovery,
) -> None:
    agents = discovery.resolve("agents")
    escaped = agents.path(namespace="default", name="a#b?c d")
    assert escaped == "/apis/joch.dev/v1alpha1/namespaces/default/agents/a%23b%3Fc%20d"
    for name in (".", "..", "a/b"):
        with pytest.raises(errors.BadRequest, match=f'invalid name "{re.escape(name)}"'):
            agents.path(namespace="default", name=name)
    with pytest.raises(errors.BadRequest, match=r'invalid namespace "\.\."'):
        agents.path(namespace="..")


def test_comma_lists_and_categories(discovery: resolve.Discovery) -> None:
    assert [rt.plural for rt in discovery.resolve_many("agents,ap,ag")] == ["agents", "agentproviders"]
    everything = [rt.plural for rt in discovery.resolve_many("all")]
    assert "agents" in everything and "agentruns" in everything
    assert "secrets" not in everything and "events" not in everything  # as kubectl leaves them out
    with pytest.raises(errors.NotFound, match='"gadgets"'):
        discovery.resolve_many("agents,gadgets")
    with pytest.raises(errors.BadRequest, match="empty resource type"):
        discovery.resolve_many("agents,")
