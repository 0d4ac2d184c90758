"""Mirrors and worktrees against real git repositories (local paths and file:// URLs)."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from integration.runtime.helpers import Repo, git, git_source
from joch.runtime import workspace
from joch.runtime.base import GitSource


def prepare(tmp_path: Path, source: GitSource, name: str = "ws") -> workspace.Checkout:
    return workspace.prepare(cache=tmp_path / "mirrors", git=source, root=tmp_path / name)


def head(path: Path) -> str:
    return git(path, "rev-parse", "HEAD")


def test_the_mirror_is_cloned_once_then_fetched(tmp_path: Path, repo: Repo) -> None:
    first = prepare(tmp_path, git_source(repo), "one")
    mirror = workspace.mirror_path(tmp_path / "mirrors", repo.url)
    assert first.mirror == mirror and (mirror / "HEAD").is_file()
    inode = mirror.stat().st_ino

    new = repo.commit({"NEW.md": "new\n"}, "third")
    second = prepare(tmp_path, git_source(repo), "two")

    assert mirror.stat().st_ino == inode  # reused, not cloned again
    assert second.base == new and head(second.root) == new
    assert (second.root / "NEW.md").exists() and not (first.root / "NEW.md").exists()
    assert sorted(p.name for p in (tmp_path / "mirrors").iterdir() if p.suffix == ".git") == [mirror.name]


@pytest.mark.parametrize("ref", ["main", "feature", "v1", "sha", "short-sha", "refs/heads/feature"])
def test_a_worktree_at_a_branch_tag_or_commit(tmp_path: Path, repo: Repo, ref: str) -> None:
    expected = {
        "main": repo.git("rev-parse", "main"), "feature": repo.git("rev-parse", "feature"),
        "v1": repo.git("rev-parse", "v1^{commit}"), "refs/heads/feature": repo.git("rev-parse", "feature"),
    }
    sha = repo.git("rev-parse", "feature")
    wanted = {"sha": sha, "short-sha": sha[:8]}.get(ref, ref)
    checkout = prepare(tmp_path, git_source(repo, wanted))
    assert checkout.base == expected.get(ref, sha)
    assert head(checkout.root) == checkout.base
    assert git(checkout.root, "rev-parse", "--abbrev-ref", "HEAD") == "HEAD"  # detached
    assert (checkout.root / "feature.txt").exists() == (ref in ("feature", "sha", "short-sha", "refs/heads/feature"))


def test_file_urls_and_sub_paths(tmp_path: Path, repo: Repo) -> None:
    checkout = prepare(tmp_path, GitSource(url=repo.path.as_uri(), ref="HEAD", path="docs/guide/"))
    assert checkout.path == checkout.root / "docs/guide"
    assert (checkout.path / "intro.md").read_text() == "intro\n"


def test_a_ref_that_does_not_exist_is_named(tmp_path: Path, repo: Repo) -> None:
    with pytest.raises(workspace.WorkspaceError) as caught:
        prepare(tmp_path, git_source(repo, "no-such-branch"))
    assert str(caught.value) == f'ref "no-such-branch" not found in {repo.url} (not a branch, tag or commit there)'
    assert not (tmp_path / "ws").exists()


def test_a_repository_that_does_not_exist_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(workspace.WorkspaceError, match=f"could not clone {missing}: "):
        prepare(tmp_path, GitSource(url=str(missing)))
    assert list((tmp_path / "mirrors").glob("*.git*")) == []  # no half-made mirror left behind


def test_a_directory_that_is_not_a_repository_is_named_as_such(tmp_path: Path, repo: Repo) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(workspace.WorkspaceError) as caught:
        prepare(tmp_path, GitSource(url=str(plain)))
    assert str(caught.value) == (f"{plain} is not a git repository (no .git in it): give the directory of a git "
                                 "checkout, or a git URL")
    inside = Path(repo.url) / "docs"
    inside.mkdir(exist_ok=True)
    with pytest.raises(workspace.WorkspaceError) as caught:
        prepare(tmp_path, GitSource(url=str(inside)), name="ws2")
    assert str(caught.value).startswith(f"{inside} is a directory inside the git repository ")
    assert str(caught.value).endswith('and path "docs"')


@pytest.mark.parametrize("path", ["..", "../other", "/etc", "docs/../../x"])
def test_paths_may_not_leave_the_worktree(tmp_path: Path, repo: Repo, path: str) -> None:
    with pytest.raises(workspace.WorkspaceError, match="must be relative and stay inside the workspace"):
        prepare(tmp_path, git_source(repo, path=path))


def test_a_path_missing_at_the_ref_or_a_symlink_out_is_rejected(tmp_path: Path, repo: Repo) -> None:
    repo.git("rm", "-r", "--quiet", "docs")
    repo.git("commit", "--quiet", "-m", "no docs")
    with pytest.raises(workspace.WorkspaceError, match=r'path "docs/guide" is not a directory in .* at main'):
        prepare(tmp_path, git_source(repo, "main", "docs/guide"), "a")
    assert not (tmp_path / "a").exists()  # a failed checkout removes its worktree

    (repo.path / "out").symlink_to(tmp_path)
    repo.git("add", "out")
    repo.git("commit", "--quiet", "-m", "a link out")
    with pytest.raises(workspace.WorkspaceError, match="leads outside the repository"):
        prepare(tmp_path, git_source(repo, "main", "out"), "b")


def test_remove_deletes_the_worktree_and_prunes_it(tmp_path: Path, repo: Repo) -> None:
    source = git_source(repo)
    checkout = prepare(tmp_path, source)
    (checkout.root / "untracked.txt").write_text("x")
    workspace.remove(cache=tmp_path / "mirrors", git=source, root=checkout.root)
    assert not checkout.root.exists()
    listed = git(workspace.mirror_path(tmp_path / "mirrors", repo.url), "worktree", "list", "--porcelain")
    assert str(checkout.root) not in listed
    workspace.remove(cache=tmp_path / "mirrors", git=source, root=checkout.root)  # again: nothing to do


def test_without_a_repository_the_workspace_is_an_empty_directory(tmp_path: Path) -> None:
    checkout = workspace.prepare(cache=tmp_path / "mirrors", git=None, root=tmp_path / "ws")
    assert checkout.root == checkout.path == tmp_path / "ws" and list(checkout.root.iterdir()) == []
    assert checkout.base is None and not (tmp_path / "mirrors").exists()


def test_an_identity_is_configured_when_git_has_none(tmp_path: Path, repo: Repo,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))  # ignored: we name the repository ourselves
    checkout = prepare(tmp_path, git_source(repo))
    monkeypatch.delenv("GIT_DIR")
    (checkout.root / "x.txt").write_text("x")
    subprocess.run(["git", "add", "x.txt"], cwd=checkout.root, check=True)
    subprocess.run(["git", "commit", "-qm", "agent"], cwd=checkout.root, check=True)  # no "who are you?"
    who = subprocess.run(["git", "log", "-1", "--format=%cn <%ce>"], cwd=checkout.root, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert who == "Joch agent <agent@joch.dev>" == "{} <{}>".format(*workspace.IDENTITY)


def test_concurrent_runs_share_one_mirror_safely(tmp_path: Path, repo: Repo) -> None:
    results: list[workspace.Checkout | Exception] = []

    def one(i: int) -> None:
        try:
            results.append(prepare(tmp_path, git_source(repo), f"ws-{i}"))
        except workspace.WorkspaceError as exc:
            results.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, workspace.Checkout) for r in results), results
    assert len({r.root for r in results if isinstance(r, workspace.Checkout)}) == 4


def test_write_changes_snapshots_without_touching_the_agents_index(tmp_path: Path, repo: Repo) -> None:
    checkout = prepare(tmp_path, git_source(repo))
    assert checkout.base is not None
    (checkout.root / "README.md").write_text("# Demo\nchanged\n")
    (checkout.root / "new.txt").write_text("new\n")
    before = subprocess.run(["git", "status", "--porcelain"], cwd=checkout.root, capture_output=True, text=True).stdout
    patch = tmp_path / "changes.patch"
    workspace.write_changes(checkout.root, checkout.base, patch)
    after = subprocess.run(["git", "status", "--porcelain"], cwd=checkout.root, capture_output=True, text=True)
    assert after.stdout == before == " M README.md\n?? new.txt\n"
    text = patch.read_text()
    assert "+changed" in text and "+++ b/new.txt" in text


def test_git_transports_are_an_explicit_allow_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A user configuration that enables ext:: and rewrites an https URL to it: git's defaults would
    # run the command; the runner's allow-list does not.
    home, marker = tmp_path / "home", tmp_path / "pwned"
    home.mkdir()
    (home / ".gitconfig").write_text(f'[protocol "ext"]\n\tallow = always\n'
                                     f'[url "ext::sh -c touch% {marker}% >&2% #"]\n\tinsteadOf = https://evil.invalid/\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    with pytest.raises(workspace.WorkspaceError, match=r"could not clone https://evil\.invalid/repo\.git"):
        prepare(tmp_path, GitSource(url="https://evil.invalid/repo.git"))
    assert not marker.exists()
    assert workspace.clean_env({})["GIT_ALLOW_PROTOCOL"] == "file:git:http:https:ssh"


@pytest.mark.parametrize(("url", "message"), [
    ("ext::sh -c touch% /tmp/x", "names a git transport helper"),
    ("relative/repo", "is neither a URL nor an absolute path"),
    ("-uhelp", 'cannot start with "-"'),
])
def test_repository_addresses_git_must_not_be_given(tmp_path: Path, url: str, message: str) -> None:
    with pytest.raises(workspace.WorkspaceError, match=message):
        prepare(tmp_path, GitSource(url=url))
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("url", ["github.invalid:org/repo.git", "git@github.com:o/r.git", "host:repo"])
def test_scp_style_urls_are_read_as_git_reads_them(url: str) -> None:
    assert workspace.scp_like(url) and workspace.url_problem(url) is None
