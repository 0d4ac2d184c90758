"""The run controller end to end: real store, real manager, real ``joch runner`` processes in real
git worktrees. Agents are small Python programs (``python -c``) so each behaviour is exact."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from joch.admission import uniqueness
from joch.admission.apply import apply_documents, create_documents
from joch.admission.documents import load_documents
from joch.api import errors, kinds
from joch.api.identity import RequestContext, UserInfo, acting_as
from joch.api.meta import parse_time
from joch.api.namespaces import NAMESPACE, namespace_object
from joch.controllers.assembly import build_controllers
from joch.controllers.manager import Manager
from joch.controllers.options import ControllerOptions
from joch.runtime.local import LocalRuntime
from joch.store import Store, open_store
from support.disks import fill, tmpfs

PY = sys.executable


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git("init", "-q", "-b", "main", cwd=path)
    (path / "README.md").write_text("# demo\n")
    git("add", "README.md", cwd=path)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init", cwd=path)
    return path


@dataclass
class Env:
    store: Store
    runtime: LocalRuntime
    manager: Manager
    data_dir: Path
    repo: Path
    tmp: Path

    def apply(self, *objs: dict[str, Any]) -> None:
        text = "\n---\n".join(json.dumps(o) for o in objs)
        apply_documents(self.store, load_documents(text), dry_run=False)

    def create_run(self, name: str = "", *, agent: str = "a", text: str = "do it", **spec: Any) -> str:
        body = {"agentRef": {"name": agent}, "implementation": {"inline": {"text": text}},
                "execution": {"coordinates": {"git": {"url": str(self.repo)}}}, **spec}
        meta = {"name": name} if name else {"generateName": "r-"}
        doc = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": meta, "spec": body}
        result = create_documents(self.store, load_documents(json.dumps(doc)), dry_run=False)
        return result.items[0].name or ""

    def run(self, name: str) -> dict[str, Any]:
        return self.store.get(kinds.AGENT_RUN, "default", name)

    def cancel(self, name: str) -> None:
        """``spec.cancel: true`` without a resourceVersion (last writer wins, as ``joch cancel``): the
        controller may write the run's status between this read and the update."""
        run = self.run(name)
        meta = {k: v for k, v in run["metadata"].items() if k != "resourceVersion"}
        self.store.update(kinds.AGENT_RUN, {**run, "metadata": meta, "spec": {**run["spec"], "cancel": True}})

    def wait(self, name: str, phases: set[str], timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            run = self.run(name)
            if (run.get("status") or {}).get("phase") in phases:
                return run
            assert time.monotonic() < deadline, f"run {name} stayed {run.get('status')}"
            time.sleep(0.05)

    def wait_gone(self, name: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                run = self.run(name)
            except errors.NotFound:
                return
            assert time.monotonic() < deadline, run
            time.sleep(0.05)

    def events(self, name: str) -> list[tuple[str, str]]:
        uid = self.run(name)["metadata"]["uid"]
        items = self.store.list(kinds.EVENT).items
        found = [e for e in items if e["spec"]["involvedObject"]["uid"] == uid]
        found.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
        return [(e["spec"]["reason"], e["spec"]["message"]) for e in found]


def provider(name: str, args: list[str], *, binary: str = PY, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": name},
            "spec": {"binary": binary, "argsTemplate": args, **spec}}


def agent(name: str, provider_name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
            "spec": {"providerRef": {"name": provider_name}, **spec}}


def script(code: str) -> list[str]:
    return ["-c", code]


def start(store: Store, data_dir: Path, **options: Any) -> tuple[LocalRuntime, Manager]:
    opts = ControllerOptions(data_dir=data_dir, leader_election=False, grace_seconds=1.0, resync_period=2.0,
                             **options)
    runtime = LocalRuntime(data_dir)
    manager = Manager(store, build_controllers(store, runtime, opts), opts)
    manager.start()
    assert manager.wait_started(10)
    return runtime, manager


@pytest.fixture
def make_env(tmp_path: Path, repo: Path) -> Iterator[Callable[..., Env]]:
    made: list[Env] = []
    stores: list[Store] = []

    def make(store_url: str | None = None, **options: Any) -> Env:
        store = open_store(store_url or f"sqlite:///{tmp_path / 'joch.db'}")
        stores.append(store)
        runtime, manager = start(store, tmp_path / "data", **options)
        env = Env(store, runtime, manager, tmp_path / "data", repo, tmp_path)
        made.append(env)
        return env

    yield make
    for env in made:
        env.manager.stop()
        env.runtime.close()
    for store in stores:
        store.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


WRITE_PID = "import os,pathlib,sys; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); "


def start_sleeper(env: Env) -> tuple[str, Path]:
    """A run of an agent that records its pid and sleeps a minute, once the agent has started."""
    pid_file = env.tmp / "pid"
    env.apply(provider("p", [*script(WRITE_PID + "import time; time.sleep(60)"), str(pid_file)]), agent("a", "p"))
    name = env.create_run()
    env.wait(name, {"Running"})
    deadline = time.monotonic() + 10
    while not pid_file.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return name, pid_file


def test_the_demo_agent_succeeds_with_artifacts_and_a_patch(make_env: Callable[..., Env], store_url: str) -> None:
    env = make_env(store_url)
    env.apply(
        provider("demo-agent", ["--implementation", "{{ workspace.inputs }}/implementation.md",
                                "--summary", "{{ workspace.outputs }}/summary.md"], binary="joch-demo-agent",
                 inputFiles=[{"path": "implementation.md", "content": "{{ implementation.text }}"}],
                 outputArtifacts=[{"name": "summary", "path": "summary.md"}]),
        agent("a", "demo-agent"),
    )
    name = env.create_run(text='Add a line "Hello from Joch" to the end of README.md.')
    run = env.wait(name, {"Succeeded", "Failed"})
    status = run["status"]
    assert status["phase"] == "Succeeded", status
    assert status["exitCode"] == 0 and status["attempt"] == 1
    assert status["compiledManifestHash"].startswith("sha256:")
    artifacts = {a["name"]: a for a in status["artifacts"]}
    assert set(artifacts) == {"summary", "changes.patch"}
    for artifact in artifacts.values():
        assert len(artifact["sha256"]) == 64 and artifact["size"] > 0
    record, stream = env.runtime.open_artifact(status["runtimeRef"], "changes.patch")
    with stream:
        patch = stream.read().decode()
    assert "+Hello from Joch" in patch and record.size == len(patch.encode())
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Succeeded"] == "True" and conditions["InProgress"] == "False"
    reasons = [reason for reason, _ in env.events(name)]
    assert reasons[0] == "Queued" and "Started" in reasons and reasons[-1] == "Succeeded"
    assert (env.repo / "README.md").read_text() == "# demo\n"  # the user's checkout is untouched


def test_an_agent_that_exits_3_fails_naming_the_code(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("import sys; print('boom'); sys.exit(3)")), agent("a", "p"))
    run = env.wait(env.create_run(), {"Succeeded", "Failed"})
    status = run["status"]
    assert (status["phase"], status["reason"], status["exitCode"]) == ("Failed", "AgentFailed", 3)
    assert "3" in status["message"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Failed"] == "True"


def test_a_sleeping_agent_past_its_timeout_fails_and_leaves_no_process(make_env: Callable[..., Env]) -> None:
    env = make_env()
    pid_file = env.tmp / "pid"
    env.apply(provider("p", [*script(WRITE_PID + "import time; time.sleep(60)"), str(pid_file)]),
              agent("a", "p"))
    name = env.create_run(timeoutSeconds=1)
    run = env.wait(name, {"Succeeded", "Failed", "Cancelled"}, timeout=30)
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "DeadlineExceeded"), run["status"]
    assert not alive(int(pid_file.read_text()))


def test_cancel_stops_the_agent_and_ends_cancelled(make_env: Callable[..., Env]) -> None:
    env = make_env()
    name, pid_file = start_sleeper(env)
    env.cancel(name)
    run = env.wait(name, {"Succeeded", "Failed", "Cancelled"})
    assert run["status"]["phase"] == "Cancelled", run["status"]
    assert not alive(int(pid_file.read_text()))


def test_deleting_a_running_run_stops_it_then_removes_it(make_env: Callable[..., Env]) -> None:
    env = make_env()
    name, pid_file = start_sleeper(env)
    env.store.delete(kinds.AGENT_RUN, "default", name)
    env.wait_gone(name)
    assert not alive(int(pid_file.read_text()))


def test_retries_are_new_attempts(make_env: Callable[..., Env]) -> None:
    env = make_env()
    counter = env.tmp / "count"
    code = ("import pathlib,sys; p=pathlib.Path(sys.argv[1]); n=int(p.read_text()) if p.exists() else 0; "
            "p.write_text(str(n+1)); sys.exit(0 if n >= 2 else 1)")
    env.apply(provider("p", [*script(code), str(counter)]), agent("a", "p", defaults={"retryLimit": 2}))
    name = env.create_run()
    run = env.wait(name, {"Succeeded", "Failed"})
    assert (run["status"]["phase"], run["status"]["attempt"]) == ("Succeeded", 3), run["status"]
    assert counter.read_text() == "3"
    assert [r for r, _ in env.events(name)].count("Retrying") == 2


def test_no_more_than_the_global_limit_run_at_once(make_env: Callable[..., Env]) -> None:
    env = make_env(max_concurrent_runs=4)
    log = env.tmp / "intervals"
    log.mkdir()
    code = ("import pathlib,sys,time,os; d=pathlib.Path(sys.argv[1]); s=time.time(); time.sleep(0.3); "
            "(d/str(os.getpid())).write_text(f'{s} {time.time()}')")
    env.apply(provider("p", [*script(code), str(log)]), agent("a", "p"))
    names = [env.create_run() for _ in range(20)]
    held = False
    for name in names:
        run = env.wait(name, {"Succeeded", "Failed"}, timeout=60)
        assert run["status"]["phase"] == "Succeeded", run["status"]
        queued = [c for c in run["status"]["conditions"] if c["type"] == "Queued"]
        held = held or any("4 of 4" in e for _, e in env.events(name)) or bool(queued)
    intervals = [tuple(map(float, f.read_text().split())) for f in log.iterdir()]
    assert len(intervals) == 20
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda p: (p[0], p[1]))
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    assert peak <= 4
    assert peak >= 2  # the limit, not a serial scheduler, is what held them back


def test_a_held_run_says_why_in_its_queued_condition(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("import time; time.sleep(60)")), agent("a", "p", maxConcurrentRuns=1))
    first = env.create_run()
    env.wait(first, {"Running"})
    second = env.create_run()
    deadline = time.monotonic() + 10
    while True:
        status = env.run(second).get("status") or {}
        queued = [c for c in status.get("conditions") or [] if c["type"] == "Queued"]
        if queued and "maxConcurrentRuns" in (queued[0].get("message") or ""):
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    assert status["phase"] == "Queued" and 'Agent "a"' in queued[0]["message"]
    for name in (first, second):
        env.cancel(name)
    assert env.wait(second, {"Cancelled"})["status"]["reason"] == "Cancelled"
    env.wait(first, {"Cancelled"})


def test_a_template_error_fails_the_run_naming_the_template(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", ["{{ implementation.titel }}"]), agent("a", "p"))
    name = env.create_run()
    run = env.wait(name, {"Failed"})
    assert run["status"]["reason"] == "TemplateError"
    assert "argsTemplate[0]" in run["status"]["message"] and "titel" in run["status"]["message"]
    assert {c["type"]: c["status"] for c in run["status"]["conditions"]}["InvalidSpec"] == "True"


def test_missing_implementation_and_disallowed_secret_are_invalid_specs(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p"),
              {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "tok"},
               "spec": {"stringData": {"TOKEN": "s3cr3t-value"}}})
    name = env.create_run(secrets=["tok"])
    run = env.wait(name, {"Failed", "Succeeded"})
    assert run["status"]["reason"] == "SecretNotAllowed" and "allowedSecrets" in run["status"]["message"]
    # An ImplementationSpec deleted after the run was admitted.
    env.store.create(kinds.AGENT_RUN, {"metadata": {"name": "orphan", "namespace": "default"}, "spec": {
        "agentRef": {"name": "a"}, "implementationRef": {"name": "gone"}}})
    run = env.wait("orphan", {"Failed", "Succeeded"})
    assert run["status"]["reason"] == "MissingImplementation" and '"gone"' in run["status"]["message"]


def test_secrets_reach_the_agent_environment_only(make_env: Callable[..., Env]) -> None:
    env = make_env()
    out = env.tmp / "seen"
    code = "import os,pathlib,sys; v=os.environ['API_KEY']; pathlib.Path(sys.argv[1]).write_text(v); print('key', v)"
    env.apply(
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "keys"},
         "spec": {"data": {"api": base64.b64encode(b"sk-very-secret").decode()}}},
        provider("p", [*script(code), str(out)],
                 secretEnv=[{"name": "API_KEY", "secretRef": {"name": "keys", "key": "api"}}]),
        agent("a", "p", security={"allowedSecrets": ["keys"]}),
    )
    name = env.create_run()
    run = env.wait(name, {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert out.read_text() == "sk-very-secret"
    log = b"".join(env.runtime.logs(run["status"]["runtimeRef"])).decode()
    assert "sk-very-secret" not in log and "key ***" in log
    assert "sk-very-secret" not in json.dumps(run) + json.dumps(env.events(name))
    leaked = [p for p in env.data_dir.rglob("*") if p.is_file() and b"sk-very-secret" in p.read_bytes()]
    assert not leaked


def test_approval_gates_dispatch(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p", requiresApproval=True))
    name = env.create_run()
    run = env.wait(name, {"AwaitingApproval"})
    assert "joch approve approval" in run["status"]["message"]
    approval = env.store.get(kinds.APPROVAL, "default", f"{name}-dispatch")
    assert approval["status"]["phase"] == "Pending" and approval["spec"]["runRef"]["name"] == name
    env.store.update_status(kinds.APPROVAL, {**approval, "status": {"phase": "Approved", "decidedBy": "ana"}})
    assert env.wait(name, {"Succeeded", "Failed"})["status"]["phase"] == "Succeeded"

    denied = env.create_run()
    env.wait(denied, {"AwaitingApproval"})
    approval = env.store.get(kinds.APPROVAL, "default", f"{denied}-dispatch")
    env.store.update_status(kinds.APPROVAL, {**approval, "status": {"phase": "Denied", "decidedBy": "bo",
                                                                    "reason": "not today"}})
    run = env.wait(denied, {"Failed", "Succeeded"})
    assert run["status"]["reason"] == "ApprovalDenied" and "bo" in run["status"]["message"]
    assert "not today" in run["status"]["message"]


def test_the_dispatch_approval_names_the_run_creator_and_carries_the_agents_rules(
        make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")),
              agent("a", "p", requiresApproval=True, approvalTimeoutSeconds=3600, approvalSeparationOfDuties=True))
    # A dispatch Approval for this run name left from before (say, restored from a backup) is not
    # the new run's: one Approval per (run, action), so the controller replaces it.
    env.store.create(kinds.APPROVAL, {"metadata": {"name": "stray", "namespace": "default", "labels": {
        uniqueness.APPROVAL_LABEL: uniqueness.approval_key("mine", "dispatch")}},
        "spec": {"runRef": {"name": "mine"}, "action": "dispatch"}})
    with acting_as(RequestContext(UserInfo("carol"))):
        name = env.create_run("mine")
    assert env.run(name)["metadata"]["annotations"][kinds.CREATED_BY] == "carol"
    env.wait(name, {"AwaitingApproval"})
    spec = env.store.get(kinds.APPROVAL, "default", f"{name}-dispatch")["spec"]
    assert (spec["requestedBy"], spec["action"], spec["separationOfDuties"]) == ("carol", "dispatch", True)
    expires = parse_time(spec["expiresAt"]).timestamp()
    assert abs(expires - (time.time() + 3600)) < 60
    assert [a["metadata"]["name"] for a in env.store.list(kinds.APPROVAL).items] == [f"{name}-dispatch"]


def test_an_unanswered_approval_expires_and_fails_the_run(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p", requiresApproval=True, approvalTimeoutSeconds=1))
    name = env.create_run()
    env.wait(name, {"AwaitingApproval", "Failed"})
    run = env.wait(name, {"Failed", "Succeeded"}, timeout=15)
    approval = env.store.get(kinds.APPROVAL, "default", f"{name}-dispatch")
    assert approval["status"]["phase"] == "Expired"
    assert run["status"]["reason"] == "ApprovalExpired"
    assert run["status"]["message"] == (f"approval {name}-dispatch expired at {approval['spec']['expiresAt']} "
                                        "without a decision")
    assert ("ApprovalExpired", run["status"]["message"]) in env.events(name)


def test_finished_runs_are_collected_after_their_ttl(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p"))
    name = env.create_run(ttlSecondsAfterFinished=0)
    env.wait_gone(name)


def test_a_restarted_manager_readopts_a_running_run_and_never_starts_it_twice(
    make_env: Callable[..., Env], tmp_path: Path,
) -> None:
    env = make_env()
    counter = env.tmp / "count"
    code = ("import pathlib,sys,time; p=pathlib.Path(sys.argv[1]); "
            "p.write_text(p.read_text() + 'x' if p.exists() else 'x'); time.sleep(1.5)")
    env.apply(provider("p", [*script(code), str(counter)]), agent("a", "p"))
    name = env.create_run()
    env.wait(name, {"Running"})
    env.manager.stop()
    env.runtime.close()
    runtime, manager = start(env.store, env.data_dir)
    try:
        run = env.wait(name, {"Succeeded", "Failed"})
    finally:
        manager.stop()
        runtime.close()
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert counter.read_text() == "x"


def test_a_killed_runner_is_reported_lost(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("import time; time.sleep(60)")), agent("a", "p"))
    name = env.create_run()
    deadline = time.monotonic() + 10
    while "runnerPid" not in ((run := env.wait(name, {"Running"})).get("status") or {}).get("runtimeRef", {}):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(int(run["status"]["runtimeRef"]["runnerPid"]), 9)
    run = env.wait(name, {"Failed", "Succeeded"}, timeout=30)
    assert run["status"]["reason"] == "RunnerLost", run["status"]


def test_an_idempotency_key_admits_one_run_per_namespace(store: Store) -> None:
    apply_documents(store, load_documents(json.dumps(provider("p", []))) + load_documents(
        json.dumps(agent("a", "p"))), dry_run=False)
    doc = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"generateName": "r-"},
           "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}},
                    "idempotencyKey": "issue-42"}}
    first = create_documents(store, load_documents(json.dumps(doc)), dry_run=False).items[0].name
    with pytest.raises(errors.Invalid) as caught:
        create_documents(store, load_documents(json.dumps(doc)), dry_run=False)
    assert f'already used by AgentRun "{first}"' in caught.value.causes[0].message
    other = {**doc, "metadata": {"generateName": "r-", "namespace": "team-b"}}
    store.create(NAMESPACE, namespace_object("team-b"))
    team_b = [{**o, "metadata": {**o["metadata"], "namespace": "team-b"}} for o in (provider("p", []), agent("a", "p"))]
    apply_documents(store, load_documents("\n---\n".join(json.dumps(o) for o in team_b)), dry_run=False)
    create_documents(store, load_documents(json.dumps(other)), dry_run=False)  # another namespace is fine
    stored = store.get(kinds.AGENT_RUN, "default", first or "")
    changed = {**stored, "spec": {**stored["spec"], "idempotencyKey": "issue-43"}}
    with pytest.raises(errors.Invalid) as caught:
        apply_documents(store, load_documents(json.dumps(changed)), dry_run=False)
    assert "immutable" in caught.value.causes[0].message


def test_two_runs_with_one_idempotency_key_in_one_batch_are_rejected(store: Store) -> None:
    apply_documents(store, load_documents(json.dumps(provider("p", []))) + load_documents(
        json.dumps(agent("a", "p"))), dry_run=False)
    runs = [{"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
             "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}},
                      "idempotencyKey": "K"}} for name in ("r1", "r2")]
    with pytest.raises(errors.Invalid) as caught:
        apply_documents(store, load_documents("\n---\n".join(json.dumps(r) for r in runs)), dry_run=False)
    assert [c.field.rsplit(".", 1)[-1] for c in caught.value.causes] == ["idempotencyKey"]
    assert "same idempotency key" in caught.value.causes[0].message
    assert store.list(kinds.AGENT_RUN).items == []


def test_a_new_run_never_inherits_the_approval_of_an_old_run_with_its_name(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p", requiresApproval=True))
    env.create_run("same")
    env.wait("same", {"AwaitingApproval"})
    approval = env.store.get(kinds.APPROVAL, "default", "same-dispatch")
    env.store.update_status(kinds.APPROVAL, {**approval, "status": {"phase": "Approved", "decidedBy": "ana"}})
    env.wait("same", {"Succeeded"})
    env.store.delete(kinds.AGENT_RUN, "default", "same")
    env.wait_gone("same")
    with pytest.raises(errors.NotFound):  # the finalizer removed the run's Approval with it
        env.store.get(kinds.APPROVAL, "default", "same-dispatch")
    # An Approval left behind (say, restored from a backup) is not the new run's either.
    env.store.create(kinds.APPROVAL, {"metadata": {"name": "same-dispatch", "namespace": "default",
                                                   "ownerReferences": [{"apiVersion": "runtime.joch.dev/v1alpha1",
                                                                        "kind": "AgentRun", "name": "same",
                                                                        "uid": "old-uid", "controller": True}]},
                                      "spec": {"runRef": {"name": "same"}},
                                      "status": {"phase": "Approved"}})
    env.create_run("same")
    run = env.wait("same", {"AwaitingApproval", "Succeeded", "Failed"})
    assert run["status"]["phase"] == "AwaitingApproval"
    time.sleep(0.5)
    assert env.run("same")["status"]["phase"] == "AwaitingApproval"
    fresh = env.store.get(kinds.APPROVAL, "default", "same-dispatch")
    assert fresh["metadata"]["ownerReferences"][0]["uid"] == env.run("same")["metadata"]["uid"]
    assert fresh["status"]["phase"] == "Pending"


def test_a_path_outside_the_checkout_fails_the_run(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p"))
    name = env.create_run(execution={"coordinates": {"git": {"url": str(env.repo), "path": "../.."}}})
    run = env.wait(name, {"Failed", "Succeeded"})
    assert run["status"]["reason"] == "InvalidPath" and "../.." in run["status"]["message"]


def test_runs_cancelled_as_they_start_leave_no_agent_running(make_env: Callable[..., Env]) -> None:
    env = make_env()
    marks = env.tmp / "marks"
    marks.mkdir()
    code = ("import pathlib,sys,time,os; d=pathlib.Path(sys.argv[1]); (d/(sys.argv[2]+'.start')).touch(); "
            "time.sleep(1); (d/(sys.argv[2]+'.done')).touch()")
    env.apply(provider("p", [*script(code), str(marks), "{{ run.name }}"]), agent("a", "p"))
    names = []
    for i in range(12):
        name = env.create_run(f"c{i}")
        time.sleep(0.01 * (i % 6))
        run = env.run(name)
        env.store.update(kinds.AGENT_RUN, {**run, "metadata": {k: v for k, v in run["metadata"].items()
                                                               if k != "resourceVersion"},
                                           "spec": {**run["spec"], "cancel": True}})
        names.append(name)
    for name in names:
        assert env.wait(name, {"Cancelled", "Succeeded", "Failed"})["status"]["phase"] == "Cancelled"
    time.sleep(1.3)
    assert sorted(p.name for p in marks.iterdir() if p.name.endswith(".done")) == []


def test_deleting_a_retried_run_removes_every_attempts_files(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("import sys; sys.exit(1)")), agent("a", "p", defaults={"retryLimit": 2}))
    name = env.create_run()
    run = env.wait(name, {"Failed"})
    assert run["status"]["attempt"] == 3
    uid_dir = env.data_dir / "runs" / run["metadata"]["uid"]
    assert sorted(p.name for p in uid_dir.iterdir()) == ["1", "2", "3"]
    env.store.delete(kinds.AGENT_RUN, "default", name)
    deadline = time.monotonic() + 10
    while uid_dir.exists():
        assert time.monotonic() < deadline, sorted(p.name for p in uid_dir.iterdir())
        time.sleep(0.05)
    assert not [p for p in (env.data_dir / "workspaces").iterdir() if p.name.startswith(run["metadata"]["uid"])]


def test_a_run_held_by_its_agents_limit_does_not_hold_back_other_agents(make_env: Callable[..., Env]) -> None:
    env = make_env(max_concurrent_runs=2)
    gate = env.tmp / "gate"  # the slow agent runs until the test opens the gate: no timing assumptions
    wait_for_gate = f"import pathlib,time\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.02)"
    env.apply(provider("slow", script(wait_for_gate)), provider("quick", script("pass")),
              agent("x", "slow", maxConcurrentRuns=1), agent("y", "quick"))
    xs = [env.create_run(f"x{i}", agent="x") for i in range(2)]
    deadline = time.monotonic() + 10
    # Either x may start first: both were created in the same second and reach Queued concurrently.
    while sorted(str((env.run(x).get("status") or {}).get("phase")) for x in xs) != ["Queued", "Running"]:
        assert time.monotonic() < deadline, [env.run(x).get("status") for x in xs]
        time.sleep(0.05)
    y = env.create_run("y1", agent="y")  # younger than the queued x, which waits on agent x's limit
    assert env.wait(y, {"Succeeded", "Failed"}, timeout=20)["status"]["phase"] == "Succeeded"
    # y1 did not wait for x's runs:
    assert sorted(env.run(x)["status"]["phase"] for x in xs) == ["Queued", "Running"]
    gate.touch()
    for name in xs:
        assert env.wait(name, {"Succeeded", "Failed"}, timeout=20)["status"]["phase"] == "Succeeded"


def test_limits_reach_the_runner_and_refused_artifacts_are_in_the_status(make_env: Callable[..., Env]) -> None:
    env = make_env(max_log_bytes=2000, max_artifact_bytes=1000)
    code = ("import os,sys; out=sys.argv[1]; sys.stdout.write('y' * 10000); "
            "open(os.path.join(out, 'big.txt'), 'w').write('x' * 5000); "
            "open(os.path.join(out, 'ok.txt'), 'w').write('ok')")
    env.apply(provider("p", [*script(code), "{{ workspace.outputs }}"],
                       outputArtifacts=[{"name": "big", "path": "big.txt", "optional": True},
                                        {"name": "ok", "path": "ok.txt"}]), agent("a", "p"))
    name = env.create_run()
    status = env.wait(name, {"Succeeded", "Failed"})["status"]
    assert status["phase"] == "Succeeded", status
    assert sorted(a["name"] for a in status["artifacts"]) == ["changes.patch", "ok"]
    message = "5000 bytes is over the artifact size limit of 1000 bytes (--max-artifact-bytes); it was not stored"
    assert status["refusedArtifacts"] == [{"name": "big", "path": "outputs/big.txt", "size": 5000, "message": message}]
    refused = next(c for c in status["conditions"] if c["type"] == "ArtifactsRefused")
    assert (refused["status"], refused["reason"], refused["message"]) == ("True", "TooLarge", f"big: {message}")
    assert env.events(name)[-1] == ("Succeeded", f"agent exited with code 0; 2 artifacts; refused: big ({message})")
    log = b"".join(env.runtime.logs(status["runtimeRef"]))
    assert log.startswith(b"y" * 1000) and log.endswith(b"y" * 1000) and b"8000 bytes of output were cut" in log


def test_a_full_disk_fails_the_run_at_once_naming_it(make_env: Callable[..., Env], tmp_path: Path) -> None:
    with tmpfs(tmp_path / "data", size="2m"):
        env = make_env()
        env.apply(provider("p", script("import sys\nwhile True: sys.stdout.write('x' * 65536)")),
                  agent("a", "p", defaults={"retryLimit": 2}))
        name = env.create_run()
        status = env.wait(name, {"Succeeded", "Failed"})["status"]
        assert (status["phase"], status["reason"], status["attempt"]) == ("Failed", "DiskFull", 1), status
        assert status["message"].startswith(f"the disk is full: cannot write {tmp_path / 'data' / 'runs'}")
        assert env.events(name)[-1][0] == "DiskFull"
        env.manager.stop()
        env.runtime.close()


def test_a_run_that_cannot_even_be_submitted_on_a_full_disk_is_disk_full(
        make_env: Callable[..., Env], tmp_path: Path) -> None:
    with tmpfs(tmp_path / "data", size="2m") as data:
        env = make_env()
        env.apply(provider("p", script("print('never')")), agent("a", "p"))
        ballast = fill(data)
        name = env.create_run()
        status = env.wait(name, {"Succeeded", "Failed"})["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "DiskFull"), status
        assert status["message"].startswith(f"the local runtime could not start the run: the disk is full: cannot "
                                            f"write {data / 'runs'}")
        assert status["message"].endswith("(0 bytes free on its filesystem)")
        ballast.unlink()
        again = env.create_run()
        assert env.wait(again, {"Succeeded", "Failed"})["status"]["phase"] == "Succeeded"  # space returned
        env.manager.stop()
        env.runtime.close()
