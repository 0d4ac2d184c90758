"""The Kubernetes Job runtime end to end, against the stand-in cluster (``support.kubecluster``: a
``joch server`` serving ``batch/v1`` Jobs, ``v1`` Pods and Secrets) and the test kubelet
(``support.kubelet``: it runs each Pod's container as local processes and writes Pod and Job status).

The Joch under test is a real ``joch server`` process with ``--kube-config`` pointing at the stand-in:
runs whose Agent says ``runtime.type: kubernetes`` become Jobs there, whose container runs ``joch
runner --report``, which reports back to that Joch server."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from support import kubelet, stop_server, wait_ready
from support.jochserver import free_port, git
from support.kubecluster import Cluster, cluster

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
JOCH = Path(sys.executable).parent / "joch"
RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"
JOBS = "/apis/batch/v1/namespaces/default/jobs"
PODS = "/api/v1/namespaces/default/pods"
TERMINAL = ("Succeeded", "Failed", "Cancelled")


@dataclass
class Kube:
    cluster: Cluster
    kubelet: kubelet.Handle
    tmp: Path
    repo: Path
    base: str
    port: int
    log: Path
    server: subprocess.Popen[str]

    def start(self) -> None:
        self.server = subprocess.Popen(
            [str(JOCH), "server", "--data-dir", str(self.tmp / "joch-data"), "--port", str(self.port),
             "--sandbox", "none", "--kube-config", str(self.cluster.kubeconfig), "--kube-namespace", "default",
             "--kube-image", "ghcr.io/joch-dev/joch:test"],
            stdout=self.log.open("a"), stderr=subprocess.STDOUT, text=True, cwd=self.tmp)
        wait_ready(self.base, self.server)

    def apply(self, *docs: dict[str, Any]) -> None:
        body = "\n---\n".join(json.dumps(d) for d in docs)
        response = httpx.post(f"{self.base}/v1/resources/apply", content=body,
                              headers={"content-type": "application/yaml"}, timeout=10)
        assert response.status_code == 200, response.text

    def run(self, name: str) -> dict[str, Any]:
        response = httpx.get(f"{self.base}{RUNS}/{name}", timeout=5)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def wait(self, name: str, until: Callable[[dict[str, Any]], bool], seconds: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while True:
            run = self.run(name)
            if until(run):
                return run
            assert time.monotonic() < deadline, (run.get("status"), self.log.read_text()[-3000:])
            time.sleep(0.1)

    def cluster_get(self, path: str) -> dict[str, Any]:
        response = httpx.get(f"{self.cluster.url}{path}", timeout=5)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body


def _phase(run: dict[str, Any]) -> str | None:
    return (run.get("status") or {}).get("phase")


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    tmp = tmp_path_factory.mktemp("kube")
    repo = tmp / "repo"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch", "main")
    (repo / "README.md").write_text("# a repository\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "--quiet", "-m", "first")
    with cluster(tmp / "cluster") as stand_in, \
            kubelet.start(stand_in.url, tmp / "kubelet", logs=tmp / "cluster" / "cluster-data" / "pod-logs") as node:
        port = free_port()
        kube = Kube(stand_in, node, tmp, repo, f"http://127.0.0.1:{port}", port, tmp / "joch.log",
                    None)  # type: ignore[arg-type]
        kube.start()
        try:
            yield kube
        finally:
            stop_server(kube.server)
    assert "Traceback" not in kube.log.read_text(), kube.log.read_text()


def quickstart(repo: Path, run_name: str = "hello-readme") -> list[dict[str, Any]]:
    """The quickstart's manifests with only the Agent's runtime.type changed (and the repository)."""
    docs = []
    for path in sorted(QUICKSTART.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] == "Agent":
            doc["spec"]["runtime"]["type"] = "kubernetes"
        if doc["kind"] == "AgentRun":
            doc["metadata"]["name"] = run_name
            doc["spec"]["execution"]["coordinates"]["git"]["url"] = str(repo)
        docs.append(doc)
    return docs


def test_the_quickstart_run_on_kubernetes_succeeds_with_its_artifacts_and_patch(kube: Kube) -> None:
    # examples/quickstart as a user has it, two levels below the checkout it works on, with only the
    # Agent's runtime.type changed; applied with `joch apply -f` (which resolves the relative URL).
    copy = kube.repo / "examples" / "quickstart"
    copy.mkdir(parents=True)
    for path in QUICKSTART.glob("*.yaml"):
        text = path.read_text()
        if path.name == "agent.yaml":
            assert "    type: local\n" in text
            text = text.replace("    type: local\n", "    type: kubernetes\n")
        (copy / path.name).write_text(text)
    done = subprocess.run([str(JOCH), "apply", "-f", str(copy), "--server", kube.base], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    run = kube.wait("hello-readme", lambda r: _phase(r) in TERMINAL)
    status = run["status"]
    assert status["phase"] == "Succeeded", status
    assert status["runtimeRef"]["type"] == "kubernetes"
    names = {a["name"]: a for a in status["artifacts"]}
    assert set(names) == {"summary", "changes.patch"}
    patch = httpx.get(f"{kube.base}{RUNS}/hello-readme/artifacts/changes.patch", timeout=5)
    assert patch.status_code == 200 and "+Hello from Joch" in patch.text
    import hashlib
    assert hashlib.sha256(patch.content).hexdigest() == names["changes.patch"]["sha256"]
    summary = httpx.get(f"{kube.base}{RUNS}/hello-readme/artifacts/summary", timeout=5)
    assert summary.status_code == 200 and summary.content
    log = httpx.get(f"{kube.base}{RUNS}/hello-readme/log", timeout=10)
    assert log.status_code == 200
    # The Job as the runtime made it (cleanup deletes it once the run ended: look at what the
    # stand-in's store recorded of it through a second run that stays).


def test_the_job_carries_labels_deadline_and_secret_refs_never_values(kube: Kube) -> None:
    secret = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "demo-token"},
              "spec": {"data": {"DEMO_TOKEN": base64.b64encode(b"s3cret-value-42").decode()}}}
    docs = quickstart(kube.repo, "slow-readme")
    provider = next(d for d in docs if d["kind"] == "AgentProvider")
    provider["metadata"]["name"] = "slow-agent"
    provider["spec"] = {"binary": sys.executable,
                        "argsTemplate": ["-c", "import time; print('working'); time.sleep(30)"]}
    agent = next(d for d in docs if d["kind"] == "Agent")
    agent["metadata"]["name"] = "slow"
    agent["spec"]["providerRef"]["name"] = "slow-agent"
    agent["spec"]["security"] = {"allowedSecrets": ["demo-token"]}
    run = next(d for d in docs if d["kind"] == "AgentRun")
    run["spec"]["agentRef"]["name"] = "slow"
    run["spec"]["secrets"] = ["demo-token"]
    run["spec"]["timeoutSeconds"] = 120
    implementation = next(d for d in docs if d["kind"] == "ImplementationSpec")
    kube.apply(secret, implementation, provider, agent, run)
    running = kube.wait("slow-readme", lambda r: (r.get("status") or {}).get("reason") == "Started")
    ref = running["status"]["runtimeRef"]
    job = kube.cluster_get(f"{JOBS}/{ref['job']}")
    labels = job["metadata"]["labels"]
    assert labels["runtime.joch.dev/run-uid"] == running["metadata"]["uid"]
    assert labels["runtime.joch.dev/attempt"] == "1"
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["ttlSecondsAfterFinished"] > 0
    assert spec["activeDeadlineSeconds"] >= 240
    pod_spec = spec["template"]["spec"]
    assert pod_spec["volumes"] == [{"name": "workspace", "emptyDir": {}}]
    container = pod_spec["containers"][0]
    assert container["image"] == "ghcr.io/joch-dev/joch:test"
    assert container["command"] == ["joch", "runner"]
    env = {e["name"]: e for e in container["env"]}
    assert env["DEMO_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == ref["job"]
    assert "JOCH_RUN_TOKEN" in env
    assert "s3cret-value-42" not in json.dumps(job)
    httpx.patch(f"{kube.base}{RUNS}/slow-readme", json={"spec": {"cancel": True}},
                headers={"content-type": "application/merge-patch+json"}, timeout=5).raise_for_status()
    kube.wait("slow-readme", lambda r: _phase(r) in TERMINAL)


def _sleeper(kube: Kube, name: str, code: str, *, timeout: int = 120) -> None:
    """A provider, Agent and run (all called ``name``) whose agent is ``python -c code PIDFILE``."""
    kube.apply(
        {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": name},
         "spec": {"binary": sys.executable, "argsTemplate": ["-c", code, str(kube.tmp / f"{name}.pids")]}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
         "spec": {"providerRef": {"name": name}, "runtime": {"type": "kubernetes"}}},
        {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
         "spec": {"agentRef": {"name": name}, "implementation": {"inline": {"text": "wait"}},
                  "timeoutSeconds": timeout}})


SLEEP = ("import os,sys,time,pathlib; p=pathlib.Path(sys.argv[1]); "
         "p.write_text(p.read_text() + ' ' if p.exists() else ''); "
         "p.write_text(p.read_text() + f'{os.getpid()} {os.getppid()}'); print('sleeping', flush=True); "
         "time.sleep(60)")


def _pids(kube: Kube, name: str, seconds: float = 30) -> list[int]:
    path = kube.tmp / f"{name}.pids"
    deadline = time.monotonic() + seconds
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, (kube.run(name).get("status"), kube.log.read_text()[-2000:])
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def _gone(pids: list[int], seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while alive := [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]:
        assert time.monotonic() < deadline, f"still running: {alive}"
        time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_cancelled_run_deletes_its_job_and_leaves_no_process(kube: Kube) -> None:
    _sleeper(kube, "cancelled", SLEEP)
    pids = _pids(kube, "cancelled")
    job = kube.run("cancelled")["status"]["runtimeRef"]["job"]
    httpx.patch(f"{kube.base}{RUNS}/cancelled", json={"spec": {"cancel": True}},
                headers={"content-type": "application/merge-patch+json"}, timeout=5).raise_for_status()
    status = kube.wait("cancelled", lambda r: _phase(r) in TERMINAL)["status"]
    assert (status["phase"], status["reason"]) == ("Cancelled", "Cancelled"), status
    _gone(pids)
    assert httpx.get(f"{kube.cluster.url}{JOBS}/{job}", timeout=5).status_code == 404


def test_a_timed_out_run_fails_deadline_exceeded_and_leaves_no_process(kube: Kube) -> None:
    _sleeper(kube, "late", SLEEP, timeout=2)
    pids = _pids(kube, "late")
    status = kube.wait("late", lambda r: _phase(r) in TERMINAL, seconds=40)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "DeadlineExceeded"), status
    _gone(pids)


def test_kill_9_of_joch_mid_run_re_adopts_the_job_and_the_agent_runs_once(kube: Kube) -> None:
    code = ("import os,sys,time,pathlib; p=pathlib.Path(sys.argv[1]); "
            "p.write_text((p.read_text() + ' ' if p.exists() else '') + f'{os.getpid()}'); time.sleep(4); "
            "print('done', flush=True)")
    _sleeper(kube, "survivor", code)
    _pids(kube, "survivor")
    os.kill(kube.server.pid, signal.SIGKILL)
    kube.server.wait(10)
    kube.start()
    status = kube.wait("survivor", lambda r: _phase(r) in TERMINAL, seconds=60)["status"]
    assert status["phase"] == "Succeeded", status
    assert len((kube.tmp / "survivor.pids").read_text().split()) == 1  # the agent started once
    log = httpx.get(f"{kube.base}{RUNS}/survivor/log", timeout=10)
    assert "done" in log.text


def test_joch_logs_follow_streams_the_pod_log_until_the_run_ends(kube: Kube) -> None:
    code = ("import sys,time\nfor i in range(4):\n    print(f'line {i}', flush=True); time.sleep(0.5)")
    _sleeper(kube, "chatty", code)
    kube.wait("chatty", lambda r: (r.get("status") or {}).get("reason") == "Started")
    done = subprocess.run([str(JOCH), "logs", "-f", "run", "chatty", "--server", kube.base], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("line ")] == [f"line {i}" for i in range(4)]
    assert _phase(kube.run("chatty")) == "Succeeded"


def test_a_run_whose_pod_cannot_be_scheduled_says_so_in_its_status(kube: Kube) -> None:
    _sleeper(kube, "roomy", SLEEP)
    # A second run of an Agent asking for more CPU than the node has.
    kube.apply({"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "greedy"},
                "spec": {"providerRef": {"name": "roomy"}, "runtime": {"type": "kubernetes"},
                         "resources": {"cpu": "512"}}},
               {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "greedy"},
                "spec": {"agentRef": {"name": "greedy"}, "implementation": {"inline": {"text": "wait"}}}})
    status = kube.wait("greedy", lambda r: (r.get("status") or {}).get("reason") == "Unschedulable")["status"]
    assert status["phase"] == "Running" and "Insufficient cpu" in status["message"], status
    for name in ("greedy", "roomy"):
        httpx.patch(f"{kube.base}{RUNS}/{name}", json={"spec": {"cancel": True}},
                    headers={"content-type": "application/merge-patch+json"}, timeout=5).raise_for_status()
    for name in ("greedy", "roomy"):
        assert _phase(kube.wait(name, lambda r: _phase(r) in TERMINAL)) == "Cancelled"


def test_a_report_without_the_runs_token_is_refused(kube: Kube) -> None:
    _sleeper(kube, "guarded", SLEEP)
    kube.wait("guarded", lambda r: (r.get("status") or {}).get("reason") == "Started")
    url = f"{kube.base}/v1/namespaces/default/agentruns/guarded/attempts/1/record"
    body = json.dumps({"phase": "Succeeded", "reason": "Completed"})
    for headers in ({}, {"authorization": "Bearer jrt1_forged"}):
        response = httpx.put(url, content=body, headers={"content-type": "application/json", **headers}, timeout=5)
        assert response.status_code == 401 and response.json()["kind"] == "Status", response.text
    forged = httpx.put(url.replace("/record", "/artifacts/changes.patch"), content=b"rm -rf",
                       headers={"content-type": "application/octet-stream"}, timeout=5)
    assert forged.status_code == 401
    httpx.patch(f"{kube.base}{RUNS}/guarded", json={"spec": {"cancel": True}},
                headers={"content-type": "application/merge-patch+json"}, timeout=5).raise_for_status()
    assert _phase(kube.wait("guarded", lambda r: _phase(r) in TERMINAL)) == "Cancelled"


# --- what the cluster says, as reasons a person can act on (the runtime driven directly) ------------

@pytest.fixture(scope="module")
def runtime(kube: Kube) -> Iterator[Any]:
    from joch.runtime.kubernetes.runtime import KubernetesRuntime
    from joch.runtime.kubernetes.settings import KubeSettings

    settings = KubeSettings(api_url=kube.base, kubeconfig=kube.cluster.kubeconfig, namespace="default",
                            pull_grace=1.0)
    direct = KubernetesRuntime(kube.tmp / "direct", settings)
    yield direct
    direct.close()


def _spec(name: str, **placement: Any) -> Any:
    from joch.runtime.base import Placement, RunId, RunnerSpec

    run = RunId(namespace="default", name=name, uid=f"uid-{name}", attempt=1)
    return RunnerSpec(run=run, argv=(sys.executable, "-c", "import time; time.sleep(30)"), timeout_seconds=60,
                      placement=Placement(type="kubernetes", **placement))


def _until(runtime: Any, ref: dict[str, Any], check: Callable[[Any], bool], seconds: float = 30) -> Any:
    deadline = time.monotonic() + seconds
    while not check(state := runtime.status(ref)):
        assert time.monotonic() < deadline, state
        time.sleep(0.1)
    return state


def test_an_image_that_cannot_be_pulled_fails_the_attempt_naming_it(runtime: Any) -> None:
    ref = runtime.submit(_spec("pull", image="registry.example/agent:missing"))
    state = _until(runtime, ref, lambda s: s.finished)
    assert state.phase == "Failed" and state.reason in ("ErrImagePull", "ImagePullBackOff"), state
    assert "registry.example/agent:missing" in state.message and "workload.image" in state.message
    assert runtime.status(ref) == state  # decided once, the same answer every time
    runtime.cleanup(ref)


def test_a_pod_that_cannot_be_scheduled_waits_saying_why(runtime: Any) -> None:
    ref = runtime.submit(_spec("huge", resources={"cpu": "512"}))
    state = _until(runtime, ref, lambda s: s.reason == "Unschedulable")
    assert state.phase == "Preparing" and "Insufficient cpu" in state.message, state
    runtime.cleanup(ref)
    assert runtime.status(ref).phase in ("Cancelled", "Lost")


def test_a_container_over_its_memory_limit_fails_oom_killed(runtime: Any) -> None:
    ref = runtime.submit(_spec("hungry", resources={"memory": "8Mi"}))
    state = _until(runtime, ref, lambda s: s.finished)
    assert (state.phase, state.reason, state.exit_code) == ("Failed", "OOMKilled", 137), state
    assert "8Mi" in state.message and "resources.memory" in state.message
    runtime.cleanup(ref)


def test_a_second_submit_of_an_attempt_starts_nothing_new(runtime: Any, kube: Kube) -> None:
    spec = _spec("twice")
    first = runtime.submit(spec)
    assert runtime.submit(spec) == first
    jobs = kube.cluster_get(f"{JOBS}?labelSelector=runtime.joch.dev/run-uid%3Duid-twice")["items"]
    assert len(jobs) == 1
    runtime.cleanup(first, keep_records=False)


def test_a_reference_without_the_jobs_name_finds_the_job_by_its_labels(runtime: Any, kube: Kube) -> None:
    # What the run controller holds for a start it had not recorded yet (a pending reference).
    first = runtime.submit(_spec("pending"))
    pending = {"type": "kubernetes", "id": first["id"]}
    assert not runtime.status(pending).finished
    runtime.cancel(pending)
    assert httpx.get(f"{kube.cluster.url}{JOBS}/{first['job']}", timeout=5).status_code == 404
    state = _until(runtime, pending, lambda s: s.finished)
    assert state.phase == "Cancelled", state
    assert runtime.reports_store.dir("uid-pending", 1).exists()
    runtime.cleanup(pending, keep_records=False)  # the run is deleted: its records go too
    assert not runtime.reports_store.dir("uid-pending", 1).exists()


def test_an_api_that_cannot_be_reached_is_a_submit_error_and_an_unreachable_status(tmp_path: Path) -> None:
    from joch.runtime.kubernetes.runtime import KubernetesRuntime
    from joch.runtime.kubernetes.settings import KubeSettings
    from support.kubecluster import kubeconfig

    config = kubeconfig(f"http://127.0.0.1:{free_port()}", tmp_path / "kubeconfig")
    away = KubernetesRuntime(tmp_path, KubeSettings(api_url="http://127.0.0.1:1", kubeconfig=config))
    try:
        with pytest.raises(RuntimeError, match="cannot reach the Kubernetes API"):
            away.submit(_spec("away"))
        state = away.status({"type": "kubernetes", "id": "uid-away/1", "job": "joch-away-uidaway-1"})
        assert (state.phase, state.reason) == ("Running", "Unreachable"), state
    finally:
        away.close()


def test_a_runs_own_runtime_type_sends_a_local_agents_run_to_kubernetes(kube: Kube) -> None:
    code = "print('from a Job', flush=True)"
    kube.apply(
        {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "mixed"},
         "spec": {"binary": sys.executable, "argsTemplate": ["-c", code]}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "mixed"},
         "spec": {"providerRef": {"name": "mixed"}, "runtime": {"type": "local"}}},
        {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "mixed"},
         "spec": {"agentRef": {"name": "mixed"}, "implementation": {"inline": {"text": "x"}},
                  "runtime": {"type": "kubernetes"}}})
    status = kube.wait("mixed", lambda r: _phase(r) in TERMINAL)["status"]
    assert status["phase"] == "Succeeded" and status["runtimeRef"]["type"] == "kubernetes", status
    assert "from a Job" in httpx.get(f"{kube.base}{RUNS}/mixed/log", timeout=10).text


def test_kube_flags_without_the_runtime_or_a_config_that_does_not_work_are_clear_errors(tmp_path: Path) -> None:
    def server(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(JOCH), "server", "--data-dir", str(tmp_path / "data"), "--port",
                               str(free_port()), *flags], capture_output=True, text=True, timeout=60)

    done = server("--kube-namespace", "agents")
    assert done.returncode != 0 and "--kube-namespace: only the Kubernetes runtime uses this" in done.stderr
    assert "--kube-config FILE or --kube-in-cluster" in done.stderr
    done = server("--kube-in-cluster")  # not in a cluster: no service account token
    assert done.returncode != 0 and "the Kubernetes runtime cannot start (--kube-in-cluster)" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_jobs_own_deadline_fails_the_run_deadline_exceeded(kube: Kube) -> None:
    _sleeper(kube, "overdue", SLEEP)
    pids = _pids(kube, "overdue")
    job = kube.run("overdue")["status"]["runtimeRef"]["job"]
    # As if the runner had stopped enforcing the timeout: the Job's backstop goes off.
    httpx.patch(f"{kube.cluster.url}{JOBS}/{job}", json={"spec": {"activeDeadlineSeconds": 1}},
                headers={"content-type": "application/merge-patch+json"}, timeout=5).raise_for_status()
    status = kube.wait("overdue", lambda r: _phase(r) in TERMINAL)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "DeadlineExceeded"), status
    assert "activeDeadlineSeconds (1 s)" in status["message"]
    _gone(pids)


def test_a_pod_deleted_by_the_cluster_loses_the_runner_not_cancelled(kube: Kube) -> None:
    _sleeper(kube, "evicted", SLEEP)
    pids = _pids(kube, "evicted")
    uid = kube.run("evicted")["metadata"]["uid"]
    pods = kube.cluster_get(f"{PODS}?labelSelector=runtime.joch.dev/run-uid%3D{uid}")["items"]
    assert len(pods) == 1
    httpx.delete(f"{kube.cluster.url}{PODS}/{pods[0]['metadata']['name']}", timeout=5).raise_for_status()
    status = kube.wait("evicted", lambda r: _phase(r) in TERMINAL)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "RunnerLost"), status
    assert "Kubernetes stopped the runner" in status["message"]
    _gone(pids)
    # backoffLimit 0: the Job made no second Pod, so the agent started once.
    assert len((kube.tmp / "evicted.pids").read_text().split()) == 2


def test_an_agent_that_ignores_sigterm_is_killed_with_its_pod_and_the_run_ends_cancelled(kube: Kube) -> None:
    # The Pod's grace period (the kubelet's, at most 5 s here) ends before the runner's own (10 s):
    # everything in the container is killed before the runner can report.
    stubborn = SLEEP.replace("import os,sys,time,pathlib;",
                             "import os,sys,time,pathlib,signal; signal.signal(signal.SIGTERM, signal.SIG_IGN);")
    _sleeper(kube, "stubborn", stubborn)
    pids = _pids(kube, "stubborn")
    httpx.patch(f"{kube.base}{RUNS}/stubborn", json={"spec": {"cancel": True}},
                headers={"content-type": "application/merge-patch+json"}, timeout=5).raise_for_status()
    status = kube.wait("stubborn", lambda r: _phase(r) in TERMINAL, seconds=30)["status"]
    assert (status["phase"], status["reason"]) == ("Cancelled", "Cancelled"), status
    _gone(pids)
