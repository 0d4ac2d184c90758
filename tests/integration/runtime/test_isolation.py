"""A run reaches nothing beyond its own work: no server setting or secret in any process the agent
can read, runner settings apart from the agent's environment, no signal to a process a forged
reference names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.runtime.helpers import (
    Repo,
    RunnerRun,
    git_source,
    group_members,
    pid_alive,
    python_agent,
    spec,
    wait_for,
)
from joch.runtime import runner, sandbox
from joch.runtime.base import Output, RunId, RunState
from joch.runtime.local import LocalRuntime

STORE = "postgresql://joch:store-pw-4711@db.invalid:5432/joch"
TOKEN = "given-token-0123456789"

# What an agent can learn of the processes above it: walks /proc/<pid>/stat's ppid up to pid 1 and
# writes each ancestor's environ and cmdline, and what it can list of the data dir, to its output.
SNOOP = """
import json, os, sys
out, data = sys.argv[1], sys.argv[2]
seen, pid = [], os.getppid()
while pid > 1:
    entry = {"pid": pid}
    for name in ("environ", "cmdline"):
        try:
            entry[name] = open(f"/proc/{pid}/{name}", "rb").read().decode(errors="replace")
        except OSError as exc:
            entry[name] = f"unreadable: {exc}"
    seen.append(entry)
    stat = open(f"/proc/{pid}/stat").read()
    pid = int(stat[stat.rfind(")") + 2:].split()[1])
listed = []
for base, dirs, files in os.walk(data):
    listed += [os.path.join(base, f) for f in files]
processes = {}
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
        for name in ("environ", "cmdline"):
            try:
                processes[f"{entry}/{name}"] = open(f"/proc/{entry}/{name}", "rb").read().decode(errors="replace")
            except OSError:
                pass
json.dump({"ancestors": seen, "data": listed, "own": dict(os.environ), "processes": processes}, open(out, "w"))
"""


def finished(rt: LocalRuntime, ref: dict[str, Any], timeout: float = 15) -> RunState:
    return wait_for(lambda: (s := rt.status(ref)).finished and s, timeout)  # type: ignore[no-any-return]


@pytest.fixture(params=["forked", "executed"])
def runtime(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalRuntime]:
    # The server's settings, as `JOCH_STORE=... joch server` would have them in os.environ.
    monkeypatch.setenv("JOCH_STORE", STORE)
    monkeypatch.setenv("SERVER_ONLY_SETTING", "server-only-value")
    rt = LocalRuntime(tmp_path / "data", poll_interval=0.02)
    if request.param == "executed":
        rt._forks._usable = False  # as where there is no fork server
    yield rt
    rt.close()


def snoop(rt: LocalRuntime, uid: str, secrets: dict[str, str]) -> dict[str, Any]:
    outputs = rt.workspace(RunId("default", "demo", uid), None).outputs
    s = spec([*python_agent(SNOOP), f"{outputs}/dump.json", str(rt.root)], uid=uid, secret_env=tuple(secrets),
             outputs=(Output("dump", "dump.json"),))
    ref = rt.submit(s, secrets=secrets)
    state = finished(rt, ref)
    assert state.phase == "Succeeded", (state, (Path(ref["dir"]) / "log").read_text())
    return json.loads(Path(outputs, "dump.json").read_text())  # type: ignore[no-any-return]


def test_no_ancestor_of_the_agent_holds_the_servers_environment_or_a_secret(runtime: LocalRuntime) -> None:
    dump = snoop(runtime, "iso-1", {"MY_TOKEN": TOKEN})
    assert dump["own"]["MY_TOKEN"] == TOKEN  # the secret it was given, in its own environment only
    ancestors = dump["ancestors"]
    runner_pid = json.loads((runtime.root / "runs/iso-1/1/ref.json").read_text())["runnerPid"]
    assert ancestors[0]["pid"] == runner_pid
    for ancestor in ancestors:
        for name in ("environ", "cmdline"):
            text = ancestor[name]
            assert "store-pw-4711" not in text and "server-only-value" not in text, (ancestor["pid"], name, text)
            assert TOKEN not in text, (ancestor["pid"], name)
            assert "JOCH_RUNNER_" not in text


def test_secret_keys_named_like_runner_settings_do_not_configure_the_runner(
        runtime: LocalRuntime, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    code = "import os, sys; print(os.getcwd()); print(os.environ['JOCH_RUNNER_WORKSPACE'])"
    names = ("JOCH_RUNNER_WORKSPACE", "JOCH_RUNNER_CACHE")
    ref = runtime.submit(spec(python_agent(code), uid="iso-2", secret_env=names),
                         secrets=dict.fromkeys(names, str(elsewhere)))
    assert finished(runtime, ref).phase == "Succeeded"
    cwd, value = b"".join(runtime.logs(ref)).decode().splitlines()
    assert cwd == str(runtime.workspace_root(RunId("default", "demo", "iso-2"))) and value == "***"
    assert not elsewhere.exists()


def test_a_secret_key_that_cannot_be_an_environment_variable_fails_the_start_clearly(runtime: LocalRuntime) -> None:
    ref = runtime.submit(spec(["true"], uid="iso-3", secret_env=("A=B",)), secrets={"A=B": "value-of-a-b"})
    state = finished(runtime, ref)
    assert (state.phase, state.reason) == ("Failed", "StartError"), state
    assert state.message is not None and "'A=B' cannot be the name of an environment variable" in state.message
    assert (Path(ref["dir"]) / "runner.log").read_text() == ""  # no traceback


GATED = ("import os, sys, time\n"
         "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n")


def test_a_forged_reference_never_gets_another_process_signalled(local: LocalRuntime, tmp_path: Path) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        go = tmp_path / "go"
        ref = local.submit(spec([*python_agent(GATED), str(go)], uid="iso-4", grace_seconds=1))
        wait_for(lambda: local.status(ref).phase == "Running")
        # What a client that may write AgentRun status could put there: another process's identity.
        forged = {**ref, "runnerPid": victim.pid, "runnerStart": runner.process_start(victim.pid)}
        assert local.status(forged).phase == "Running"  # the runner this runtime started, not the victim
        local.cancel(forged)
        assert finished(local, forged).phase == "Cancelled"  # the real runner got the signal
        assert victim.poll() is None and pid_alive(victim.pid)

        # A reference whose run has no runner record names nothing this runtime will signal either.
        (tmp_path / "data/runs/iso-5/1").mkdir(parents=True)
        (tmp_path / "data/runs/iso-5/1/spec.json").write_text(spec(["true"], uid="iso-5").to_json())
        local.cancel({"type": "local", "id": "iso-5/1", "runnerPid": victim.pid,
                      "runnerStart": runner.process_start(victim.pid), "dir": str(tmp_path / "data/runs/iso-5/1")})
        assert victim.poll() is None and pid_alive(victim.pid)
    finally:
        victim.kill()
        victim.wait()


def test_a_runner_record_that_disagrees_is_not_trusted(local: LocalRuntime, tmp_path: Path) -> None:
    go = tmp_path / "go"
    ref = local.submit(spec([*python_agent(GATED), str(go)], uid="iso-6"))
    wait_for(lambda: local.status(ref).phase == "Running")
    # ref.json rewritten to name another live process: the runner's own record names another pid, and
    # the process does not work in the run directory; it is not signalled.
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    saved = tmp_path / "data/runs/iso-6/1/ref.json"
    try:
        saved.write_text(json.dumps({**json.loads(saved.read_text()), "runnerPid": victim.pid,
                                     "runnerStart": runner.process_start(victim.pid)}))
        local.cancel(ref)
        # Its runner can no longer be told apart, so the run ends (however it is recorded) ...
        assert finished(local, ref).finished
        assert victim.poll() is None and pid_alive(victim.pid)  # ... and the named process is not signalled
    finally:
        victim.kill()
        victim.wait()
        go.touch()


@pytest.fixture
def sandboxed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalRuntime]:
    problem = sandbox.sandbox_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"bubblewrap is required in CI: {problem}")
        pytest.skip(problem)
    monkeypatch.setenv("JOCH_STORE", STORE)
    rt = LocalRuntime(tmp_path / "data", poll_interval=0.02, sandbox="bwrap")
    yield rt
    rt.close()


def test_a_sandboxed_agent_sees_no_other_process_and_no_other_runs_files(sandboxed: LocalRuntime, repo: Repo) -> None:
    # Another run, holding a secret of its own, alive while the snooping run looks around.
    # (/tmp is the sandbox's own: the go file is in the other run's outputs, which it sees.)
    go = Path(sandboxed.workspace(RunId("default", "demo", "iso-other"), None).outputs) / "go"
    other_secret = "other-runs-secret-9876"
    other = sandboxed.submit(spec([*python_agent(GATED), str(go)], uid="iso-other", secret_env=("OTHER",)),
                             secrets={"OTHER": other_secret})
    wait_for(lambda: sandboxed.status(other).phase == "Running")
    try:
        uid = "iso-snoop"
        outputs = sandboxed.workspace(RunId("default", "demo", uid), None).outputs
        s = spec([*python_agent(SNOOP), f"{outputs}/dump.json", str(sandboxed.root)], uid=uid, secret_env=("MY_TOKEN",),
                 outputs=(Output("dump", "dump.json"),), git=git_source(repo))
        ref = sandboxed.submit(s, secrets={"MY_TOKEN": TOKEN})
        state = finished(sandboxed, ref)
        assert state.phase == "Succeeded", (state, (Path(ref["dir"]) / "log").read_text())
        dump = json.loads(Path(outputs, "dump.json").read_text())
    finally:
        go.touch()
    assert finished(sandboxed, other).phase == "Succeeded"
    assert dump["ancestors"] == []  # its parent is the sandbox's pid 1: no ancestor is visible
    seen = json.dumps(dump["processes"]) + json.dumps(dump["ancestors"])
    for leak in ("store-pw-4711", other_secret):  # (the sandbox's pid 1 has the agent's own environment)
        assert leak not in seen
    assert set(dump["processes"]) <= {"1/environ", "1/cmdline"}
    assert [p for p in dump["data"] if "iso-other" in p or p.endswith(("ref.json", "state.json", "spec.json"))] == []
    assert dump["own"]["MY_TOKEN"] == TOKEN and dump["own"]["HOME"] == f"{ref['dir']}/home"
    patch = (Path(ref["dir"]) / "artifacts/changes.patch")
    assert patch.exists()  # git worked in the sandboxed worktree


def test_run_records_are_readable_by_this_user_only(local: LocalRuntime, tmp_path: Path) -> None:
    ref = local.submit(spec(["true"], uid="iso-7"))
    assert finished(local, ref).phase == "Succeeded"
    for path in (tmp_path / "data/runs", tmp_path / "data/runs/iso-7", tmp_path / "data/runs/iso-7/1"):
        assert path.stat().st_mode & 0o077 == 0, oct(path.stat().st_mode)


def test_joch_runner_takes_the_sandbox_options(make_run: Callable[..., RunnerRun]) -> None:
    r = make_run(spec(python_agent("import os; print(os.getppid())")))
    joch = str(Path(sys.executable).with_name("joch"))
    done = subprocess.run([joch, "runner", "--spec", str(r.files.spec), *r.options(), "--sandbox", "docker"],
                          env=r.env, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stderr == 'error: --sandbox must be none or bwrap (got "docker")\n'
    if sandbox.sandbox_problem() is not None:
        pytest.skip("bubblewrap does not work here")
    done = subprocess.run([joch, "runner", "--spec", str(r.files.spec), *r.options(), "--sandbox", "bwrap",
                           "--hide", str(r.files.dir)], env=r.env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert r.log() == "1\n"  # its parent is the sandbox's init: nothing above it is visible


def test_a_sandboxed_run_is_cancelled_and_timed_out_like_any_other(sandboxed: LocalRuntime) -> None:
    script = "sleep 60 & sleep 60"
    ref = sandboxed.submit(spec(["sh", "-c", script], uid="iso-8", grace_seconds=1))
    wait_for(lambda: sandboxed.status(ref).phase == "Running")
    pid = sandboxed.status(ref).pid
    assert pid is not None
    wait_for(lambda: len(group_members(pid)) >= 3)  # bwrap, its init and the shell with its sleeps
    sandboxed.cancel(ref)
    state = finished(sandboxed, ref)
    assert (state.phase, state.reason) == ("Cancelled", "Cancelled")
    assert group_members(pid) == []
    ref = sandboxed.submit(spec(["sh", "-c", script], uid="iso-9", timeout_seconds=1, grace_seconds=1))
    state = finished(sandboxed, ref)
    assert (state.phase, state.reason) == ("Failed", "DeadlineExceeded") and group_members(state.pid or 0) == []


def test_a_sandboxed_agent_installed_under_tmp_still_runs(sandboxed: LocalRuntime) -> None:
    # A checkout cloned into /tmp and set up by `make run` has its .venv (joch-demo-agent, its
    # Python) under /tmp, which the sandbox replaces with a fresh tmpfs: the installation of the
    # agent and of its #! interpreter are mounted back, read-only; the rest of /tmp stays hidden.
    base = Path(tempfile.mkdtemp(prefix="joch-installed-", dir="/tmp"))
    try:
        env = base / "env"
        (env / "bin").mkdir(parents=True)
        (env / "bin/sh").symlink_to(shutil.which("sh") or "/bin/sh")
        (env / "share").mkdir()
        (env / "share/greeting").write_text("hello from the prefix\n")
        agent = base / "tools/agent"
        agent.parent.mkdir()
        agent.write_text(f'#!{env}/bin/sh\ncat "{env}/share/greeting" && cat "{base}/secret" || echo hidden\n')
        agent.chmod(0o755)
        (base / "secret").write_text("not for the agent\n")
        ref = sandboxed.submit(spec([str(agent)], uid="iso-tmp"))
        state = finished(sandboxed, ref)
        log = (Path(ref["dir"]) / "log").read_text()
        assert state.phase == "Succeeded", (state, log)
        assert log == "hello from the prefix\ncat: /tmp/" + f"{base.name}/secret: No such file or directory\nhidden\n"
    finally:
        shutil.rmtree(base)


# A sandboxed agent turning git against its runner, which runs git outside the sandbox (the diff after
# the agent ends, the next run's fetch): a clean filter and an upload-pack command in its repository's
# config (the run's own; the mirror's is not even there), a commondir file naming another repository's
# config, and the checkout's .git replaced by a file pointing at a repository of its own with such a filter.
# Each command writes a marker where only a process outside the sandbox can (its /tmp is its own).
ESCAPE = """
set -e
marker="$1"
common=$(git rev-parse --git-common-dir)
git config -f "$common/config" filter.evil.clean "touch $marker.filter; cat" || true
git config -f "$common/config" remote.origin.uploadpack "touch $marker.uploadpack; git-upload-pack" || true
git config -f "$common/config" remote.origin.url /nonexistent/elsewhere || true
git init --quiet "$HOME/common"
git -C "$HOME/common" config remote.origin.uploadpack "touch $marker.commondir; git-upload-pack"
echo "$HOME/common/.git" > "$common/commondir" || true
echo '* filter=evil' > .gitattributes
echo changed >> README.md
git init --quiet "$HOME/own"
git -C "$HOME/own" config filter.evil.clean "touch $marker.gitfile; cat"
mv .git "$HOME/moved"
echo "gitdir: $HOME/own/.git" > .git
"""


def test_a_sandboxed_agent_cannot_make_its_runner_run_a_command(sandboxed: LocalRuntime, repo: Repo,
                                                                tmp_path: Path) -> None:
    marker = tmp_path / "escaped"
    ref = sandboxed.submit(spec(["sh", "-c", ESCAPE, "escape", str(marker)], uid="iso-esc-1",
                                git=git_source(repo)))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, (Path(ref["dir"]) / "log").read_text())
    patch = (Path(ref["dir"]) / "artifacts/changes.patch").read_text()
    assert "+changed" in patch and "+* filter=evil" in patch  # the diff is still taken, by git of its own
    # The next run of the same repository fetches it into the same mirror, from where it was.
    ref = sandboxed.submit(spec(["git", "log", "-1", "--format=%s"], uid="iso-esc-2", git=git_source(repo)))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, (Path(ref["dir"]) / "log").read_text())
    assert (Path(ref["dir"]) / "log").read_text() == "second\n"
    commit = "git commit --quiet -am work && git checkout --quiet -b agent-branch && git log -1 --format=%s"
    ref = sandboxed.submit(spec(["sh", "-c", f"echo more >> README.md && {commit}"], uid="iso-esc-3",
                                git=git_source(repo)))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, (Path(ref["dir"]) / "log").read_text())  # agents still commit
    assert (Path(ref["dir"]) / "log").read_text() == "work\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("escaped")) == []
