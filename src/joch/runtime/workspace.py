"""Workspaces: a repository per run attempt, borrowing the objects of a cached bare mirror per repository.

Every repository URL (a local path, ``file://``, https or ssh: all take the same path through git)
gets one bare mirror below the cache directory, ``<cache>/<sha256(url)[:16]>.git``. The first run
clones it (``git clone --mirror``, into a temporary name renamed into place, so a clone that dies
halfway never leaves a mirror that looks complete); later runs ``git fetch --prune`` it, and a
failed fetch falls back to what the mirror already has. Each run attempt then gets a repository of
its own, ``git clone --shared --no-checkout`` of the mirror (the mirror's branches are its
``origin/*``, its tags its tags), with the requested commit checked out as a detached HEAD. The
clone borrows the mirror's objects (``objects/info/alternates``) rather than copying them, so a
checkout costs the files written and the refs copied, not another clone; what the agent commits
goes to the clone's own ``.git/objects``. The mirror is never the agent's to write (``sandbox``
mounts only its objects, read-only): it is every run's of the repository, and an object replaced
there would be what the next run checks out. Its garbage collection never deletes an object
(``gc.pruneExpire=never``): a base commit a force-push left unreachable stays for the clones that
borrow it.

A flock on ``<cache>/<key>.lock`` serializes what changes a mirror across runner processes: clone,
fetch (and the garbage collection git may start after one), and resolving the ref. The run's clone
and its files are made after the lock is released: they only read the mirror. Removing a
workspace deletes its directory (a worktree of the mirror, as earlier versions made, also has its
record in the mirror pruned). flock cannot wait with a timeout, so waiters poll, from 1 ms apart up
to 10 ms: often enough that the longest waiter is not the one left behind. Two shortcuts skip the
fetch:

* A run whose ref is a full commit sha the mirror has already does not fetch: nothing a fetch
  brings can change what that sha names.
* Fetches are counted in ``<cache>/<key>.fetches`` (begun, last completed). A run notes the count
  begun before it waits for the lock; once a fetch that began after that has completed (while it
  waits, or by the time it holds the lock), that fetch is as fresh as its own would have been, and
  it does not fetch again.

The requested ref is resolved in the mirror (``refs/heads``, ``refs/tags``, any fetched ref, or a
commit sha) to the run's base commit; ``changes.patch`` is later taken against it. The agent works
in ``GitSource.path`` inside the checkout, which must exist at that commit and may not leave it.

Git runs with options and environment that user configuration cannot turn against us: no hooks, no
fsmonitor daemon, no pager or colour, no terminal prompt (a credential that is not configured fails
instead of waiting for a person), an explicit transport allow-list (``ALLOWED_PROTOCOLS``: no
``ext::``), and none of the ``GIT_DIR``-like variables that would point git at another repository.
Agents commit, so a checkout whose git has no identity gets a neutral one in its own config.
A repository is a URL, an scp-style ``[user@]host:path`` or an absolute path (``url_problem``).

A run without a repository gets an empty directory as its workspace root.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import posixpath
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from joch.runtime.base import GitSource

IDENTITY = ("Joch agent", "agent@joch.dev")
_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "color.ui=false",
    "advice.detachedHead=false",
    # A root runner's agent runs as another uid (sandbox.AgentUser) and owns its checkout and its
    # repository: git would refuse them as of "dubious ownership". What that check guards against (a
    # repository of another user's configuring commands) is kept out otherwise: the runner's git
    # after the agent (write_changes) runs in a scratch repository of its own, not the agent's.
    "safe.directory=*",
    # Runs' repositories borrow a mirror's objects (``prepare``), their base commits among them, which
    # a force-push leaves unreachable in the mirror: the garbage collection a fetch may start (which
    # gets these options through git's environment) never deletes an object.
    "gc.pruneExpire=never",
)
# Variables that make git operate on another repository or index than the one we name.
LOCATION_VARS = (
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_PREFIX", "GIT_QUARANTINE_PATH", "GIT_CEILING_DIRECTORIES",
)
_LOCK_POLL = 0.01
_LOCK_POLL_FIRST = 0.001
_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class WorkspaceError(Exception):
    """The workspace could not be prepared; the message says which repository, ref or path."""


@dataclass(frozen=True)
class Checkout:
    root: Path            # the run's checkout (work tree), or the empty directory of a run without a repository
    path: Path            # root joined with GitSource.path: the agent's working directory
    base: str | None      # the commit checked out (detached HEAD) when the checkout was made
    mirror: Path | None   # the shared mirror whose objects the run's repository borrows (read-only)
    git_dir: Path | None = None  # the run's own repository, root/.git, as it was made (the agent's to write)


def mirror_path(cache: Path, url: str) -> Path:
    return cache / f"{_key(url)}.git"


def subpath(root: Path, path: str) -> Path:
    """``root / path`` for a relative path that stays inside root (checked without touching disk)."""
    normal = posixpath.normpath(path.replace(os.sep, "/")) if path else "."
    if posixpath.isabs(normal) or normal == ".." or normal.startswith("../"):
        raise WorkspaceError(f'path "{path}" must be relative and stay inside the workspace')
    return root if normal == "." else root / normal


ALLOWED_PROTOCOLS = "file:git:http:https:ssh"
"""The transports git may use for a run's repository (``GIT_ALLOW_PROTOCOL``): set explicitly rather
than left to git's defaults and the user's ``protocol.*.allow`` configuration, so ``ext::`` (which runs
a command) and ``fd::`` never work, whatever a URL or a config file says."""


def clean_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without the variables that would point git elsewhere, without prompts, and with the
    transports limited to ``ALLOWED_PROTOCOLS``."""
    env = {k: v for k, v in base.items() if k not in LOCATION_VARS}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", GCM_INTERACTIVE="never", GIT_ALLOW_PROTOCOL=ALLOWED_PROTOCOLS)
    return env


def url_problem(url: str) -> str | None:
    """Why git must not be given ``url``, or None: a URL (``scheme://``), an scp-style ``[user@]host:path``
    (a colon before any slash, as git reads it) or an absolute local path. A relative path would be
    relative to wherever the runner happens to run git, and a ``transport::`` address picks a remote
    helper (``ext::`` runs a command)."""
    if url.startswith("-"):
        return f'repository URL "{url}" cannot start with "-"'
    if "::" in url.split("/", 1)[0]:
        return f'repository URL "{url}" names a git transport helper; use https://, ssh://, git:// or a path'
    if "://" in url or os.path.isabs(url) or scp_like(url):
        return None
    return f'repository "{url}" is neither a URL nor an absolute path'


def scp_like(url: str) -> bool:
    """Whether git reads ``url`` as scp-style ``[user@]host:path``: a colon before any slash (a single
    letter before it is a Windows drive). ``github.invalid:org/repo.git`` is one, with no user."""
    colon, slash = url.find(":"), url.find("/")
    return colon > 1 and (slash < 0 or colon < slash) and "::" not in url[:colon + 2]


def prepare(*, cache: Path, git: GitSource | None, root: Path, deadline: float | None = None) -> Checkout:
    """Create the run's workspace at ``root``: a checkout of ``git`` (its own repository, borrowing the
    mirror's objects) or an empty directory.

    ``deadline`` (``time.monotonic()``) bounds waiting for the mirror lock and every git command."""
    if root.exists() and any(root.iterdir()):
        raise WorkspaceError(f"workspace directory {root} exists already and is not empty")
    if git is None:
        root.mkdir(parents=True, exist_ok=True)
        return Checkout(root=root, path=root, base=None, mirror=None)
    if git.ref.startswith("-") or not git.ref.strip():
        raise WorkspaceError(f'invalid ref "{git.ref}" for {git.url}')
    path = subpath(root, git.path)  # rejected before any network traffic
    problem = url_problem(git.url)
    if problem is not None:
        raise WorkspaceError(problem)
    mirror = mirror_path(cache, git.url)
    base = None
    if _FULL_SHA.fullmatch(git.ref) and (mirror / "HEAD").is_file():  # a commit fetched before: no fetch
        with _locked(mirror, deadline):
            base = _resolve(mirror, git, deadline, missing_ok=True)
    if base is None:
        asked = _fetches(mirror)[0]
        with _locked(mirror, deadline, unless=lambda: _fetched_since(mirror, asked)) as held:
            if held:
                _sync(git.url, mirror, deadline, asked)
                base = _resolve(mirror, git, deadline)
        if base is None:  # a fetch that began after this run asked served it
            with _locked(mirror, deadline):
                base = _resolve(mirror, git, deadline)
    if base is None:  # _resolve raises instead, unless missing_ok
        raise WorkspaceError(f'ref "{git.ref}" not found in {git.url}')
    checkout = Checkout(root=root, path=path, base=base, mirror=mirror, git_dir=root / ".git")
    try:
        # The run's own repository, outside the lock: it only reads the mirror (its refs, to copy
        # them as origin's, and its objects, which it borrows through objects/info/alternates),
        # and the mirror's fetches never prune an object (``_sync``).
        root.parent.mkdir(parents=True, exist_ok=True)
        _git("clone", "--shared", "--no-checkout", "--quiet", "--", str(mirror), str(root), cwd=root.parent,
             deadline=deadline, what=f"could not check out {git.url} at {git.ref}")
        _git("update-ref", "--no-deref", "-m", "joch: the run's base commit", "HEAD", base, cwd=root,
             deadline=deadline, what=f"could not check out {git.url} at {git.ref}")
        _git("reset", "--hard", "--no-recurse-submodules", "--quiet", cwd=root, deadline=deadline,
             what=f"could not check out {git.url} at {git.ref}")
        _check_path(checkout, git)
        _ensure_identity(checkout, deadline)
    except WorkspaceError:
        remove(cache=cache, git=git, root=root)
        raise
    return checkout


def reuse(*, cache: Path, git: GitSource | None, root: Path, base: str | None) -> Checkout:
    """An earlier attempt's workspace at ``root``, to continue in (a resumed attempt): checked, not
    made. ``base`` is the commit that attempt started from (its record's ``base_commit``).

    The checkout must be a repository of its own (``root/.git`` a directory, not a link) that
    borrows the mirror's objects; a worktree of the mirror (what earlier versions made) is not
    resumed in."""
    if not root.is_dir():
        raise WorkspaceError(f"cannot resume: the workspace {root} of the attempt to continue is gone")
    if git is None:
        return Checkout(root=root, path=root, base=None, mirror=None)
    path = subpath(root, git.path)
    mirror = mirror_path(cache, git.url)
    if base is None:
        raise WorkspaceError(f"cannot resume in {root}: the attempt to continue recorded no base commit")
    git_dir = root / ".git"
    if git_dir.is_symlink() or not git_dir.is_dir() or not _borrows(git_dir, mirror):
        raise WorkspaceError(f"cannot resume: {root} is not a checkout of {git.url} (its repository does not "
                             f"borrow the objects of the mirror {mirror})")
    if _run(["cat-file", "-e", f"{base}^{{commit}}"], cwd=mirror, timeout=None).returncode != 0:
        raise WorkspaceError(f"cannot resume in {root}: its base commit {base} is not in the mirror of {git.url}")
    checkout = Checkout(root=root, path=path, base=base, mirror=mirror, git_dir=git_dir)
    _check_path(checkout, git)
    return checkout


def _borrows(git_dir: Path, mirror: Path) -> bool:
    """Whether the repository ``git_dir`` names the mirror's objects in its ``objects/info/alternates``
    (what ``prepare``'s clone wrote; the agent could have rewritten it, so this only tells a checkout of
    this repository from another directory, and nothing the runner does relies on the file)."""
    try:
        lines = (git_dir / "objects" / "info" / "alternates").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    want = os.path.realpath(mirror / "objects")
    return any(os.path.realpath(line.strip()) == want for line in lines if line.strip())


def remove(*, cache: Path, git: GitSource | None, root: Path) -> None:
    """Remove a workspace made by ``prepare`` (a missing one is fine): its files and repository.
    A worktree of the mirror (what earlier versions made) also leaves a record in the mirror, which
    ``git worktree prune`` drops once the directory is gone."""
    old_style = (root / ".git").is_file() and not (root / ".git").is_symlink()
    if root.exists():
        shutil.rmtree(root, ignore_errors=True)
    mirror = mirror_path(cache, git.url) if git is not None else None
    if old_style and mirror is not None and (mirror / "worktrees").is_dir():
        with _locked(mirror, None):
            _run(["worktree", "prune"], cwd=mirror, timeout=None)


class TooLarge(Exception):
    """``write_changes`` stopped: the patch passed its size limit (``size`` bytes were seen)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"the patch is more than {size - 1} bytes")
        self.size = size


def write_changes(root: Path, base: str, dest: Path, *, limit: int | None = None, git_dir: Path | None = None,
                  common_dir: Path | None = None, exclude: Sequence[str] = (),
                  max_file_bytes: int | None = None) -> list[tuple[str, int]]:
    """Write ``git diff --binary`` from ``base`` to everything in the worktree now (commits,
    uncommitted and untracked files; ignored files excluded) to ``dest``; past ``limit`` bytes,
    stop, remove ``dest`` and raise ``TooLarge`` (a huge file the agent left would otherwise be
    written out again, larger, as base85).

    ``exclude`` are git pathspec globs (``:(exclude,glob)``, relative to ``root``) left out of the
    patch: a tool's caches and history files. A changed file whose old or new content is over
    ``max_file_bytes`` is left out too, and returned with its size (``(path, size)``, the list is
    empty when nothing was left out): the patch stays one ``git apply`` takes, without those files.

    The snapshot is staged in a temporary index, a copy of the agent's own, so neither the agent's
    index nor its refs change; copying it lets git skip rehashing files that did not change. The
    diff is of that index against ``base`` (``diff --cached``): the same as of a tree written from
    it, without writing the tree.

    ``git_dir`` is the run's repository (``Checkout.git_dir``, ``root/.git`` as ``prepare`` made it) and
    ``common_dir`` the mirror whose objects it borrows (``Checkout.mirror``). Everything in ``git_dir``
    is the agent's to rewrite, its config too, where a command (a clean filter) git would run here,
    outside the sandbox, could be configured; so git runs in a scratch repository of its own, with
    ``root`` as its work tree, the agent's index copied, and the agent's objects (its commits, what it
    staged) and the mirror's borrowed. Without ``git_dir`` git finds the repository from ``root``."""
    own = git_dir is not None and git_dir.is_dir() and not git_dir.is_symlink()
    index = git_dir / "index" if git_dir is not None else _index_file(root)
    with tempfile.TemporaryDirectory(prefix="joch-patch-") as tmp:
        scratch = Path(tmp) / "index"
        # The agent's to rewrite: a link there (to /dev/zero, to a root-only file) is not followed,
        # nor is anything but a regular file read; git then stages from no index, the same diff.
        if (own or git_dir is None) and index.is_file() and not index.is_symlink():
            shutil.copyfile(index, scratch, follow_symlinks=False)
        env = {"GIT_INDEX_FILE": str(scratch)}
        # What staging hashes goes into a scratch object directory, not the repository's: this run's
        # files (untracked ones too) are not left in the agent's repository (or a mirror) by this.
        if git_dir is not None:
            repo = Path(tmp) / "repo"
            _git("init", "--quiet", "--bare", "--", str(repo), cwd=Path(tmp),
                 what="could not make a scratch repository")
            borrowed = [str(git_dir / "objects")] if own and (git_dir / "objects").is_dir() else []
            if common_dir is not None:
                borrowed.append(str(common_dir / "objects"))
            env.update(GIT_DIR=str(repo), GIT_WORK_TREE=str(root), GIT_OBJECT_DIRECTORY=str(repo / "objects"),
                       GIT_ALTERNATE_OBJECT_DIRECTORIES=os.pathsep.join(borrowed))
        else:
            shared = _git("rev-parse", "--path-format=absolute", "--git-path", "objects", cwd=root, env=env,
                          what="could not find the repository's objects").strip()
            (Path(tmp) / "objects").mkdir()
            env.update(GIT_OBJECT_DIRECTORY=str(Path(tmp) / "objects"), GIT_ALTERNATE_OBJECT_DIRECTORIES=shared)
        pathspec = [".", *(f":(exclude,glob){pattern}" for pattern in exclude)]
        _git("add", "--all", "--", *pathspec, cwd=root, env=env, what="could not stage the workspace's changes")
        omitted = _over_size(root, base, pathspec, env, max_file_bytes) if max_file_bytes is not None else []
        pathspec += [f":(exclude,literal){path}" for path, _ in omitted]
        args = ["diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/",
                "--dst-prefix=b/", base, "--", *pathspec]
        # stderr to a file: a pipe nobody reads while stdout is copied could fill and stall git.
        with open(dest, "wb") as out, open(Path(tmp) / "stderr", "w+b") as errors, subprocess.Popen(
                _command(args), cwd=root, env={**clean_env(os.environ), **env}, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=errors) as git:
            written = _copy_limited(git, out, limit)
            code = git.wait()
            errors.seek(0)
            stderr = errors.read()
        if written is None:
            dest.unlink(missing_ok=True)
            raise TooLarge((limit or 0) + 1)
        if code != 0:
            raise WorkspaceError(f"could not diff the workspace against {base}: {_last_line(stderr.decode())}")
    return omitted


def _over_size(root: Path, base: str, pathspec: list[str], env: Mapping[str, str],
               limit: int) -> list[tuple[str, int]]:
    """The changed paths (staged in ``env``'s index, against ``base``) whose old or new content is
    over ``limit`` bytes, with that size: a deletion's patch carries the old content too."""
    listed = _git("diff", "--cached", "--raw", "-z", "--no-renames", "--no-abbrev", base, "--", *pathspec, cwd=root,
                  env=env, what="could not list the workspace's changes")
    fields = listed.split("\0")
    changes: list[tuple[str, tuple[str, ...]]] = []
    for header, path in zip(fields[0::2], fields[1::2], strict=False):
        parts = header.lstrip(":").split()
        if len(parts) >= 4 and path:
            changes.append((path, tuple(sha for sha in parts[2:4] if sha.strip("0"))))
    blobs = sorted({sha for _, shas in changes for sha in shas})
    if not blobs:
        return []
    try:
        done = subprocess.run(_command(["cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize)"]),
                              cwd=root, env={**clean_env(os.environ), **env}, input="\n".join(blobs) + "\n",
                              capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise WorkspaceError("git is not installed (not found on PATH)") from None
    sizes: dict[str, int] = {}
    for line in done.stdout.splitlines():
        name, kind, length = [*line.split(), "", "", ""][:3]
        if kind == "blob" and length.isdigit():
            sizes[name] = int(length)
    over = []
    for path, shas in changes:
        size = max((sizes.get(sha, 0) for sha in shas), default=0)
        if size > limit:
            over.append((path, size))
    return over


def _copy_limited(proc: subprocess.Popen[bytes], out: BinaryIO, limit: int | None) -> int | None:
    """Copy ``proc``'s stdout to ``out``; None (and ``proc`` killed) once it passes ``limit`` bytes."""
    written = 0
    if proc.stdout is None:
        return written
    while chunk := proc.stdout.read(65536):
        written += len(chunk)
        if limit is not None and written > limit:
            proc.kill()
            return None
        out.write(chunk)
    return written


def _index_file(root: Path) -> Path:
    """The worktree's index, found the way git finds it: ``root/.git`` is the repository, or a file
    naming it (``gitdir: <path>``, which is what a worktree has); else git is asked."""
    dot_git = root / ".git"
    try:
        if dot_git.is_dir():
            return dot_git / "index"
        text = dot_git.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    if text.startswith("gitdir: ") and text.count("\n") <= 1:
        return root / text.removeprefix("gitdir: ").strip() / "index"  # root / an absolute path is that path
    found = _git("rev-parse", "--git-path", "index", cwd=root, what="could not find the worktree's index")
    return root / found.strip()


# --- mirrors --------------------------------------------------------------------------------------


def _key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(mirror: Path, deadline: float | None, *, unless: Callable[[], bool] | None = None) -> Iterator[bool]:
    """Hold the mirror's lock (True); or, once ``unless()`` is true while waiting for it, do not (False)."""
    mirror.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(mirror.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        pause = _LOCK_POLL_FIRST
        while not _try_lock(fd):
            if unless is not None and unless():
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise WorkspaceError(f"timed out waiting for the repository cache lock {mirror}")
            time.sleep(pause)
            pause = min(pause * 2, _LOCK_POLL)
        else:
            yield True
            return
        yield False
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _fetched_since(mirror: Path, asked: int) -> bool:
    """Whether a fetch that began after ``asked`` (the fetches begun when a run asked) has completed."""
    return _fetches(mirror)[1] > asked and (mirror / "HEAD").exists()


def _sync(url: str, mirror: Path, deadline: float | None, asked: int) -> None:
    """Clone or fetch the mirror (holding the exclusive lock), unless a fetch that began after
    ``asked`` (the fetches begun when this run asked, ``_fetches``) has completed meanwhile."""
    if _fetched_since(mirror, asked):
        return
    begun, done = _fetches(mirror)
    _record_fetches(mirror, begun + 1, done)
    if (mirror / "HEAD").exists():
        drop_foreign_refs(mirror)
        fetched = _run(["fetch", "--prune", "--quiet", "origin"], cwd=mirror, timeout=_left(deadline))
        if fetched.returncode != 0:
            # Offline or the remote is down: the cached commits may still have the ref.
            _note(f"joch runner: fetching {url} failed, using the cached mirror: {_last_line(fetched.stderr)}")
            return
        _record_fetches(mirror, begun + 1, begun + 1)
        return
    tmp = mirror.with_name(f"{mirror.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _git("clone", "--mirror", "--quiet", "--", url, str(tmp), cwd=mirror.parent, deadline=deadline,
             what=f"could not clone {url}")
        os.rename(tmp, mirror)
    except WorkspaceError as exc:
        raise _not_a_repository(url) or exc from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _record_fetches(mirror, begun + 1, begun + 1)


def drop_foreign_refs(mirror: Path) -> None:
    """Remove the loose refs of ``mirror`` that are not an object it has, or not a file: an agent
    writes the mirror's refs (its branches), and git's fetch fails on a ref whose object is missing
    ("bad object"), which would leave every later run of the repository with the stale mirror; a
    link would be read through by the runners' git (a file only root may read)."""
    loose: dict[Path, str] = {}
    for base, _, names in os.walk(mirror / "refs"):
        for name in names:
            path = Path(base, name)
            try:
                status = path.lstat()
                value = path.read_text(errors="replace").strip() if stat.S_ISREG(status.st_mode) else ""
            except OSError:
                continue
            if not value.startswith("ref: "):
                loose[path] = value
    if not loose:
        return
    wanted = sorted({v for v in loose.values() if _FULL_SHA.fullmatch(v)})
    found = subprocess.run(_command(["cat-file", "--batch-check=%(objectname)"]), cwd=mirror,
                           env=clean_env(os.environ), input="".join(f"{v}\n" for v in wanted), capture_output=True,
                           text=True, check=False).stdout if wanted else ""
    present = {line.strip() for line in found.splitlines() if _FULL_SHA.fullmatch(line.strip())}  # not "X missing"
    for path, value in loose.items():
        if value not in present:
            for gone in (path, mirror / "logs" / path.relative_to(mirror)):
                with contextlib.suppress(OSError):
                    gone.unlink()


def _not_a_repository(url: str) -> WorkspaceError | None:
    """A clearer error than git's "repository 'DIR' does not exist" for a local directory that
    exists but is not a repository (or is a directory inside one); None for anything else."""
    if "://" in url or not os.path.isdir(url):
        return None
    found = _run(["rev-parse", "--show-toplevel"], cwd=Path(url), timeout=10)
    top = found.stdout.strip() if found.returncode == 0 else ""
    if top and os.path.realpath(top) != os.path.realpath(url):
        rel = os.path.relpath(os.path.realpath(url), os.path.realpath(top))
        return WorkspaceError(f"{url} is a directory inside the git repository {top}, not the repository itself: "
                              f'give url {top} and path "{rel}"')
    return WorkspaceError(f"{url} is not a git repository (no .git in it): give the directory of a git "
                          "checkout, or a git URL")


def _fetches(mirror: Path) -> tuple[int, int]:
    """(fetches begun, the last one completed) in the mirror's counter file; (0, 0) without one."""
    try:
        begun, done = (int(n) for n in mirror.with_suffix(".fetches").read_text().split())
    except (OSError, ValueError):
        return 0, 0
    return begun, done


def _record_fetches(mirror: Path, begun: int, done: int) -> None:
    path = mirror.with_suffix(".fetches")
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{begun} {done}\n")
    os.replace(tmp, path)  # read without the lock: whole or not at all


def _resolve(mirror: Path, git: GitSource, deadline: float | None, *, missing_ok: bool = False) -> str | None:
    found = _run(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{git.ref}^{{commit}}"], cwd=mirror,
                 timeout=_left(deadline))
    if found.returncode != 0 or not found.stdout.strip():
        if missing_ok:
            return None
        raise WorkspaceError(f'ref "{git.ref}" not found in {git.url} (not a branch, tag or commit there)')
    return found.stdout.strip()


def _check_path(checkout: Checkout, git: GitSource) -> None:
    real_root = checkout.root.resolve()
    if not checkout.path.resolve().is_relative_to(real_root):
        raise WorkspaceError(f'path "{git.path}" in {git.url} at {git.ref} leads outside the repository')
    if not checkout.path.is_dir():
        raise WorkspaceError(f'path "{git.path}" is not a directory in {git.url} at {git.ref}')


def _ensure_identity(checkout: Checkout, deadline: float | None) -> None:
    found = _run(["config", "--get-regexp", r"^user\.(name|email)$"], cwd=checkout.root, timeout=_left(deadline))
    present = {key for key, _, value in (line.partition(" ") for line in found.stdout.splitlines()) if value.strip()}
    missing = [key for key in ("user.name", "user.email") if key not in present]
    for key in missing:  # in the run's own repository's config
        value = IDENTITY[0] if key == "user.name" else IDENTITY[1]
        _git("config", key, value, cwd=checkout.root, deadline=deadline, what="could not set a git identity")


def copy_identity(root: Path, config: Path) -> None:
    """Write the ``user.name`` and ``user.email`` git uses in ``root`` into the git config file
    ``config`` (a sandboxed agent's ``~/.gitconfig``): nothing else of this user's configuration."""
    for key in ("user.name", "user.email"):
        value = _run(["config", "--get", key], cwd=root, timeout=None).stdout.strip()
        if value:
            _git("config", "--file", str(config), key, value, cwd=root, what="could not set a git identity")


# --- running git ----------------------------------------------------------------------------------


def _command(args: list[str]) -> list[str]:
    command = ["git"]
    for option in _CONFIG:
        command += ["-c", option]
    return command + args


def _run(args: list[str], *, cwd: Path, timeout: float | None,
         env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # git in its own process group: at the deadline the whole group goes, including the ssh or
    # https helper a clone or fetch started (killing git alone would orphan it).
    if not cwd.is_dir():
        raise WorkspaceError(f"cannot run git {args[0]}: the directory {cwd} does not exist")
    try:
        proc = subprocess.Popen(_command(args), cwd=cwd, env={**clean_env(os.environ), **(env or {})},
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except FileNotFoundError:
        raise WorkspaceError("git is not installed (not found on PATH)") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise WorkspaceError(f"git {args[0]} did not finish before the run's deadline") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


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
    """git's reason: its first ``fatal:``/``error:`` line (later lines often only add advice such as
    "Please make sure you have the correct access rights and the repository exists."), else its last."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("fatal: ", "error: ")):
            return line.removeprefix("fatal: ").removeprefix("error: ")
    return lines[-1] if lines else ""


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
