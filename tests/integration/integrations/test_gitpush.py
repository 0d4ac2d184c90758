"""``push_patch`` against a real bare repository: one deterministic commit, force-pushed, and errors
that say what went wrong."""

from __future__ import annotations

import base64
import ssl
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from joch.integrations.base import TrackerError
from joch.integrations.gitpush import push_patch

DATE = "2026-11-28T09:00:00Z"


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def remote(tmp_path: Path) -> tuple[Path, str]:
    """A bare repository with one commit on main (README, a binary file); its path and the commit."""
    seed = tmp_path / "seed"
    seed.mkdir()
    git("init", "-q", "-b", "main", cwd=seed)
    (seed / "README.md").write_text("hello\n")
    (seed / "app.py").write_text("print('v1')\n")
    (seed / "logo.bin").write_bytes(bytes(range(256)))
    git("add", "-A", cwd=seed)
    git("-c", "user.name=Seed", "-c", "user.email=seed@example.com", "commit", "-qm", "initial", cwd=seed)
    bare = tmp_path / "remote.git"
    git("clone", "-q", "--bare", str(seed), str(bare), cwd=tmp_path)
    return bare, git("rev-parse", "HEAD", cwd=seed)


def make_patch(bare: Path, tmp_path: Path, edit: dict[str, bytes | None]) -> bytes:
    """The patch a run's worktree would give: ``edit`` (path → new content, None to delete) on main."""
    work = tmp_path / f"work-{len(list(tmp_path.iterdir()))}"
    git("clone", "-q", str(bare), str(work), cwd=tmp_path)
    for path, content in edit.items():
        if content is None:
            (work / path).unlink()
        else:
            (work / path).parent.mkdir(parents=True, exist_ok=True)
            (work / path).write_bytes(content)
    git("add", "-A", cwd=work)
    return subprocess.run(["git", "diff", "--cached", "--binary"], cwd=work, check=True, capture_output=True).stdout


def push(bare: Path, base: str, patch: bytes, workdir: Path, *, branch: str = "joch/run-1") -> str:
    return push_patch(git_url=str(bare), base_commit=base, fetch_ref="main", patch=patch, branch=branch,
                      message="Fix the greeting\n\nRun run-1 of agent demo.", author_name="Joch",
                      author_email="joch@example.com", date=DATE, token=None, workdir=workdir)


def test_a_patch_becomes_one_commit_on_the_branch(remote: tuple[Path, str], tmp_path: Path) -> None:
    bare, base = remote
    patch = make_patch(bare, tmp_path, {"app.py": b"print('v2')\n", "docs/new.md": b"new\n", "logo.bin": None,
                                        "data.bin": bytes(range(255, -1, -1))})
    sha = push(bare, base, patch, tmp_path / "cache")
    assert git("rev-parse", "refs/heads/joch/run-1", cwd=bare) == sha
    assert git("rev-parse", f"{sha}^", cwd=bare) == base
    assert git("show", f"{sha}:app.py", cwd=bare) == "print('v2')"
    assert git("show", f"{sha}:docs/new.md", cwd=bare) == "new"
    assert subprocess.run(["git", "cat-file", "-p", f"{sha}:data.bin"], cwd=bare, capture_output=True,
                          check=True).stdout == bytes(range(255, -1, -1))
    assert "logo.bin" not in git("ls-tree", "--name-only", sha, cwd=bare).split()
    log = git("log", "-1", "--format=%an <%ae>|%cn|%aI|%cI|%s", sha, cwd=bare)
    assert log == "Joch <joch@example.com>|Joch|2026-11-28T09:00:00+00:00|2026-11-28T09:00:00+00:00|Fix the greeting"
    assert git("rev-parse", "refs/heads/main", cwd=bare) == base  # main untouched


def test_a_retry_makes_the_same_commit_even_from_a_fresh_cache(remote: tuple[Path, str], tmp_path: Path) -> None:
    bare, base = remote
    patch = make_patch(bare, tmp_path, {"app.py": b"print('v2')\n"})
    first = push(bare, base, patch, tmp_path / "cache")
    assert push(bare, base, patch, tmp_path / "cache") == first
    assert push(bare, base, patch, tmp_path / "other-cache") == first
    assert git("rev-parse", "refs/heads/joch/run-1", cwd=bare) == first


def test_the_branch_is_force_pushed_over_an_older_attempt(remote: tuple[Path, str], tmp_path: Path) -> None:
    bare, base = remote
    older = push(bare, base, make_patch(bare, tmp_path, {"app.py": b"print('old')\n"}), tmp_path / "cache")
    newer = push(bare, base, make_patch(bare, tmp_path, {"app.py": b"print('new')\n"}), tmp_path / "cache")
    assert older != newer and git("rev-parse", "refs/heads/joch/run-1", cwd=bare) == newer


def test_a_base_behind_the_ref_is_fetched_by_its_sha(remote: tuple[Path, str], tmp_path: Path) -> None:
    bare, base = remote
    patch = make_patch(bare, tmp_path, {"app.py": b"print('v2')\n"})
    # main moves on after the run started: the base is no longer the ref's tip
    moved = tmp_path / "mover"
    git("clone", "-q", str(bare), str(moved), cwd=tmp_path)
    (moved / "README.md").write_text("hello again\n")
    git("-c", "user.name=M", "-c", "user.email=m@example.com", "commit", "-qam", "more", cwd=moved)
    git("push", "-q", "origin", "main", cwd=moved)
    sha = push(bare, base, patch, tmp_path / "cache")
    assert git("rev-parse", f"{sha}^", cwd=bare) == base


def test_a_patch_that_does_not_apply_says_so(remote: tuple[Path, str], tmp_path: Path) -> None:
    bare, base = remote
    patch = make_patch(bare, tmp_path, {"app.py": b"print('v2')\n"}).replace(b"-print('v1')", b"-print('v0')")
    with pytest.raises(TrackerError) as caught:
        push(bare, base, patch, tmp_path / "cache")
    assert caught.value.reason == "PatchDoesNotApply" and not caught.value.retryable
    assert base[:12] in caught.value.message and "app.py" in caught.value.message
    assert "refs/heads/joch/run-1" not in git("for-each-ref", cwd=bare)


def test_a_missing_base_commit_or_repository_is_a_push_failure(remote: tuple[Path, str], tmp_path: Path) -> None:
    bare, base = remote
    patch = make_patch(bare, tmp_path, {"app.py": b"print('v2')\n"})
    with pytest.raises(TrackerError) as caught:
        push(bare, "0" * 40, patch, tmp_path / "cache")
    assert caught.value.reason == "PushFailed" and "0" * 40 in caught.value.message
    with pytest.raises(TrackerError) as caught:
        push(tmp_path / "nowhere.git", base, patch, tmp_path / "cache2")
    assert caught.value.reason == "PushFailed" and not caught.value.retryable


def test_an_empty_patch_or_a_bad_branch_is_refused(remote: tuple[Path, str], tmp_path: Path) -> None:
    bare, base = remote
    with pytest.raises(TrackerError) as caught:
        push(bare, base, b"", tmp_path / "cache")
    assert caught.value.reason == "Invalid"
    patch = make_patch(bare, tmp_path, {"app.py": b"print('v2')\n"})
    with pytest.raises(TrackerError) as caught:
        push(bare, base, patch, tmp_path / "cache", branch="joch/bad..name")
    assert caught.value.reason == "Invalid" and "bad..name" in caught.value.message


def test_a_token_never_shows_in_a_failure(remote: tuple[Path, str], tmp_path: Path) -> None:
    _, base = remote
    token = "ghs_supersecrettoken123"
    with pytest.raises(TrackerError) as caught:
        push_patch(git_url="https://127.0.0.1:9/acme/web.git", base_commit=base, fetch_ref="main",
                   patch=b"diff --git a/x b/x\n", branch="joch/run-1", message="m", author_name="J",
                   author_email="j@example.com", date=DATE, token=token, workdir=tmp_path / "cache")
    assert caught.value.reason == "PushFailed" and caught.value.retryable
    assert token not in caught.value.message and "127.0.0.1:9" in caught.value.message


@pytest.fixture
def https_git(tmp_path: Path) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An https server on 127.0.0.1 (self-signed) that refuses every git request with 401, recording
    the headers each came with."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=1)).sign(key, hashes.SHA256()))
    pem = tmp_path / "tls.pem"
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()) + cert.public_bytes(serialization.Encoding.PEM))
    seen: list[dict[str, str]] = []

    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="GitHub"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/acme/web.git", seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_token_reaches_an_https_remote_as_a_header(https_git: tuple[str, list[dict[str, str]]],
                                                       remote: tuple[Path, str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    url, seen = https_git
    _, base = remote
    monkeypatch.setenv("GIT_SSL_NO_VERIFY", "1")  # the operator's environment reaches git
    token = "ghs_supersecrettoken123"
    with pytest.raises(TrackerError) as caught:
        push_patch(git_url=url, base_commit=base, fetch_ref="main", patch=b"diff --git a/x b/x\n",
                   branch="joch/run-1", message="m", author_name="J", author_email="j@example.com", date=DATE,
                   token=token, workdir=tmp_path / "cache")
    assert caught.value.reason == "PushFailed" and not caught.value.retryable  # refused credentials
    expected = "Basic " + base64.b64encode(f"x-access-token:{token}".encode()).decode()
    assert seen and all(h.get("authorization") == expected for h in seen)
    assert token not in caught.value.message and expected not in caught.value.message
