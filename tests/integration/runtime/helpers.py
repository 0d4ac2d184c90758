"""Helpers for the runtime tests: real git repositories, runner specs, polling, process checks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from joch.runtime import runner
from joch.runtime.base import GitSource, RunId, RunnerSpec, RunState

PYTHON = sys.executable
IDENTITY = ["-c", "user.name=Test", "-c", "user.email=test@example.com"]


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *IDENTITY, *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"git {' '.join(args)} failed: {done.stderr}"
    return done.stdout.strip()


@dataclass
class Repo:
    path: Path

    @property
    def url(self) -> str:
        return str(self.path)

    def git(self, *args: str) -> str:
        return git(self.path, *args)

    def commit(self, files: dict[str, str], message: str) -> str:
        for name, content in files.items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        self.git("add", "--all")
        self.git("commit", "--quiet", "-m", message)
        return self.git("rev-parse", "HEAD")


def spec(argv: list[str], *, uid: str = "uid-1", attempt: int = 1, **fields: Any) -> RunnerSpec:
    return RunnerSpec(run=RunId(namespace="default", name="demo", uid=uid, attempt=attempt), argv=tuple(argv),
                      **fields)


def python_agent(code: str) -> list[str]:
    return [PYTHON, "-c", code]


@dataclass
class RunnerRun:
    files: runner.RunFiles
    workspace_root: Path
    env: dict[str, str]
    cache: Path

    def options(self) -> list[str]:
        return ["--workspace", str(self.workspace_root), "--cache", str(self.cache)]

    def command(self) -> list[str]:
        return [PYTHON, "-m", "joch.runtime.runner", "--spec", str(self.files.spec), *self.options()]

    def start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.command(), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def run(self, timeout: float = 30) -> tuple[int, RunState]:
        done = subprocess.run(self.command(), env=self.env, capture_output=True, timeout=timeout, check=False)
        state = self.state()
        assert state is not None, done.stderr.decode()
        return done.returncode, state

    def state(self) -> RunState | None:
        return runner.read_state(self.files.state)

    def log(self) -> str:
        return self.files.log.read_text()


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    until = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True for a live process (a zombie is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def git_source(r: Repo, ref: str = "main", path: str = ".") -> GitSource:
    return GitSource(url=r.url, ref=ref, path=path)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def make_repo(path: Path) -> Repo:
    """main: README.md and docs/guide/intro.md; tag v1 on the first commit; branch feature one commit
    ahead with feature.txt; main one commit ahead of v1 with CHANGES.md."""
    path.mkdir()
    git(path, "init", "--quiet", "--initial-branch=main")
    r = Repo(path)
    r.commit({"README.md": "# Demo\n", "docs/guide/intro.md": "intro\n"}, "first")
    r.git("tag", "v1")
    r.git("checkout", "--quiet", "-b", "feature")
    r.commit({"feature.txt": "feature\n"}, "feature work")
    r.git("checkout", "--quiet", "main")
    r.commit({"CHANGES.md": "changes\n"}, "second")
    return r


def run_files_factory(tmp_path: Path) -> Callable[..., RunnerRun]:
    count = 0

    def make(s: RunnerSpec, env: dict[str, str] | None = None) -> RunnerRun:
        nonlocal count
        count += 1
        files = runner.RunFiles(tmp_path / f"run-{count}")
        files.dir.mkdir()
        files.spec.write_text(s.to_json())
        root = tmp_path / f"workspace-{count}"
        return RunnerRun(files, root, {**os.environ, **(env or {})}, tmp_path / "mirrors")

    return make
