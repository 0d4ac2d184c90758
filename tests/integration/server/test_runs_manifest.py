"""``GET /v1/namespaces/{ns}/agents/{name}/manifest``: the compiled manifest, or the problems."""

from __future__ import annotations

from joch.server.testing import LiveServer, is_status
from support import provider

MANIFEST = "/v1/namespaces/default/agents/{}/manifest"


def agent(name: str, provider_name: str) -> dict[str, object]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
            "spec": {"providerRef": {"name": provider_name}}}


def test_a_compiled_manifest_with_its_hash_as_etag(server: LiveServer) -> None:
    server.create(provider("p", binary="codex"))
    server.create(agent("a", "p"))
    r = server.http.get(MANIFEST.format("a"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kind"] == "CompiledAgentManifest" and body["metadata"] == {"name": "a", "namespace": "default"}
    assert body["spec"]["provider"]["binary"] == "codex"
    assert body["hash"].startswith("sha256:") and r.headers["etag"] == f'"{body["hash"]}"'
    assert server.http.get(MANIFEST.format("a")).json() == body  # deterministic


def test_an_agent_that_does_not_compile_is_a_422_listing_the_problems(server: LiveServer) -> None:
    server.create(agent("orphan", "missing"))  # accepted with a warning: the provider may come later
    r = server.http.get(MANIFEST.format("orphan"))
    body = r.json()
    assert is_status(body, 422, "Invalid"), r.text
    assert body["details"]["name"] == "orphan" and body["details"]["kind"] == "agents"
    [cause] = body["details"]["causes"]
    assert cause["reason"] == "ProviderNotFound" and 'AgentProvider "missing" not found' in cause["message"]
    assert body["message"] == f'agent "orphan" cannot be compiled: [{cause["message"]}]'


def test_a_missing_agent_is_a_404(server: LiveServer) -> None:
    r = server.http.get(MANIFEST.format("ghost"))
    assert is_status(r.json(), 404, "NotFound")
