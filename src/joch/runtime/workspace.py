"""Workspaces: a git worktree per run attempt, checked out from a cached bare mirror per repository.

Every repository URL (a local path, ``file://``, https or ssh: all take the same path through git)
gets one bare mirror below the cache directory, ``<cache>/<sha256(url)[:16]>.git``. The first run
clones it (``git clone --mirror``, into a temporary name renamed into place, so a clone that dies
halfway never leaves a mirror that looks complete); later runs ``git fetch --prune`` it, and a
failed fetch falls back to what the mirror already has. Each run attempt then gets its own
``git worktree add --detach`` at the requested ref: the worktrees share the mirror's objects, so a
checkout costs the files written, not another clone. A flock on ``<cache>/<key>.lock`` serializes
everything that changes a mirror (clone, fetch, worktree add and remove) across runner processes.

The requested ref is resolved in the mirror (``refs/heads``, ``refs/tags``, any fetched ref, or a
commit sha) to the run's base commit; ``changes.patch`` is later taken against it. The agent works
in ``GitSource.path`` inside the worktree, which must exist at that commit and may not leave it.

Git runs with options and environment that user configuration cannot turn against us: no hooks, no
fsmonitor daemon, no pager or colour, no terminal prompt (a credential that is not configured fails
instead of waiting for a person), and none of the ``GIT_DIR``-like variables that would point git at
another repository. Agents commit, so a worktree whose git has no identity gets a neutral one in the
mirror's config.

A run without a repository gets an empty directory as its workspace root.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import posixpath
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from joch.runtime.base import GitSource

IDENTITY = ("Joch agent", "agent@joch.dev")
_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "color.ui=false",
    "advice.detachedHead=false",
)
# Variables that make git operate on another repository or index than the one we name.
LOCATION_VARS = (
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_PREFIX", "GIT_QUARANTINE_PATH", "GIT_CEILING_DIRECTORIES",
)
_LOCK_POLL = 0.05


class WorkspaceError(Exception):
    """The workspace could not be prepared; the message says which repository, ref or path."""


@dataclass(frozen=True)
class Checkout:
    root: Path            # the worktree, or the empty directory of a run without a repository
    path: Path            # root joined with GitSource.path: the agent's working directory
    base: str | None      # the commit the worktree was created at
    mirror: Path | None


def mirror_path(cache: Path, url: str) -> Path:
    return cache / f"{_key(url)}.git"


def subpath(root: Path, path: str) -> Path:
    """``root / path`` for a relative path that stays inside root (checked without touching disk)."""
    normal = posixpath.normpath(path.replace(os.sep, "/")) if path else "."
    if posixpath.isabs(normal) or normal == ".." or normal.startswith("../"):
        raise WorkspaceError(f'path "{path}" must be relative and stay inside the workspace')
    return root if normal == "." else root / normal


def clean_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without the variables that would point git elsewhere, and without prompts."""
    env = {k: v for k, v in base.items() if k not in LOCATION_VARS}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", GCM_INTERACTIVE="never")
    return env


def prepare(*, cache: Path, git: GitSource | None, root: Path, deadline: float | None = None) -> Checkout:
    """Create the run's workspace at ``root``: a worktree of ``git`` or an empty directory.

    ``deadline`` (``time.monotonic()``) bounds waiting for the mirror lock and every git command."""
    if root.exists() and any(root.iterdir()):
        raise WorkspaceError(f"workspace directory {root} exists already and is not empty")
    if git is None:
        root.mkdir(parents=True, exist_ok=True)
        return Checkout(root=root, path=root, base=None, mirror=None)
    if git.ref.startswith("-") or not git.ref.strip():
        raise WorkspaceError(f'invalid ref "{git.ref}" for {git.url}')
    path = subpath(root, git.path)  # rejected before any network traffic
    mirror = mirror_path(cache, git.url)
    with _locked(mirror, deadline):
        _sync(git.url, mirror, deadline)
        base = _resolve(mirror, git, deadline)
        root.parent.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--detach", "--", str(root), base, cwd=mirror, deadline=deadline,
             what=f"could not check out {git.url} at {git.ref}")
    checkout = Checkout(root=root, path=path, base=base, mirror=mirror)
    try:
        _check_path(checkout, git)
        _ensure_identity(checkout, deadline)
    except WorkspaceError:
        remove(cache=cache, git=git, root=root)
        raise
    return checkout


def remove(*, cache: Path, git: GitSource | None, root: Path) -> None:
    """Remove a workspace made by ``prepare`` (a missing one is fine)."""
    if git is not None:
        mirror = mirror_path(cache, git.url)
        if mirror.is_dir():
            with _locked(mirror, None):
                if root.exists():
                    _run(["worktree", "remove", "--force", "--", str(root)], cwd=mirror, timeout=None)
                _run(["worktree", "prune"], cwd=mirror, timeout=None)
    if root.exists():
        shutil.rmtree(root, ignore_errors=True)


def write_changes(root: Path, base: str, dest: Path) -> None:
    """Write ``git diff --binary`` from ``base`` to everything in the worktree now (commits,
    uncommitted and untracked files; ignored files excluded) to ``dest``.

    The snapshot is staged in a temporary index, a copy of the agent's own, so neither the agent's
    index nor its refs change; copying it lets git skip rehashing files that did not change."""
    found = _git("rev-parse", "--git-path", "index", cwd=root, what="could not find the worktree's index")
    index = root / found.strip()
    with tempfile.TemporaryDirectory(prefix="joch-patch-") as tmp:
        scratch = Path(tmp) / "index"
        if index.exists():
            shutil.copyfile(index, scratch)
        env = {"GIT_INDEX_FILE": str(scratch)}
        _git("add", "--all", "--", ".", cwd=root, env=env, what="could not stage the workspace's changes")
        tree = _git("write-tree", cwd=root, env=env, what="could not snapshot the workspace").strip()
        with open(dest, "wb") as out:
            args = ["diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/",
                    "--dst-prefix=b/", base, tree, "--"]
            done = subprocess.run(_command(args), cwd=root, env=clean_env(os.environ), stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.PIPE, text=False, check=False)
        if done.returncode != 0:
            raise WorkspaceError(f"could not diff the workspace against {base}: {_last_line(done.stderr.decode())}")


# --- mirrors --------------------------------------------------------------------------------------


def _key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(mirror: Path, deadline: float | None) -> Iterator[None]:
    mirror.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(mirror.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WorkspaceError(f"timed out waiting for the repository cache lock {mirror}") from None
                time.sleep(_LOCK_POLL)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _sync(url: str, mirror: Path, deadline: float | None) -> None:
    if (mirror / "HEAD").exists():
        fetched = _run(["fetch", "--prune", "--quiet", "origin"], cwd=mirror, timeout=_left(deadline))
        if fetched.returncode != 0:
            # Offline or the remote is down: the cached commits may still have the ref.
            _note(f"joch runner: fetching {url} failed, using the cached mirror: {_last_line(fetched.stderr)}")
        return
    tmp = mirror.with_name(f"{mirror.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _git("clone", "--mirror", "--quiet", "--", url, str(tmp), cwd=mirror.parent, deadline=deadline,
             what=f"could not clone {url}")
        os.rename(tmp, mirror)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _resolve(mirror: Path, git: GitSource, deadline: float | None) -> str:
    found = _run(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{git.ref}^{{commit}}"], cwd=mirror,
                 timeout=_left(deadline))
    if found.returncode != 0 or not found.stdout.strip():
        raise WorkspaceError(f'ref "{git.ref}" not found in {git.url} (not a branch, tag or commit there)')
    return found.stdout.strip()


def _check_path(checkout: Checkout, git: GitSource) -> None:
    real_root = checkout.root.resolve()
    if not checkout.path.resolve().is_relative_to(real_root):
        raise WorkspaceError(f'path "{git.path}" in {git.url} at {git.ref} leads outside the repository')
    if not checkout.path.is_dir():
        raise WorkspaceError(f'path "{git.path}" is not a directory in {git.url} at {git.ref}')


def _ensure_identity(checkout: Checkout, deadline: float | None) -> None:
    missing = [key for key in ("user.name", "user.email")
               if not _run(["config", "--get", key], cwd=checkout.root, timeout=_left(deadline)).stdout.strip()]
    if not missing or checkout.mirror is None:
        return
    with _locked(checkout.mirror, deadline):
        for key in missing:
            value = IDENTITY[0] if key == "user.name" else IDENTITY[1]
            _git("config", key, value, cwd=checkout.mirror, deadline=deadline, what="could not set a git identity")


# --- running git ----------------------------------------------------------------------------------


def _command(args: list[str]) -> list[str]:
    command = ["git"]
    for option in _CONFIG:
        command += ["-c", option]
    return command + args


def _run(args: list[str], *, cwd: Path, timeout: float | None,
         env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(_command(args), cwd=cwd, env={**clean_env(os.environ), **(env or {})},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise WorkspaceError(f"git {args[0]} did not finish before the run's deadline") from None
    except FileNotFoundError:
        raise WorkspaceError("git is not installed (not found on PATH)") from None


def _git(*args: str, cwd: Path, what: str, deadline: float | None = None, env: Mapping[str, str] | None = None) -> str:
    done = _run(list(args), cwd=cwd, timeout=_left(deadline), env=env)
    if done.returncode != 0:
        raise WorkspaceError(f"{what}: {_last_line(done.stderr) or f'git exited with code {done.returncode}'}")
    return done.stdout


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise WorkspaceError("preparing the workspace took longer than the run's deadline")
    return left


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1].removeprefix("fatal: ").removeprefix("error: ") if lines else ""


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
