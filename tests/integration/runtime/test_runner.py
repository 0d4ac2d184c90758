"""``joch runner`` as a real process around real agents, in real worktrees."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from integration.runtime.helpers import (
    Repo,
    RunnerRun,
    git,
    git_source,
    group_members,
    pid_alive,
    python_agent,
    spec,
    wait_for,
)
from joch.runtime import runner
from joch.runtime.base import InputFile, Output

AGENT_WORK = """
import os, pathlib, subprocess
out = pathlib.Path(os.environ["OUT"])
def git(*a): subprocess.run(["git", "-c", "user.name=A", "-c", "user.email=a@x", *a], check=True)
pathlib.Path("committed.txt").write_text("committed\\n")
git("add", "committed.txt"); git("commit", "-qm", "agent commit")
pathlib.Path("README.md").write_text("# Demo\\nuncommitted\\n")
pathlib.Path("untracked.bin").write_bytes(bytes(range(256)))
(out / "summary.md").write_text("did things\\n")
(out / "deep").mkdir(); (out / "deep" / "data.json").write_text('{"ok": true}')
print("agent done")
"""


def test_a_successful_run_records_artifacts_and_the_patch(make_run: Callable[..., RunnerRun], repo: Repo,
                                                          tmp_path: Path) -> None:
    r = make_run(spec(python_agent(AGENT_WORK), git=git_source(repo), env={"OUT": "set below"},
                      outputs=(Output("summary", "summary.md"), Output("data", "deep/data.json"),
                               Output("extra", "absent.txt", optional=True))))
    r.files.spec.write_text(r.files.spec.read_text().replace("set below", str(r.files.outputs)))
    code, state = r.run()

    assert (code, state.phase, state.reason, state.exit_code) == (0, "Succeeded", "Completed", 0), state
    assert state.message == "agent exited with code 0" and "agent done" in r.log()
    assert state.started_at is not None and state.finished_at is not None and state.started_at <= state.finished_at
    by_name = {a.name: a for a in state.artifacts}
    assert sorted(by_name) == ["changes.patch", "data", "summary"]
    for artifact in by_name.values():
        content = (r.files.artifacts / artifact.path).read_bytes()
        assert artifact.size == len(content) and artifact.sha256 == hashlib.sha256(content).hexdigest()
    assert by_name["summary"].path == "outputs/summary.md"
    assert (r.files.artifacts / "outputs/deep/data.json").read_text() == '{"ok": true}'

    record = json.loads(r.files.state.read_text())
    base = record["base_commit"]
    assert base == repo.git("rev-parse", "main") and record["runner_pid"] > 0

    # The patch holds the commit, the uncommitted edit and the untracked file, and applies on the base.
    patch = (r.files.artifacts / "changes.patch").read_bytes()
    assert b"+++ b/committed.txt" in patch and b"+uncommitted" in patch and b"untracked.bin" in patch
    check = tmp_path / "check"
    git(tmp_path, "clone", "--quiet", repo.url, str(check))
    git(check, "checkout", "--quiet", base)
    subprocess.run(["git", "apply", "--index", "-"], cwd=check, input=patch, check=True)
    worktree = r.workspace_root
    for name in ("committed.txt", "README.md", "untracked.bin"):
        assert (check / name).read_bytes() == (worktree / name).read_bytes(), name
    # The agent's own index is untouched: its edit is still unstaged, its new file still untracked.
    status = subprocess.run(["git", "status", "--porcelain"], cwd=worktree, capture_output=True, text=True).stdout
    assert status == " M README.md\n?? untracked.bin\n"


def test_a_non_zero_exit_fails_the_run(make_run: Callable[..., RunnerRun]) -> None:
    r = make_run(spec(python_agent("import sys; print('bad'); sys.exit(3)")))
    code, state = r.run()
    assert (code, state.phase, state.reason, state.exit_code) == (1, "Failed", "AgentFailed", 3)
    assert state.message == "agent exited with code 3"


def test_the_deadline_stops_the_whole_group(make_run: Callable[..., RunnerRun]) -> None:
    # The shell and both sleeps ignore SIGTERM: only SIGKILL after the grace period stops them.
    script = "trap '' TERM; sleep 30 & echo $! > grandchild; echo started; sleep 30; echo never"
    r = make_run(spec(["sh", "-c", script], timeout_seconds=0.5, grace_seconds=0.3))
    code, state = r.run()
    assert (code, state.phase, state.reason, state.exit_code) == (1, "Failed", "DeadlineExceeded", 137)
    assert state.message == "agent ran longer than its 0.5 s deadline and was stopped (killed after the grace period)"
    assert state.pid is not None and group_members(state.pid) == []
    assert not pid_alive(int((r.workspace_root / "grandchild").read_text()))
    assert "started" in r.log() and "never" not in r.log()


def test_sigterm_to_the_runner_cancels_the_run(make_run: Callable[..., RunnerRun]) -> None:
    script = "sleep 30 & echo $! > grandchild; echo started; wait"
    r = make_run(spec(["sh", "-c", script], grace_seconds=2))
    proc = r.start()
    try:
        wait_for(lambda: (r.workspace_root / "grandchild").exists())
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    state = r.state()
    assert state is not None and (state.phase, state.reason) == ("Cancelled", "Cancelled"), state
    assert state.message == "cancelled; the agent was stopped" and proc.returncode == 1
    assert state.pid is not None and group_members(state.pid) == []
    assert not pid_alive(int((r.workspace_root / "grandchild").read_text()))


def test_secrets_are_redacted_even_when_split_across_writes(make_run: Callable[..., RunnerRun]) -> None:
    code = ("import os, sys, time\n"
            "s = os.environ['API_TOKEN']\n"
            "print('token:', s, flush=True)\n"
            "sys.stdout.write(s[:5]); sys.stdout.flush(); time.sleep(0.2)\n"
            "sys.stdout.write(s[5:] + ' tail\\n'); sys.stdout.flush()\n"
            "print('short', os.environ['SHORT'], flush=True)\n")
    secret = "sk-abcdef0123456789"
    r = make_run(spec(python_agent(code), secret_env=("API_TOKEN", "SHORT")), env={"API_TOKEN": secret, "SHORT": "abc"})
    _, state = r.run()
    assert state.phase == "Succeeded", r.log()
    assert r.log() == "token: ***\n*** tail\nshort abc\n"  # values under 4 characters are not secrets
    for path in r.files.dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_the_agents_environment(make_run: Callable[..., RunnerRun], tmp_path: Path) -> None:
    dump = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    r = make_run(spec([*python_agent(dump), str(tmp_path / "env.json")], env={"FROM_SPEC": "1", "SHARED": "spec"}),
                 env={"SHARED": "runner", "INHERITED": "yes", "GIT_DIR": "/nowhere"})
    _, state = r.run()
    assert state.phase == "Succeeded"
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["FROM_SPEC"] == "1" and env["SHARED"] == "spec"
    assert "INHERITED" not in env  # only an allowlist (PATH, HOME, LANG, LC_*, proxies…) is inherited
    assert "GIT_DIR" not in env
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_inputs_outputs_and_the_working_directory(make_run: Callable[..., RunnerRun], repo: Repo) -> None:
    code = ("import os, sys; print(os.getcwd()); print(open(sys.argv[1]).read())")
    s = spec([], git=git_source(repo, "v1", "docs/guide"), input_files=(InputFile("task/implementation.md", "do it"),))
    r = make_run(s)
    ws = runner.workspace_of(r.files, r.workspace_root, s.git)
    r.files.spec.write_text(spec([*python_agent(code), f"{ws.inputs}/task/implementation.md"], git=s.git,
                                 input_files=s.input_files).to_json())
    _, state = r.run()
    assert state.phase == "Succeeded"
    assert r.log() == f"{ws.path}\ndo it\n" and ws.path == str(r.workspace_root / "docs/guide")


def test_a_missing_output_fails_an_otherwise_successful_run(make_run: Callable[..., RunnerRun]) -> None:
    r = make_run(spec(python_agent("pass"), outputs=(Output("summary", "summary.md"),)))
    _, state = r.run()
    assert (state.phase, state.reason, state.exit_code) == ("Failed", "MissingOutput", 0)
    assert state.message == 'agent exited with code 0 but did not write output "summary" (summary.md)'
    r = make_run(spec(python_agent("raise SystemExit(2)"), outputs=(Output("summary", "summary.md"),)))
    _, state = r.run()
    assert (state.reason, state.message) == ("AgentFailed", "agent exited with code 2")  # its own reason wins


def test_start_and_workspace_errors(make_run: Callable[..., RunnerRun], repo: Repo) -> None:
    r = make_run(spec(["no-such-agent-binary", "--flag"]))
    code, state = r.run()
    assert (code, state.phase, state.reason) == (1, "Failed", "StartError")
    assert state.message == 'binary "no-such-agent-binary" not found on PATH' and state.pid is None
    for target, why in ((repo.path, "is a directory"), (repo.path / "README.md", "is not executable")):
        _, state = make_run(spec([str(target)])).run()
        assert (state.reason, state.message) == ("StartError", f'binary "{target}" {why}' + (
            " (chmod +x it)" if why == "is not executable" else ""))

    r = make_run(spec(["true"], git=git_source(repo, "nope")))
    _, state = r.run()
    assert (state.phase, state.reason) == ("Failed", "WorkspaceError")
    assert state.message == f'ref "nope" not found in {repo.url} (not a branch, tag or commit there)'


def test_a_runner_executes_a_run_once(make_run: Callable[..., RunnerRun]) -> None:
    r = make_run(spec(["true"]))
    assert r.run()[1].phase == "Succeeded"
    again = subprocess.run(r.command(), env=r.env, capture_output=True, text=True, check=False)
    assert again.returncode == 2 and "executed already" in again.stderr
    assert runner.main(["--spec", str(r.files.spec)]) == 2  # the in-process entry point says the same


def test_the_runner_imports_only_the_standard_library() -> None:
    code = ("import sys, joch.runtime.runner as r; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'typer', 'yaml', 'jinja2', "
            "'fastapi', 'httpx', 'rich')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_joch_runner_is_the_same_command(make_run: Callable[..., RunnerRun]) -> None:
    r = make_run(spec(python_agent("print('via the joch CLI')")))
    joch = str(Path(sys.executable).with_name("joch"))
    done = subprocess.run([joch, "runner", "--spec", str(r.files.spec), *r.options()], env=r.env, capture_output=True,
                          text=True, check=False)
    state = r.state()
    assert done.returncode == 0 and state is not None and state.phase == "Succeeded", done.stderr
    assert r.log() == "via the joch CLI\n"
