"""How runs share a mirror: fetches skipped or shared when that changes nothing, checkouts added and
removed side by side, nothing left behind in git's records."""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
from pathlib import Path

import pytest

from integration.runtime.helpers import Repo, git, git_source
from joch.runtime import workspace
from joch.runtime.base import GitSource


def prepare(tmp_path: Path, source: GitSource, name: str) -> workspace.Checkout:
    return workspace.prepare(cache=tmp_path / "mirrors", git=source, root=tmp_path / name)


def fetches(tmp_path: Path, repo: Repo) -> int:
    counter = workspace.mirror_path(tmp_path / "mirrors", repo.url).with_suffix(".fetches")
    return int(counter.read_text().split()[0])


def test_a_full_sha_already_fetched_is_checked_out_without_a_fetch(tmp_path: Path, repo: Repo,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    sha = repo.git("rev-parse", "feature")
    prepare(tmp_path, git_source(repo), "first")
    before = fetches(tmp_path, repo)
    checkout = prepare(tmp_path, git_source(repo, sha), "pinned")
    assert checkout.base == sha and (checkout.root / "feature.txt").exists()
    assert fetches(tmp_path, repo) == before

    # An abbreviated sha or a branch may name something else upstream by now: those fetch.
    prepare(tmp_path, git_source(repo, sha[:10]), "short")
    assert fetches(tmp_path, repo) == before + 1
    assert "failed" not in capsys.readouterr().err


def test_a_full_sha_the_mirror_lacks_is_fetched(tmp_path: Path, repo: Repo) -> None:
    prepare(tmp_path, git_source(repo), "first")
    new = repo.commit({"later.txt": "later\n"}, "later")
    checkout = prepare(tmp_path, git_source(repo, new), "pinned")
    assert checkout.base == new and (checkout.root / "later.txt").exists()


def test_runs_waiting_together_share_one_fetch_made_after_they_asked(tmp_path: Path, repo: Repo,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    prepare(tmp_path, git_source(repo), "first")
    before = fetches(tmp_path, repo)
    mirror = workspace.mirror_path(tmp_path / "mirrors", repo.url)
    asked = threading.Semaphore(0)
    counted = workspace._fetches

    def counting(path: Path) -> tuple[int, int]:
        asked.release()
        return counted(path)

    monkeypatch.setattr(workspace, "_fetches", counting)
    results: dict[str, workspace.Checkout] = {}
    lock = os.open(mirror.with_suffix(".lock"), os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a fetch in progress: both runs ask while it holds the mirror
    try:
        threads = [threading.Thread(target=lambda n=n: results.update({n: prepare(tmp_path, git_source(repo), n)}))
                   for n in ("a", "b")]
        for t in threads:
            t.start()
        for _ in threads:
            assert asked.acquire(timeout=10)  # both have noted the fetches begun, and wait for the lock
        new = repo.commit({"NEW.md": "new\n"}, "while they waited")
    finally:
        os.close(lock)
    for t in threads:
        t.join()
    assert results["a"].base == results["b"].base == new  # both see what was pushed while they waited
    assert fetches(tmp_path, repo) == before + 1  # the second one used the first one's fetch

    prepare(tmp_path, git_source(repo), "later")  # one that asks afterwards fetches again
    assert fetches(tmp_path, repo) == before + 2


def test_removed_worktrees_leave_nothing_in_gits_records(tmp_path: Path, repo: Repo) -> None:
    source = git_source(repo)
    cache = tmp_path / "mirrors"
    mirror = workspace.mirror_path(cache, repo.url)
    checkouts = [prepare(tmp_path, source, f"ws-{i}") for i in range(3)]
    threads = [threading.Thread(target=workspace.remove, kwargs={"cache": cache, "git": source, "root": c.root})
               for c in checkouts[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    vanished = checkouts[2].root
    for path in sorted(vanished.rglob("*"), reverse=True):  # deleted behind git's back
        path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
    vanished.rmdir()
    workspace.remove(cache=cache, git=source, root=vanished)
    listed = git(mirror, "worktree", "list", "--porcelain")
    assert listed.count("worktree ") == 1 and not any(c.root.exists() for c in checkouts)
    assert not (mirror / "worktrees").exists() or list((mirror / "worktrees").iterdir()) == []


def test_a_runs_commits_go_to_its_own_repository_not_the_mirror(tmp_path: Path, repo: Repo) -> None:
    cache = tmp_path / "mirrors"
    mirror = workspace.mirror_path(cache, repo.url)
    checkout = prepare(tmp_path, git_source(repo), "ws")
    assert checkout.git_dir == checkout.root / ".git" and checkout.git_dir.is_dir()
    assert git(checkout.root, "rev-parse", "HEAD") == checkout.base
    assert git(checkout.root, "rev-parse", "--abbrev-ref", "HEAD") == "HEAD"  # detached, as before
    (checkout.root / "README.md").write_text("committed\n")
    git(checkout.root, "commit", "--quiet", "-am", "agent work")
    (checkout.root / "untracked.txt").write_text("new\n")
    commit = git(checkout.root, "rev-parse", "HEAD")
    assert subprocess.run(["git", "--git-dir", str(mirror), "cat-file", "-e", commit], check=False).returncode != 0
    patch = tmp_path / "changes.patch"
    workspace.write_changes(checkout.root, str(checkout.base), patch, git_dir=checkout.git_dir,
                            common_dir=checkout.mirror)
    assert "+committed" in patch.read_text() and "+new" in patch.read_text()
    # An attempt continuing there finds it by the mirror its repository borrows from.
    assert workspace.reuse(cache=cache, git=git_source(repo), root=checkout.root, base=checkout.base) == checkout
    other = prepare(tmp_path, git_source(repo, "feature"), "elsewhere")
    with pytest.raises(workspace.WorkspaceError, match="is not a checkout of"):
        workspace.reuse(cache=tmp_path / "other-cache", git=git_source(repo), root=other.root, base=other.base)
    workspace.remove(cache=cache, git=git_source(repo), root=checkout.root)
    assert not checkout.root.exists() and (mirror / "HEAD").is_file()
