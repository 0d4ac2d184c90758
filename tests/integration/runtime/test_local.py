"""The local runtime: idempotent submit, re-adoption, lost runners, cancel, logs, cleanup."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from integration.runtime.helpers import (
    Repo,
    git_source,
    group_members,
    pid_alive,
    python_agent,
    spec,
    wait_for,
)
from joch.runtime.base import GitSource, Output, RunId, RunState
from joch.runtime.local import LocalRuntime

# Waits for a file named by its first argument, so a test decides when the agent ends.
GATED = ("import os, sys, time\n"
         "open(sys.argv[2], 'a').write('started\\n')\n"
         "print('waiting', flush=True)\n"
         "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
         "print('released', flush=True)\n")


def gated(tmp_path: Path, **fields: object) -> tuple[list[str], Path, Path]:
    go, starts = tmp_path / "go", tmp_path / "starts"
    return [*python_agent(GATED), str(go), str(starts)], go, starts


def finished(rt: LocalRuntime, ref: dict[str, object], timeout: float = 15) -> RunState:
    return wait_for(lambda: (s := rt.status(ref)).finished and s, timeout)  # type: ignore[no-any-return]


def running(rt: LocalRuntime, ref: dict[str, object]) -> RunState:
    return wait_for(lambda: (s := rt.status(ref)).phase == "Running" and s)  # type: ignore[no-any-return]


def test_a_run_from_submit_to_artifacts(local: LocalRuntime, repo: Repo, tmp_path: Path) -> None:
    changed: list[RunId] = []
    local.subscribe(changed.append)
    source = git_source(repo)
    ws = local.workspace(RunId("default", "demo", "u-1"), source)
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())  # pure: nothing created
    code = ("import os, sys; print(os.getcwd()); open('README.md', 'a').write('more\\n'); "
            "open(os.path.join(sys.argv[1], 'summary.md'), 'w').write('ok')")
    s = spec([*python_agent(code), ws.outputs], uid="u-1", git=source, outputs=(Output("summary", "summary.md"),))
    ref = local.submit(s)
    assert ref["type"] == "local" and ref["id"] == "u-1/1" and isinstance(ref["runnerPid"], int)
    assert ref["dir"] == str(tmp_path / "data" / "runs" / "u-1" / "1")

    state = finished(local, ref)
    assert (state.phase, state.reason) == ("Succeeded", "Completed")
    assert b"".join(local.logs(ref)) == f"{ws.path}\n".encode()
    assert b"".join(local.logs(ref, offset=3)) == f"{ws.path}\n".encode()[3:]
    record, f = local.open_artifact(ref, "summary")
    with f:
        assert f.read() == b"ok" and record.size == 2
    record, f = local.open_artifact(ref, "changes.patch")
    with f:
        assert b"+more" in f.read()
    with pytest.raises(KeyError):
        local.open_artifact(ref, "nothing")
    wait_for(lambda: changed.count(s.run) >= 2)  # running, then finished (or both in one poll)
    wait_for(lambda: not pid_alive(ref["runnerPid"]) and not Path(f"/proc/{ref['runnerPid']}").exists())  # reaped

    assert Path(ws.home).is_dir()
    local.cleanup(ref)
    assert not Path(ws.root).exists() and (tmp_path / "data/runs/u-1/1/state.json").exists()
    assert not Path(ws.home).exists()  # what the CLI kept there (keys in Codex's shell snapshots) goes too
    local.cleanup(ref, keep_records=False)
    assert not (tmp_path / "data/runs/u-1").exists()


def test_submit_is_idempotent_across_instances(local: LocalRuntime, tmp_path: Path) -> None:
    argv, go, starts = gated(tmp_path)
    s = spec(argv, uid="u-2")
    ref = local.submit(s)
    assert local.submit(s) == ref
    other = LocalRuntime(tmp_path / "data", poll_interval=0.02)
    try:
        assert other.submit(s) == ref
        running(local, ref)
        go.touch()
        assert finished(other, ref).phase == "Succeeded"
    finally:
        other.close()
    assert starts.read_text() == "started\n"  # one agent process, ever


def test_a_new_instance_re_adopts_a_running_run(tmp_path: Path) -> None:
    first = LocalRuntime(tmp_path / "data", poll_interval=0.02)
    argv, go, _ = gated(tmp_path)
    ref = first.submit(spec(argv, uid="u-3"))
    running(first, ref)
    first.close()  # a server stopping: the run goes on

    second = LocalRuntime(tmp_path / "data", poll_interval=0.02)
    try:
        seen: list[RunId] = []
        second.subscribe(seen.append)
        assert second.status(dict(ref)).phase == "Running"  # adopted
        go.touch()
        wait_for(lambda: seen)
        assert finished(second, ref).phase == "Succeeded"
        assert b"".join(second.logs(ref)) == b"waiting\nreleased\n"
    finally:
        second.close()


def test_a_killed_runner_is_lost_and_its_agent_killed(local: LocalRuntime, tmp_path: Path) -> None:
    seen: list[RunId] = []
    local.subscribe(seen.append)
    script = "sleep 30 & echo $! > grandchild; echo started; wait"
    ref = local.submit(spec(["sh", "-c", script], uid="u-4"))
    agent = running(local, ref)
    workspace_root = tmp_path / "data/workspaces/u-4-1"
    wait_for(lambda: (workspace_root / "grandchild").exists())
    os.kill(ref["runnerPid"], signal.SIGKILL)

    state = finished(local, ref)
    assert (state.phase, state.reason) == ("Lost", "RunnerLost")
    assert state.message == "the runner process vanished while the agent ran; agent killed"
    pid = agent.pid
    assert pid is not None
    wait_for(lambda: group_members(pid) == [], timeout=5)
    assert not pid_alive(int((workspace_root / "grandchild").read_text()))
    assert LocalRuntime.status(local, ref) == state  # recorded: the same answer every time
    wait_for(lambda: seen)


def test_cancel_stops_the_agent(local: LocalRuntime, tmp_path: Path) -> None:
    script = "sleep 30 & echo started; wait"
    ref = local.submit(spec(["sh", "-c", script], uid="u-5", grace_seconds=1))
    agent = running(local, ref)
    local.cancel(ref)
    state = finished(local, ref)
    assert (state.phase, state.reason, state.message) == ("Cancelled", "Cancelled", "cancelled; the agent was stopped")
    assert agent.pid is not None and group_members(agent.pid) == []
    local.cancel(ref)  # a finished run: nothing happens
    assert local.status(ref) == state


def test_cancel_right_after_submit(local: LocalRuntime, tmp_path: Path) -> None:
    argv, _, starts = gated(tmp_path)
    ref = local.submit(spec(argv, uid="u-6"))
    local.cancel(ref)
    state = finished(local, ref)
    assert (state.phase, state.reason) == ("Cancelled", "Cancelled")
    if state.pid is None:
        assert state.message == "cancelled before the agent started"
        time.sleep(0.2)
        assert not starts.exists()
    else:  # the runner was quick: the agent had started and was stopped
        assert group_members(state.pid) == []


def test_logs_follow_until_the_run_ends(local: LocalRuntime) -> None:
    code = "import time\nfor i in range(5):\n    print('line', i, flush=True); time.sleep(0.05)"
    ref = local.submit(spec(python_agent(code), uid="u-7"))
    text = b"".join(local.logs(ref, follow=True)).decode()
    assert text == "".join(f"line {i}\n" for i in range(5))
    assert local.status(ref).finished


def test_secrets_reach_only_the_agent(local: LocalRuntime, tmp_path: Path) -> None:
    secret = "s3cr3t-value-xyz"
    code = "import os; print('key', os.environ['KEY'], os.environ.get('OTHER'))"
    ref = local.submit(spec(python_agent(code), uid="u-8", secret_env=("KEY",)),
                       secrets={"KEY": secret, "OTHER": "not-named-in-secret-env"})
    assert finished(local, ref).phase == "Succeeded"
    assert b"".join(local.logs(ref)) == b"key *** None\n"
    assert secret not in str(ref)
    for path in (tmp_path / "data").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_the_agent_does_not_inherit_the_servers_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOCH_STORE", "postgresql://joch:store-password@db/joch")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "server-side-key")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    rt = LocalRuntime(tmp_path / "data")  # started after the variables are set, as a server would be
    try:
        code = "import os,json; print(json.dumps(sorted(os.environ)))"
        ref = rt.submit(spec(python_agent(code), uid="u-env", env={"FROM_PROVIDER": "yes"}))
        assert finished(rt, ref).phase == "Succeeded"
        names = json.loads(b"".join(rt.logs(ref)))
    finally:
        rt.close()
    assert "JOCH_STORE" not in names and "AWS_SECRET_ACCESS_KEY" not in names
    assert {"PATH", "HOME", "LC_ALL", "FROM_PROVIDER"} <= set(names)


def test_variants_of_a_secret_are_redacted(local: LocalRuntime) -> None:
    secret = "line-one-secret\nline-two-secret\n"
    code = "import os; v=os.environ['KEY']; print(v.strip()); print(v.splitlines()[1]); print(v.upper())"
    ref = local.submit(spec(python_agent(code), uid="u-variants", secret_env=("KEY",)), secrets={"KEY": secret})
    assert finished(local, ref).phase == "Succeeded"
    log = b"".join(local.logs(ref)).decode()
    assert "line-one-secret" not in log and "line-two-secret" not in log
    assert "***" in log and "LINE-ONE-SECRET" in log  # a transformed value is not recognised


def test_submit_to_agent_start_latency(local: LocalRuntime, repo: Repo) -> None:
    started = time.time()
    ref = local.submit(spec(["true"], uid="u-9", git=git_source(repo)))
    state = finished(local, ref)
    assert state.started_at is not None
    latency = state.started_at - started
    print(f"submit -> agent start: {latency * 1000:.0f} ms (with a worktree checkout)")
    assert latency < 2.0


def test_unknown_and_malformed_references(local: LocalRuntime) -> None:
    state = local.status({"type": "local", "id": "nobody/1"})
    assert (state.phase, state.reason) == ("Lost", "RunnerLost")
    with pytest.raises(ValueError, match="not a local runtime reference"):
        local.status({"type": "kubernetes", "id": "x"})
    with pytest.raises(ValueError, match="malformed"):
        local.status({"type": "local", "id": "../../etc"})
    with pytest.raises(ValueError, match="cannot name a run directory"):
        local.workspace(RunId("default", "x", "../up"), None)
    with pytest.raises(ValueError, match="must be relative and stay inside the workspace"):
        local.workspace(RunId("default", "x", "u"), GitSource(url="x", path="../.."))


def test_a_runner_that_died_at_start_is_lost_with_its_last_words(local: LocalRuntime, tmp_path: Path) -> None:
    s = spec(["true"], uid="u-10")
    files = local.files(s.run)
    files.dir.mkdir(parents=True)
    files.spec.write_text(s.to_json())
    (files.dir / "runner.log").write_text("Traceback (most recent call last):\nImportError: boom\n")
    ref = {"type": "local", "id": "u-10/1", "runnerPid": os.getpid()}  # alive, but not this run's runner
    (files.dir / "ref.json").write_text(json.dumps(ref))
    state = local.status(ref)
    assert (state.phase, state.reason) == ("Lost", "RunnerLost")
    assert state.message == "the runner process vanished before it started the agent (runner.log: ImportError: boom)"
    assert local.status(ref) == state and local.submit(s) == ref  # recorded, and never started again


@pytest.mark.parametrize("timeout", [1.0, 30.0])
def test_processes_that_leave_the_agents_group_do_not_outlive_the_run(
    local: LocalRuntime, tmp_path: Path, timeout: float,
) -> None:
    """A daemon the agent starts in a session of its own (``setsid``), ignoring SIGTERM, is stopped
    too: when the deadline stops the agent, and when the agent exits on its own."""
    pid_file = tmp_path / f"daemon-{int(timeout)}"
    daemon_code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    code = ("import subprocess,sys,time,signal; "
            f"p=subprocess.Popen([sys.executable,'-c',{daemon_code!r}], start_new_session=True); "
            f"open({str(pid_file)!r},'w').write(str(p.pid)); "
            "time.sleep(60 if len(sys.argv) < 2 else 0)")
    argv = python_agent(code) + ([] if timeout < 5 else ["exit-now"])
    ref = local.submit(spec(argv, uid=f"u-setsid-{int(timeout)}", timeout_seconds=timeout, grace_seconds=0.5))
    state = finished(local, ref)
    assert state.phase == ("Failed" if timeout < 5 else "Succeeded"), state
    daemon = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while True:
        try:
            os.kill(daemon, 0)
            stat = Path(f"/proc/{daemon}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                break
        except (ProcessLookupError, FileNotFoundError):
            break
        assert time.monotonic() < deadline, f"daemon {daemon} outlived the run"
        time.sleep(0.05)


def test_a_run_of_another_data_dir_is_unreachable_not_lost(tmp_path: Path) -> None:
    """A replica with another data dir (another host, in practice) cannot see the run's runner: it
    must not call it Lost (the run would be retried and run twice), nor touch its files."""
    first = LocalRuntime(tmp_path / "a")
    other = LocalRuntime(tmp_path / "b")
    try:
        ref = first.submit(spec(python_agent("import time; time.sleep(0.3)"), uid="u-away"))
        state = other.status(ref)
        assert (state.phase, state.reason) == ("Running", "Unreachable")
        assert str(tmp_path / "a") in (state.message or "")
        other.cancel(ref)
        other.cleanup(ref, keep_records=False)
        assert finished(first, ref).phase == "Succeeded"  # neither stopped nor removed it
        moved = {**ref, "host": "elsewhere.example"}
        assert "host elsewhere.example" in (first.status(moved).message or "")
    finally:
        first.close()
        other.close()
