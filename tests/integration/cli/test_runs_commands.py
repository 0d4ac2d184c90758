"""``joch run``, ``logs``, ``cancel``, ``approve``/``deny``, ``artifacts`` and ``describe run``
against a real server in this process, with a real store, ``LocalRuntime`` and ``joch runner``
processes, and the real controllers where a run has to move on its own (``with_controllers``).

The CLI runs in-process (typer's CliRunner, as the ``joch`` fixture of this directory does); the
server is built here rather than started as ``joch server`` so it can share its runtime with the
controllers and so tests can write a run's status directly where the controller's timing would
only make them slow or flaky."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from joch.admission.apply import apply_documents
from joch.admission.documents import load_documents
from joch.api import kinds
from joch.cli.main import app
from joch.controllers.assembly import build_controllers
from joch.controllers.manager import Manager
from joch.controllers.options import ControllerOptions
from joch.runtime.base import RunId, RunnerSpec
from joch.runtime.local import LocalRuntime
from joch.server.app import create_app
from joch.server.testing import ServerThread
from joch.store import Store, open_store

PY = sys.executable
RUN_LINE = "agentrun.runtime.joch.dev/{} created"


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


@dataclass
class Cluster:
    url: str
    store: Store
    runtime: LocalRuntime
    data: Path
    repo: Path
    managers: list[Manager] = field(default_factory=list)

    def joch(self, *args: str, input: str | None = None) -> Result:
        result = CliRunner().invoke(app, list(args), input=input,
                                    env={"JOCH_SERVER": self.url, "JOCH_NAMESPACE": None})
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return Result(result.exit_code, result.stdout, result.stderr)

    def ok(self, *args: str, input: str | None = None) -> Result:
        result = self.joch(*args, input=input)
        assert result.code == 0, f"joch {' '.join(args)} exited {result.code}:\n{result.out}\n{result.err}"
        return result

    def apply(self, *objs: dict[str, Any]) -> None:
        apply_documents(self.store, load_documents("\n---\n".join(json.dumps(o) for o in objs)), dry_run=False)

    def agent(self, name: str, code: str, *, outputs: bool = False, **spec: Any) -> None:
        """An Agent whose provider runs ``python -c code OUTPUTS_DIR``."""
        provider: dict[str, Any] = {"binary": PY, "argsTemplate": ["-c", code, "{{ workspace.outputs }}"]}
        if outputs:
            provider["outputArtifacts"] = [{"name": "summary", "path": "summary.md"}]
        self.apply({"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": f"{name}-p"},
                    "spec": provider},
                   {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
                    "spec": {"providerRef": {"name": f"{name}-p"}, **spec}})

    def with_controllers(self) -> None:
        options = ControllerOptions(data_dir=self.data, leader_election=False, grace_seconds=1.0, resync_period=2.0)
        manager = Manager(self.store, build_controllers(self.store, self.runtime, options), options)
        manager.start()
        assert manager.wait_started(10)
        self.managers.append(manager)

    def run(self, name: str) -> dict[str, Any]:
        return self.store.get(kinds.AGENT_RUN, "default", name)

    def set_status(self, name: str, **status: Any) -> dict[str, Any]:
        current = self.run(name)
        return self.store.update_status(kinds.AGENT_RUN, {**current, "status": {**(current.get("status") or {}),
                                                                                  **status}})

    def executed(self, name: str, code: str, **status: Any) -> dict[str, Any]:
        """Run ``python -c code`` as the run's agent to its end and record it as the controller would."""
        run = self.run(name)
        rid = RunId(namespace="default", name=name, uid=run["metadata"]["uid"], attempt=1)
        outdir = self.runtime.workspace(rid, None).outputs
        ref = self.runtime.submit(RunnerSpec(run=rid, argv=(PY, "-c", code, outdir), timeout_seconds=60,
                                             outputs=status.pop("outputs", ())))
        deadline = time.monotonic() + 30
        while not (state := self.runtime.status(ref)).finished:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        artifacts = [{"name": a.name, "path": a.path, "sha256": a.sha256, "size": a.size} for a in state.artifacts]
        return self.set_status(name, **{"phase": "Succeeded", "runtimeRef": ref, "attempt": 1,
                                        "artifacts": artifacts, **status})

    def wait(self, name: str, phases: set[str], timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (self.run(name).get("status") or {}).get("phase") not in phases:
            assert time.monotonic() < deadline, f"run {name} stayed {self.run(name).get('status')}"
            time.sleep(0.05)
        return self.run(name)


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    (repo / "README.md").write_text("# demo\n")
    git("add", "README.md", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init", cwd=repo)
    store = open_store(f"sqlite:///{tmp_path / 'joch.db'}")
    runtime = LocalRuntime(tmp_path / "data")
    with ServerThread(create_app(store, runtime=runtime)) as thread:
        made = Cluster(thread.url, store, runtime, tmp_path / "data", repo)
        try:
            yield made
        finally:
            for manager in made.managers:
                manager.stop()
    runtime.close()
    store.close()


def created_name(result: Result) -> str:
    first = result.out.splitlines()[0]
    assert first.startswith("agentrun.runtime.joch.dev/") and first.endswith(" created"), result.out
    return first.split("/", 1)[1].removesuffix(" created")


# --- run ---------------------------------------------------------------------------------------------

def test_run_creates_an_agent_run(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.agent("coder", "print('hi')")
    monkeypatch.chdir(cluster.repo.parent)
    result = cluster.ok("run", "--agent", "coder", "--text", "add tests", "--repo", "repo", "--ref", "main",
                        "--path", ".", "--timeout", "60", "--idempotency-key", "k-1", "--param", "a=1",
                        "--param", "b=x=y")
    name = created_name(result)
    assert name.startswith("coder-") and len(name) > len("coder-")
    spec = cluster.run(name)["spec"]
    assert spec["agentRef"] == {"name": "coder"}
    assert spec["implementation"] == {"inline": {"text": "add tests"}}
    assert spec["execution"]["coordinates"]["git"] == {"url": str(cluster.repo), "ref": "main", "path": "."}
    assert (spec["timeoutSeconds"], spec["idempotencyKey"]) == (60, "k-1")
    assert spec["parameters"] == {"a": "1", "b": "x=y"}


def test_run_with_a_spec_a_name_a_url_and_text_from_stdin(cluster: Cluster) -> None:
    cluster.agent("coder", "print('hi')")
    cluster.apply({"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSpec", "metadata": {"name": "s"},
                   "spec": {"text": "do it"}})
    assert cluster.ok("run", "--agent", "coder", "--spec", "s", "--repo", "https://example.com/r.git",
                      "--name", "mine").out == RUN_LINE.format("mine") + "\n"
    run = cluster.run("mine")
    assert run["spec"]["implementationRef"] == {"name": "s"}
    assert run["spec"]["execution"]["coordinates"]["git"] == {"url": "https://example.com/r.git", "ref": "HEAD",
                                                              "path": "."}  # the defaults
    piped = cluster.ok("run", "--agent", "coder", "--text", "-", "--repo", "git@example.com:o/r.git",
                       input="from stdin\n")
    assert cluster.run(created_name(piped))["spec"]["implementation"]["inline"]["text"] == "from stdin\n"


@pytest.mark.parametrize(("args", "message"), [
    (["--spec", "s", "--text", "t"], "error: give exactly one of --spec NAME (an ImplementationSpec) or --text TEXT"),
    ([], "error: give exactly one of --spec NAME (an ImplementationSpec) or --text TEXT"),
    (["--text", "t", "--param", "novalue"], 'error: --param must be KEY=VALUE (got "novalue")'),
    (["--text", "  "], "error: --text is empty"),
])
def test_run_usage_errors(cluster: Cluster, args: list[str], message: str) -> None:
    result = cluster.joch("run", "--agent", "coder", "--repo", str(cluster.repo), *args)
    assert result.code == 2 and result.err.startswith(message), result.err
    assert result.out == "" and not cluster.store.list(kinds.AGENT_RUN).items


def test_run_usage_errors_from_the_parser_and_the_server(cluster: Cluster) -> None:
    missing = cluster.joch("run", "--text", "t", "--repo", str(cluster.repo))
    assert missing.code == 2 and "--agent" in missing.err and "Traceback" not in missing.err
    no_dir = cluster.joch("run", "--agent", "coder", "--text", "t", "--repo", "no/such/dir")
    assert no_dir.code == 2
    assert no_dir.err.startswith('error: --repo "no/such/dir" is neither a URL nor a directory')
    zero = cluster.joch("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--timeout", "0")
    assert zero.code == 2 and "--timeout" in zero.err
    no_agent = cluster.joch("run", "--agent", "ghost", "--text", "t", "--repo", str(cluster.repo))
    assert no_agent.code == 2 and "ghost" in no_agent.err  # admission: the agent must exist


def test_run_follow_succeeds_with_log_and_artifacts(cluster: Cluster) -> None:
    cluster.with_controllers()
    code = ("import sys, pathlib; print('working', flush=True); "
            "pathlib.Path(sys.argv[1], 'summary.md').write_text('all done')")
    cluster.agent("coder", code, outputs=True)
    result = cluster.joch("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--follow")
    assert result.code == 0, result.out + result.err
    name = created_name(result)
    lines = result.out.splitlines()
    assert "working" in lines
    assert any(line.startswith("==> Running") for line in lines)
    assert any(line.startswith(f"agentrun.runtime.joch.dev/{name} Succeeded") for line in lines)
    digest = hashlib.sha256(b"all done").hexdigest()
    assert "Artifacts:" in lines and any(line.split()[:3] == ["summary", "8", digest] for line in lines)


def test_run_follow_exit_codes_for_failed_and_cancelled(cluster: Cluster) -> None:
    cluster.with_controllers()
    cluster.agent("failing", "import sys; print('bad'); sys.exit(3)")
    failed = cluster.joch("run", "--agent", "failing", "--text", "t", "--repo", str(cluster.repo), "--follow")
    assert failed.code == 8, failed.out + failed.err
    assert f"agentrun.runtime.joch.dev/{created_name(failed)} Failed: agent exited with code 3" in failed.out

    cluster.agent("slow", "import time; print('sleeping', flush=True); time.sleep(60)")

    def cancel_when_running() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            running = [r["metadata"]["name"] for r in cluster.store.list(kinds.AGENT_RUN).items
                       if r["spec"]["agentRef"]["name"] == "slow" and (r.get("status") or {}).get("phase") == "Running"]
            path = f"/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns/{running[0]}" if running else ""
            if path and "sleeping" in httpx.get(f"{cluster.url}{path}/log").text:  # the agent is under way
                httpx.patch(f"{cluster.url}{path}", content=b'{"spec":{"cancel":true}}',
                            headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
                return
            time.sleep(0.05)

    canceller = threading.Thread(target=cancel_when_running, daemon=True)
    canceller.start()
    cancelled = cluster.joch("run", "--agent", "slow", "--text", "t", "--repo", str(cluster.repo), "--follow")
    canceller.join(5)
    assert cancelled.code == 9, cancelled.out + cancelled.err
    assert "sleeping" in cancelled.out and " Cancelled" in cancelled.out


def test_run_follow_through_an_approval(cluster: Cluster) -> None:
    cluster.with_controllers()
    cluster.agent("gated", "print('approved and ran')", requiresApproval=True)
    name = created_name(cluster.ok("run", "--agent", "gated", "--text", "t", "--repo", str(cluster.repo)))
    cluster.wait(name, {"AwaitingApproval"})
    approved = cluster.ok("approve", "run", name, "--reason", "looks fine")
    assert approved.out == f"approval.runtime.joch.dev/{name}-dispatch approved\n"
    cluster.wait(name, {"Succeeded"})
    assert cluster.ok("logs", name).out == "approved and ran\n"

    denied_run = created_name(cluster.ok("run", "--agent", "gated", "--text", "t", "--repo", str(cluster.repo)))
    cluster.wait(denied_run, {"AwaitingApproval"})
    assert cluster.ok("deny", f"run/{denied_run}").out == f"approval.runtime.joch.dev/{denied_run}-dispatch denied\n"
    assert cluster.wait(denied_run, {"Failed"})["status"]["reason"] == "ApprovalDenied"
    none_left = cluster.joch("approve", "run", denied_run)
    assert none_left.code == 3
    assert none_left.err == f'error: run "{denied_run}" has no pending approval (phase Failed)\n'


# --- logs --------------------------------------------------------------------------------------------

def test_logs_in_every_spelling(cluster: Cluster) -> None:
    cluster.agent("coder", "print('hi')")
    cluster.ok("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--name", "r1")
    cluster.executed("r1", "print('line one'); print('line two')")
    for args in (["r1"], ["run", "r1"], ["runs", "r1"], ["run/r1"], ["agentruns.runtime.joch.dev", "r1"],
                 ["-f", "r1"], ["r1", "--attempt", "1"]):
        assert cluster.ok("logs", *args).out == "line one\nline two\n", args


def test_logs_errors(cluster: Cluster) -> None:
    cluster.agent("coder", "print('hi')")
    missing = cluster.joch("logs", "ghost")
    assert missing.code == 3 and missing.err.startswith("error: ") and "ghost" in missing.err
    cluster.ok("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--name", "r1")
    cluster.set_status("r1", phase="Queued")
    queued = cluster.joch("logs", "run", "r1")
    assert queued.code == 2
    assert queued.err == 'error: run "r1" has not started (phase Queued); use --follow to wait\n'
    wrong_kind = cluster.joch("logs", "agent", "coder")
    assert wrong_kind.code == 2 and wrong_kind.err.startswith('error: joch logs works on run objects, not "agent"')
    two = cluster.joch("logs", "run", "a", "b")
    assert two.code == 2 and "one run's log at a time" in two.err


def test_logs_follow_waits_for_the_run_and_streams_it(cluster: Cluster) -> None:
    cluster.with_controllers()
    cluster.agent("gated", "import time; print('one', flush=True); time.sleep(0.5); print('two')",
                  requiresApproval=True)
    name = created_name(cluster.ok("run", "--agent", "gated", "--text", "t", "--repo", str(cluster.repo)))
    cluster.wait(name, {"AwaitingApproval"})
    threading.Timer(0.5, lambda: httpx.post(f"{cluster.url}/v1/namespaces/default/approvals/{name}-dispatch/decide",
                                            json={"decision": "approve"})).start()
    assert cluster.ok("logs", "-f", name).out == "one\ntwo\n"


# --- cancel ------------------------------------------------------------------------------------------

def test_cancel(cluster: Cluster) -> None:
    cluster.agent("coder", "print('hi')")
    cluster.ok("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--name", "q")
    cluster.set_status("q", phase="Queued")
    assert cluster.ok("cancel", "run", "q").out == "agentrun.runtime.joch.dev/q cancel requested\n"
    assert cluster.run("q")["spec"]["cancel"] is True

    cluster.ok("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--name", "done")
    before = cluster.executed("done", "print('x')")
    result = cluster.ok("cancel", "run/done")
    assert result.out == "agentrun.runtime.joch.dev/done already finished (Succeeded); nothing to cancel\n"
    after = cluster.run("done")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert not after["spec"].get("cancel")

    several = cluster.joch("cancel", "run", "ghost", "q")
    assert several.code == 3 and "ghost" in several.err
    assert several.out == "agentrun.runtime.joch.dev/q cancel requested\n"
    assert cluster.joch("cancel", "approval", "x").code == 2
    assert cluster.joch("cancel", "run").code == 2


def test_cancel_a_running_run_with_the_controller(cluster: Cluster) -> None:
    cluster.with_controllers()
    cluster.agent("slow", "import time; time.sleep(60)")
    name = created_name(cluster.ok("run", "--agent", "slow", "--text", "t", "--repo", str(cluster.repo)))
    cluster.wait(name, {"Running"})
    cluster.ok("cancel", "run", name)
    assert cluster.wait(name, {"Cancelled", "Failed"})["status"]["phase"] == "Cancelled"


# --- approvals ---------------------------------------------------------------------------------------

def approval(cluster: Cluster, name: str, run: str, action: str = "dispatch") -> None:
    cluster.apply({"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "Approval", "metadata": {"name": name},
                   "spec": {"runRef": {"name": run}, "action": action}})


def test_approve_and_deny_by_name(cluster: Cluster) -> None:
    cluster.agent("coder", "print('hi')")
    cluster.ok("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--name", "r")
    approval(cluster, "yes", "r")
    approval(cluster, "no", "r", "write-back")
    assert cluster.ok("approve", "approval", "yes", "--reason", "ok").out == "approval.runtime.joch.dev/yes approved\n"
    status = cluster.store.get(kinds.APPROVAL, "default", "yes")["status"]
    assert (status["phase"], status["reason"], status["decidedBy"]) == ("Approved", "ok", "system:anonymous")
    assert cluster.ok("deny", "apr/no").out == "approval.runtime.joch.dev/no denied\n"
    twice = cluster.joch("deny", "approval", "yes")
    assert twice.code == 5
    assert twice.err.startswith('error: approval "yes" was already approved by system:anonymous at ')
    missing = cluster.joch("approve", "approval", "ghost")
    assert missing.code == 3 and "ghost" in missing.err


def test_approve_run_needs_exactly_one_pending_approval(cluster: Cluster) -> None:
    cluster.agent("coder", "print('hi')")
    cluster.ok("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--name", "r")
    none = cluster.joch("approve", "run", "r")
    assert none.code == 3 and none.err == 'error: run "r" has no pending approval (phase Pending)\n'
    approval(cluster, "first", "r")
    approval(cluster, "second", "r", "release")
    two = cluster.joch("approve", "run", "r")
    assert two.code == 5
    assert two.err == ('error: run "r" has 2 pending approvals (first, second): decide one by name, e.g. '
                       "joch approve approval first\n")
    cluster.ok("deny", "approval", "second")
    assert cluster.ok("approve", "run", "r").out == "approval.runtime.joch.dev/first approved\n"
    ghost = cluster.joch("approve", "run", "ghost")
    assert ghost.code == 3 and "ghost" in ghost.err
    assert cluster.joch("approve", "agent", "x").code == 2


# --- artifacts ---------------------------------------------------------------------------------------

WRITE = "import sys, pathlib; pathlib.Path(sys.argv[1], 'summary.md').write_text('the summary')"


def with_artifact(cluster: Cluster, name: str = "r") -> dict[str, Any]:
    from joch.runtime.base import Output

    cluster.agent("coder", "print('hi')")
    cluster.ok("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--name", name)
    return cluster.executed(name, WRITE, outputs=(Output("summary", "summary.md"),))


def test_artifacts_table_and_download(cluster: Cluster, tmp_path: Path) -> None:
    with_artifact(cluster)
    digest = hashlib.sha256(b"the summary").hexdigest()
    table = cluster.ok("artifacts", "run", "r").out.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "SHA256", "PATH"]
    assert table[1].split()[:3] == ["summary", "11", digest]
    target = tmp_path / "out" / "nested"
    result = cluster.ok("artifacts", "run/r", "--download", str(target))
    # saved under the artifact's name with its path's suffix: summary (outputs/summary.md) → summary.md
    assert result.out == f"{target / 'summary.md'} (11 bytes, sha256 verified)\n"
    assert (target / "summary.md").read_bytes() == b"the summary"
    assert sorted(p.name for p in target.iterdir()) == ["summary.md"]


def test_a_download_that_does_not_match_its_digest_is_removed(cluster: Cluster, tmp_path: Path) -> None:
    run = with_artifact(cluster)
    tampered = [{**run["status"]["artifacts"][0], "sha256": "0" * 64}]
    cluster.set_status("r", artifacts=tampered)
    result = cluster.joch("artifacts", "run", "r", "--download", str(tmp_path / "dl"))
    assert result.code == 1
    assert result.err.startswith('error: artifact "summary": the downloaded bytes have sha256 ')
    assert "the file was removed" in result.err
    assert list((tmp_path / "dl").iterdir()) == []


def test_artifacts_of_runs_without_any(cluster: Cluster, tmp_path: Path) -> None:
    cluster.agent("coder", "print('hi')")
    cluster.ok("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--name", "r")
    empty = cluster.ok("artifacts", "run", "r")
    assert empty.out == "" and empty.err == 'No artifacts for run "r" in default namespace.\n'
    assert cluster.ok("artifacts", "run", "r", "--download", str(tmp_path / "d")).out == ""
    missing = cluster.joch("artifacts", "run", "ghost")
    assert missing.code == 3
    unsafe = cluster.set_status("r", phase="Succeeded", artifacts=[{"name": "../escape", "path": "x"}])
    assert unsafe["status"]["artifacts"]
    escaped = cluster.joch("artifacts", "run", "r", "--download", str(tmp_path / "d"))
    assert escaped.code == 2 and "not a plain file name" in escaped.err
    assert not (tmp_path / "escape").exists()


# --- describe ----------------------------------------------------------------------------------------

def test_describe_run_shows_artifacts_and_the_runs_events(cluster: Cluster) -> None:
    cluster.with_controllers()
    cluster.agent("coder", WRITE, outputs=True)
    name = created_name(cluster.ok("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo)))
    cluster.wait(name, {"Succeeded"})
    page = cluster.ok("describe", "run", name).out
    artifacts = page.split("Artifacts:\n")[1].splitlines()
    assert artifacts[0].split() == ["Name", "Size", "SHA256"]
    assert artifacts[2].split() == ["summary", "11", hashlib.sha256(b"the summary").hexdigest()]
    assert "  artifacts:" not in page  # shown once, as the table
    events = page.split("Events:\n")[1].splitlines()
    assert events[0].split() == ["Type", "Reason", "Age", "From", "Message"]
    reasons = [line.split()[1] for line in events[2:]]
    assert "Started" in reasons and "Succeeded" in reasons
    other = cluster.ok("describe", "agent", "coder").out
    assert "Artifacts:" not in other


def test_get_approvals_shows_pending_first_then_the_newest(cluster: Cluster) -> None:
    cluster.agent("coder", "print('hi')")
    cluster.ok("run", "--agent", "coder", "--text", "t", "--repo", str(cluster.repo), "--name", "r")
    approval(cluster, "z-old", "r")
    time.sleep(1.1)  # creationTimestamp has seconds: the next ones are newer
    approval(cluster, "m-new", "r", "tool-use")
    approval(cluster, "a-done", "r", "release")
    cluster.ok("approve", "approval", "a-done")
    lines = cluster.ok("get", "approvals").out.splitlines()
    assert lines[0].split() == ["NAME", "RUN", "ACTION", "PHASE", "REQUESTED-BY", "DECIDED-BY", "AGE"]
    rows = [line.split() for line in lines[1:]]
    assert [row[0] for row in rows] == ["m-new", "z-old", "a-done"]
    assert rows[2][1:6] == ["r", "release", "Approved", "<none>", "system:anonymous"]
