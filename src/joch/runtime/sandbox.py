"""The bubblewrap sandbox an agent runs in (``joch runner --sandbox bwrap``).

What the agent sees is described where the runner starts it (``joch.runtime.runner``'s docstring):
its own PID namespace, a read-only root, its worktree, outputs, HOME and a private ``/tmp``
writable, and the data directory and the ``hide`` paths out of sight. This module builds that
command line and tells whether bubblewrap works here; like the runner, it imports only the
standard library and ``workspace`` (the runner's start-up time is every run's dispatch latency).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from joch.runtime import workspace

if TYPE_CHECKING:
    from joch.runtime.runner import RunFiles

SANDBOXES = ("none", "bwrap")
BWRAP = "bwrap"


def sandboxed(executable: str, args: list[str], *, checkout: workspace.Checkout, files: RunFiles, home: Path,
              hide: Iterable[Path]) -> list[str]:
    """The bubblewrap command line that runs ``executable`` with ``args`` as the agent.

    New PID (and IPC, UTS) namespaces: the agent is not shown a single process outside its own tree,
    so no ancestor's environment or command line (the runner's, the fork server's, the server's). The
    root file system is read-only; writable are the worktree (and of the mirror it commits into, the
    objects, refs and its worktree's git directory: not what configures the runners' git), the
    run's outputs, a per-run HOME and an empty /tmp; each ``hide`` directory (the data dir: other
    runs' files, the store) is an empty tmpfs, with this run's own directories mounted back on top,
    and each ``hide`` file (the store URL's file, a ``.pgpass``) reads as empty.
    The network is the host's: agents call model APIs. ``--die-with-parent``: a runner that dies
    takes its agent along, so no agent ever runs unsupervised."""
    command = [shutil.which(BWRAP) or BWRAP, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
               "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]  # noqa: S108 - a fresh tmpfs in the sandbox
    for installed in installed_under_tmp(executable):
        command += ["--ro-bind", installed, installed]
    for path in hide:
        command += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", os.devnull, str(path)]
    writable = [checkout.root, files.outputs, home]
    mirror: list[str] = []
    if checkout.mirror is not None:
        # The mirror is every run's of this repository, and runners run git in it outside any
        # sandbox (the next run's fetch, this run's diff): what configures that git (config, a
        # commondir file naming another repository's, hooks, info/) is the agent's to read, not to
        # write. Writable are what its commits need: objects, refs and their logs, and the worktree's
        # own git directory (HEAD, index).
        mirror = ["--ro-bind", str(checkout.mirror), str(checkout.mirror)]
        for part in ("objects", "refs", "logs"):
            (checkout.mirror / part).mkdir(exist_ok=True)
            mirror += ["--bind", str(checkout.mirror / part), str(checkout.mirror / part)]
        if checkout.git_dir is not None and checkout.git_dir.is_relative_to(checkout.mirror):
            mirror += ["--bind", str(checkout.git_dir), str(checkout.git_dir)]
    for path in writable:
        command += ["--bind", str(path), str(path)]
    command += mirror
    command += ["--ro-bind", str(files.inputs), str(files.inputs), "--chdir", str(checkout.path), "--", executable]
    return command + args


def installed_under_tmp(executable: str) -> list[str]:
    """What the agent needs that the sandbox's fresh /tmp would hide, to mount back read-only: the
    installation of ``executable``, of the interpreter its ``#!`` line names, the Python environment
    joch runs from (whose ``bin`` is on the agent's PATH) and the directory joch is imported from,
    when they live under /tmp.

    A checkout cloned into /tmp and set up with ``make run`` has its ``.venv`` there:
    ``joch-demo-agent`` and every console script installed with joch. An installation is the prefix
    of a ``PREFIX/bin/NAME`` executable (a virtualenv, a ``--prefix`` install: its ``lib`` is
    needed too), else the executable's own directory; /tmp itself is never mounted back whole (an
    executable directly in /tmp is mounted alone)."""
    tmp = os.path.realpath("/tmp")  # noqa: S108 - the sandbox's own /tmp hides this directory
    programs = {executable, os.path.realpath(executable)}
    interpreter = _interpreter(executable)
    if interpreter is not None:
        programs |= {interpreter, os.path.realpath(interpreter)}
    found: set[str] = set()
    # joch's Python environment, and the directory joch is imported from (an editable install's
    # src/ is outside the environment): joch-demo-agent and other scripts installed with joch run there.
    for prefix in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.dirname(__file__)))):
        found.add(os.path.realpath(prefix))
    for program in programs:
        directory = os.path.dirname(os.path.abspath(program))
        root = os.path.dirname(directory) if os.path.basename(directory) == "bin" else directory
        found.add(os.path.realpath(root) if os.path.realpath(root) != tmp else os.path.realpath(program))
    inside = sorted(path for path in found if path.startswith(tmp + os.sep) and os.path.exists(path))
    # An installation inside another one is mounted with it.
    return [path for path in inside if not any(path.startswith(other + os.sep) for other in inside)]


def _interpreter(executable: str) -> str | None:
    """The program a ``#!`` script names (``#!/usr/bin/env python3`` names ``/usr/bin/env``), or None."""
    try:
        with open(executable, "rb") as script:
            first = script.readline(1024)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].split()
    return os.fsdecode(words[0]) if words else None


def sandbox_problem() -> str | None:
    """Why bubblewrap cannot sandbox agents here (not installed, or no namespaces for this user), or None."""
    found = shutil.which(BWRAP)
    if found is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        done = subprocess.run([found, "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/", "--dev", "/dev",
                               "--proc", "/proc", "--tmpfs", "/tmp", "true"],  # noqa: S108 - a fresh tmpfs in the sandbox
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{found} could not be run: {exc}"
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"{found} does not work here: {reason}"
    return None
