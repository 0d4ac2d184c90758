"""Issue 9 in the run controller: the provider's policies reach the runner's spec, what the runner
records reaches the run's status, and an attempt whose runner was lost is resumed — its CLI session
id in the argv, the earlier attempt's worktree kept and used — or started over, and status says which."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from integration.controllers.test_runs import Env, agent, make_env, provider, repo, script
from joch.api import kinds
from joch.runtime import runner
from joch.runtime.base import RunnerSpec

__all__ = ["make_env", "repo"]  # fixtures

# The agent: records its argv (one file per attempt), then on a first attempt leaves a file in its
# worktree and sleeps (its runner is killed); an attempt given --resume reports whether that file
# is in the worktree it was told about, and exits 0.
AGENT = """\
import json, os, pathlib, sys, time
out = pathlib.Path(sys.argv[1]); worktree = pathlib.Path(sys.argv[2]); attempt = sys.argv[3]
(out / f"argv-{attempt}").write_text(json.dumps(sys.argv[1:]))
if "--resume" in sys.argv:
    (out / "found").write_text(str((worktree / "work-of-attempt-1").exists()))
    if (out / f"sleep-{attempt}").exists():
        (out / f"pid-{attempt}").write_text(str(os.getpid()))
        time.sleep(60)
    sys.exit(0)
if attempt == "1":
    (worktree / "work-of-attempt-1").write_text("half done")
    (out / "pid").write_text(str(os.getpid()))
    time.sleep(60)
sys.exit(0)
"""


def resumable(out: Path, **spec: Any) -> dict[str, Any]:
    return provider("p", [*script(AGENT), str(out), "{{ workspace.path }}", "{{ run.attempt }}",
                          {"when": "session.id", "args": ["--resume", "{{ session.id }}"]}], **spec)


def wait_for(path: Path, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def record_session(env: Env, uid: str, attempt: int, session_id: str) -> None:
    """What the runner does when the agent's output names its session (issue 9 §3): the id, in the
    Running record, at once."""
    state = env.data_dir / "runs" / uid / str(attempt) / "state.json"
    record = json.loads(state.read_text())
    record["session"] = {"id": session_id, "resumed_from": None}
    runner.write_durably(state, json.dumps(record).encode())


def kill_runner_after_session(env: Env, name: str, out: Path, attempt: int = 1, session_id: str | None = None
                              ) -> dict[str, Any]:
    wait_for(out / ("pid" if attempt == 1 else f"pid-{attempt}"))
    deadline = time.monotonic() + 15
    while (run := env.run(name))["status"].get("attempt") != attempt or "runnerPid" not in (
            run["status"].get("runtimeRef") or {}):
        assert time.monotonic() < deadline, run["status"]
        time.sleep(0.05)
    session_id = session_id or f"sess-{attempt}"
    record_session(env, run["metadata"]["uid"], attempt, session_id)
    while ((run := env.run(name))["status"].get("session") or {}).get("id") != session_id:
        assert time.monotonic() < deadline, run["status"]  # mapped into status while it runs
        time.sleep(0.05)
    os.kill(int(run["status"]["runtimeRef"]["runnerPid"]), 9)
    return run


def spec_of(env: Env, uid: str, attempt: int) -> RunnerSpec:
    return RunnerSpec.from_json((env.data_dir / "runs" / uid / str(attempt) / "spec.json").read_text())


def test_a_lost_runner_of_a_resumable_provider_is_resumed_in_the_same_worktree(make_env: Callable[..., Env]) -> None:
    env = make_env()
    out = env.tmp / "out"
    out.mkdir()
    env.apply(resumable(out, resumable=True), agent("a", "p", defaults={"retryLimit": 1}))
    name = env.create_run()
    run = kill_runner_after_session(env, name, out)
    assert run["status"]["session"] == {"id": "sess-1", "attempt": 1}
    uid = run["metadata"]["uid"]
    run = env.wait(name, {"Succeeded", "Failed"}, timeout=30)
    status = run["status"]
    assert status["phase"] == "Succeeded" and status["attempt"] == 2, status
    assert status["session"]["id"] == "sess-1" and status["session"]["resumedFromAttempt"] == 1, status
    first_worktree = str(env.data_dir / "workspaces" / f"{uid}-1")
    argv = json.loads((out / "argv-2").read_text())
    assert argv[1:] == [first_worktree, "2", "--resume", "sess-1"]
    assert (out / "found").read_text() == "True"  # attempt 1's worktree was kept for attempt 2
    resume = spec_of(env, uid, 2).resume
    assert resume is not None and (resume.attempt, resume.session_id) == (1, "sess-1")
    notes = [m for reason, m in env.events(name) if reason == "Retrying"]
    assert "resuming the agent's session sess-1 (attempt 1's worktree)" in notes[0]
    # once the run has ended, the kept worktree goes too
    deadline = time.monotonic() + 10
    while Path(first_worktree).exists():
        assert time.monotonic() < deadline, "attempt 1's worktree was never removed"
        time.sleep(0.05)


def test_an_attempt_lost_while_resuming_is_resumed_in_the_first_worktree(make_env: Callable[..., Env]) -> None:
    env = make_env()
    out = env.tmp / "out"
    out.mkdir()
    (out / "sleep-2").write_text("")  # attempt 2 (resuming) sleeps too, and its runner is killed
    env.apply(resumable(out, resumable=True), agent("a", "p", defaults={"retryLimit": 2}))
    name = env.create_run()
    uid = kill_runner_after_session(env, name, out)["metadata"]["uid"]
    run = kill_runner_after_session(env, name, out, attempt=2)
    # the runner recorded the CLI's (new) session id without resumed_from: status still knows
    assert run["status"]["session"] == {"id": "sess-2", "attempt": 2, "resumedFromAttempt": 1}
    status = env.wait(name, {"Succeeded", "Failed"}, timeout=30)["status"]
    assert status["phase"] == "Succeeded" and status["attempt"] == 3, status
    assert status["session"] == {"id": "sess-2", "attempt": 3, "resumedFromAttempt": 1}
    first_worktree = str(env.data_dir / "workspaces" / f"{uid}-1")
    assert json.loads((out / "argv-3").read_text())[1:] == [first_worktree, "3", "--resume", "sess-2"]
    resume = spec_of(env, uid, 3).resume
    assert resume is not None and (resume.attempt, resume.session_id) == (1, "sess-2")


def test_a_deadline_raised_while_the_agent_ran_continues_its_session(make_env: Callable[..., Env]) -> None:
    env = make_env()
    out = env.tmp / "out"
    out.mkdir()
    env.apply(resumable(out, resumable=True), agent("a", "p"))  # no retries: the raise alone continues it
    name = env.create_run(timeoutSeconds=6)
    wait_for(out / "pid")
    run = env.wait(name, {"Running"})
    uid = run["metadata"]["uid"]
    while "runnerPid" not in (run["status"].get("runtimeRef") or {}):
        run = env.wait(name, {"Running"})
    record_session(env, uid, 1, "sess-1")
    while ((run := env.run(name))["status"].get("session") or {}).get("id") != "sess-1":
        assert run["status"]["phase"] == "Running", run["status"]
        time.sleep(0.05)
    env.store.update(kinds.AGENT_RUN, {**run, "spec": {**run["spec"], "timeoutSeconds": 60}})
    status = env.wait(name, {"Succeeded", "Failed"}, timeout=30)["status"]
    assert status["phase"] == "Succeeded" and status["attempt"] == 2, status
    assert status["session"] == {"id": "sess-1", "attempt": 2, "resumedFromAttempt": 1}
    assert json.loads((out / "argv-2").read_text())[3:] == ["--resume", "sess-1"]
    notes = [m for reason, m in env.events(name) if reason == "Retrying"]
    assert "spec.timeoutSeconds was raised to 60 s meanwhile; continuing as attempt 2" in notes[0], notes


def test_a_missed_deadline_that_was_not_raised_fails(make_env: Callable[..., Env]) -> None:
    env = make_env()
    out = env.tmp / "out"
    out.mkdir()
    env.apply(resumable(out, resumable=True), agent("a", "p", defaults={"retryLimit": 1}))
    name = env.create_run(timeoutSeconds=2)
    wait_for(out / "pid")
    run = env.wait(name, {"Running"})
    while "runnerPid" not in (run["status"].get("runtimeRef") or {}):
        run = env.wait(name, {"Running"})
    record_session(env, run["metadata"]["uid"], 1, "sess-1")
    status = env.wait(name, {"Succeeded", "Failed"}, timeout=30)["status"]
    assert (status["phase"], status["reason"], status["attempt"]) == ("Failed", "DeadlineExceeded", 1), status


def test_a_provider_that_is_not_resumable_starts_over(make_env: Callable[..., Env]) -> None:
    env = make_env()
    out = env.tmp / "out"
    out.mkdir()
    env.apply(resumable(out), agent("a", "p", defaults={"retryLimit": 1}))
    name = env.create_run()
    uid = kill_runner_after_session(env, name, out)["metadata"]["uid"]
    run = env.wait(name, {"Succeeded", "Failed"}, timeout=30)
    assert run["status"]["attempt"] == 2 and run["status"]["phase"] == "Succeeded", run["status"]
    assert "session" not in run["status"]
    assert json.loads((out / "argv-2").read_text())[1:] == [str(env.data_dir / "workspaces" / f"{uid}-2"), "2"]
    assert spec_of(env, uid, 2).resume is None
    notes = [m for reason, m in env.events(name) if reason == "Retrying"]
    assert "starting over (the provider is not resumable)" in notes[0]


def test_a_recorded_session_id_that_is_an_option_is_not_resumed(make_env: Callable[..., Env]) -> None:
    # A record the agent could have written (a container runtime's runner shares its file system):
    # its "session id" must not reach the next attempt's argv as a flag.
    env = make_env()
    out = env.tmp / "out"
    out.mkdir()
    env.apply(resumable(out, resumable=True), agent("a", "p", defaults={"retryLimit": 1}))
    name = env.create_run()
    uid = kill_runner_after_session(env, name, out, session_id="--dangerously-skip-permissions")["metadata"]["uid"]
    run = env.wait(name, {"Succeeded", "Failed"}, timeout=30)
    assert run["status"]["attempt"] == 2 and run["status"]["phase"] == "Succeeded", run["status"]
    assert json.loads((out / "argv-2").read_text())[1:] == [str(env.data_dir / "workspaces" / f"{uid}-2"), "2"]
    assert spec_of(env, uid, 2).resume is None


def test_the_provider_policies_and_agent_network_reach_the_runner(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(
        provider("p", script("import sys; sys.exit(0)"), outputFormat="claude-code", versionArgs=["-V"],
                 parameters=[{"name": "model", "default": "m1"}],
                 configFiles=[{"path": ".tool/config.toml", "content": 'model = "{{ parameters.model }}"'}],
                 successPolicy={"failurePatterns": ["boom"]}, patch={"exclude": [".cache*"], "maxFileBytes": 99}),
        agent("a", "p", defaults={"parameters": {"model": "m2"}},
              security={"network": {"mode": "limited", "allow": ["127.0.0.1:9"]}}),
    )
    name = env.create_run()
    run = env.wait(name, {"Succeeded", "Failed"})
    status = run["status"]
    # These runs are not sandboxed (--sandbox none), so a limited network cannot be enforced: the
    # run is refused rather than run with the host's network; everything else reached the runner.
    assert (status["phase"], status["reason"]) == ("Failed", "StartError"), status
    assert "spec.security.network.mode is limited" in status["message"], status
    spec = spec_of(env, run["metadata"]["uid"], 1)
    assert [(f.path, f.content, f.mode) for f in spec.config_files] == [(".tool/config.toml", 'model = "m2"', 0o600)]
    assert (spec.output_format, spec.version_args) == ("claude-code", ("-V",))
    assert spec.success.failure_patterns == ("boom",) and spec.success.agent_result
    assert (spec.patch.exclude, spec.patch.max_file_bytes) == ((".cache*",), 99)
    assert (spec.network.mode, spec.network.allow) == ("limited", ("127.0.0.1:9",))
    assert spec.manifest_hash == status["compiledManifestHash"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=env.repo, capture_output=True, text=True).stdout.strip()
    assert status["baseCommit"] == head


def test_an_undeclared_run_parameter_fails_the_run_naming_it(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", ["{{ parameters.model }}"], parameters=[{"name": "model", "default": "m"}]),
              agent("a", "p"))
    name = env.create_run(parameters={"modle": "x"})
    status = env.wait(name, {"Failed"})["status"]
    assert status["reason"] == "UnknownParameter", status
    assert 'spec.parameters.modle: AgentProvider/p declares no parameter "modle" (did you mean "model"?)' in (
        status["message"])
