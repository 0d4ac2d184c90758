"""Pushing a run's patch as a branch: ``push_patch`` makes ONE commit (the base commit plus the patch)
and force-pushes it to ``refs/heads/<branch>``.

* **Deterministic.** The commit is built with plumbing (``read-tree``, ``apply --cached``,
  ``write-tree``, ``commit-tree``) from fixed inputs — base, patch, message, author, and the
  author and committer date both set to ``date`` — so a retry after a crash makes the very same
  commit, and the force push of the same sha changes nothing.
* **Private.** The work happens in ``workdir``, a bare repository used as an object cache, with an
  index file of its own per call; the run's worktree is never touched. Only what is needed is
  fetched: the base ref at depth 1, else the base commit itself.
* **Credentials.** A token goes to git for ``https`` URLs only, as an ``Authorization`` header in
  ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/``GIT_CONFIG_VALUE_n`` scoped to the URL's origin: never
  in argv (visible in ``ps``) or in the URL (kept in logs and reflogs). Messages are scrubbed of it.
* **Errors** are ``TrackerError``: ``PatchDoesNotApply`` (not retryable: the base moved or the patch
  is broken) and ``PushFailed`` (retryable unless git says the credentials or the repository are
  wrong), each ending with the last lines git wrote.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from joch.integrations.base import TrackerError

GIT_TIMEOUT = 600.0
_OURS = frozenset({
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL",
    "GIT_AUTHOR_DATE", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE", "GIT_CONFIG_PARAMETERS",
})
_TAIL_LINES = 6
_PERMANENT = ("authentication failed", "could not read username", "permission denied", "403",
              "repository not found", "does not appear to be a git repository", "not found")


def _git_date(date: str) -> str:
    """``date`` (RFC 3339) in git's own ``<epoch> +0000`` form; given as it is when it does not parse."""
    try:
        parsed = datetime.fromisoformat(date.replace("Z", "+00:00"))
    except ValueError:
        return date
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return f"{int(parsed.timestamp())} +0000"


def _shown_url(url: str) -> str:
    """``url`` without any user or password in it."""
    parts = urlsplit(url)
    if parts.scheme and "@" in parts.netloc:
        return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return url


class _Git:
    def __init__(self, workdir: Path, git_url: str, token: str | None) -> None:
        self.workdir = workdir
        self.url = git_url
        self.token = token
        # Where git looks for the repository and who it commits as are ours to say; the rest of the
        # environment (GIT_SSL_CAINFO for an Enterprise Server's CA, GIT_SSH_COMMAND) is the operator's.
        env = {k: v for k, v in os.environ.items() if k not in _OURS and not k.startswith("GIT_CONFIG_")}
        env.update(GIT_TERMINAL_PROMPT="0", GIT_DIR=str(workdir), LC_ALL="C")
        parts = urlsplit(git_url)
        if token and parts.scheme == "https":
            origin = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], "/", "", ""))
            basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
            env.update(GIT_CONFIG_COUNT="2", GIT_CONFIG_KEY_0=f"http.{origin}.extraHeader",
                       GIT_CONFIG_VALUE_0=f"Authorization: Basic {basic}",
                       GIT_CONFIG_KEY_1="credential.helper", GIT_CONFIG_VALUE_1="")
        self.env = env

    def scrub(self, text: str) -> str:
        if self.token:
            text = text.replace(self.token, "***")
            text = text.replace(base64.b64encode(f"x-access-token:{self.token}".encode()).decode(), "***")
        return text.replace(self.url, _shown_url(self.url))

    def tail(self, stderr: str) -> str:
        lines = [line for line in self.scrub(stderr).strip().splitlines() if line.strip()]
        return "\n".join(lines[-_TAIL_LINES:]) or "(git wrote nothing)"

    def run(self, *args: str, stdin: bytes | None = None, env: Mapping[str, str] | None = None,
            timeout: float = GIT_TIMEOUT) -> subprocess.CompletedProcess[bytes]:
        binary = shutil.which("git")
        if binary is None:
            raise TrackerError("PushFailed", "git is not installed on the server (not found on PATH)")
        try:
            return subprocess.run([binary, *args], input=stdin, capture_output=True, check=False, timeout=timeout,
                                  env={**self.env, **(env or {})}, cwd=self.workdir)
        except subprocess.TimeoutExpired as exc:
            raise TrackerError("PushFailed", f"git {args[0]} for {_shown_url(self.url)} did not finish in "
                               f"{timeout:.0f} s", retryable=True) from exc
        except OSError as exc:
            raise TrackerError("PushFailed", f"git could not be run: {exc}") from exc

    def has_commit(self, sha: str) -> bool:
        return self.run("cat-file", "-e", f"{sha}^{{commit}}").returncode == 0

    def failed(self, what: str, done: subprocess.CompletedProcess[bytes]) -> TrackerError:
        stderr = done.stderr.decode(errors="replace")
        permanent = any(p in stderr.lower() for p in _PERMANENT)
        return TrackerError("PushFailed", f"{what}: {self.tail(stderr)}", retryable=not permanent)


def push_patch(*, git_url: str, base_commit: str, fetch_ref: str, patch: bytes, branch: str, message: str,
               author_name: str, author_email: str, date: str, token: str | None, workdir: Path) -> str:
    """Commit ``patch`` on ``base_commit`` (from ``git_url``, fetched by ``fetch_ref`` or by itself) as
    ``author`` at ``date``, force-push it to ``refs/heads/<branch>`` of ``git_url``, and return the
    commit's sha. The same arguments make the same commit."""
    if not patch.strip():
        raise TrackerError("Invalid", f"the patch for branch {branch} is empty: there is nothing to push")
    workdir.mkdir(parents=True, exist_ok=True)
    git = _Git(workdir, git_url, token)
    shown = _shown_url(git_url)
    if not (workdir / "HEAD").exists():
        done = git.run("init", "--bare", "--quiet", str(workdir))
        if done.returncode != 0:
            raise git.failed(f"could not prepare {workdir} for pushing", done)
    if git.run("check-ref-format", f"refs/heads/{branch}").returncode != 0:
        raise TrackerError("Invalid", f'"{branch}" is not a valid branch name: check the writeBack branchPrefix')

    if not git.has_commit(base_commit):
        fetched = git.run("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--depth=1", git_url, fetch_ref)
        if not git.has_commit(base_commit):
            by_sha = git.run("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--depth=1", git_url,
                             base_commit)
            if not git.has_commit(base_commit):
                failure = by_sha if by_sha.returncode != 0 else fetched
                raise git.failed(f"could not fetch the base commit {base_commit} from {shown} (tried {fetch_ref}, "
                                 "then the commit itself)", failure)

    index = workdir / f"joch-index-{uuid.uuid4().hex}"
    indexed = {"GIT_INDEX_FILE": str(index)}
    try:
        done = git.run("read-tree", base_commit, env=indexed)
        if done.returncode != 0:
            raise git.failed(f"could not read the tree of {base_commit}", done)
        done = git.run("apply", "--cached", "--whitespace=nowarn", "-", stdin=patch, env=indexed)
        if done.returncode != 0:
            raise TrackerError("PatchDoesNotApply", f"the run's patch does not apply to {base_commit[:12]} of "
                               f"{shown}: {git.tail(done.stderr.decode(errors='replace'))}")
        done = git.run("write-tree", env=indexed)
        if done.returncode != 0:
            raise git.failed("could not write the patched tree", done)
        tree = done.stdout.decode().strip()
    finally:
        index.unlink(missing_ok=True)

    when = _git_date(date)
    who = {"GIT_AUTHOR_NAME": author_name, "GIT_AUTHOR_EMAIL": author_email, "GIT_AUTHOR_DATE": when,
           "GIT_COMMITTER_NAME": author_name, "GIT_COMMITTER_EMAIL": author_email, "GIT_COMMITTER_DATE": when}
    text = message if message.endswith("\n") else message + "\n"
    done = git.run("commit-tree", "--no-gpg-sign", tree, "-p", base_commit, "-F", "-", stdin=text.encode(), env=who)
    if done.returncode != 0:
        raise git.failed("could not make the commit", done)
    sha = done.stdout.decode().strip()

    done = git.run("push", "--quiet", "--force", "--no-verify", git_url, f"{sha}:refs/heads/{branch}")
    if done.returncode != 0:
        raise git.failed(f"git push of {sha[:12]} to branch {branch} of {shown} failed", done)
    return sha


__all__ = ["push_patch"]
