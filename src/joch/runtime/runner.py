"""``joch runner``: the one wrapper every runtime starts around an agent (``python -m joch.runtime.runner
--spec PATH``).

A run attempt's directory holds what the runner reads and writes::

    <run dir>/spec.json        the RunnerSpec (written by the runtime; no secret values)
              state.json       the record: RunState plus apiVersion and runner_pid
              log              the agent's stdout and stderr, secrets replaced by ***
              inputs/          the spec's input files          (Workspace.inputs)
              outputs/         the agent writes its outputs here (Workspace.outputs)
              artifacts/       outputs/<path>: the declared outputs (hard links, not copies), and changes.patch
              cancel-requested a marker the runtime leaves before it signals the runner
              .reserve         space held back so the last record can be written on a full disk
              log.tail         while the agent runs, the end of an over-long log (see "Limits")
              home/            the agent's HOME, this attempt's own (Workspace.home)

The run directory is the spec file's directory. The workspace root (the git worktree) is
``--workspace`` and the repository mirrors are below ``--cache`` (by default ``workspace/`` and
``mirrors/`` in the run directory). The runner's own configuration is on its command line, never in
an environment variable: the agent's environment is built from names, and a Secret key that happened
to be called like a runner setting must not be able to move the workspace or point git elsewhere.

Steps, each durably recorded (write a temporary file, fsync, rename, fsync the directory) so a
server that restarts finds the truth on disk: ``Preparing`` (checkout, input files) → ``Running``
(the agent's pid and start time) → ``Succeeded`` | ``Failed`` | ``Cancelled`` with exit code,
reason, message and artifacts. A record exists before anything else happens, and a runner refuses
to start on a directory that has one: a run attempt is executed once.

* **The agent** is ``argv[0]`` looked up on the agent's PATH (with the directory of this Python's
  executable in front, so console scripts installed alongside joch are found), started in its own
  session and process group, in ``Workspace.path``, with an allowlist of the runner's environment
  (``PASSED_ENV``), plus ``spec.env``, plus the variables named by ``spec.secret_env``.
* **Its HOME** is the attempt's own, ``home/`` (sandboxed or not): ``HOME`` and the XDG base
  directories (``XDG_DIRS``) point below it, never at the runner's HOME (the server's), whose CLI
  configuration must not apply to runs and whose state runs must not share. Before the agent starts
  it gets the git identity the runner's git uses (``workspace.copy_identity``: the agent's commits
  work) and ``spec.config_files`` (paths relative to HOME and staying inside it, also through
  symbolic links; written with their ``mode``).
* **What runs is recorded** with the ``Running`` record (``RunState.invocation``, ``_describe``):
  the argv (secrets redacted, arguments over ``MAX_ARG_BYTES`` cut), the environment's names, the
  executable found, the sha256 of its real file and its version (``<exe> *version_args`` under the
  agent's environment, ``VERSION_TIMEOUT``; failing or hanging there only leaves it out), with the
  base commit and ``RunState.sandbox`` (``sandbox.record``). The version is asked in the sandbox (no network),
  as the agent user, never as the runner's user.
* **Secret values** never pass through a file, and never through the runner's own environment when
  the local runtime starts it: an agent can read ``/proc/<pid>/environ`` of its parent, and the
  runner's environment holds nothing the agent was not given. With ``--secrets-stdin`` the runner
  reads them as one JSON object from stdin (the local runtime writes them into a pipe; a forked
  runner gets them in memory); without it (a container whose environment is the agent's anyway)
  they come from the runner's environment. A secret whose name cannot be an environment variable
  (empty, or with ``=`` or NUL in it) fails the run with ``StartError`` naming it.
* **The sandbox** (``--sandbox bwrap``): the agent runs under bubblewrap in new PID, IPC and UTS
  namespaces with the root file system read-only, its checkout (a repository of its own, which its
  commits go into; the mirror's objects it borrows are there read-only), outputs and its HOME and a
  private /tmp writable (what the agent runs from, if under the host's /tmp, is mounted back
  read-only: ``installed_under_tmp``), and the ``--hide`` paths (the
  data directory: every other run's files, other repositories' mirrors, the SQLite store) empty: it
  sees no ancestor process, so no environment or command line but its own (``sandboxed``).
  A root runner's agent runs as ``--agent-user`` (default nobody), with what it writes chowned to
  it (``sandbox.AgentUser``); its network is ``spec.network`` (``on``, ``off``, ``limited``: through
  the runner's proxy, ``joch.runtime.netbridge``). ``--sandbox none`` runs it as a plain child
  process, as the runner's user, and refuses (``StartError``) a network other than ``on``. The
  record says which (``RunState.sandbox``; ``--sandbox-reason``: why none).
* **Reporting usage.** With ``--api-url`` (the server as the runtime reaches it) the agent gets
  ``JOCH_API_URL``, ``JOCH_RUN_NAMESPACE``, ``JOCH_RUN_NAME`` and ``JOCH_CALLBACK_URL`` (the run's
  ``POST .../agentruns/<name>/callback``), and the run token ``JOCH_RUN_TOKEN`` arrives as a secret
  (so it is redacted from the log like one). Usage the runner sees itself goes the same way:
  ``Runner.report_usage`` posts events to that callback with that token (``usage.post_usage``: retried
  on connection failures and 5xx with the same event ids, which the server counts once), so there
  is one path into metering (``joch.controllers.metering``) whoever reports.
* **Reporting the run** (``--report``, with ``--api-url``): for a runner whose files the server
  cannot read (a Kubernetes Job's container), every record also goes to the Joch API with the run
  token, the final one after the artifacts and the log (``joch.runtime.reports``). ``--spec-json``
  hands such a runner its spec on the command line.
* **The deadline** (``timeout_seconds``) counts from the agent's start; preparing the workspace
  is bounded by the same length separately, so a hung clone cannot hold a run forever either.
  At the deadline, or when the runner gets SIGTERM or SIGINT (cancel), the agent's process group
  gets SIGTERM, then SIGKILL after ``grace_seconds``. Processes the agent leaves behind in its
  group when it exits get the same treatment: nothing in the agent's group outlives the record.
* **Output** goes through a pipe the runner reads; every secret value of four or more characters
  is replaced by ``***`` before it reaches the log, including one split across reads, and so are its
  common encodings (``encodings``: base64, hex, percent-encoding, JSON escapes).
* **The output is read** as well as logged (``OutputWatch``): each complete line after redaction
  (cut at ``MAX_LINE_BYTES``) goes to the parser ``spec.output_format`` names (``agentoutput``) and
  is searched for ``spec.success.failure_patterns`` (a pattern that takes over ``PATTERN_SECONDS``
  on a line is given up, ``_bounded_search``: it must not hold the runner). The parser's usage events are posted to the
  run's callback from a thread (``UsageReporter``, ids prefixed ``a<attempt>-``; never holding up
  the log; a failure is said in runner.log, and the run goes on), its session id is recorded at
  once (the ``Running`` record is written again), and its error is kept for the success policy.
* **After the agent ends,** each declared output (a regular file below ``outputs/``) is hard-linked
  into ``artifacts/`` with its sha256 and size (hashed in place: an artifact takes its size on disk
  once, not twice; copied only when it cannot be linked), and ``changes.patch`` records everything
  the agent did to the worktree against the base commit (commits, uncommitted and untracked files).
  A missing non-optional output fails a run that otherwise succeeded (reason ``MissingOutput``); a
  failed run keeps its own reason. ``changes.patch`` leaves out ``spec.patch.exclude`` (git pathspec
  globs) and, with ``spec.patch.max_file_bytes``, every file over that size (listed in the record's
  ``omitted``); it stays ``git apply``-able.
* **The success policy** (``spec.success``) judges only an agent that exited 0 with nothing else
  wrong: the CLI's own error (``AgentReportedError``), a failure pattern's line (``FailurePattern``),
  a required artifact not stored (``MissingOutput``), an empty patch (``NoChanges``), in that order.
  An agent that exited non-zero after its CLI reported an error (Claude Code's ``is_error`` result
  exits 1) ends ``AgentReportedError`` too, with the exit code and the CLI's own words.
* **Resuming** (``spec.resume``): the attempt runs in attempt ``resume.attempt``'s worktree
  (``--workspace`` names it; ``workspace.reuse`` checks it is still a checkout of that repository and
  never checks out afresh), from that attempt's base commit, with a copy of the HOME (links kept as
  links) of the latest attempt that worked on the session, once what is left of the earlier agents
  is killed; ``RunState.session`` says which attempt it continued.
* **Limits.** ``max_log_bytes``: the log keeps the first half of that many bytes as they come, and
  of the rest only the last half (held in ``log.tail``, a ring, and appended when the agent ends),
  with a line saying how many bytes were cut between them. ``max_artifact_bytes``: a larger output
  is not stored (it is removed from ``outputs/``) and the record lists it under ``refused`` with the
  reason; a refused non-optional output fails a run that otherwise succeeded (``ArtifactTooLarge``).
  ``changes.patch`` is held to the same limit as it is written.
* **A full disk** (``ENOSPC``/``EDQUOT`` on any write of the runner's: the log, the workspace, the
  artifacts, the record) ends the run ``Failed`` with reason ``DiskFull`` and a message naming the
  file and the space left; the agent is killed at once. An agent that failed while its disk is full
  gets the same reason. The record can still be written then: the runner holds ``.reserve`` (a
  small allocated file) from the start and gives it up when a record does not fit.

Reasons: ``Completed``, ``AgentFailed``, ``DeadlineExceeded``, ``Cancelled``, ``WorkspaceError``,
``StartError``, ``MissingOutput``, ``ArtifactTooLarge``, ``DiskFull``, ``NoChanges``,
``FailurePattern``, ``AgentReportedError``, and ``RunnerError`` for a bug
in the runner itself; the runtime adds ``RunnerLost``. An agent killed by signal N has exit code
128 + N, as shells and Kubernetes report it (the message names the signal). The runner's own exit
status: 0 when the run succeeded, 1 when it did not, 2 when there was no run to execute (a bad
spec, or a directory that already has a record).

Start-up time is part of every run's dispatch latency, so this module imports only the standard
library (and ``runtime.base`` and ``runtime.workspace``, which do the same). Even so, starting an
interpreter and importing costs more than the runner's own work; the local runtime therefore starts
its runners through a fork server (``serve_forks``: ``python -m joch.runtime.runner --fork-server``)
that has done both once, and each forked runner is what ``--spec PATH`` in a new interpreter is.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from joch.runtime import agentoutput, disks, reports, workspace
from joch.runtime import sandbox as sandboxing
from joch.runtime.base import (
    API_URL_ENV,
    RUN_TOKEN_ENV,
    SPEC_VERSION,
    ArtifactRecord,
    GitSource,
    Invocation,
    RefusedArtifact,
    Resume,
    RunnerPhase,
    RunnerSpec,
    RunState,
    Sandbox,
    Session,
    Workspace,
)
from joch.runtime.outputwatch import (  # noqa: F401 - MAX_LINE_BYTES, PATTERN_SECONDS: runner's public names
    MAX_LINE_BYTES,
    PATTERN_SECONDS,
    OutputWatch,
)
from joch.runtime.outputwatch import printable as _printable
from joch.runtime.redaction import Redactor, encodings
from joch.runtime.sandbox import SANDBOXES
from joch.runtime.usage import (  # noqa: F401 - post_usage, USAGE_*: runner's public names
    USAGE_ATTEMPTS,
    USAGE_TIMEOUT,
    UsageNotReported,
    UsageReporter,
    callback_url,
    post_usage,
)
from joch.runtime.usage import say as _say

PATCH = "changes.patch"
EXECUTABLES = ".executables-2"
"""Below the runner's cache directory: what is known of each agent executable (``Runner._known``). The
suffix changes with how a version is read (2: stdout before stderr), so no entry an older runner
recorded is reused."""
PASSED_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
})
"""What the agent inherits from the runner's environment (besides ``LC_*``)."""
RUNNER_ENV = PASSED_ENV | {"SSH_AUTH_SOCK", "PYTHONPATH"}
"""What the local runtime passes to a runner (and its fork server) of its own environment (besides
``LC_*``): what git and Python need, never the server's settings or credentials (``JOCH_STORE``)."""
_PR_SET_CHILD_SUBREAPER = 36
_POLL = 0.25          # longest sleep of the supervision loop (signals and output wake it earlier)
_AFTER_KILL = 2.0     # how long to wait for a SIGKILLed group to vanish, or for its output pipe to close
_CHUNK = 65536
RESERVE_BYTES = 256 * 1024  # far more than a record needs, little next to a run's files
VERSION_TIMEOUT = 15.0      # how long the CLI may take to say its version (a node CLI under load: over 5 s)
MAX_ARG_BYTES = 4096        # an argument longer than this is cut in the record (``Invocation.argv``)
MAX_OMITTED = 100            # files changes.patch left out that the record lists one by one (the rest: one line)
USAGE_WAIT = 30.0           # how long, once the agent ended, usage still being reported may take
XDG_DIRS = {"XDG_CONFIG_HOME": ".config", "XDG_DATA_HOME": ".local/share", "XDG_CACHE_HOME": ".cache",
            "XDG_STATE_HOME": ".local/state"}
"""The agent's XDG base directories, below its own HOME (``RunFiles.home``)."""


@dataclass(frozen=True)
class RunFiles:
    """A run attempt's directory and the files in it."""

    dir: Path

    @property
    def spec(self) -> Path:
        return self.dir / "spec.json"

    @property
    def state(self) -> Path:
        return self.dir / "state.json"

    @property
    def log(self) -> Path:
        return self.dir / "log"

    @property
    def inputs(self) -> Path:
        return self.dir / "inputs"

    @property
    def outputs(self) -> Path:
        return self.dir / "outputs"

    @property
    def artifacts(self) -> Path:
        return self.dir / "artifacts"

    @property
    def cancel(self) -> Path:
        return self.dir / "cancel-requested"

    @property
    def reserve(self) -> Path:
        return self.dir / ".reserve"

    @property
    def log_tail(self) -> Path:
        return self.dir / "log.tail"

    @property
    def home(self) -> Path:
        return self.dir / "home"


def workspace_of(files: RunFiles, root: Path, git: GitSource | None) -> Workspace:
    """The paths the agent is given; the same function serves ``Runtime.workspace`` (before the
    run) and the runner (during it), so rendered templates and the real run agree."""
    path = workspace.subpath(root, git.path) if git is not None else root
    return Workspace(root=str(root), path=str(path), inputs=str(files.inputs), outputs=str(files.outputs),
                     home=str(files.home))


# --- the state record -----------------------------------------------------------------------------


def read_state(path: Path) -> RunState | None:
    record = read_record(path)
    if record is None:
        return None
    return RunState(
        phase=record["phase"], reason=record.get("reason"), message=record.get("message"),
        exit_code=record.get("exit_code"), started_at=record.get("started_at"),
        finished_at=record.get("finished_at"), pid=record.get("pid"),
        artifacts=tuple(ArtifactRecord(**a) for a in record.get("artifacts") or ()),
        refused=tuple(RefusedArtifact(**a) for a in record.get("refused") or ()),
        base_commit=record.get("base_commit"),
        invocation=_invocation_of(record.get("invocation")),
        sandbox=Sandbox(**record["sandbox"]) if isinstance(record.get("sandbox"), dict) else None,
        session=Session(**record["session"]) if isinstance(record.get("session"), dict) else None,
        omitted=tuple(RefusedArtifact(**a) for a in record.get("omitted") or ()),
    )


def _invocation_of(body: Any) -> Invocation | None:
    if not isinstance(body, dict):
        return None
    return Invocation(argv=tuple(body.get("argv") or ()), env=tuple(body.get("env") or ()),
                      executable=body.get("executable"), version=body.get("version"), sha256=body.get("sha256"))


def read_record(path: Path) -> dict[str, Any] | None:
    """The raw record (RunState's fields and the runner's extras); None when there is none yet."""
    try:
        record = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    return record if isinstance(record, dict) else None


def write_state(path: Path, state: RunState, **extra: Any) -> None:
    body = {**extra, **asdict(state), "apiVersion": SPEC_VERSION}
    write_durably(path, json.dumps(body, indent=2, sort_keys=True).encode())


def record_state(files: RunFiles, state: RunState, **extra: Any) -> None:
    """``write_state`` to the run's record; on a full disk, give up the run's reserve and try once
    more, so that the end of a run that filled its disk is still recorded."""
    try:
        write_state(files.state, state, **extra)
    except OSError as exc:
        if not disks.is_full_error(exc) or not release_reserve(files):
            raise
        write_state(files.state, state, **extra)


def hold_reserve(files: RunFiles) -> None:
    """Allocate ``RESERVE_BYTES`` for ``record_state`` to free; without room for it, go without."""
    try:
        fd = os.open(files.reserve, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except (OSError, AttributeError):
        with contextlib.suppress(OSError):
            os.unlink(files.reserve)
    finally:
        os.close(fd)


def release_reserve(files: RunFiles) -> bool:
    """Whether there was a reserve to give up."""
    try:
        os.unlink(files.reserve)
    except OSError:
        return False
    return True


def write_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically and durably: a reader sees the old or the new file, never part.
    A failed write leaves no temporary file behind (on a full disk it would hold the space)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _naming(exc, path) from None
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def runner_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a runtime starts a runner (or its fork server) with: ``RUNNER_ENV`` of
    ``environ``. Everything else, the server's store URL and credentials above all, stays out: the
    agent can read its parent's ``/proc/<pid>/environ``."""
    return {k: v for k, v in environ.items() if k in RUNNER_ENV or k.startswith("LC_")}


def valid_env_name(name: str) -> bool:
    """What ``execve`` can carry as a name (Kubernetes allows the same: printable, no ``=``)."""
    return bool(name) and "=" not in name and "\0" not in name


# --- process groups -------------------------------------------------------------------------------


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is alive (zombies waiting for their reaper do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.scandir("/proc")
    except OSError:
        return True
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                return True
    return False


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# --- the runner -----------------------------------------------------------------------------------


class _Cancelled(Exception):
    """Raised by the signal handler while the workspace is being prepared."""


class _StartError(Exception):
    pass


@dataclass(frozen=True)
class _Ending:
    status: int        # as os.waitstatus_to_exitcode says: -N when killed by signal N
    cause: str | None  # "cancel", "deadline" or None (the agent ended by itself)
    killed: bool

    @property
    def exit_code(self) -> int:
        """The exit code as shells and Kubernetes report it: 128 + N for signal N."""
        return 128 - self.status if self.status < 0 else self.status

    def describe(self) -> str:
        if self.status >= 0:
            return f"agent exited with code {self.status}"
        try:
            name = signal.Signals(-self.status).name
        except ValueError:
            name = f"signal {-self.status}"
        return f"agent was killed by {name} (exit code {self.exit_code})"


class Runner:
    def __init__(self, spec: RunnerSpec, files: RunFiles, *, root: Path, cache: Path,
                 environ: Mapping[str, str], secrets: Mapping[str, str] | None = None, sandbox: str = "none",
                 hide: Iterable[Path] = (), api_url: str | None = None,
                 agent_user: sandboxing.AgentUser | None = None, sandbox_reason: str | None = None,
                 report: bool = False) -> None:
        self.spec = spec
        self.api_url = api_url
        self.files = files
        self.root = root
        self.cache = cache
        self.environ = dict(environ)
        # Without secrets of its own (a runner started by hand, or in a container), the runner's
        # environment holds them.
        source = self.environ if secrets is None else secrets
        self.secret_values = {name: source[name] for name in spec.secret_env if name in source}
        self.sandbox = sandbox
        self.hide = tuple(hide)
        self.agent_user = agent_user if sandbox == "bwrap" else None  # see sandbox.AgentUser
        self.sandbox_reason = sandbox_reason
        self._sandbox: Sandbox | None = None
        self._entered: sandboxing.Entered | None = None
        self.cancelled = False
        self._raise_on_signal = True
        self._base: str | None = None
        self._started_at: float | None = None
        self._pid: int | None = None
        self._invocation: Invocation | None = None
        self._session: Session | None = None
        self._omitted: tuple[RefusedArtifact, ...] = ()
        self._changed: bool | None = None  # whether changes.patch holds anything (None: no repository)
        self._watch = OutputWatch(None, (), on_usage=lambda events: None, on_session=lambda session: None)
        self._usage: UsageReporter | None = None
        self._said_no_usage = False
        # --report (a runner whose files the server cannot read: a Job's container): every record
        # also goes to the Joch API (joch.runtime.reports).
        self._reporter = reports.Reporter(api_url, spec.run, self.secret_values.get(RUN_TOKEN_ENV)) \
            if report and api_url else None

    # The record ------------------------------------------------------------------------------------

    def record(self, state: RunState) -> None:
        """Write ``state``, with what this runner learned so far (base commit, invocation, sandbox,
        session, omitted files) filled in where ``state`` leaves it out."""
        state = dataclasses.replace(
            state, base_commit=state.base_commit or self._base, invocation=state.invocation or self._invocation,
            sandbox=state.sandbox or self._sandbox, session=state.session or self._session,
            omitted=state.omitted or self._omitted)
        record_state(self.files, state, runner_pid=os.getpid())
        if self._reporter is not None:
            failed = self._reporter.report(self.files.dir, self.files.state.read_bytes(), finished=state.finished,
                                           artifacts=state.artifacts)
            if failed:
                _say(f"joch runner: the {state.phase} record was not reported to {self.api_url}: {failed}")

    def finish(self, phase: RunnerPhase, reason: str, message: str, *, exit_code: int | None = None,
               artifacts: tuple[ArtifactRecord, ...] = (), refused: tuple[RefusedArtifact, ...] = ()) -> int:
        self.record(RunState(phase=phase, reason=reason, message=message, exit_code=exit_code,
                             started_at=self._started_at, finished_at=time.time(), pid=self._pid,
                             artifacts=artifacts, refused=refused))
        return 0 if phase == "Succeeded" else 1

    def finish_disk_full(self, exc: OSError) -> int:
        """End the run for a write that failed with ENOSPC (the agent, if any, is stopped by now)."""
        where = exc.filename if exc.filename is not None else self.files.dir
        after = "the agent was not started" if self._pid is None else "the agent was stopped"
        return self.finish("Failed", disks.REASON, f"{disks.describe(where)}; {after}")

    # Signals ---------------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.cancelled = True
        if self._raise_on_signal:
            self._raise_on_signal = False
            raise _Cancelled

    # The steps -------------------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self.record(RunState(phase="Preparing"))
            hold_reserve(self.files)
            if self.files.cancel.exists():
                raise _Cancelled
            checkout = self._prepare()
            self._raise_on_signal = False
        except _Cancelled:
            return self.finish("Cancelled", "Cancelled", "cancelled before the agent started")
        except workspace.WorkspaceError as exc:
            self._raise_on_signal = False
            return self.finish("Failed", "WorkspaceError", str(exc))
        if self.cancelled or self.files.cancel.exists():
            return self.finish("Cancelled", "Cancelled", "cancelled before the agent started")
        log = LogSink(self.files, self.spec.max_log_bytes)
        if self._reporter is not None:
            log.echo = sys.stdout.fileno()  # the redacted output is the container's log too
        try:
            # Subreaper only while the agent runs: orphans of the runner's own git (a detached
            # `gc --auto` in the shared mirror after a fetch) are not the agent's and must live on.
            _set_subreaper(True)
            try:
                agent = self._start(checkout)
            except _StartError as exc:
                _set_subreaper(False)
                return self.finish("Failed", "StartError", str(exc))
            try:
                ending = self._supervise(agent, log)
            except BaseException:
                signal_group(agent.pid, signal.SIGKILL)
                raise
            finally:
                _kill_descendants()  # what left the agent's process group (setsid daemons) goes too
                _set_subreaper(False)
                if self._entered is not None:
                    self._entered.close()  # the limited network's proxy
                if agent.stdout is not None:
                    agent.stdout.close()
                if self._usage is not None:
                    self._usage.close(USAGE_WAIT)
            log.finish()
        finally:
            log.close()
        artifacts, refused, missing = self._collect(checkout)
        return self._conclude(ending, artifacts, refused, missing)

    def _prepare(self) -> workspace.Checkout:
        deadline = time.monotonic() + self.spec.timeout_seconds
        for directory in (self.files.inputs, self.files.outputs, self.files.artifacts):
            directory.mkdir(parents=True, exist_ok=True)
        self.files.log.touch()
        for item in self.spec.input_files:
            try:
                target = workspace.subpath(self.files.inputs, item.path)
            except workspace.WorkspaceError as exc:
                raise workspace.WorkspaceError(f"input file: {exc}") from None
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(item.content, encoding="utf-8")
        if self.spec.resume is not None:
            checkout = self._resume(self.spec.resume)
        else:
            checkout = workspace.prepare(cache=self.cache, git=self.spec.git, root=self.root, deadline=deadline)
        self._base = checkout.base
        self._prepare_home(checkout)
        return checkout

    def _resume(self, resume: Resume) -> workspace.Checkout:
        """Continue the CLI session ``resume.session_id``, made in attempt ``resume.attempt``'s worktree
        (``--workspace`` names it): from that attempt's base commit, with a copy of the HOME (where the
        CLI keeps its sessions) of the latest attempt that worked on the session (attempt 1 made it,
        attempt 2 continued it and was lost: attempt 3 continues from attempt 2's HOME), what is left
        of their agents killed first."""
        what = f"cannot resume attempt {resume.attempt}"
        if not 1 <= resume.attempt < self.spec.run.attempt:
            raise workspace.WorkspaceError(f"{what}: attempt {self.spec.run.attempt} can only continue an earlier one")
        origin = read_state(RunFiles(self.files.dir.parent / str(resume.attempt)).state)
        if origin is None:
            raise workspace.WorkspaceError(f"{what}: it left no record")
        latest, latest_state = resume.attempt, origin
        for attempt in range(resume.attempt, self.spec.run.attempt):
            state = origin if attempt == resume.attempt else read_state(self._attempt(attempt).state)
            if state is None:
                continue
            if state.pid is not None:
                _stop_leftover(state.pid, self.root)
            if attempt == resume.attempt or (state.session is not None and state.session.id == resume.session_id
                                             and state.session.resumed_from == resume.attempt):
                latest, latest_state = attempt, state
        if not latest_state.finished:
            raise workspace.WorkspaceError(f"cannot resume attempt {latest}: its record says it is still "
                                           f"{latest_state.phase}")
        checkout = workspace.reuse(cache=self.cache, git=self.spec.git, root=self.root, base=origin.base_commit)
        home = self._attempt(latest).home
        if home.is_dir():
            # Links are copied as links: what the earlier agent pointed at is not read here.
            try:
                shutil.copytree(home, self.files.home, symlinks=True, dirs_exist_ok=True)
            except shutil.Error as exc:  # what could not be copied (a socket, a pipe): the rest was
                failed = [str(item[0]) for item in exc.args[0]] if exc.args and isinstance(exc.args[0], list) else []
                _say(f"joch runner: resuming from attempt {latest}: not copied from its HOME: "
                     f"{', '.join(failed[:10]) or exc}")
        self._session = Session(id=resume.session_id, resumed_from=resume.attempt)
        return checkout

    def _attempt(self, attempt: int) -> RunFiles:
        """Another attempt's directory of this run (attempts are siblings: ``<uid>/<attempt>``)."""
        return RunFiles(self.files.dir.parent / str(attempt))

    def _prepare_home(self, checkout: workspace.Checkout) -> None:
        """The attempt's own HOME (``RunFiles.home``) with its XDG directories, the git identity the
        agent's commits need, and the provider's configuration files."""
        home = self.files.home
        try:
            home.mkdir(mode=0o700, exist_ok=True)
            real_home = home.resolve()
            for sub in XDG_DIRS.values():
                # A resumed HOME is a copy of an earlier agent's, links and all: nothing is made
                # through a link that leads out of it (the runner may be root).
                if not (home / sub).resolve().is_relative_to(real_home):
                    raise workspace.WorkspaceError(f"the agent's HOME {home}: {sub} leads outside it through a "
                                                   "symbolic link (left by an earlier attempt's agent)")
                (home / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if disks.is_full_error(exc):
                raise
            raise workspace.WorkspaceError(f"cannot prepare the agent's HOME {home}: {exc}") from None
        if checkout.base is not None:
            # The identity git gave the runner may come from this user's ~/.gitconfig, which the
            # agent's HOME is not: without it here, the agent's commits would fail. git writes a
            # config file through a link: an earlier agent's link there is removed, not followed.
            gitconfig = home / ".gitconfig"
            if gitconfig.is_symlink():
                gitconfig.unlink()
            workspace.copy_identity(checkout.root, gitconfig)
        for i, item in enumerate(self.spec.config_files):
            where = f'config file "{item.path}" (configFiles[{i}].path)'
            try:
                target = workspace.subpath(home, item.path)
            except workspace.WorkspaceError:
                raise workspace.WorkspaceError(f"{where}: must be a relative path that stays inside HOME") from None
            if target == home:
                raise workspace.WorkspaceError(f"{where}: names HOME itself, not a file in it")
            # Checked before its directories are made too: through a link an earlier agent left in
            # a resumed HOME, they would be made outside it.
            if not target.parent.resolve().is_relative_to(real_home):
                raise workspace.WorkspaceError(f"{where}: leads outside HOME through a symbolic link")
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                if disks.is_full_error(exc):
                    raise
                raise workspace.WorkspaceError(f"{where}: cannot create its directory: {exc}") from None
            if not target.parent.resolve().is_relative_to(real_home):
                raise workspace.WorkspaceError(f"{where}: leads outside HOME through a symbolic link")
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, item.mode & 0o7777)
            except OSError as exc:
                if disks.is_full_error(exc):
                    raise _naming(exc, target) from None
                raise workspace.WorkspaceError(f"{where}: cannot write {target}: {exc.strerror or exc}") from None
            try:
                os.fchmod(fd, item.mode & 0o7777)  # whatever the umask says
                _write_all(fd, item.content.encode())
            except OSError as exc:
                raise _naming(exc, target) from None
            finally:
                os.close(fd)

    def agent_env(self) -> dict[str, str]:
        # An allowlist, not the server's whole environment: that holds the store URL (with its
        # password on Postgres) and whatever credentials the server was started with. The agent gets
        # what a login shell needs, plus what its provider and Agent declare and its allowed secrets.
        env = {k: v for k, v in self.environ.items() if k in PASSED_ENV or k.startswith("LC_")}
        # The attempt's own HOME, never the runner's (the server's): CLIs keep their state and
        # configuration there, and the operator's own must not apply to runs, nor runs share it.
        env["HOME"] = str(self.files.home)
        env.update({name: str(self.files.home / sub) for name, sub in XDG_DIRS.items()})
        env.update(self.spec.env)
        if self.api_url:
            env.update({API_URL_ENV: self.api_url, "JOCH_RUN_NAMESPACE": self.spec.run.namespace,
                        "JOCH_RUN_NAME": self.spec.run.name,
                        "JOCH_CALLBACK_URL": callback_url(self.api_url, self.spec.run)})
        for name in self.spec.secret_env:
            if name in self.secret_values:
                env[name] = self.secret_values[name]
            else:
                print(f"joch runner: secret env {name} is not set; the agent runs without it", file=sys.stderr)
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH") or os.defpath])
        bad = sorted(name for name in env if not valid_env_name(name))
        if bad:
            raise _StartError(f"cannot start the agent: {', '.join(repr(n) for n in bad)} cannot be the name of an "
                              "environment variable (it must be non-empty, without '=' or NUL); rename the key")
        return env

    def report_usage(self, *events: Mapping[str, Any]) -> dict[str, Any]:
        """Meter usage the runner saw itself: ``events`` (``{id, model, inputTokens, outputTokens,
        cachedTokens, costUsd?}``, ids stable across retries) go to the run's callback with the run
        token, exactly as an agent's own report does. The server's answer (what it accepted, the run's
        totals); ``UsageNotReported`` when there is no callback or the server refused them."""
        token = self.secret_values.get(RUN_TOKEN_ENV)
        if not self.api_url or not token:
            raise UsageNotReported("this runner has no callback: it was started without --api-url or a run token")
        return post_usage(callback_url(self.api_url, self.spec.run), token, list(events))

    def secrets(self) -> list[bytes]:
        """The byte strings to redact: each secret value, and the forms tools print it in — without
        surrounding whitespace (a value ending in a newline printed stripped) and line by line (a
        PEM key printed in pieces)."""
        found: set[bytes] = set()
        for name in self.spec.secret_env:
            value = self.secret_values.get(name)
            if value is None:
                continue
            for form in (value, value.strip(), *value.splitlines()):
                form = form.strip() if form is not value else form
                if form:
                    found.add(os.fsencode(form))
                    found.update(encodings(os.fsencode(form)))
        return sorted(found, key=len, reverse=True)

    def _start(self, checkout: workspace.Checkout) -> subprocess.Popen[bytes]:
        if not self.spec.argv:
            raise _StartError("the run has no command (argv is empty)")
        env = self.agent_env()
        self._watch = self._output_watch()
        name = self.spec.argv[0]
        executable = _which(name, env["PATH"], checkout.path)
        if executable is None:
            raise _StartError(_not_runnable(name, checkout.path))
        argv = list(self.spec.argv)
        self._sandbox = sandboxing.record(mode=self.sandbox, user=self.agent_user, network=self.spec.network.mode,
                                          reason=self.sandbox_reason or "the runner was started with --sandbox none")
        # The version is asked of the CLI as the agent would be run: in the sandbox (without a
        # network), not as the runner's possibly privileged user.
        found, described_env = executable, dict(env)
        version_command = [executable, *self.spec.version_args]
        if self.sandbox == "bwrap":
            try:
                self._entered = sandboxing.enter(
                    executable, argv[1:], env=env, checkout=checkout, files=self.files, home=self.files.home,
                    hide=self.hide, user=self.agent_user, network=self.spec.network, say=_say,
                    callback=callback_url(self.api_url, self.spec.run) if self.api_url else None)
            except (sandboxing.SandboxError, OSError) as exc:
                raise _StartError(f"cannot sandbox the agent: {exc}") from None
            version_command = sandboxing.sandboxed(
                executable, list(self.spec.version_args), checkout=checkout, files=self.files, home=self.files.home,
                hide=self.hide, user=self.agent_user, network="off")
            argv, env = self._entered.argv, self._entered.env
            executable = argv[0]
        elif self.spec.network.mode != "on":
            raise _StartError(sandboxing.unenforceable(self.spec.network.mode, self.sandbox_reason))
        self._invocation = self._describe(found, list(self.spec.argv), described_env, checkout.path, version_command)
        self._started_at = time.time()
        try:
            agent = subprocess.Popen(
                argv, executable=executable, cwd=checkout.path, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            if self._entered is not None:
                self._entered.close()
            raise _StartError(f'could not start "{name}": {exc.strerror or exc}') from None
        self._pid = agent.pid
        self.record(RunState(phase="Running", started_at=self._started_at, pid=agent.pid, sandbox=self._sandbox))
        return agent

    def _output_watch(self) -> OutputWatch:
        try:
            parser = agentoutput.parser_for(self.spec.output_format)
        except ValueError as exc:
            raise _StartError(f"outputFormat: {exc}") from None
        patterns = []
        for i, pattern in enumerate(self.spec.success.failure_patterns):
            try:
                patterns.append(re.compile(pattern))
            except re.error as exc:
                raise _StartError(f'successPolicy.failurePatterns[{i}]: "{pattern}" is not a regular expression: '
                                  f"{exc}") from None
        if self.api_url and self.secret_values.get(RUN_TOKEN_ENV):
            self._usage = UsageReporter(self.report_usage, f"a{self.spec.run.attempt}-")
        return OutputWatch(parser, patterns, on_usage=self._on_usage, on_session=self._on_session)

    def _on_usage(self, events: list[dict[str, Any]]) -> None:
        if self._usage is not None:
            self._usage.add(events)
        elif not self._said_no_usage:
            self._said_no_usage = True
            _say("joch runner: the agent's output reports usage, but this runner has no callback to report it to "
                 "(no --api-url or run token)")

    def _on_session(self, session_id: str) -> None:
        """Record the CLI's session id at once (a retry after this runner is killed can resume it)."""
        if self._session is not None and self._session.id == session_id:
            return
        self._session = Session(id=session_id, resumed_from=self._session.resumed_from if self._session else None)
        if self._pid is not None:
            self.record(RunState(phase="Running", started_at=self._started_at, pid=self._pid))

    def _describe(self, executable: str, argv: list[str], env: Mapping[str, str], cwd: Path,
                  version_command: list[str]) -> Invocation:
        """What is about to run, for the record: the argv (secrets redacted, long arguments cut), the
        environment's names, the executable as found on PATH, the sha256 of the file it is (links
        followed) and what it says its version is (``None`` when it would not say)."""
        secrets = self.secrets()
        real = os.path.realpath(executable)
        known = self._known(real)
        if known is not None:
            digest, version = known.get("sha256"), known.get("version")
            if isinstance(version, str):
                version = _redacted(version.encode(), secrets).decode(errors="replace")
        else:
            try:
                digest = _hashed("", Path(real), "").sha256
            except OSError:
                digest = None
            version = self._version(version_command, env, cwd, secrets)
            if digest is not None and (version is not None or not self.spec.version_args):
                self._remember(real, {"sha256": digest, "version": version})
        return Invocation(argv=tuple(_recorded_arg(arg, secrets) for arg in argv), env=tuple(sorted(env)),
                          executable=os.path.abspath(executable), sha256=digest if isinstance(digest, str) else None,
                          version=version if isinstance(version, str) else None)

    # Hashing a CLI of a few hundred MB (Claude Code's, OpenCode's) and asking a Node.js CLI its version
    # takes seconds, every run. Both are kept per file in the runner's cache directory, which agents
    # never see, keyed like git's index keys a file: by its device, inode, size and modification and
    # change times (a change time cannot be set back by anyone writing the file) and the version
    # arguments and confinement it was asked under.

    def _known_key(self, real: str) -> str | None:
        try:
            st = os.stat(real)
        except OSError:
            return None
        who = self.agent_user.uid if self.agent_user is not None else os.getuid()
        key = json.dumps([real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                          list(self.spec.version_args), self.sandbox, who])
        return hashlib.sha256(key.encode()).hexdigest()

    def _known(self, real: str) -> dict[str, Any] | None:
        key = self._known_key(real)
        if key is None:
            return None
        try:
            known = json.loads((self.cache / EXECUTABLES / f"{key}.json").read_bytes())
        except (OSError, ValueError):
            return None
        return known if isinstance(known, dict) else None

    def _remember(self, real: str, known: dict[str, Any]) -> None:
        key = self._known_key(real)
        if key is None:
            return
        directory = self.cache / EXECUTABLES
        temporary = directory / f".{key}.{os.getpid()}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(known))
            os.replace(temporary, directory / f"{key}.json")
        except OSError:  # only a cache: the next run asks again
            with contextlib.suppress(OSError):
                temporary.unlink()

    def _version(self, command: list[str], env: Mapping[str, str], cwd: Path, secrets: list[bytes]) -> str | None:
        """The first line ``executable *version_args`` prints on stdout within ``VERSION_TIMEOUT`` seconds
        (redacted), or on stderr when stdout is empty (a CLI that warns on stderr first, as Codex does
        about its CODEX_HOME, still has its version); None when it is not asked, fails or takes
        longer. Never a reason for the run to fail."""
        if not self.spec.version_args:
            return None
        try:
            proc = subprocess.Popen(command, cwd=cwd, env=dict(env),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, close_fds=True)
        except OSError:
            return None
        try:
            out, err = proc.communicate(timeout=VERSION_TIMEOUT)
        except subprocess.TimeoutExpired:
            signal_group(proc.pid, signal.SIGKILL)
            proc.communicate()
            asked = " ".join(self.spec.version_args)
            _say(f"joch runner: the agent's version ({asked}) took longer than {VERSION_TIMEOUT:g} s; "
                 "no version recorded")
            return None
        finally:
            signal_group(proc.pid, signal.SIGKILL)  # nothing it started lives on
        if proc.returncode != 0:
            return None
        for said in (out, err):
            line = next((line.strip() for line in _redacted(said, secrets).splitlines() if line.strip()), b"")
            if line:
                return _printable(line[:200].decode(errors="replace")) or None
        return None

    def _supervise(self, agent: subprocess.Popen[bytes], log: LogSink) -> _Ending:
        """Copy output to the log until the agent and its group are gone; stop them when asked."""
        if agent.stdout is None:
            raise RuntimeError("the agent's output pipe is missing")
        os.set_blocking(agent.stdout.fileno(), False)
        pipe: int | None = agent.stdout.fileno()
        redactor = Redactor(self.secrets())
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        previous_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        previous_chld = signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select on exit
        deadline = time.monotonic() + self.spec.timeout_seconds
        grace = max(0.0, self.spec.grace_seconds)
        cause: str | None = None
        exit_code: int | None = None
        kill_at: float | None = None
        killed_at: float | None = None
        gone_at: float | None = None
        try:
            while True:
                now = time.monotonic()
                if exit_code is None and cause is None and (self.cancelled or now >= deadline):
                    cause = "cancel" if self.cancelled else "deadline"
                    signal_group(agent.pid, signal.SIGTERM)
                    kill_at = now + grace
                if kill_at is not None and killed_at is None and now >= kill_at:
                    signal_group(agent.pid, signal.SIGKILL)
                    killed_at = now
                for pid, code in _reap():
                    if pid == agent.pid:
                        exit_code = code
                        agent.returncode = code  # so Popen never waits for it again
                if exit_code is not None:
                    alive = group_alive(agent.pid)
                    if alive and kill_at is None:  # the agent ended but left processes behind
                        signal_group(agent.pid, signal.SIGTERM)
                        kill_at = now + grace
                    if not alive:
                        gone_at = gone_at or now
                        if pipe is None or now - gone_at >= _AFTER_KILL:
                            break  # all output read, or the pipe is held by a process outside the group
                    elif killed_at is not None and now - killed_at >= _AFTER_KILL:
                        break  # unkillable or unreaped leftovers: give up waiting for them
                # Leftovers of an ended agent are not our children (no SIGCHLD): poll them closely.
                timeout = _POLL if exit_code is None else 0.05
                for point in (deadline if cause is None else None, kill_at if killed_at is None else None):
                    if point is not None:
                        timeout = max(0.0, min(timeout, point - now))
                readable, _, _ = select.select([fd for fd in (pipe, wake_r) if fd is not None], [], [], timeout)
                if wake_r in readable:
                    _drain(wake_r)
                if pipe is not None and pipe in readable and not _copy(pipe, log, redactor, self._watch):
                    pipe = None
            rest = redactor.flush()
            log.write(rest)
            self._watch.feed(rest)
            self._watch.finish()
        finally:
            signal.signal(signal.SIGCHLD, previous_chld)
            signal.set_wakeup_fd(previous_wakeup)
            os.close(wake_r)
            os.close(wake_w)
        if exit_code is None:
            raise RuntimeError("the agent's exit status was not collected")
        return _Ending(status=exit_code, cause=cause, killed=killed_at is not None)

    def _collect(self, checkout: workspace.Checkout
                 ) -> tuple[tuple[ArtifactRecord, ...], tuple[RefusedArtifact, ...], list[str]]:
        """The stored artifacts, the refused ones (over ``max_artifact_bytes``), and the missing
        outputs."""
        records: list[ArtifactRecord] = []
        refused: list[RefusedArtifact] = []
        missing: list[str] = []
        limit = self.spec.max_artifact_bytes
        outputs = self.files.outputs.resolve()
        for output in self.spec.outputs:
            try:
                source = workspace.subpath(outputs, output.path)
            except workspace.WorkspaceError:
                missing.append(f'"{output.name}" ({output.path}: not inside the outputs directory)')
                continue
            if not source.resolve().is_relative_to(outputs) or not source.resolve().is_file():
                if not output.optional:
                    missing.append(f'"{output.name}" ({output.path})')
                continue
            relative = source.relative_to(outputs).as_posix()
            stored = _store_artifact(output.name, source.resolve(), self.files.artifacts, f"outputs/{relative}",
                                     limit)
            if isinstance(stored, ArtifactRecord):
                records.append(stored)
            else:
                refused.append(stored)
        if checkout.base is not None:
            patch = self.files.artifacts / PATCH
            per_file = self.spec.patch.max_file_bytes
            try:
                omitted = workspace.write_changes(checkout.root, checkout.base, patch, limit=limit,
                                                  git_dir=checkout.git_dir, common_dir=checkout.mirror,
                                                  exclude=self.spec.patch.exclude, max_file_bytes=per_file)
                stored = _hashed(PATCH, patch, PATCH)
                records.append(stored)
                self._omitted = tuple(RefusedArtifact(
                    name=_printable(path), path=_printable(path), size=size,
                    message=f"{size} bytes is over the patch's limit of {per_file} bytes per file "
                            f"(patch.maxFileBytes); it was left out of {PATCH}")
                    for path, size in omitted[:MAX_OMITTED])
                if len(omitted) > MAX_OMITTED:
                    # The record goes into the run's status: an agent that leaves 100,000 large files
                    # must not make it megabytes long.
                    rest = omitted[MAX_OMITTED:]
                    self._omitted += (RefusedArtifact(
                        name="…", path="…", size=sum(size for _, size in rest),
                        message=f"and {len(rest)} more files over the patch's limit of {per_file} bytes per file "
                                f"(patch.maxFileBytes), {sum(size for _, size in rest)} bytes in all: left out of "
                                f"{PATCH}, not listed"),)
                self._changed = stored.size > 0 or bool(omitted)
            except workspace.TooLarge as exc:
                message = (f"the workspace's changes are more than the artifact size limit of {limit} bytes "
                           "(--max-artifact-bytes); they were not stored")
                refused.append(RefusedArtifact(name=PATCH, path=PATCH, size=exc.size, message=message))
                self._changed = True
            except (workspace.WorkspaceError, OSError) as exc:
                with contextlib.suppress(OSError):
                    patch.unlink()  # a partial patch is no use, and on a full disk it holds space
                _say(f"joch runner: no {PATCH}: {exc}")
        return tuple(records), tuple(refused), missing

    def _conclude(self, ending: _Ending, artifacts: tuple[ArtifactRecord, ...],
                  refused: tuple[RefusedArtifact, ...], missing: list[str]) -> int:
        code = ending.exit_code
        forced = " (killed after the grace period)" if ending.killed else ""

        def end(phase: RunnerPhase, reason: str, message: str) -> int:
            return self.finish(phase, reason, message, exit_code=code, artifacts=artifacts, refused=refused)

        if ending.cause == "cancel":
            return end("Cancelled", "Cancelled", f"cancelled; the agent was stopped{forced}")
        if ending.cause == "deadline":
            limit = _seconds(self.spec.timeout_seconds)
            message = f"agent ran longer than its {limit} s deadline and was stopped{forced}"
            return end("Failed", "DeadlineExceeded", message)
        if code != 0:
            full = next((p for p in (self.files.dir, self.root) if disks.is_full(p)), None)
            if full is not None:  # the agent most likely failed for want of space: say that
                message = f"{ending.describe()}; {disks.describe(full, doing='no room in')}"
                return end("Failed", disks.REASON, message)
            if self.spec.success.agent_result and self._watch.error is not None:
                # The CLI said why (Claude Code's is_error result, Gemini CLI's error status): its words
                # say more than the exit code it ended with.
                return end("Failed", "AgentReportedError", f"{ending.describe()}: {_shortened(self._watch.error)}")
            return end("Failed", "AgentFailed", ending.describe())
        too_large = [f'"{r.name}" ({r.path}: {r.message})' for r in refused
                     if any(o.name == r.name and not o.optional for o in self.spec.outputs)]
        if too_large:
            message = f"agent exited with code 0 but its output {', '.join(too_large)} was not stored"
            return end("Failed", "ArtifactTooLarge", message)
        if missing:
            message = f"agent exited with code 0 but did not write output {', '.join(missing)}"
            return end("Failed", "MissingOutput", message)
        policy = self.spec.success
        if policy.agent_result and self._watch.error is not None:
            return end("Failed", "AgentReportedError", f"agent exited with code 0 but reported an error: "
                                                       f"{_printable(_shortened(self._watch.error))}")
        if self._watch.failure is not None:
            return end("Failed", "FailurePattern", f"agent exited with code 0 but {self._watch.failure}")
        stored = {a.name for a in artifacts}
        absent = [name for name in policy.required_artifacts if name not in stored]
        if absent:
            names = ", ".join(f'"{name}"' for name in absent)
            return end("Failed", "MissingOutput", f"agent exited with code 0 but its required output {names} was not "
                                                  "stored (successPolicy.requiredArtifacts)")
        if policy.require_changes and self._changed is False:
            return end("Failed", "NoChanges", "agent exited with code 0 but changed nothing in the repository "
                                              f"({PATCH} is empty; successPolicy.requireChanges)")
        return end("Succeeded", "Completed", "agent exited with code 0")


def _redacted(data: bytes, secrets: list[bytes]) -> bytes:
    redactor = Redactor(secrets)
    return redactor.feed(data) + redactor.flush()


def _recorded_arg(arg: str, secrets: list[bytes]) -> str:
    """An argument as the record shows it: secrets redacted, cut to ``MAX_ARG_BYTES`` with a marker."""
    data = _redacted(os.fsencode(arg), secrets)
    if len(data) <= MAX_ARG_BYTES:
        return data.decode(errors="replace")
    return data[:MAX_ARG_BYTES].decode(errors="ignore") + f"…[joch: {len(data) - MAX_ARG_BYTES} more bytes]"


def _stop_leftover(pgid: int, root: Path) -> None:
    """Kill what is left of an earlier attempt's agent (process group ``pgid``) before its worktree
    (``root``) is worked in again: only when the group's leader still works below ``root``, since a
    group id of a process long gone may belong to another process now."""
    try:
        cwd = os.readlink(f"/proc/{pgid}/cwd")
    except OSError:
        return
    if not Path(cwd).is_relative_to(os.path.realpath(root)):
        return
    signal_group(pgid, signal.SIGKILL)
    until = time.monotonic() + _AFTER_KILL
    while group_alive(pgid) and time.monotonic() < until:
        time.sleep(0.01)



def _shortened(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _seconds(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.3g}"


def _not_runnable(name: str, cwd: Path) -> str:
    if os.sep not in name:
        return f'binary "{name}" not found on PATH'
    candidate = Path(name) if os.path.isabs(name) else cwd / name
    if candidate.is_dir():
        return f'binary "{name}" is a directory'
    if candidate.exists():
        return f'binary "{name}" is not executable (chmod +x it)'
    return f'binary "{name}" not found' + ("" if os.path.isabs(name) else f" (relative to the workspace {cwd})")


def _which(name: str, path: str, cwd: Path) -> str | None:
    if os.sep in name:
        candidate = Path(name) if os.path.isabs(name) else cwd / name
        return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None
    for directory in path.split(os.pathsep):
        candidate = Path(directory or ".", name)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _set_subreaper(on: bool) -> None:
    """While on, orphans of the agent's processes (a daemon that called ``setsid`` and whose parent
    exited) are re-parented to the runner instead of init, so ``_kill_descendants`` can find them."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: only the agent's process group is stopped


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_descendants() -> None:
    """SIGKILL every process below the runner that is still there once the agent's group is gone,
    and reap them: the run is over, and nothing it started may outlive it."""
    deadline = time.monotonic() + _AFTER_KILL
    while True:
        left = _descendants(os.getpid())
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _reap()
        if not left or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def _reap() -> list[tuple[int, int]]:
    """Reap every exited child (the agent; orphans too when we are PID 1 in a container)."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, os.waitstatus_to_exitcode(status)))


def _copy(pipe: int, log: LogSink, redactor: Redactor, watch: OutputWatch) -> bool:
    """Move what the pipe has to the log (and the output watch); False at end of file."""
    while True:
        try:
            chunk = os.read(pipe, _CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        redacted = redactor.feed(chunk)
        log.write(redacted)
        watch.feed(redacted)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _store_artifact(name: str, source: Path, artifacts: Path, relative: str,
                    limit: int | None) -> ArtifactRecord | RefusedArtifact:
    """Store one output under ``artifacts/relative``, or refuse it (and remove it) when it is over
    ``limit``. A hard link, not a copy: the agent is gone and nothing writes the file any more, so
    its one copy on disk serves both names. A file with other links already (the agent linked it
    from elsewhere, where it may still change) is copied, as is one on another filesystem."""
    size = source.stat().st_size
    if limit is not None and size > limit:
        with contextlib.suppress(OSError):
            source.unlink()  # the limit bounds what a run keeps on disk, not just what it lists
        return RefusedArtifact(name=name, path=relative, size=size, message=_over(size, limit))
    dest = artifacts / relative
    dest.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        dest.unlink()
    try:
        if source.stat().st_nlink != 1:
            raise OSError("linked elsewhere")
        os.link(source, dest)
    except OSError as exc:
        if disks.is_full_error(exc):
            raise _naming(exc, dest) from None
        try:
            shutil.copyfile(source, dest)
        except OSError as copying:
            with contextlib.suppress(OSError):
                dest.unlink()
            raise _naming(copying, dest) from None
    return _hashed(name, dest, relative)


def _over(size: int, limit: int | None) -> str:
    return (f"{size} bytes is over the artifact size limit of {limit} bytes (--max-artifact-bytes); "
            "it was not stored")


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` with ``path`` as its file name, where it had none (``os.write`` gives none)."""
    if exc.filename is not None:
        return exc
    return type(exc)(exc.errno, exc.strerror, str(path))




class LogSink:
    """The agent's log, held to ``limit`` bytes (None: no limit) and the two lines that say so.

    The first half of the limit is written as it comes, so ``joch logs -f`` shows it live. Past
    that, output goes to ``log.tail``, a ring that keeps the last half; when the agent ends it is
    appended to the log, after a line saying how many bytes were cut (nothing is cut, and no line is
    written, when all of it fits). The log only ever grows, so a reader following it by offset
    never reads a byte twice. Writes that fail name their file (``OSError.filename``)."""

    def __init__(self, files: RunFiles, limit: int | None) -> None:
        self.files = files
        self.limit = limit if limit is None else max(limit, 2)
        self.head = (self.limit or 0) // 2
        self.tail = (self.limit or 0) - self.head
        self._written = 0       # bytes of output that went to the log as they came
        self._spooled = 0       # bytes of output past the head (the ring holds the last `tail` of them)
        self._last = b"\n"      # the log's last byte, so the notes start on a line of their own
        self._log = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._ring: int | None = None
        self.echo: int | None = None  # also written here as it comes (a Job's runner: its stdout, the Pod's log)

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self.echo is not None:
            with contextlib.suppress(OSError):
                _write_all(self.echo, data)
        if self.limit is None or self._written < self.head:
            take = len(data) if self.limit is None else min(len(data), self.head - self._written)
            self._append(data[:take])
            self._written += take
            data = data[take:]
        if data:
            self._spool(data)

    def _append(self, data: bytes) -> None:
        try:
            _write_all(self._log, data)
        except OSError as exc:
            raise _naming(exc, self.files.log) from None
        if data:
            self._last = data[-1:]

    def _note(self, text: str) -> None:
        self._append((b"" if self._last == b"\n" else b"\n") + f"[joch: {text}]\n".encode())

    def _spool(self, data: bytes) -> None:
        if self._ring is None:
            try:
                self._ring = os.open(self.files.log_tail, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            except OSError as exc:
                raise _naming(exc, self.files.log_tail) from None
        before = self._spooled
        self._spooled += len(data)
        if before <= self.tail < self._spooled:
            self._note(f"the output passed the log limit of {self.limit} bytes (--max-log-bytes): it is cut "
                       f"from here, and its last {self.tail} bytes are added when the agent ends")
        skip = max(0, len(data) - self.tail)  # only the last `tail` bytes of a chunk can survive
        position, view = (before + skip) % self.tail, memoryview(data)[skip:]
        try:
            while view:
                n = os.pwrite(self._ring, view[:self.tail - position], position)
                view, position = view[n:], (position + n) % self.tail
        except OSError as exc:
            raise _naming(exc, self.files.log_tail) from None

    def finish(self) -> None:
        """Append the held-back end of the output (and say what was cut), and make the log durable."""
        if self._spooled > self.tail:
            self._note(f"{self._spooled - self.tail} bytes of output were cut here; the log keeps the first "
                       f"{self.head} and the last {self.tail} bytes (--max-log-bytes {self.limit})")
            start = self._spooled % self.tail  # the oldest byte the ring still holds
            self._copy_ring(start, self.tail - start)
            self._copy_ring(0, start)
        else:
            self._copy_ring(0, self._spooled)
        try:
            os.fsync(self._log)
        except OSError as exc:
            raise _naming(exc, self.files.log) from None

    def _copy_ring(self, offset: int, length: int) -> None:
        if self._ring is None:
            return
        end = offset + length
        while offset < end:
            chunk = os.pread(self._ring, min(_CHUNK, end - offset), offset)
            if not chunk:
                return
            self._append(chunk)
            offset += len(chunk)

    def close(self) -> None:
        os.close(self._log)
        if self._ring is not None:
            os.close(self._ring)
            self._ring = None
            with contextlib.suppress(OSError):
                self.files.log_tail.unlink()


def _hashed(name: str, path: Path, relative: str) -> ArtifactRecord:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return ArtifactRecord(name=name, path=relative, sha256=digest.hexdigest(), size=size)


# --- the command ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, *, secrets: Mapping[str, str] | None = None) -> int:
    """``joch runner``; ``secrets`` are the secret values when the caller has them in memory (a
    forked runner), else they come from stdin (``--secrets-stdin``) or the environment."""
    parser = argparse.ArgumentParser(
        prog="joch runner", description="Run one agent run attempt described by a runner spec, and record it.")
    parser.add_argument("--spec", required=True, metavar="PATH",
                        help="the run's spec.json; its directory is the run directory")
    parser.add_argument("--workspace", metavar="PATH", help="the workspace root (default: workspace/ in the run "
                        "directory)")
    parser.add_argument("--cache", metavar="PATH", help="the repository mirrors (default: mirrors/ in the run "
                        "directory)")
    parser.add_argument("--sandbox", choices=SANDBOXES, default="none",
                        help="run the agent under bubblewrap (bwrap), or as a plain child process (none)")
    parser.add_argument("--hide", action="append", default=[], metavar="PATH",
                        help="with --sandbox bwrap: a directory the agent sees as empty (the data dir); repeatable")
    parser.add_argument("--agent-user", metavar="USER[:GROUP]",
                        help="with --sandbox bwrap, when this runner is root: the user (name or uid) the agent "
                             "runs as (default nobody, 65534; root: no change)")
    parser.add_argument("--sandbox-reason", metavar="TEXT",
                        help="with --sandbox none: why, for the run's record (the server's --sandbox auto found "
                             "no bubblewrap)")
    parser.add_argument("--secrets-stdin", action="store_true",
                        help="read the secret values as one JSON object from stdin, not from the environment")
    parser.add_argument("--api-url", metavar="URL",
                        help="the Joch server as this runner reaches it: the agent gets JOCH_API_URL and the "
                             "run's callback URL for reporting usage")
    parser.add_argument("--report", action="store_true",
                        help="also send every record, the artifacts and the log to the Joch API at --api-url "
                             "(a runner whose files the server cannot read: a Kubernetes Job's container)")
    parser.add_argument("--spec-json", metavar="JSON",
                        help="the spec itself, written to --spec first (a container has no file from the runtime)")
    args = parser.parse_args(argv)
    if args.spec_json is not None and not Path(args.spec).exists():
        Path(args.spec).parent.mkdir(parents=True, exist_ok=True)
        write_durably(Path(args.spec), args.spec_json.encode())
    if args.secrets_stdin and secrets is None:
        try:
            given = json.loads(sys.stdin.buffer.read() or b"{}")
        except ValueError as exc:
            print(f"joch runner: --secrets-stdin: stdin is not a JSON object: {exc}", file=sys.stderr)
            return 2
        if not isinstance(given, dict):
            print("joch runner: --secrets-stdin: stdin is not a JSON object", file=sys.stderr)
            return 2
        secrets = {str(k): str(v) for k, v in given.items()}
    files = RunFiles(Path(args.spec).absolute().parent)
    if files.state.exists():
        print(f"joch runner: {files.state} exists: this run attempt was executed already", file=sys.stderr)
        return 2
    try:
        spec = RunnerSpec.from_json(Path(args.spec).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        message = f"cannot read the runner spec {args.spec}: {exc}"
        print(f"joch runner: {message}", file=sys.stderr)
        if files.dir.is_dir():
            write_state(files.state, RunState(phase="Failed", reason="StartError", message=message,
                                              finished_at=time.time()), runner_pid=os.getpid())
        return 2
    root = Path(args.workspace or files.dir / "workspace")
    cache = Path(args.cache or files.dir / "mirrors")
    try:
        user = sandboxing.agent_user(args.agent_user) if args.sandbox == "bwrap" else None
    except sandboxing.SandboxError as exc:
        print(f"joch runner: {exc}", file=sys.stderr)
        write_state(files.state, RunState(phase="Failed", reason="StartError", message=str(exc),
                                          finished_at=time.time()), runner_pid=os.getpid())
        return 2
    runner = Runner(spec, files, root=root, cache=cache, environ=os.environ, secrets=secrets, sandbox=args.sandbox,
                    hide=[Path(h) for h in args.hide], api_url=args.api_url, agent_user=user,
                    sandbox_reason=args.sandbox_reason, report=args.report)
    handlers = {signum: signal.signal(signum, runner._on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            return runner.run()
        except _Cancelled:  # the signal arrived between two steps of preparing
            return runner.finish("Cancelled", "Cancelled", "cancelled before the agent started")
        except OSError as exc:
            if not disks.is_full_error(exc):
                raise
            return runner.finish_disk_full(exc)
    except Exception as exc:  # noqa: BLE001 - a bug in the runner still ends the record
        if disks.is_full_error(exc):
            # Not even the end could be recorded: the runtime sees the runner gone and the disk full.
            _say(f"joch runner: {disks.describe(getattr(exc, 'filename', None) or files.dir)}: the run's end "
                 "could not be recorded")
            return 1
        import traceback  # only on this path: start-up time matters

        traceback.print_exc()
        return runner.finish("Failed", "RunnerError", f"joch runner failed: {exc}")
    finally:
        release_reserve(files)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


# --- the fork server ------------------------------------------------------------------------------

FORK_SERVER = "--fork-server"


def serve_forks() -> int:
    """``python -m joch.runtime.runner --fork-server``: start runners by forking this interpreter.

    A runner's own work is small next to starting Python and importing what it needs, so the local
    runtime keeps one of these per server and asks it for runners instead of executing a new
    interpreter each time. Requests arrive on stdin, one JSON object per line: ``{"spec": PATH,
    "log": PATH, "args": [...], "env": {...}, "secrets": {...}}`` (``args`` follow ``--spec``).
    Each is answered on stdout with ``{"pid": N, "start": T}`` (``T`` is the process's start time,
    its identity should the pid be reused) or ``{"error": "..."}`` when nothing was started;
    ``{"exited": N}`` reports a runner reaped. The first line is ``{"ready": N}``. The end of stdin
    ends the fork server, never the runners: each is in its own session.

    A forked runner is what ``main(["--spec", PATH])`` in a new interpreter would be: cwd the run
    directory, stdin ``/dev/null``, stdout and stderr appended to ``log``, ``env`` its whole
    environment, default signal handling; ``secrets`` arrive through the pipe and stay in its memory
    (never a file, nor an environment: a forked process's ``/proc/<pid>/environ`` is the one this
    fork server was executed with, which is why the runtime starts it with ``runner_env``). This
    process stays single-threaded, which is what makes forking it safe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's terminal is not ours to obey
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select when a runner ends
    pending = b""
    try:
        _write_all(1, json.dumps({"ready": os.getpid()}).encode() + b"\n")
        while True:
            for pid, _ in _reap():
                _write_all(1, json.dumps({"exited": pid}).encode() + b"\n")
            readable, _, _ = select.select([0, wake_r], [], [])
            if wake_r in readable:
                _drain(wake_r)
            if 0 not in readable:
                continue
            chunk = os.read(0, _CHUNK)
            if not chunk:
                return 0
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line.strip():
                    _write_all(1, _fork_runner(line, (wake_r, wake_w)).encode() + b"\n")
    except BrokenPipeError:  # the server is gone
        return 0


def process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, from /proc): with the pid, a process's identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state ppid ... starttime is the 20th
    return int(fields[19]) if len(fields) > 19 else None


def _fork_runner(line: bytes, inherited: tuple[int, ...]) -> str:
    try:
        request = json.loads(line)
        spec, log, env = str(request["spec"]), str(request["log"]), {str(k): str(v) for k, v in request["env"].items()}
        args = [str(a) for a in request.get("args") or ()]
        secrets = {str(k): str(v) for k, v in (request.get("secrets") or {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return json.dumps({"error": f"not a runner request: {exc}"})
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # The runner is born in its run directory: the runtime tells a runner from another process
        # by its working directory, from the moment it has the pid.
        os.chdir(os.path.dirname(spec))
    except OSError as exc:
        return json.dumps({"error": f"no run directory for {spec}: {exc}"})
    try:
        pid = os.fork()
    except OSError as exc:
        os.chdir("/")
        return json.dumps({"error": f"could not fork a runner: {exc}"})
    if pid == 0:
        _become_runner(spec, log, env, inherited, args=args, secrets=secrets)
    os.chdir("/")
    return json.dumps({"pid": pid, "start": process_start(pid)})


def _become_runner(spec: str, log: str, env: dict[str, str], inherited: tuple[int, ...], *,
                   args: list[str], secrets: dict[str, str]) -> NoReturn:
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in inherited:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd, target in ((null, 0), (out, 1), (out, 2)):  # also closes the pipes to the server
            os.dup2(fd, target)
        os.close(null)
        os.close(out)
        os.chdir(os.path.dirname(spec))
        os.environ.clear()
        os.environ.update(env)
        code = main(["--spec", spec, *args], secrets=secrets)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - whatever happens, this process must not return to the loop
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


if __name__ == "__main__":
    sys.exit(serve_forks() if sys.argv[1:] == [FORK_SERVER] else main())
