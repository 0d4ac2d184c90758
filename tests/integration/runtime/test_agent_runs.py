"""What the runner does for real agent CLIs: a HOME of each attempt's own with the provider's config
files, a record of what ran, the agent's output read for usage, its session and its verdict, the
success policy, patch hygiene, and resuming an earlier attempt. Real runner processes throughout."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integration.runtime import lineformat
from integration.runtime.helpers import (
    PYTHON,
    Repo,
    RunnerRun,
    git,
    git_source,
    group_members,
    python_agent,
    spec,
    wait_for,
)
from joch.runtime import runner, workspace
from joch.runtime.base import ConfigFile, Output, PatchPolicy, Resume, RunnerSpec, RunState, Session, SuccessPolicy
from joch.runtime.local import LocalRuntime
from joch.runtime.sandbox import sandbox_problem

TESTS = str(Path(__file__).resolve().parents[2])


def with_test_format(r: RunnerRun, *extra: str) -> list[str]:
    """The runner command, in an interpreter that reads the ``test-lines`` output format."""
    return [PYTHON, "-c", lineformat.RUNNER_WITH_TEST_FORMAT, "--spec", str(r.files.spec), *r.options(), *extra]


def run_with_test_format(r: RunnerRun, *extra: str, timeout: float = 60) -> tuple[int, RunState, str]:
    """Run the runner to its end: its exit code, its record and its stderr (runner.log)."""
    env = {**r.env, "PYTHONPATH": os.pathsep.join([TESTS, r.env.get("PYTHONPATH", "")])}
    done = subprocess.run(with_test_format(r, *extra), env=env, capture_output=True, timeout=timeout, check=False)
    state = r.state()
    assert state is not None, done.stderr.decode()
    return done.returncode, state, done.stderr.decode()


DUMP_ENV = """
import json, os, sys, time
home = os.environ["HOME"]
open(os.path.join(home, "written-by-the-agent"), "w").write("mine")
time.sleep(0.3)  # the two runs overlap
json.dump({"env": dict(os.environ), "files": sorted(os.listdir(home))}, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("sandbox", [
    "none",
    pytest.param("bwrap", marks=pytest.mark.skipif(sandbox_problem() is not None,
                                                   reason=f"bubblewrap does not work here: {sandbox_problem()}")),
])
def test_each_attempt_has_its_own_home_with_its_config_files(make_run: Callable[..., RunnerRun], tmp_path: Path,
                                                             sandbox: str) -> None:
    server_home = tmp_path / "server-home"
    (server_home / ".codex").mkdir(parents=True)
    (server_home / ".codex" / "config.toml").write_text("operator's own\n")
    configs = (ConfigFile(".codex/config.toml", 'model = "m1"\n'),
               ConfigFile(".config/tool/settings.json", "{}", mode=0o644))
    runs = [make_run(spec([*python_agent(DUMP_ENV), "ENV_JSON"], uid=f"uid-{n}", config_files=configs),
                     env={"HOME": str(server_home), "XDG_CONFIG_HOME": "/etc/xdg-x"}) for n in (1, 2)]
    for r in runs:  # written to the outputs: the sandbox's /tmp is not the host's
        r.files.spec.write_text(r.files.spec.read_text().replace("ENV_JSON", str(r.files.outputs / "env.json")))
    started = [subprocess.Popen([*r.command(), "--sandbox", sandbox], env=r.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT) for r in runs]  # concurrently
    for proc in started:
        assert proc.wait(timeout=60) == 0, proc.stdout.read() if proc.stdout else ""
    homes = []
    for n, r in enumerate(runs, 1):
        state = r.state()
        assert state is not None and state.phase == "Succeeded", state
        seen = json.loads((r.files.outputs / "env.json").read_text())
        env = seen["env"]
        home = r.files.home
        assert env["HOME"] == str(home)
        assert {k: env[k] for k in env if k.startswith("XDG_")} == {
            "XDG_CONFIG_HOME": f"{home}/.config", "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_CACHE_HOME": f"{home}/.cache", "XDG_STATE_HOME": f"{home}/.local/state"}
        assert not any(str(server_home) in value for value in env.values())  # nothing of the server's HOME
        assert (home / ".codex" / "config.toml").read_text() == 'model = "m1"\n'
        assert stat.S_IMODE((home / ".codex" / "config.toml").stat().st_mode) == 0o600
        assert stat.S_IMODE((home / ".config" / "tool" / "settings.json").stat().st_mode) == 0o644
        assert (home / "written-by-the-agent").read_text() == "mine"
        assert all((home / sub).is_dir() for sub in (".config", ".local/share", ".cache", ".local/state"))
        homes.append(env["HOME"])
        assert state.sandbox is not None and state.sandbox.mode == sandbox
    assert homes[0] != homes[1]
    assert (server_home / ".codex" / "config.toml").read_text() == "operator's own\n"
    assert sorted(p.name for p in server_home.iterdir()) == [".codex"]


def test_a_config_file_must_stay_inside_home(make_run: Callable[..., RunnerRun], tmp_path: Path) -> None:
    for path, why in (("../outside.toml", "must be a relative path that stays inside HOME"),
                      ("/etc/x.toml", "must be a relative path that stays inside HOME"),
                      (".", "names HOME itself, not a file in it"),
                      ("ok.toml/under", "cannot create its directory: [Errno 17] File exists: ")):
        r = make_run(spec(["true"], config_files=(ConfigFile("ok.toml", "x"), ConfigFile(path, "x"))))
        code, state = r.run()
        assert (code, state.phase, state.reason) == (1, "Failed", "WorkspaceError")
        assert (state.message or "").startswith(f'config file "{path}" (configFiles[1].path): {why}'), state.message
    assert not (tmp_path / "outside.toml").exists()


FAKE_CLI = """#!/bin/sh
case "$1" in
  --version) echo; echo "  fake-cli 1.2.3 (key $FAKE_KEY)"; echo "second line"; exit 0 ;;
  --broken) exit 3 ;;
  --slow) sleep 30; exit 0 ;;
esac
[ "$STATE" = /dev/null ] && exit 0
until grep -q '"phase": "Running"' "$STATE"; do sleep 0.02; done  # recorded just after the agent started
cp "$STATE" "$COPY"
"""


def test_the_record_says_what_ran(make_run: Callable[..., RunnerRun], tmp_path: Path) -> None:
    real = tmp_path / "install" / "fake-cli.sh"
    real.parent.mkdir()
    real.write_text(FAKE_CLI)
    real.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fake-cli").symlink_to(real)
    secret = "sk-the-key-1234"
    long_arg = "x" * 5000
    s = spec(["fake-cli", f"--key={secret}", long_arg], env={"COPY": str(tmp_path / "running.json")},
             secret_env=("FAKE_KEY",))
    r = make_run(s, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_KEY": secret})
    r.files.spec.write_text(r.files.spec.read_text().replace('"env": {', f'"env": {{"STATE": "{r.files.state}", '))
    code, state = r.run()
    assert (code, state.phase) == (0, "Succeeded"), state
    running = json.loads((tmp_path / "running.json").read_text())  # the record while the agent ran
    assert running["phase"] == "Running" and running["invocation"] == json.loads(json.dumps(
        state.invocation, default=lambda o: o.__dict__))
    inv = state.invocation
    assert inv is not None
    assert inv.executable == str(bin_dir / "fake-cli")
    assert inv.sha256 == hashlib.sha256(FAKE_CLI.encode()).hexdigest()
    assert inv.version == "fake-cli 1.2.3 (key ***)"
    assert inv.argv[:2] == ("fake-cli", "--key=***")
    assert inv.argv[2] == "x" * 4096 + "…[joch: 904 more bytes]"
    assert list(inv.env) == sorted(inv.env) and {"COPY", "FAKE_KEY", "HOME", "PATH", "STATE"} <= set(inv.env)
    assert state.sandbox is not None and (state.sandbox.mode, state.sandbox.user) == ("none", os.getuid())
    assert running["sandbox"]["mode"] == "none" and running["sandbox"]["network"] == "on"
    assert secret not in r.files.state.read_text()

    # A CLI that will not say its version, or takes too long to: no version, and the run goes on.
    for args in (("--broken",), ("--slow",)):
        r = make_run(spec(["fake-cli"], version_args=args, env={"STATE": "/dev/null", "COPY": str(tmp_path / "copy")}),
                     env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
        code, state = r.run()
        assert (code, state.phase) == (0, "Succeeded") and state.invocation is not None
        assert state.invocation.version is None and state.invocation.sha256 is not None
    r = make_run(spec([sys.executable, "-c", "pass"], version_args=()))
    _, state = r.run()
    assert state.invocation is not None and state.invocation.version is None  # not asked


class Callback:
    """A real HTTP server on 127.0.0.1 standing in for the run callback: it records what it is sent."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        import http.server

        self.posts: list[tuple[str, str, dict[str, Any]]] = []
        posts = self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if gate is not None:
                    gate.wait(30)  # an answer that takes its time
                posts.append((self.path, self.headers.get("Authorization", ""), body))
                answer = json.dumps({"accepted": len(body["events"])}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[dict[str, Any]]:
        return [event for _, _, body in self.posts for event in body["events"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# Prints usage and its session, then waits until the runner has recorded the session before it ends.
REPORTING_AGENT = """
import json, sys, time
print("USAGE u1 100 20 0.25", flush=True)
print("noise", flush=True)
sys.stdout.write("USAGE u2 5 1 0.01\\nSESSION sess-"); sys.stdout.flush(); time.sleep(0.1)
print("42", flush=True)  # a line split across two reads
until = time.time() + 20
while time.time() < until:
    record = json.load(open(sys.argv[1]))
    if (record.get("session") or {}).get("id") == "sess-42":
        print("session seen while running:", record["phase"], flush=True)
        break
    time.sleep(0.02)
else:
    sys.exit(7)
"""


def test_usage_and_the_session_from_the_agents_output(make_run: Callable[..., RunnerRun]) -> None:
    callback = Callback()
    try:
        token = "jrt1_the-run-token"
        fields: dict[str, Any] = {"output_format": lineformat.NAME, "secret_env": ("JOCH_RUN_TOKEN",), "attempt": 2}
        r = make_run(spec(["placeholder"], **fields), env={"JOCH_RUN_TOKEN": token})
        r.files.spec.write_text(spec([*python_agent(REPORTING_AGENT), str(r.files.state)], **fields).to_json())
        code, state, _ = run_with_test_format(r, "--api-url", callback.url)
    finally:
        callback.close()
    assert (code, state.phase) == (0, "Succeeded"), (state, r.log())
    assert "session seen while running: Running" in r.log()
    assert state.session is not None and (state.session.id, state.session.resumed_from) == ("sess-42", None)
    assert [(e["id"], e.get("costUsd")) for e in callback.events()] == [
        ("a2-u1", 0.25), ("a2-u2", 0.01), ("a2-final", None)]  # ids carry the attempt
    assert callback.events()[0] == {"id": "a2-u1", "model": "m", "inputTokens": 100, "outputTokens": 20,
                                    "costUsd": 0.25}
    for path, authorization, _ in callback.posts:
        assert path == "/v1/namespaces/default/agentruns/demo/callback"
        assert authorization == f"Bearer {token}"
    assert token not in r.log()


def test_a_slow_callback_does_not_hold_up_the_log(make_run: Callable[..., RunnerRun], tmp_path: Path) -> None:
    gate = threading.Event()
    callback = Callback(gate)
    release = tmp_path / "release"
    code = ("import os, sys, time\nprint('USAGE u1 1 1 0.1', flush=True)\nprint('after the usage', flush=True)\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n")
    r = make_run(spec([*python_agent(code), str(release)], output_format=lineformat.NAME,
                      secret_env=("JOCH_RUN_TOKEN",)), env={"JOCH_RUN_TOKEN": "jrt1_t"})
    env = {**r.env, "PYTHONPATH": os.pathsep.join([TESTS, r.env.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(with_test_format(r, "--api-url", callback.url), env=env)
    try:
        # The post is held by the server, and the log goes on meanwhile.
        wait_for(lambda: r.files.log.exists() and "after the usage" in r.log(), timeout=20)
        assert callback.posts == []
    finally:
        gate.set()
        release.touch()
        assert proc.wait(timeout=60) == 0
        callback.close()
    assert [e["id"] for e in callback.events()] == ["a1-u1", "a1-final"]


def test_usage_that_cannot_be_reported_and_a_failing_parser_do_not_fail_the_run(
        make_run: Callable[..., RunnerRun], tmp_path: Path) -> None:
    code = "print('USAGE u1 1 1 0.5'); print('BOOM'); print('SESSION never-seen')"
    r = make_run(spec(python_agent(code), output_format=lineformat.NAME, secret_env=("JOCH_RUN_TOKEN",)),
                 env={"JOCH_RUN_TOKEN": "jrt1_x"})
    exit_code, state, stderr = run_with_test_format(r, "--api-url", "http://127.0.0.1:9")  # nothing listens there
    assert (exit_code, state.phase, state.reason) == (0, "Succeeded", "Completed"), state
    assert state.session is None  # the parser was not asked again after it failed
    assert "the output parser failed (RuntimeError: the test parser was told to fail)" in stderr
    assert "1 usage event(s) not reported: usage was not recorded" in stderr
    assert "jrt1_x" not in stderr


def test_an_unknown_output_format_is_a_start_error(make_run: Callable[..., RunnerRun]) -> None:
    r = make_run(spec(["true"], output_format="no-such-format"))
    code, state = r.run()
    assert (code, state.phase, state.reason) == (1, "Failed", "StartError")
    assert (state.message or "").startswith('outputFormat: unknown output format "no-such-format"')


def test_the_success_policy_judges_an_agent_that_exited_0(make_run: Callable[..., RunnerRun], repo: Repo) -> None:
    def judged(code: str, *, fmt: bool = False, exit_code: int = 0, **policy: Any) -> RunState:
        s = spec(python_agent(code), git=git_source(repo), success=SuccessPolicy(**policy),
                 output_format=lineformat.NAME if fmt else None,
                 patch=PatchPolicy(exclude=(".aider*",)), outputs=(Output("summary", "summary.md", optional=True),),
                 env={"OUT": "OUTPUTS"})
        r = make_run(s)
        r.files.spec.write_text(r.files.spec.read_text().replace('"OUTPUTS"', json.dumps(str(r.files.outputs))))
        got, state, _ = run_with_test_format(r)
        assert got == (0 if state.phase == "Succeeded" else 1)
        return state

    edit = "open('README.md', 'a').write('more\\n')"
    assert judged("pass").reason == "Completed"  # nothing asked: exit 0 is success, as before
    state = judged("pass", require_changes=True)
    assert (state.phase, state.reason, state.exit_code) == ("Failed", "NoChanges", 0)
    assert state.message == ("agent exited with code 0 but changed nothing in the repository (changes.patch is empty; "
                             "successPolicy.requireChanges)")
    assert judged(edit, require_changes=True).reason == "Completed"
    # A change only to what the patch leaves out is no change.
    assert judged("open('.aider.chat.history.md', 'w').write('x')", require_changes=True).reason == "NoChanges"

    noisy = "print('Retrying...'); print('litellm.APIConnectionError: ' + 'x' * 400); " + edit
    state = judged(noisy, failure_patterns=(r"litellm\.APIConnectionError", "unused"))
    assert (state.phase, state.reason) == ("Failed", "FailurePattern")
    assert state.message == ('agent exited with code 0 but a line of its output matched the failure pattern '
                             f'"litellm\\.APIConnectionError": litellm.APIConnectionError: {"x" * 272}…')
    # A line over the cap is cut for the patterns (the log keeps it whole), and the next line is read.
    huge = "import sys; sys.stdout.write('y' * (3 << 20) + '\\nFATAL\\n')"
    assert judged(huge, failure_patterns=("^FATAL$",)).reason == "FailurePattern"
    assert judged("print('all fine')", failure_patterns=("FATAL",)).reason == "Completed"

    state = judged("print('ERROR the model could not be reached')", fmt=True)
    assert (state.reason, state.message) == ("AgentReportedError", "agent exited with code 0 but reported an error: "
                                                                   "the model could not be reached")
    assert judged("print('ERROR ignored')", fmt=True, agent_result=False).reason == "Completed"
    # A CLI that says why it failed and exits non-zero (Claude Code's is_error result exits 1): its
    # words are the reason, not only the exit code.
    state = judged("print('ERROR API Error: 400 refused'); raise SystemExit(1)", fmt=True)
    assert (state.reason, state.message) == ("AgentReportedError", "agent exited with code 1: API Error: 400 refused")
    assert judged("print('ERROR x'); raise SystemExit(1)", fmt=True, agent_result=False).reason == "AgentFailed"

    state = judged("pass", required_artifacts=("summary",))
    assert (state.reason, state.message) == ("MissingOutput", 'agent exited with code 0 but its required output '
                                             '"summary" was not stored (successPolicy.requiredArtifacts)')
    writes = "import os; open(os.environ['OUT'] + '/summary.md', 'w').write('s')"
    assert judged(writes, required_artifacts=("summary",)).reason == "Completed"

    # An agent that failed keeps its own reason.
    state = judged("print('FATAL'); raise SystemExit(4)", failure_patterns=("FATAL",), require_changes=True)
    assert (state.reason, state.message) == ("AgentFailed", "agent exited with code 4")


def test_a_bad_failure_pattern_is_a_start_error(make_run: Callable[..., RunnerRun]) -> None:
    r = make_run(spec(["true"], success=SuccessPolicy(failure_patterns=("ok", "(unclosed"))))
    code, state = r.run()
    assert (code, state.reason) == (1, "StartError")
    assert state.message is not None and state.message.startswith(
        'successPolicy.failurePatterns[1]: "(unclosed" is not a regular expression: missing )')


PATCH_AGENT = """
import os, pathlib, subprocess
pathlib.Path(".aider.chat.history.md").write_text("chat\\n")
pathlib.Path("src/.aider.tags.cache.v4").mkdir(parents=True)
pathlib.Path("src/.aider.tags.cache.v4/cache.db").write_bytes(b"\\0" * 32768)
pathlib.Path("src/code.py").write_text("print('edited')\\n")
pathlib.Path("big.bin").write_bytes(os.urandom(3000))
pathlib.Path("README.md").write_text("# Demo\\nedited\\n")
pathlib.Path("committed-big.txt").write_text("z" * 5000)
subprocess.run(["git", "add", "committed-big.txt"], check=True)
subprocess.run(["git", "commit", "-qm", "big"], check=True)
"""


def test_the_patch_leaves_out_excluded_and_oversized_files(make_run: Callable[..., RunnerRun], repo: Repo,
                                                           tmp_path: Path) -> None:
    s = spec(python_agent(PATCH_AGENT), git=git_source(repo),
             patch=PatchPolicy(exclude=(".aider*", "**/.aider.tags.cache.v4/**"), max_file_bytes=2000))
    r = make_run(s)
    code, state = r.run()
    assert (code, state.phase) == (0, "Succeeded"), (state, r.log())
    patch = (r.files.artifacts / "changes.patch").read_text()
    changed = sorted(line.split(" b/")[-1] for line in patch.splitlines() if line.startswith("diff --git"))
    assert changed == ["README.md", "src/code.py"]
    assert [(o.path, o.size) for o in state.omitted] == [("big.bin", 3000), ("committed-big.txt", 5000)]
    assert state.omitted[0].message == ("3000 bytes is over the patch's limit of 2000 bytes per file "
                                        "(patch.maxFileBytes); it was left out of changes.patch")
    # What is left applies cleanly to the commit the run started from.
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "--quiet", str(repo.path), str(clone))
    git(clone, "checkout", "--quiet", state.base_commit or "")
    git(clone, "apply", "--index", str(r.files.artifacts / "changes.patch"))
    assert (clone / "src/code.py").read_text() == "print('edited')\n"
    assert not (clone / "big.bin").exists()


def test_the_record_lists_at_most_a_hundred_omitted_files(make_run: Callable[..., RunnerRun], repo: Repo) -> None:
    # The record becomes the run's status: thousands of large files must not make it megabytes long.
    code = "import pathlib\nfor i in range(130): pathlib.Path(f'big-{i:03}.bin').write_bytes(b'x' * 50)\n"
    r = make_run(spec(python_agent(code), git=git_source(repo), patch=PatchPolicy(max_file_bytes=10)))
    _, state = r.run()
    assert state.phase == "Succeeded", (state, r.log())
    assert len(state.omitted) == runner.MAX_OMITTED + 1
    assert state.omitted[-1].size == 30 * 50 and state.omitted[-1].message.startswith("and 30 more files over")


FIRST_ATTEMPT = """
import os, pathlib
pathlib.Path("work.txt").write_text("first attempt\\n")
tool = pathlib.Path(os.environ["HOME"], ".tool")
tool.mkdir()
(tool / "session.json").write_text('{"id": "s-1"}')
(tool / "link").symlink_to("/nonexistent/target")
os.mkfifo(tool / "fifo")  # not copied (reading it would block), and no reason to fail
print("SESSION s-1", flush=True)
raise SystemExit(1)
"""

SECOND_ATTEMPT = """
import os, pathlib, sys
assert os.getcwd() == sys.argv[1], os.getcwd()
assert pathlib.Path("work.txt").read_text() == "first attempt\\n"
tool = pathlib.Path(os.environ["HOME"], ".tool")
assert os.environ["HOME"] == sys.argv[2] and (tool / "session.json").read_text() == '{"id": "s-1"}'
assert os.readlink(tool / "link") == "/nonexistent/target"
assert pathlib.Path(os.environ["HOME"], "c.toml").read_text() == "again"
with open("work.txt", "a") as f: f.write("second attempt\\n")
print("resumed")
"""


def attempt_run(tmp_path: Path, s: RunnerSpec) -> RunnerRun:
    """A runner run laid out as the local runtime lays attempts out: ``runs/<uid>/<attempt>``."""
    files = runner.RunFiles(tmp_path / "runs" / s.run.uid / str(s.run.attempt))
    files.dir.mkdir(parents=True)
    files.spec.write_text(s.to_json())
    return RunnerRun(files, tmp_path / "workspace-1", dict(os.environ), tmp_path / "mirrors")


def test_a_resumed_attempt_continues_in_the_earlier_worktree_and_home(repo: Repo, tmp_path: Path) -> None:
    first = attempt_run(tmp_path, spec(python_agent(FIRST_ATTEMPT), git=git_source(repo), output_format=lineformat.NAME,
                                       config_files=(ConfigFile("c.toml", "once"),)))
    _, one, _ = run_with_test_format(first)
    assert (one.phase, one.reason) == ("Failed", "AgentFailed") and one.session == Session("s-1", None)
    second_spec = spec([*python_agent(SECOND_ATTEMPT), str(first.workspace_root), "HOME"], attempt=2,
                       git=git_source(repo), resume=Resume(attempt=1, session_id="s-1"),
                       config_files=(ConfigFile("c.toml", "again"),))
    second = attempt_run(tmp_path, second_spec)
    second.files.spec.write_text(second.files.spec.read_text().replace('"HOME"', json.dumps(str(second.files.home))))
    code, two = second.run()
    assert (code, two.phase) == (0, "Succeeded"), (two, second.log())
    assert two.session == Session(id="s-1", resumed_from=1)
    assert two.base_commit == one.base_commit is not None
    patch = (second.files.artifacts / "changes.patch").read_text()
    assert "+first attempt\n+second attempt\n" in patch  # both attempts' work, against the first's base
    assert (first.files.home / ".tool" / "session.json").exists()  # a copy: the first attempt's HOME stays

    # Attempt 3 continues the session attempt 2 continued: attempt 1's worktree, attempt 2's HOME.
    write_home = ("import os, pathlib; p = pathlib.Path(os.environ['HOME'], '.tool', 'turns'); "
                  "p.write_text(p.read_text() + 'turn\\n' if p.exists() else 'turn\\n'); "
                  "print(p.read_text().count('turn')); raise SystemExit(int(os.environ['CODE']))")
    for attempt, exit_code in ((3, 1), (4, 0)):
        r = attempt_run(tmp_path, spec(python_agent(write_home), attempt=attempt, git=git_source(repo),
                                       env={"CODE": str(exit_code)}, resume=Resume(attempt=1, session_id="s-1")))
        _, state = r.run()
        assert state.session == Session("s-1", 1) and r.log() == f"{attempt - 2}\n", (state, r.log())
    assert not (first.files.home / ".tool" / "turns").exists()

    # A worktree that is gone is not silently replaced by a fresh checkout.
    shutil.rmtree(first.workspace_root)
    third = attempt_run(tmp_path, spec(["true"], attempt=5, git=git_source(repo), resume=Resume(1, "s-1")))
    _, three = third.run()
    assert (three.phase, three.reason) == ("Failed", "WorkspaceError")
    assert three.message == (f"cannot resume: the workspace {first.workspace_root} of the attempt to continue is gone")
    fourth = attempt_run(tmp_path, spec(["true"], attempt=6, resume=Resume(9, "s-1")))
    assert fourth.run()[1].message == "cannot resume attempt 9: attempt 6 can only continue an earlier one"


SLOW_FIRST = """
import pathlib, time
pathlib.Path("work.txt").write_text("done before the runner was killed\\n")
time.sleep(60)
"""


def test_a_lost_attempt_is_resumed_by_the_local_runtime(local: LocalRuntime, repo: Repo) -> None:
    source = git_source(repo)
    s1 = spec(python_agent(SLOW_FIRST), uid="u-res", git=source)
    ref1 = local.submit(s1)
    root = local.workspace_root(s1.run)
    wait_for(lambda: (root / "work.txt").exists(), timeout=30)
    os.kill(int(ref1["runnerPid"]), signal.SIGKILL)  # kill -9 of the runner mid-run
    one = wait_for(lambda: (s := local.status(ref1)).finished and s, timeout=15)
    assert one.phase == "Lost" and one.pid is not None
    wait_for(lambda: not group_members(one.pid), timeout=5)  # its agent is gone too
    # What the output parser records when the CLI prints its session id (see the runner tests).
    runner.write_state(local.files(s1.run).state, dataclasses.replace(one, session=Session("sid-1")))

    resume = Resume(attempt=1, session_id="sid-1")
    run2 = dataclasses.replace(s1.run, attempt=2)
    ws = local.workspace(run2, source, resume=resume)
    assert ws.root == str(root) and ws.home == str(local.files(run2).home)
    check = "import pathlib; print(pathlib.Path('work.txt').read_text().strip())"
    ref2 = local.submit(spec(python_agent(check), uid="u-res", attempt=2, git=source, resume=resume))
    two = wait_for(lambda: (s := local.status(ref2)).finished and s, timeout=30)
    log = b"".join(local.logs(ref2)).decode()
    assert (two.phase, two.session) == ("Succeeded", Session("sid-1", 1)), (two, log)
    assert log == "done before the runner was killed\n"
    local.cleanup(ref2, keep_records=True)
    assert not root.exists()  # the worktree both attempts worked in
    local.cleanup(ref1, keep_records=True)  # and the earlier attempt's cleanup finds it gone: fine


def test_a_config_file_is_not_written_through_a_link_the_earlier_agent_left(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    plant = f"import os; os.symlink({str(outside)!r}, os.path.join(os.environ['HOME'], '.codex'))"
    first = attempt_run(tmp_path, spec(python_agent(plant)))
    assert first.run()[1].phase == "Succeeded"
    second = attempt_run(tmp_path, spec(["true"], attempt=2, resume=Resume(1, "s"),
                                        config_files=(ConfigFile(".codex/config.toml", "x"),)))
    _, state = second.run()
    assert (state.reason, state.message) == (
        "WorkspaceError", 'config file ".codex/config.toml" (configFiles[0].path): leads outside HOME through a '
                          "symbolic link")
    assert list(outside.iterdir()) == []


def test_a_resumed_home_s_links_are_not_followed_to_make_or_write_files_outside(repo: Repo, tmp_path: Path) -> None:
    # The runner (root, on a server) prepares the copy of an earlier agent's HOME: links that agent
    # planted there must not have it make directories or write git's config outside that HOME.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("[core]\n\tbare = false\n")
    for case, (links, config, message) in enumerate((
        ({".codex": outside}, ".codex/deeper/config.toml",
         'config file ".codex/deeper/config.toml" (configFiles[0].path): leads outside HOME through a symbolic link'),
        ({".local": outside}, None, "leads outside it through a symbolic link"),
        ({".gitconfig": outside / "victim"}, None, None),
    )):
        plant = "; ".join(f"p = os.path.join(os.environ['HOME'], {name!r}); shutil.rmtree(p, ignore_errors=True); "
                          "os.path.lexists(p) and os.remove(p); "
                          f"os.symlink({str(target)!r}, p)" for name, target in links.items())
        first = attempt_run(tmp_path / str(case), spec(python_agent(f"import os, shutil; {plant}"),
                                                       git=git_source(repo)))
        one = first.run()[1]
        assert one.phase == "Succeeded", (one, first.log())
        configs = (ConfigFile(config, "x"),) if config else ()
        second = attempt_run(tmp_path / str(case), spec(["true"], attempt=2, git=git_source(repo),
                                                        resume=Resume(1, "s"), config_files=configs))
        _, state = second.run()
        if message is None:
            assert state.phase == "Succeeded", state
            assert not (second.files.home / ".gitconfig").is_symlink()
        else:
            assert state.reason == "WorkspaceError" and message in (state.message or ""), state
        assert sorted(p.name for p in outside.iterdir()) == ["victim"]
        assert (outside / "victim").read_text() == "[core]\n\tbare = false\n"


def test_patch_hygiene_for_tracked_files(repo: Repo, tmp_path: Path) -> None:
    base = repo.commit({".aider.conf.yml": "model: a\n", "data.bin": "d" * 5000, "keep.txt": "k\n"}, "tracked")
    checkout = workspace.prepare(cache=tmp_path / "mirrors", git=git_source(repo), root=tmp_path / "ws")
    assert checkout.base == base
    (checkout.root / ".aider.conf.yml").write_text("model: b\n")  # tracked, but excluded: not in the patch
    (checkout.root / "data.bin").unlink()  # a deletion carries the old content: over the limit too
    (checkout.root / "keep.txt").write_text("k2\n")
    patch = tmp_path / "changes.patch"
    omitted = workspace.write_changes(checkout.root, base, patch, git_dir=checkout.git_dir,
                                      common_dir=checkout.mirror, exclude=(".aider*",), max_file_bytes=1000)
    assert omitted == [("data.bin", 5000)]
    text = patch.read_text()
    assert "keep.txt" in text and ".aider.conf.yml" not in text and "data.bin" not in text
    assert workspace.write_changes(checkout.root, base, patch, git_dir=checkout.git_dir,
                                   common_dir=checkout.mirror) == []  # without a policy: everything, as before
    assert "data.bin" in patch.read_text() and ".aider.conf.yml" in patch.read_text()


def test_the_agents_index_is_not_read_through_a_link(repo: Repo, tmp_path: Path) -> None:
    # The worktree's git directory is the agent's to write; the runner (root, on a server) copies its
    # index to diff the workspace: a link the agent put there (to a root-only file, or /dev/zero,
    # copied forever) must not be followed.
    base = repo.commit({"keep.txt": "k\n"}, "tracked")
    checkout = workspace.prepare(cache=tmp_path / "mirrors", git=git_source(repo), root=tmp_path / "ws")
    assert checkout.git_dir is not None and checkout.base == base
    secret = tmp_path / "secret"
    secret.write_bytes(b"SECRET-BYTES" * 100)
    (checkout.root / "keep.txt").write_text("k2\n")
    (checkout.git_dir / "index").unlink()
    (checkout.git_dir / "index").symlink_to(secret)
    patch = tmp_path / "changes.patch"
    assert workspace.write_changes(checkout.root, base, patch, git_dir=checkout.git_dir,
                                   common_dir=checkout.mirror) == []
    assert "+k2" in patch.read_text()


def test_the_patch_leaves_nothing_of_the_run_in_the_shared_mirror(repo: Repo, tmp_path: Path) -> None:
    # The mirror is every run's of the repository, and its objects are readable to their agents:
    # staging this run's files for the diff must not store them there.
    base = repo.commit({"keep.txt": "k\n"}, "tracked")
    checkout = workspace.prepare(cache=tmp_path / "mirrors", git=git_source(repo), root=tmp_path / "ws")
    assert checkout.mirror is not None and checkout.base == base
    (checkout.root / "keep.txt").write_text("changed, private to this run\n")
    (checkout.root / "notes.txt").write_text("an untracked file of this run's\n")
    patch = tmp_path / "changes.patch"
    workspace.write_changes(checkout.root, base, patch, git_dir=checkout.git_dir, common_dir=checkout.mirror,
                            max_file_bytes=1000)
    text = patch.read_text()
    assert "+changed, private to this run" in text and "+an untracked file of this run's" in text
    for content in ("changed, private to this run\n", "an untracked file of this run's\n"):
        blob = subprocess.run(["git", "hash-object", "--stdin"], input=content, capture_output=True, text=True,
                              check=True).stdout.strip()
        found = subprocess.run(["git", "--git-dir", str(checkout.mirror), "cat-file", "-e", blob], check=False)
        assert found.returncode != 0, f"{content!r} was stored in the shared mirror"


COUNTING_CLI = """#!/bin/sh
if [ "$1" = --version ]; then echo x >> "$ASKED"; echo "counting-cli $(wc -l < "$ASKED" | tr -d ' ') VARIANT"; fi
exit 0
"""


def test_the_executables_hash_and_version_are_kept_until_the_file_changes(make_run: Callable[..., RunnerRun],
                                                                           tmp_path: Path) -> None:
    cli = tmp_path / "bin" / "counting-cli"
    cli.parent.mkdir()
    cli.write_text(COUNTING_CLI.replace("VARIANT", "a"))
    cli.chmod(0o755)
    asked = tmp_path / "asked"
    env = {"PATH": f"{cli.parent}{os.pathsep}{os.environ['PATH']}", "ASKED": str(asked)}

    def invocation() -> Any:
        _, state = make_run(spec(["counting-cli"], env={"ASKED": str(asked)}), env=env).run()
        assert state.phase == "Succeeded" and state.invocation is not None, state
        return state.invocation

    first, second = invocation(), invocation()
    assert first.version == second.version == "counting-cli 1 a"
    assert first.sha256 == second.sha256 == hashlib.sha256(cli.read_bytes()).hexdigest()
    assert asked.read_text().count("x") == 1  # asked once: the second run knew it
    cli.write_text(COUNTING_CLI.replace("VARIANT", "b"))  # an upgrade (or a tampered file): asked again
    third = invocation()
    assert third.version == "counting-cli 2 b" and third.sha256 == hashlib.sha256(cli.read_bytes()).hexdigest()
