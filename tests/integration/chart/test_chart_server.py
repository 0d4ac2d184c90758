"""A ``joch server`` started exactly as the chart's Deployment starts it: the rendered arguments and
environment, the rendered Secret and ConfigMap written as the kubelet mounts them (mode 0440), each
mount path moved under a temporary directory, ``$(POD_NAME)`` expanded as Kubernetes does. Its
probes answer without a token, the Service's names are accepted as Host, the generated admin token
works, and the manifests of ``values-local.yaml`` exist after start. This is as close to a cluster
as these machines get: no kubelet, no image."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from support import stop_server, wait_ready
from support.helmchart import CHART, FULLNAME, NAMESPACE, container, local_values, only
from support.jochserver import free_port

POD = f"{FULLNAME}-7d4f9c-x2x9q"


def mount_files(docs: list[dict[str, Any]], volume: dict[str, Any]) -> dict[str, bytes]:
    """The files the kubelet would put in ``volume``: path → content."""
    if "secret" in volume:
        source = volume["secret"]
        obj = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == source["secretName"])
        data = {k: base64.b64decode(v) for k, v in obj["data"].items()}
    elif "configMap" in volume:
        source = volume["configMap"]
        obj = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == source["name"])
        data = {k: v.encode() for k, v in obj["data"].items()}
    else:
        return {}
    return {item["path"]: data[item["key"]] for item in source["items"]}


class Pod:
    """The chart's pod, as processes on this machine."""

    def __init__(self, docs: list[dict[str, Any]], root: Path) -> None:
        self.docs = docs
        spec = only(docs, "Deployment")["spec"]["template"]["spec"]
        self.container = container(docs)
        volumes = {v["name"]: v for v in spec["volumes"]}
        self.paths: dict[str, Path] = {}
        for mount in self.container["volumeMounts"]:
            local = root / mount["name"]
            local.mkdir(parents=True)
            for path, content in mount_files(docs, volumes[mount["name"]]).items():
                (local / path).parent.mkdir(parents=True, exist_ok=True)
                (local / path).write_bytes(content)
                (local / path).chmod(0o440)
            self.paths[mount["mountPath"]] = local
        self.port = free_port()

    def local(self, text: str) -> str:
        for mount_path, local in sorted(self.paths.items(), key=lambda item: -len(item[0])):
            if text == mount_path or text.startswith(f"{mount_path}/"):
                return str(local) + text[len(mount_path):]
        return text

    def env(self) -> dict[str, str]:
        fields = {"metadata.name": POD, "metadata.namespace": NAMESPACE}
        env = {"PATH": os.environ["PATH"]}
        for var in self.container["env"]:
            if "valueFrom" in var:
                env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                env[var["name"]] = self.local(var["value"])
        return env

    def args(self, env: dict[str, str]) -> list[str]:
        args = []
        for arg in self.container["args"]:
            arg = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)
            name, sep, value = arg.partition("=")
            if name == "--port":
                value = str(self.port)
            args.append(f"{name}{sep}{self.local(value)}" if sep else arg)
        return args


@pytest.fixture(scope="module")
def pod(render: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pod, str]]:
    # The Job runtime's --kube-in-cluster needs a pod's service account: not on this machine.
    docs = render({**local_values(), "kubernetesRuntime": {"enabled": False}})
    pod = Pod(docs, tmp_path_factory.mktemp("pod"))
    env = pod.env()
    joch = Path(sys.executable).parent / "joch"
    log = pod.paths["/tmp"] / "server.log"
    process = subprocess.Popen([str(joch), *pod.args(env)], env=env, stdout=log.open("w"),
                               stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{pod.port}"
    try:
        wait_ready(url, process)
        yield pod, url
    finally:
        stop_server(process)


def admin_token(pod: Pod) -> str:
    secret = only(pod.docs, "Secret")["data"]
    return base64.b64decode(secret["admin-token"]).decode()


def test_the_probes_answer_without_a_token(pod: tuple[Pod, str]) -> None:
    p, url = pod
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        path = p.container[probe]["httpGet"]["path"]
        # The kubelet sends the pod's IP as Host.
        answer = httpx.get(f"{url}{path}", timeout=5)
        assert answer.status_code == 200, (probe, answer.text)


def test_clients_in_the_cluster_reach_it_by_the_services_names(pod: tuple[Pod, str]) -> None:
    _, url = pod
    for host in (f"{FULLNAME}.{NAMESPACE}.svc:8080", f"{FULLNAME}.{NAMESPACE}.svc.cluster.local", FULLNAME):
        assert httpx.get(f"{url}/livez", headers={"Host": host}, timeout=5).status_code == 200, host
    assert httpx.get(f"{url}/livez", headers={"Host": "evil.example"}, timeout=5).status_code == 400


def test_the_api_needs_the_generated_admin_token(pod: tuple[Pod, str]) -> None:
    p, url = pod
    agents = f"{url}/apis/joch.dev/v1alpha1/namespaces/default/agents"
    assert httpx.get(agents, timeout=5).status_code == 401
    answer = httpx.get(agents, headers={"Authorization": f"Bearer {admin_token(p)}"}, timeout=5)
    assert answer.status_code == 200, answer.text
    # values-local.yaml's manifests, created at start from the ConfigMap (--apply-missing).
    assert [item["metadata"]["name"] for item in answer.json()["items"]] == ["demo"]


def test_the_artifacthub_crd_examples_are_accepted_by_the_server(pod: tuple[Pod, str]) -> None:
    p, url = pod
    examples = yaml.safe_load(yaml.safe_load((CHART / "Chart.yaml").read_text())["annotations"]
                              ["artifacthub.io/crdsExamples"])
    for example in examples:
        example["metadata"].setdefault("namespace", "default")
        if example["kind"] == "AgentProvider":
            example["metadata"]["name"] = "example-provider"
        if example["kind"] == "Agent":
            example["metadata"]["name"] = "example"
            example["spec"]["providerRef"]["name"] = "example-provider"
        if example["kind"] == "AgentRun":
            example["spec"]["agentRef"]["name"] = "example"
    answer = httpx.post(f"{url}/v1/resources/create", params={"dryRun": "All"},
                        content=yaml.safe_dump_all(examples), timeout=10,
                        headers={"Authorization": f"Bearer {admin_token(p)}", "Content-Type": "application/yaml"})
    assert answer.status_code == 201, answer.text
    assert answer.json()["dryRun"] is True


def test_the_server_reads_its_settings_from_the_mounted_files(pod: tuple[Pod, str]) -> None:
    p, _ = pod
    data = p.paths["/var/lib/joch"]
    assert (data / "joch.db").is_file(), "the embedded SQLite lives in the data volume"
    assert not (data / "secret.key").exists(), "the key ring comes from the Secret, not generated in the volume"
