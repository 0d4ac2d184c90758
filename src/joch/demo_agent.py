"""``joch-demo-agent``: a coding agent without a model, for the quickstart and the tests.

It does what an agent does, visibly and deterministically: reads the implementation request,
edits one file in the current directory (the run's worktree), commits, and writes a summary.
From the request it takes the target file (the first file name it mentions that exists here, else
the first one that looks like a source or text file, else ``README.md``) and the line to add (the
first double-quoted phrase, else the request's first line), and appends that line to the file.

Standard library only: it must start anywhere joch is installed.
"""

from __future__ import annotations

import argparse
import posixpath
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from joch import __version__

AUTHOR = "Joch demo agent <demo-agent@joch.dev>"
DEFAULT_TARGET = "README.md"
TEXT_SUFFIXES = frozenset({
    "md", "txt", "rst", "adoc", "py", "js", "ts", "go", "rs", "java", "c", "h", "cpp", "rb", "sh", "toml", "yaml",
    "yml", "json", "cfg", "ini", "html", "css",
})
_FILE_NAME = re.compile(r"(?<![\w/.-])(?:[\w-]+/)*[\w-]+(?:\.[\w-]+)*\.([A-Za-z0-9]+)\b")
_QUOTED = re.compile(r'"([^"\n]+)"|\u201c([^\u201d\n]+)\u201d')


class AgentError(Exception):
    """Something the person running the demo can fix; printed without a traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="joch-demo-agent",
        description="Append the line the implementation request asks for to a file, commit it, and write a summary.",
    )
    parser.add_argument("--implementation", required=True, metavar="FILE", help="the implementation request (text)")
    parser.add_argument("--summary", required=True, metavar="FILE", help="where to write summary.md")
    parser.add_argument("--version", action="version", version=f"joch-demo-agent {__version__}",
                        help="print the version (what the runner records of every run) and exit")
    args = parser.parse_args(argv)
    try:
        run(Path(args.implementation), Path(args.summary))
    except AgentError as exc:
        print(f"joch-demo-agent: error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def run(implementation: Path, summary: Path) -> None:
    say(f"reading the implementation request from {implementation}")
    try:
        text = implementation.read_text(encoding="utf-8")
    except OSError as exc:
        raise AgentError(f"cannot read the implementation request {implementation}: {exc.strerror or exc}") from None
    if not text.strip():
        raise AgentError(f"the implementation request {implementation} is empty")
    top = git("rev-parse", "--show-toplevel", error="not in a git repository (run me inside a checkout)").strip()
    target = choose_target(text, Path.cwd(), exclude=summary.name)
    line = choose_line(text)
    say(f'appending "{line}" to {target}')
    append_line(Path(target), line)
    git("add", "--", target, error=f"could not stage {target}")
    subject = f'Add "{line}" to {target}'
    git(*identity(), "commit", "--quiet", f"--author={AUTHOR}", "-m", subject, "-m", "Requested by:\n\n" + text.strip(),
        "--", target, error="could not commit")
    sha = git("rev-parse", "HEAD", error="could not read the new commit").strip()
    say(f"committed {sha[:12]} in {top}: {subject}")
    write_summary(summary, target=target, line=line, sha=sha, subject=subject, request=text)
    say(f"wrote the summary to {summary}")


def choose_target(text: str, cwd: Path, *, exclude: str) -> str:
    names = [m.group(0) for m in _FILE_NAME.finditer(text) if m.group(0) != exclude and _inside(m.group(0))]
    for name in names:
        if (cwd / name).is_file():
            return name
    for name in names:
        if name.rsplit(".", 1)[-1].lower() in TEXT_SUFFIXES:
            return name
    return DEFAULT_TARGET


def choose_line(text: str) -> str:
    quoted = _QUOTED.search(text)
    if quoted:
        return (quoted.group(1) or quoted.group(2)).strip()
    return next(line.strip() for line in text.splitlines() if line.strip())


def append_line(path: Path, line: str) -> None:
    try:
        existing = path.read_bytes() if path.exists() else b""
        with open(path, "ab") as f:
            if existing and not existing.endswith(b"\n"):
                f.write(b"\n")
            f.write(line.encode() + b"\n")
    except OSError as exc:
        raise AgentError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_summary(path: Path, *, target: str, line: str, sha: str, subject: str, request: str) -> None:
    quoted = "\n".join(f"> {row}" if row else ">" for row in request.strip().splitlines())
    body = (
        "# Summary\n\n"
        f'Appended the line "{line}" to `{target}` and committed it as `{sha}` ({subject}).\n\n'
        "## Request\n\n"
        f"{quoted}\n"
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    except OSError as exc:
        raise AgentError(f"cannot write the summary {path}: {exc.strerror or exc}") from None


def identity() -> list[str]:
    """A committer for a git that has none configured (the author is always the demo agent)."""
    configured = subprocess.run([_git_binary(), "config", "--get", "user.email"], capture_output=True, text=True,
                                check=False)
    if configured.returncode == 0 and configured.stdout.strip():
        return []
    name, email = AUTHOR[:-1].split(" <")
    return ["-c", f"user.name={name}", "-c", f"user.email={email}"]


def git(*args: str, error: str) -> str:
    done = subprocess.run([_git_binary(), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        detail = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"git exited with {done.returncode}"
        raise AgentError(f"{error}: {detail}")
    return done.stdout


def _git_binary() -> str:
    found = shutil.which("git")
    if found is None:
        raise AgentError("git is not installed (not found on PATH)")
    return found


def say(text: str) -> None:
    print(f"joch-demo-agent: {text}", flush=True)


def _inside(name: str) -> bool:
    normal = posixpath.normpath(name)
    return not posixpath.isabs(normal) and normal != ".." and not normal.startswith("../")


if __name__ == "__main__":
    sys.exit(main())
