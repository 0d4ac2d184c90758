"""The demo agent, alone and as the quickstart runs it: through the local runtime, in a worktree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import joch
from integration.runtime.helpers import Repo, git, git_source, spec, wait_for
from joch.runtime.base import InputFile, Output, RunId, RunState
from joch.runtime.local import LocalRuntime

DEMO = str(Path(sys.executable).with_name("joch-demo-agent"))  # installed with joch, like the runner finds it
REQUEST = 'Add a line "Hello from Joch" to the end of README.md and explain the change in summary.md.\n'


def test_the_quickstart_run_end_to_end(local: LocalRuntime, repo: Repo) -> None:
    source = git_source(repo)
    ws = local.workspace(RunId("default", "hello", "demo-1"), source)
    s = spec(["joch-demo-agent", "--implementation", f"{ws.inputs}/implementation.md",
              "--summary", f"{ws.outputs}/summary.md"], uid="demo-1", git=source, env={"JOCH_RUN_NAME": "hello"},
             input_files=(InputFile("implementation.md", REQUEST),), outputs=(Output("summary", "summary.md"),))
    ref = local.submit(s)
    state: RunState = wait_for(lambda: (st := local.status(ref)).finished and st, timeout=15)
    log = b"".join(local.logs(ref)).decode()
    assert (state.phase, state.reason) == ("Succeeded", "Completed"), log

    assert (Path(ws.root) / "README.md").read_text() == "# Demo\nHello from Joch\n"
    author = git(Path(ws.root), "log", "-1", "--format=%an <%ae>|%s")
    assert author == 'Joch demo agent <demo-agent@joch.dev>|Add "Hello from Joch" to README.md'
    sha = git(Path(ws.root), "rev-parse", "HEAD")
    _, f = local.open_artifact(ref, "summary")
    with f:
        summary = f.read().decode()
    assert "Hello from Joch" in summary and "README.md" in summary and sha in summary
    _, f = local.open_artifact(ref, "changes.patch")
    with f:
        assert b"+Hello from Joch" in f.read()
    assert 'appending "Hello from Joch" to README.md' in log and f"committed {sha[:12]}" in log
    # What ran is on record: the demo agent as installed, its version, the commit the run started from.
    assert state.invocation is not None and state.invocation.executable == DEMO
    assert state.invocation.version == f"joch-demo-agent {joch.__version__}"
    assert state.base_commit == repo.git("rev-parse", "main")


def test_outside_a_git_repository_it_says_so(tmp_path: Path) -> None:
    request = tmp_path / "implementation.md"
    request.write_text(REQUEST)
    done = subprocess.run([DEMO, "--implementation", str(request), "--summary", str(tmp_path / "s.md")],
                          cwd=tmp_path, capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)})
    assert done.returncode == 1
    assert "joch-demo-agent: error: not in a git repository" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "s.md").exists()
    missing = subprocess.run([DEMO, "--implementation", str(tmp_path / "nope"), "--summary", "s.md"],
                             cwd=tmp_path, capture_output=True, text=True, check=False)
    assert missing.returncode == 1 and "cannot read the implementation request" in missing.stderr
