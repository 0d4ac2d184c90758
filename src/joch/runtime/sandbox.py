"""The bubblewrap sandbox an agent runs in (``joch runner --sandbox bwrap``).

What the agent sees is described where the runner starts it (``joch.runtime.runner``'s docstring):
its own PID namespace, a read-only root, its worktree, outputs, HOME and a private ``/tmp``
writable, and the data directory and the ``hide`` paths out of sight. This module builds that
command line and tells whether bubblewrap works here; like the runner, it imports only the
standard library and ``workspace`` (the runner's start-up time is every run's dispatch latency).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from joch.runtime import workspace
from joch.runtime.base import Network, Sandbox

if TYPE_CHECKING:
    from joch.runtime.netbridge import Proxy
    from joch.runtime.runner import RunFiles

SANDBOXES = ("none", "bwrap")
BWRAP = "bwrap"
PROXY_SOCKET = "/tmp/.joch-network.sock"  # noqa: S108 - in the sandbox's own /tmp
"""Where the runner's proxy socket is mounted in a ``limited`` sandbox (a short path: a unix socket's
is at most 107 bytes, and the run directory's may be longer)."""


def sandboxed(executable: str, args: list[str], *, checkout: workspace.Checkout, files: RunFiles, home: Path,
              hide: Iterable[Path], user: AgentUser | None = None, network: str = "on",
              proxy_socket: Path | None = None) -> list[str]:
    """The bubblewrap command line that runs ``executable`` with ``args`` as the agent.

    New PID (and IPC, UTS) namespaces: the agent is not shown a single process outside its own tree,
    so no ancestor's environment or command line (the runner's, the fork server's, the server's). The
    root file system is read-only; writable are the worktree (with its own repository, ``.git``, which
    the agent's commits go to; of the mirror it borrows objects from, only ``objects`` is there, read-only), the
    run's outputs, a per-run HOME and an empty /tmp; each ``hide`` directory (the data dir: other
    runs' files, the store) is an empty tmpfs, with this run's own directories mounted back on top,
    and each ``hide`` file (the store URL's file, a ``.pgpass``) reads as empty.
    ``network`` ``on`` keeps the host's network (agents call model APIs); ``off`` and ``limited`` give
    the agent a network namespace of its own (``--unshare-net``: a loopback and nothing else, and
    ``SOCKET_DIRS`` empty: the host's unix sockets are a network too), and
    for ``limited`` the runner's proxy socket ``proxy_socket`` is mounted in at ``PROXY_SOCKET``, which
    ``joch.runtime.netbridge`` inside bridges to 127.0.0.1:``PROXY_PORT``. ``user``: the agent
    drops to that uid and gid with ``setpriv`` once bubblewrap (as root) has mounted everything
    (see ``AgentUser``). ``--die-with-parent``: a runner that dies takes its agent along, so no
    agent ever runs unsupervised."""
    command = [shutil.which(BWRAP) or BWRAP, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if network != "on":
        command.append("--unshare-net")
    command += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--perms", "1777", "--tmpfs", "/tmp"]  # noqa: S108 - a fresh tmpfs in the sandbox, everyone's as /tmp is
    hide = tuple(hide)
    if network != "on":
        # Without a network, the host's unix sockets would still be one: a database's (a Postgres
        # that trusts local connections lets any user in), a daemon's. Their directory is empty.
        hide = (*hide, *socket_dirs())
    fresh = [Path("/tmp"), *(path for path in hide if path.is_dir())]  # noqa: S108 - the sandbox's own /tmp
    made: set[Path] = set()
    bound: list[Path] = []

    def mount(target: str | Path, *operation: str | Path) -> None:
        # The directories bubblewrap makes for a mount point in a tmpfs are root's, mode 0700: made
        # first with --dir (0755), so an agent of another uid can get to what is mounted there.
        for parent in reversed(Path(target).parents):
            if (parent not in made and any(parent != root and parent.is_relative_to(root) for root in fresh)
                    and not any(parent.is_relative_to(other) for other in bound)):
                command.extend(["--dir", str(parent)])
                made.add(parent)
        command.extend([*(str(part) for part in operation), str(target)])
        if "--tmpfs" not in operation:
            bound.append(Path(target))

    for installed in installed_under_tmp(executable):
        mount(installed, "--ro-bind", installed)
    if user is not None:
        # A directory on the way that the agent's user may not enter (/root, mode 0700, with the
        # Python joch runs on, or the data directory below it) becomes an empty tmpfs it may enter,
        # with what the agent needs of it mounted back as it is: its installations here, the run's
        # own directories below.
        needed: list[str | Path] = [*installations(executable), checkout.root, files.outputs, files.inputs, home]
        if checkout.mirror is not None:
            needed.append(checkout.mirror / "objects")
        for directory in closed_to(user, needed, fresh=fresh):
            mount(directory, "--perms", "0755", "--tmpfs")
            fresh.append(directory)
            for installed in installed_under(directory, executable):
                mount(installed, "--ro-bind", installed)
    for path in hide:
        mount(path, *(("--tmpfs",) if path.is_dir() else ("--ro-bind", os.devnull)))
    for path in (checkout.root, files.outputs, home):
        mount(path, "--bind", path)
    if checkout.mirror is not None:
        # The run's repository (root/.git, mounted with the worktree) borrows the mirror's objects:
        # those, and nothing else of the mirror, are there, read-only. The mirror is every run's of
        # this repository: an object replaced there would be what the next run checks out.
        mount(checkout.mirror / "objects", "--ro-bind", checkout.mirror / "objects")
    if proxy_socket is not None:
        mount(PROXY_SOCKET, "--bind", proxy_socket)
    mount(files.inputs, "--ro-bind", files.inputs)
    command += ["--chdir", str(checkout.path), "--"]
    if network == "limited" and proxy_socket is not None:
        from joch.runtime import netbridge  # only for limited runs: start-up time matters

        # The bridge first: it drops to the agent's user itself once it listens, and then becomes
        # setpriv, whose exec of the agent may still pass directories only root may enter (an
        # interpreter installed below /root: the agent is that program, it cannot read it).
        command += netbridge.bridge_command(PROXY_SOCKET, None if user is None else (user.uid, user.gid))
    if user is not None:
        command += user.setpriv()
    return [*command, executable, *args]


SOCKET_DIRS = ("/run", "/var/run")
"""Where the host's daemons keep their unix sockets (``/tmp``'s are hidden anyway)."""


def socket_dirs() -> list[Path]:
    """``SOCKET_DIRS`` as they are on this host (``/var/run`` is mostly a link to ``/run``)."""
    found = {Path(os.path.realpath(path)) for path in SOCKET_DIRS if os.path.isdir(path)}
    return sorted(path for path in found if path != Path("/"))


def installed_under_tmp(executable: str) -> list[str]:
    """``installed_under`` /tmp, which the sandbox replaces with a fresh tmpfs."""
    return installed_under(Path("/tmp"), executable)  # noqa: S108 - the sandbox's own /tmp hides this directory


def installed_under(directory: Path, executable: str) -> list[str]:
    """What the agent needs that the sandbox's fresh /tmp would hide, to mount back read-only: the
    installation of ``executable``, of the interpreter its ``#!`` line names, the Python environment
    joch runs from (whose ``bin`` is on the agent's PATH) and the directory joch is imported from,
    when they live under /tmp.

    A checkout cloned into /tmp and set up with ``make run`` has its ``.venv`` there:
    ``joch-demo-agent`` and every console script installed with joch. An installation is the prefix
    of a ``PREFIX/bin/NAME`` executable (a virtualenv, a ``--prefix`` install: its ``lib`` is
    needed too), else the executable's own directory; ``directory`` itself is never mounted back
    whole (an executable directly in it is mounted alone)."""
    tmp = os.path.realpath(directory)
    inside = sorted(path for path in installations(executable, alone_in=tmp)
                    if path.startswith(tmp + os.sep) and os.path.exists(path))
    # An installation inside another one is mounted with it.
    return [path for path in inside if not any(path.startswith(other + os.sep) for other in inside)]


def installations(executable: str, *, alone_in: str | None = None) -> set[str]:
    """Where the agent's program, its ``#!`` interpreter, joch's Python environment (and the
    interpreter it was made from) and the directory joch is imported from are installed (real
    paths); a program whose installation would be ``alone_in`` is listed itself."""
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
        found.add(os.path.realpath(root) if os.path.realpath(root) != alone_in else os.path.realpath(program))
    return found


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


# --- the agent's user -----------------------------------------------------------------------------

NOBODY = 65534
SETPRIV = "setpriv"


class SandboxError(Exception):
    """The agent cannot be confined as asked (the message names the setting and the fix)."""


@dataclass(frozen=True)
class AgentUser:
    """The unprivileged uid and gid a root runner's agent runs as (``--agent-user``, default nobody).

    How the privileges are dropped: bubblewrap runs as root (it needs to: the run's directories are
    below the data directory, which only root may enter, and root's bind mounts are what puts them in
    the sandbox), and the agent's first command inside is ``setpriv --reuid --regid --clear-groups``
    (util-linux), with no capabilities left in any set: from there on the agent is that uid on the
    host's own file system, so /etc/shadow and every other root-only file are closed to it however it
    gets to see them. ``bwrap --unshare-user --uid N`` as root is not that: in a user namespace whose
    uid 0 is the host's root, root-owned files stay root's to the agent. Starting bubblewrap itself
    as the user (an unprivileged user namespace) would need that user to reach the run's directories
    on the host, which the data directory's 0700 forbids. setpriv executes the agent's program while
    it still holds root's capabilities (a Python below /root starts), but nothing the agent executes
    later does: a directory the user may not enter on the way to the program's installation, joch's
    Python or the run's directories is therefore an empty tmpfs in the sandbox with just those
    mounted back (``closed_to``), and the run's worktrees and mirrors are 0700 on the host, so no
    other process of that uid (the host's own ``nobody``) reaches them there.

    What the agent writes (its worktree with its repository, outputs and HOME) is chowned to it before
    it starts (the mirror's objects it borrows are made readable to it, not its); the runner, root, still runs git
    there afterwards (``safe.directory`` is ``*`` for the runner's git: ``joch.runtime.workspace``).
    Without the sandbox the agent is not dropped (it could not reach its outputs and HOME, which are
    in the 0700 run directory): ``--sandbox none`` on a root server runs agents as root, and the
    record says so (``Sandbox.user`` 0)."""

    uid: int
    gid: int

    def setpriv(self) -> list[str]:
        return [shutil.which(SETPRIV) or SETPRIV, f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--"]

    def __str__(self) -> str:
        return f"{self.uid}:{self.gid}"


def parse_agent_user(text: str, *, flag: str = "--agent-user") -> AgentUser:
    """``NAME``, ``UID`` or either with ``:GROUP``/``:GID``; a name's group is its primary group, a
    bare uid's the one its passwd entry names (else the same number). ``SandboxError`` names ``flag``."""
    import grp
    import pwd

    user, _, group = text.strip().partition(":")
    if not user:
        raise SandboxError(f'{flag} must be a user name or uid, optionally with :GROUP or :GID (got "{text}")')
    try:
        if user.isdigit():
            uid = int(user)
            try:
                gid = pwd.getpwuid(uid).pw_gid
            except KeyError:
                gid = uid
        else:
            entry = pwd.getpwnam(user)
            uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        raise SandboxError(f'{flag}: no user "{user}" on this machine (give a uid, or a user in /etc/passwd)') from None
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise SandboxError(f'{flag}: no group "{group}" on this machine (give a gid, or a group in /etc/group)'
                               ) from None
    return AgentUser(uid=uid, gid=gid)


def agent_user(choice: str | None) -> AgentUser | None:
    """Whom the agent runs as when this process is root: ``choice`` (``--agent-user``), by default
    nobody; None (no change) when this process is not root, or ``choice`` names root."""
    if os.geteuid() != 0:
        return None
    user = parse_agent_user(choice) if choice else parse_agent_user(str(NOBODY))
    return None if user.uid == 0 else user


def give(user: AgentUser, *paths: Path) -> None:
    """Make ``paths`` (whole trees, symlinks not followed) the agent user's: what it must write."""
    for top in paths:
        if not top.exists():
            continue
        _own(top, user)
        for base, dirs, names in os.walk(top):
            for name in (*dirs, *names):
                _own(Path(base, name), user)


def readable(top: Path, *, skip: Iterable[str] = ()) -> None:
    """Let everyone read ``top`` and what is below it but ``skip`` (the mirror's objects, which the
    agent's repository borrows, written under whatever umask the server has; the mirrors directory
    itself is 0700 on the host)."""
    skipped = set(skip)
    for base, dirs, names in os.walk(top):
        if base == str(top):
            dirs[:] = [d for d in dirs if d not in skipped]
        for name in (*dirs, *names):
            path = os.path.join(base, name)
            with contextlib.suppress(OSError):
                status = os.lstat(path)
                wanted = 0o555 if stat.S_ISDIR(status.st_mode) else 0o444
                if not stat.S_ISLNK(status.st_mode) and status.st_mode & wanted != wanted:
                    os.chmod(path, status.st_mode | wanted)
    with contextlib.suppress(OSError):
        os.chmod(top, os.stat(top).st_mode | 0o555)  # noqa: S103 - below the 0700 mirrors directory


def _own(path: Path, user: AgentUser) -> None:
    try:
        status = os.lstat(path)
        if (status.st_uid, status.st_gid) != (user.uid, user.gid):
            os.lchown(path, user.uid, user.gid)
    except FileNotFoundError:
        pass


def closed_to(user: AgentUser, paths: Iterable[str | Path], *, fresh: Iterable[Path]) -> list[Path]:
    """The outermost directories above ``paths`` that ``user`` may not enter (by their mode: its
    supplementary groups are cleared). Directories in ``fresh`` (the sandbox's own /tmp, the hidden
    data dir: tmpfs where only the run's own directories are mounted) end the search."""
    fresh_dirs = [Path(os.path.realpath(p)) for p in fresh]
    closed: set[Path] = set()
    for path in paths:
        current = Path("/")
        for part in Path(os.path.abspath(path)).parts[1:-1]:
            current = current / part
            if any(current.is_relative_to(f) for f in fresh_dirs):
                break
            try:
                status = os.stat(current)
            except OSError:
                break
            bit = 0o100 if status.st_uid == user.uid else 0o010 if status.st_gid == user.gid else 0o001
            if not status.st_mode & bit:
                closed.add(current)
                break
    return sorted(path for path in closed if not any(path != other and path.is_relative_to(other) for other in closed))


def record(*, mode: str, user: AgentUser | None, network: str, reason: str | None) -> Sandbox:
    """The ``RunState.sandbox`` the runner records: the uid the agent runs as, its network, and why
    it was not sandboxed."""
    return Sandbox(mode=mode, user=user.uid if user is not None else os.geteuid(), network=network,
                   reason=reason if mode == "none" else None)


def unenforceable(network: str, reason: str | None) -> str:
    """The ``StartError`` message of a run whose network must be ``off`` or ``limited`` where there
    is no sandbox to enforce it: it is refused, not run with a network it was told not to have."""
    why = reason or "the runner was started with --sandbox none"
    return (f"the Agent's spec.security.network.mode is {network}, which only the bubblewrap sandbox can enforce, "
            f"and this run is not sandboxed ({why}); install bubblewrap (make sandbox-tools; Debian: apt-get install "
            "bubblewrap) and start the server with --sandbox auto or bwrap, or set spec.security.network.mode to on")


@dataclass
class Entered:
    """What ``enter`` made of a run: the command line, the agent's environment, and the proxy of a
    ``limited`` network (``close`` it when the agent has ended)."""

    argv: list[str]
    env: dict[str, str]
    proxy: Proxy | None = None

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None


def enter(executable: str, args: list[str], *, env: dict[str, str], checkout: workspace.Checkout, files: RunFiles,
          home: Path, hide: Iterable[Path], user: AgentUser | None, network: Network,
          say: Callable[[str], None], callback: str | None = None) -> Entered:
    """Everything a sandboxed start needs besides ``sandboxed``'s command line: the agent user's
    ownership of what it writes, and for a ``limited`` network the runner's proxy, with the run's
    usage callback on the Joch server (``callback``, its URL) reachable besides the Agent's ``allow``
    list: only that route of the server's over http (``netbridge.Proxy``), its host:port over https."""
    proxy: Proxy | None = None
    proxy_socket: Path | None = None
    hide = tuple(hide)
    if network.mode not in ("on", "off", "limited"):
        raise SandboxError(f'spec.security.network.mode must be on, off or limited (got "{network.mode}")')
    if user is not None:
        if shutil.which(SETPRIV) is None:
            raise SandboxError("setpriv is not installed (Debian/Ubuntu: apt-get install util-linux): without it the "
                               "agent cannot run as --agent-user; install it, or give --agent-user root")
        if checkout.mirror is not None:
            readable(checkout.mirror / "objects")  # borrowed, read-only; the root's own repository is in root
        give(user, checkout.root, files.outputs, files.inputs, home)
    if network.mode == "limited":
        from joch.runtime import netbridge  # only for limited runs: start-up time matters

        allow = list(network.allow)
        reachable: tuple[str, int, str] | None = None
        if callback:
            import urllib.parse

            parts = urllib.parse.urlsplit(callback)
            if parts.hostname and parts.scheme == "http":
                reachable = (parts.hostname, parts.port or 80, parts.path)  # only the callback itself
            elif parts.hostname:  # https: the proxy sees no path, only the host
                host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
                allow.append(f"{host}:{parts.port or 443}")
        proxy_socket = files.dir / "network.sock"
        try:
            proxy = netbridge.Proxy(proxy_socket, allow, say, callback=reachable)
        except ValueError as exc:
            raise SandboxError(str(exc)) from None
        env = netbridge.agent_env(env)
    argv = sandboxed(executable, args, checkout=checkout, files=files, home=home, hide=hide, user=user,
                     network=network.mode, proxy_socket=proxy_socket)
    return Entered(argv=argv, env=env, proxy=proxy)
