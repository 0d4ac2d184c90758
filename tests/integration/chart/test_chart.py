"""The ``charts/agents`` Helm chart, offline: it lints, renders with its default and local values
(and the other shapes a user may choose), every manifest it renders and every CRD in ``crds/``
validates against the Kubernetes schemas of the oldest and newest versions it supports, and what it
renders is what the Helm chart seed asks: one Deployment of ``joch server`` (non-root, read-only
root filesystem, probes), a ClusterIP Service, a ServiceAccount, RBAC only where needed, no
Ingress, database, migrations Job or backups."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from joch.api import REGISTRY
from support.helmchart import CHART, FULLNAME, NAMESPACE, container, crd_files, local_values, only

KUBE_VERSIONS = ("1.32.0", "1.37.0")
CA = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUTest\n-----END CERTIFICATE-----\n"

CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "local": local_values(),
    "postgres-from-existing-secrets-3-replicas": {
        "replicaCount": 3,
        "store": {"existingSecret": {"name": "joch-db", "key": "dsn"}},
        "auth": {"tokens": {"generate": False, "existingSecret": "joch-tokens", "key": "token.csv"}},
        "secretKey": {"existingSecret": "joch-key", "key": "ring"},
    },
    "postgres-inline-url": {"store": {"url": "postgresql://joch:s3cret@db.example:5432/joch"}},
    "oidc-only": {
        "auth": {"tokens": {"generate": False},
                 "oidc": {"issuerUrl": "https://issuer.example", "clientId": "joch", "groupsClaim": "groups",
                          "usernamePrefix": "-", "signingAlgs": "RS256,ES256", "caPem": CA}},
    },
    "kubernetes-store-and-job-runtime": {
        "replicaCount": 2,
        "store": {"url": "kubernetes://?namespace=joch-store"},
        "kubernetesRuntime": {"enabled": True, "namespace": "joch-runs", "serviceAccount": "agent-runs"},
    },
    "persistence-existing-claim": {"persistence": {"enabled": True, "existingClaim": "joch-data"}},
}

LEFT_OUT = {"Ingress", "StatefulSet", "Job", "CronJob", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "NetworkPolicy"}


@pytest.fixture(scope="module")
def rendered(render: Any) -> dict[str, list[dict[str, Any]]]:
    return {case: render(values) for case, values in CASES.items()}


@pytest.fixture(scope="module")
def server_flags() -> set[str]:
    joch = Path(sys.executable).parent / "joch"
    out = subprocess.run([str(joch), "server", "--help"], capture_output=True, text=True, check=True,
                         env={**os.environ, "COLUMNS": "200"}).stdout
    return set(re.findall(r"(--[a-z][-a-z]*)", out))


def args_of(docs: list[dict[str, Any]]) -> list[str]:
    args: list[str] = container(docs)["args"]
    return args


def flag(docs: list[dict[str, Any]], name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in args_of(docs) if a.startswith(f"{name}=")]


# --- lint and schemas --------------------------------------------------------------------------------

@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values_file", ["values.yaml", "values-local.yaml"])
def test_the_chart_lints_strict_without_a_warning(values_file: str, kube_version: str) -> None:
    values = helm.values_from_yaml((CHART / values_file).read_text())
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}")
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("case", CASES)
def test_every_rendered_manifest_validates_against_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]], case: str, kube_version: str,
) -> None:
    docs = rendered[case]
    assert docs, "nothing rendered"
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} ({case}, Kubernetes {kube_version}): "
                        f"{exc.message} at {'.'.join(map(str, exc.path))}")


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_crd_in_crds_validates_and_helm_loads_it(chart: helm.Chart, kube_version: str) -> None:
    """Passes with an empty ``crds/`` too: ``joch crds --output-dir charts/agents/crds`` fills it."""
    files = crd_files()
    groups = set(REGISTRY.groups())
    for path in files:
        for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
            assert (doc["apiVersion"], doc["kind"]) == ("apiextensions.k8s.io/v1", "CustomResourceDefinition"), path
            assert doc["spec"]["group"] in groups, f"{path.name}: group {doc['spec']['group']} is not Joch's"
            try:
                kubernetes_validate.validate(doc, kube_version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{path.name} (Kubernetes {kube_version}): {exc.message} at {'.'.join(map(str, exc.path))}")
    assert sorted(c["filename"].rsplit("/", 1)[-1] for c in chart.crds) == sorted(p.name for p in files)


# --- what is rendered -------------------------------------------------------------------------------

EXPECTED_KINDS = {
    "default": {"Deployment", "Service", "ServiceAccount", "Secret"},
    "local": {"Deployment", "Service", "ServiceAccount", "Secret", "ConfigMap", "PersistentVolumeClaim",
              "Role", "RoleBinding"},
    "postgres-from-existing-secrets-3-replicas": {"Deployment", "Service", "ServiceAccount"},
    "kubernetes-store-and-job-runtime": {"Deployment", "Service", "ServiceAccount", "Secret", "ClusterRole",
                                         "ClusterRoleBinding", "Role", "RoleBinding"},
    "persistence-existing-claim": {"Deployment", "Service", "ServiceAccount", "Secret"},
}


@pytest.mark.parametrize("case", EXPECTED_KINDS)
def test_only_the_minimal_control_plane_is_rendered(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    kinds = {d["kind"] for d in rendered[case]}
    assert kinds == EXPECTED_KINDS[case]
    assert not kinds & LEFT_OUT
    assert only(rendered[case], "Service")["spec"]["type"] == "ClusterIP"
    for doc in rendered[case]:
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] in (NAMESPACE, "joch-runs", "joch-store"), doc["metadata"]


@pytest.mark.parametrize("case", CASES)
def test_the_server_runs_non_root_on_a_read_only_root_filesystem(
    rendered: dict[str, list[dict[str, Any]]], case: str,
) -> None:
    pod = only(rendered[case], "Deployment")["spec"]["template"]["spec"]
    c = container(rendered[case])
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/tmp", "/var/lib/joch"} <= mounts, "a read-only root needs writable /tmp and data dir"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert c["args"][0] == "server" and "--host=0.0.0.0" in c["args"]


@pytest.mark.parametrize("case", CASES)
def test_every_server_flag_the_chart_passes_exists(
    rendered: dict[str, list[dict[str, Any]]], server_flags: set[str], case: str,
) -> None:
    used = {a.split("=", 1)[0] for a in args_of(rendered[case]) if a.startswith("--")}
    missing = used - server_flags
    if missing and all(f.startswith("--kube-") for f in missing) and not importlib.util.find_spec(
            "joch.runtime.kubernetes"):
        pytest.skip(f"{sorted(missing)} arrive with the Kubernetes Job runtime (joch.runtime.kubernetes)")
    assert missing == set(), f"joch server has no {sorted(missing)}"


def test_controllers_run_leader_elected_with_the_pod_name_as_identity(
    rendered: dict[str, list[dict[str, Any]]], render: Any,
) -> None:
    docs = rendered["kubernetes-store-and-job-runtime"]
    args = args_of(docs)
    assert "--controllers" in args and flag(docs, "--identity") == ["$(POD_NAME)"]
    assert flag(docs, "--lease-duration") == ["15"]
    env = {e["name"]: e for e in container(docs)["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # A shared store: replicas roll one by one; the embedded SQLite stops the old pod first.
    assert "strategy" not in only(docs, "Deployment")["spec"]
    assert only(rendered["default"], "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    on_a_claim = render({"store": {"url": "postgresql://db/joch"}, "persistence": {"enabled": True}})
    assert only(on_a_claim, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}, "ReadWriteOnce"


def test_service_names_are_accepted_hosts_and_the_api_url(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["default"]
    hosts = flag(docs, "--allowed-host")
    assert f"{FULLNAME}.{NAMESPACE}.svc" in hosts and f"{FULLNAME}.{NAMESPACE}.svc.cluster.local" in hosts
    assert flag(docs, "--api-url") == [f"http://{FULLNAME}.{NAMESPACE}.svc:8080"]
    assert "localhost" in flag(rendered["local"], "--allowed-host")


# --- configuration: Secrets, ConfigMap ---------------------------------------------------------------

def volume(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    volumes = only(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    return next(v for v in volumes if v["name"] == name)


def test_by_default_the_chart_generates_an_admin_token_and_a_key_ring(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    import base64

    docs = rendered["default"]
    data = {k: base64.b64decode(v).decode() for k, v in only(docs, "Secret")["data"].items()}
    token = data["admin-token"]
    assert len(token) >= 32 and data["tokens"] == f'{token},admin,admin,"system:masters"\n'
    assert len(base64.b64decode(data["secret.key"].strip())) == 32
    assert flag(docs, "--token-file") == ["/etc/joch/tokens/tokens"]
    assert flag(docs, "--secret-key-file") == ["/etc/joch/secret-key/secret.key"]
    assert flag(docs, "--store-file") == [], "no store given: the embedded SQLite in the data dir"
    assert only(docs, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_existing_secrets_are_mounted_and_the_chart_makes_none(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["postgres-from-existing-secrets-3-replicas"]
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert volume(docs, "store")["secret"]["secretName"] == "joch-db"
    assert volume(docs, "store")["secret"]["items"] == [{"key": "dsn", "path": "url"}]
    assert volume(docs, "tokens")["secret"] == {"secretName": "joch-tokens", "defaultMode": 0o440,
                                                "items": [{"key": "token.csv", "path": "tokens"}]}
    assert volume(docs, "secret-key")["secret"]["items"] == [{"key": "ring", "path": "secret.key"}]
    assert flag(docs, "--store-file") == ["/etc/joch/store/url"]
    assert only(docs, "Deployment")["spec"]["replicas"] == 3


def test_a_store_url_with_a_password_is_never_on_the_command_line(rendered: dict[str, list[dict[str, Any]]]) -> None:
    import base64

    docs = rendered["postgres-inline-url"]
    secret = only(docs, "Secret")["data"]
    assert base64.b64decode(secret["store-url"]).decode() == CASES["postgres-inline-url"]["store"]["url"]
    assert "s3cret" not in yaml.safe_dump(only(docs, "Deployment"))
    assert flag(docs, "--store-file") == ["/etc/joch/store/url"]


def test_oidc_settings_become_flags_and_the_ca_a_configmap_file(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["oidc-only"]
    assert flag(docs, "--oidc-issuer-url") == ["https://issuer.example"]
    assert flag(docs, "--oidc-client-id") == ["joch"]
    assert flag(docs, "--oidc-groups-claim") == ["groups"]
    assert flag(docs, "--oidc-username-prefix") == ["-"]
    assert flag(docs, "--oidc-ca-file") == ["/etc/joch/config/oidc-ca.pem"]
    assert flag(docs, "--token-file") == []
    assert only(docs, "ConfigMap")["data"]["oidc-ca.pem"] == CA


def test_manifests_are_created_at_start_from_the_configmap(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["local"]
    config = only(docs, "ConfigMap")["data"]
    assert list(config) == ["demo-agent.yaml"]
    kinds = [d["kind"] for d in yaml.safe_load_all(config["demo-agent.yaml"])]
    assert kinds == ["AgentProvider", "Agent"]
    assert flag(docs, "--apply-missing") == ["/etc/joch/config/manifests"]
    assert volume(docs, "config")["configMap"]["items"] == [{"key": "demo-agent.yaml",
                                                             "path": "manifests/demo-agent.yaml"}]


# --- RBAC --------------------------------------------------------------------------------------------

def rules(docs: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)["rules"]
    return found


def test_rbac_grants_only_what_the_kubernetes_store_and_job_runtime_use(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["kubernetes-store-and-job-runtime"]
    store = rules(docs, "ClusterRole", f"{FULLNAME}-store")
    assert set(store[0]["apiGroups"]) == set(REGISTRY.groups()) - {""}
    assert store[1]["apiGroups"] == ["coordination.k8s.io"] and store[1]["resources"] == ["leases"]
    assert store[2] == {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}
    keys = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == f"{FULLNAME}-store")
    assert keys["metadata"]["namespace"] == "joch-store", "kubernetes://?namespace= names the store's namespace"
    assert keys["rules"][1] == {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["joch-shared-keys"],
                                "verbs": ["get", "update"]}
    runs = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == f"{FULLNAME}-runs")
    assert runs["metadata"]["namespace"] == "joch-runs"
    assert {r["resources"][0] for r in runs["rules"]} == {"jobs", "pods", "pods/log", "secrets"}
    binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == f"{FULLNAME}-runs")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert only(docs, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert not [d for d in rendered["default"] if d["kind"] in ("Role", "ClusterRole")]


def test_the_job_runtime_runs_in_cluster_with_the_charts_image(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["kubernetes-store-and-job-runtime"]
    assert "--kube-in-cluster" in args_of(docs)
    assert flag(docs, "--kube-namespace") == ["joch-runs"]
    assert flag(docs, "--kube-image") == [container(docs)["image"]]
    assert flag(docs, "--kube-service-account") == ["agent-runs"]
    assert flag(docs, "--api-url") == [f"http://{FULLNAME}.{NAMESPACE}.svc:8080"], "where run Pods report"
    assert flag(rendered["local"], "--kube-namespace") == [NAMESPACE]
    assert not [a for a in args_of(rendered["default"]) if a.startswith("--kube-")]


def test_rbac_create_false_renders_no_rbac(render: Any) -> None:
    docs = render({**CASES["kubernetes-store-and-job-runtime"], "rbac": {"create": False}})
    assert not {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"} & {d["kind"] for d in docs}


# --- rules between values ----------------------------------------------------------------------------

RULES = {
    "no-authentication": ({"auth": {"tokens": {"generate": False}}}, "auth.tokens.generate=true"),
    "replicas-on-sqlite": ({"replicaCount": 2}, "replicaCount: more than one replica needs a store they share"),
    "replicas-on-a-readwriteonce-claim": (
        {"replicaCount": 2, "store": {"url": "postgresql://db/joch"}, "persistence": {"enabled": True}},
        "persistence: several replicas cannot share a ReadWriteOnce claim",
    ),
}


@pytest.mark.parametrize("case", RULES)
def test_values_that_cannot_work_fail_with_the_fix(render: Any, case: str) -> None:
    values, message = RULES[case]
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(values)


# --- metadata ----------------------------------------------------------------------------------------

def chart_yaml() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return data


def test_chart_yaml_declares_kube_version_and_the_joch_version() -> None:
    meta = chart_yaml()
    assert meta["apiVersion"] == "v2" and meta["name"] == "agents" and meta["type"] == "application"
    assert meta["kubeVersion"] == ">=1.32.0-0"
    assert meta["appVersion"] == importlib.metadata.version("joch")
    for path in ("LICENSE", "README.md", "values.schema.json", "values-local.yaml"):
        assert (CHART / path).is_file(), path
    assert (CHART / "LICENSE").read_text() == (CHART.parents[1] / "LICENSE").read_text()


def test_artifacthub_annotations_list_every_crd_with_examples_and_links() -> None:
    annotations = chart_yaml()["annotations"]
    crds = yaml.safe_load(annotations["artifacthub.io/crds"])
    expected = {f"{k.plural}.{k.group}": (k.kind, k.version) for k in REGISTRY if k.group}
    assert {c["name"]: (c["kind"], c["version"]) for c in crds} == expected
    assert all(c["displayName"] and c["description"] for c in crds)
    if crd_files():
        names = {d["metadata"]["name"] for p in crd_files() for d in yaml.safe_load_all(p.read_text()) if d}
        assert names == set(expected), "artifacthub.io/crds and crds/ disagree"
    examples = yaml.safe_load(annotations["artifacthub.io/crdsExamples"])
    assert {e["kind"] for e in examples} == {"AgentProvider", "Agent", "ImplementationSpec", "AgentRun"}
    for example in examples:
        REGISTRY.for_object(example["apiVersion"], example["kind"])
    links = yaml.safe_load(annotations["artifacthub.io/links"])
    assert all(link["url"].startswith("https://") for link in links)
    assert annotations["artifacthub.io/license"] == "Apache-2.0"
    images = yaml.safe_load(annotations["artifacthub.io/images"])
    assert images[0]["image"].endswith(f":{chart_yaml()['appVersion']}")


def leaf_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    paths: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths.extend(leaf_paths(value, f"{path}."))
        else:
            paths.append(path)
    return paths


def test_the_readme_documents_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))
    paths = leaf_paths(values)
    # A free-form map (resources, securityContext) is documented as a whole.
    missing = [p for p in paths if p not in documented and not any(p.startswith(f"{d}.") for d in documented)]
    assert missing == [], f"charts/agents/README.md has no row for {missing}"
    prefixes = {".".join(p.split(".")[:n]) for p in paths for n in range(1, p.count(".") + 2)}
    assert documented - prefixes == set(), "rows for values that are gone"


def test_values_schema_accepts_both_values_files(chart: helm.Chart) -> None:
    for name in ("values.yaml", "values-local.yaml"):
        chart.validate_schema(chart.merge_values(helm.values_from_yaml((CHART / name).read_text())))
    assert Path(CHART / "values.schema.json").read_text().endswith("\n")


@pytest.mark.parametrize("case", ["default", "postgres-from-existing-secrets-3-replicas"])
def test_notes_say_how_to_reach_the_api_and_warn_of_an_ephemeral_store(chart: helm.Chart, case: str) -> None:
    notes = chart.render(CASES[case], name="joch", namespace=NAMESPACE)["agents/templates/NOTES.txt"]
    assert f"kubectl -n {NAMESPACE} port-forward svc/{FULLNAME} 8080:8080" in notes
    generated = f"get secret {FULLNAME} -o jsonpath='{{.data.admin-token}}' | base64 -d"
    ephemeral = "EVERYTHING IS LOST WHEN THE POD GOES"
    if case == "default":
        assert generated in notes and ephemeral in notes and "Back it up" in notes
    else:
        assert generated not in notes and ephemeral not in notes and "Back it up" not in notes
        assert "Secret joch-tokens (key token.csv)" in notes


def test_the_packaged_chart_carries_what_artifact_hub_shows(tmp_path: Path) -> None:
    archive = helm.package(CHART, destination=tmp_path)
    assert Path(archive).name == f"agents-{chart_yaml()['version']}.tgz"
    with helm.Chart.load_archive(Path(archive).read_bytes()) as packaged:
        files = {f["name"] for f in packaged.files}
        assert {"README.md", "LICENSE", "values-local.yaml"} <= files
        assert packaged.schema is not None and packaged.metadata["kubeVersion"] == ">=1.32.0-0"
        assert len(packaged.crds) == len(crd_files())
        assert manifests_of(packaged) == manifests_of_dir()


def manifests_of(loaded: helm.Chart) -> list[str]:
    return sorted(t["name"] for t in loaded.templates)


def manifests_of_dir() -> list[str]:
    return sorted(f"templates/{p.name}" for p in (CHART / "templates").iterdir())


RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


@pytest.mark.parametrize("case", CASES)
def test_the_pod_meets_the_restricted_pod_security_standard(
    rendered: dict[str, list[dict[str, Any]]], case: str,
) -> None:
    """What a namespace labelled ``pod-security.kubernetes.io/enforce: restricted`` admits
    (https://kubernetes.io/docs/concepts/security/pod-security-standards/, v1.32+)."""
    pod = only(rendered[case], "Deployment")["spec"]["template"]["spec"]
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "hostUsers"))
    for volume in pod["volumes"]:
        assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, volume
    pod_context = pod.get("securityContext", {})
    for c in pod["containers"] + pod.get("initContainers", []):
        context = {**pod_context, **c.get("securityContext", {})}
        assert context.get("runAsNonRoot") is True and context.get("runAsUser", 1) != 0
        assert context.get("privileged") in (None, False)
        assert context.get("allowPrivilegeEscalation") is False
        assert context["capabilities"]["drop"] == ["ALL"] and set(context["capabilities"].get("add", [])) <= {
            "NET_BIND_SERVICE"}
        assert context["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost")
        assert not any(p.get("hostPort") for p in c.get("ports", []))
