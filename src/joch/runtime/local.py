"""The local runtime: each run attempt is a ``joch runner`` process on this machine, in a worktree.

Layout below ``root`` (the server's data directory)::

    runs/<uid>/<attempt>/     the run directory (see ``runner``): spec.json, state.json, log, inputs/,
                              outputs/, artifacts/, plus ref.json (the reference submit returned) and
                              runner.log (the runner's own stderr: a traceback is a bug)
    workspaces/<uid>-<attempt>/   the git worktree (or empty directory) the agent works in; an attempt that
                              resumes another (``RunnerSpec.resume``) works in that one's (``resumed_root``)
    mirrors/<key>.git         bare mirrors shared by all runs of a repository (see ``workspace``)

Decisions:

* **Submitting is claiming a directory.** ``os.mkdir`` of the run directory is atomic, so of two
  submits for the same ``(uid, attempt)`` (two threads, two server instances, a server that crashed
  after submitting and submits again after restart) exactly one starts a runner; the others read the
  reference it leaves in ``ref.json``. A claim whose ``ref.json`` never appears (the claimant died
  between ``mkdir`` and spawning) is reported ``Lost``.
* **Runners are forked, not executed.** Starting Python and importing the runner costs more than
  a run of a quick agent does, so runners come from a fork server (``runner.serve_forks``) that this
  instance starts on first use and talks to through a pipe: a runner costs a ``fork``. Where that
  cannot work (no /proc, no fork, the fork server will not start) runners are executed directly,
  ``python -m joch.runtime.runner --spec ...``. A fork server that took a request and died without
  answering may have started the runner: rather than risk a second one, submit waits for the record
  a runner writes first and takes its pid from there (no record: the run is ``Lost``).
* **Runners outlive the server.** A runner starts in its own session, so neither Ctrl-C on the
  server's terminal nor the server's death reaches it (nor the fork server's end); it records its
  outcome on disk, and a new ``LocalRuntime`` on the same root re-adopts it the first time it is
  asked for its ``status``.
* **A dead runner is detected, not guessed.** A run is ``Lost`` only when its record is unfinished
  and the runner is no longer running: its pid is gone, a zombie, or a process other than the one
  the reference names (pids are reused): one with another start time (``runnerStart``, from /proc),
  or for a reference without one, a process whose command line does not name this run's spec. Its
  agent's process group is then killed and ``Lost`` recorded, so the answer is the same the next
  time and for every instance. Writes to a record from here take a flock on the run directory's
  ``state.lock``; the runner itself never writes once it is gone.
* **Cancel is a marker, then a signal.** ``cancel`` leaves ``cancel-requested`` in the run directory
  and sends SIGTERM to the runner, which stops the agent's group (SIGTERM, SIGKILL after the grace
  period) and records ``Cancelled``. The marker covers a runner too young to have its signal
  handler (SIGTERM kills it outright: the run is then recorded ``Cancelled`` here, not ``Lost``).
  A run whose runner is gone is cancelled here: its agent's group is killed at once.
* **One monitor thread** reaps this instance's runner children (no zombies; the fork server reaps
  its own) and polls the state files of unfinished runs it tracks (``(inode, mtime, size)``, every
  ``poll_interval``, and at once when the fork server reports a runner ended), calling the
  ``subscribe`` callbacks when a record changed or a runner vanished; a run stops being tracked once
  its finished record was reported.
* **A full disk is not a lost runner.** A runner that is gone without a finished record, on a
  filesystem with (next to) no space left, ends its run ``Failed`` with reason ``DiskFull`` (it most
  likely died writing), not ``Lost``. When even that record cannot be written, the ending is kept in
  memory (the same answer every time), logged once, and written when space returns; the monitor
  logs a failure that repeats at every poll once, not every ``poll_interval``.
* **A resumed attempt works in the worktree of the attempt it continues** (``RunnerSpec.resume``:
  ``--workspace`` is that directory, and ``workspace(..., resume=...)`` says so to the templates), so
  the caller must not ``cleanup`` that attempt before: the run controller skips it when it retries
  with a resume. Cleaning up either attempt removes the shared worktree (``resumed_root``).
* **Agents are sandboxed with bubblewrap** where it works (``sandbox``; ``sandbox.sandboxed`` says
  what the agent sees): a PID namespace hides every other process, the data directory is an empty
  tmpfs with the run's own worktree, mirror, outputs and HOME mounted back; a root server's agents
  run as ``agent_user`` (nobody by default), and each Agent's network is on, off or limited. Without
  it, an agent runs as this user and can read what this user can; ``auto`` warns once about that at
  start, and each run's record says why (``Sandbox.reason``).
* **Nothing of the server's reaches a runner's environment or command line.** An agent can read
  ``/proc/<pid>/environ`` and ``cmdline`` of its ancestors, so runners and the fork server start with
  ``runner.runner_env`` (PATH, HOME, locale, proxies: no ``JOCH_STORE``), their settings are command
  line options (paths), and secret values travel through a pipe: the fork server's request pipe (the
  forked runner keeps them in memory) or, for a runner executed directly, its stdin. Never spec.json,
  ref.json or state.json either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from joch.runtime import disks, runner, workspace
from joch.runtime.base import (
    LOG_IDLE_SECONDS,
    ArtifactRecord,
    GitSource,
    Ref,
    Resume,
    RunId,
    RunnerSpec,
    RunState,
    Runtime,
    Workspace,
    run_dir_name,
)
from joch.runtime.sandbox import SandboxError, parse_agent_user, sandbox_problem

logger = logging.getLogger(__name__)

TYPE = "local"
_REF_WAIT = 10.0        # how long a second submit waits for the first one's ref.json
_CLEANUP_WAIT = 5.0     # beyond the grace period, how long cleanup waits for a cancelled run to end


@dataclass
class _Tracked:
    run: RunId
    files: runner.RunFiles
    ref: Ref
    seen: tuple[int, int, int] | None = None
    child: subprocess.Popen[bytes] | None = None
    ended: bool = False  # an ending was reported (it may be waiting in `_unwritten` for disk space)


@dataclass
class _Monitor:
    tracked: dict[str, _Tracked] = field(default_factory=dict)
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    callbacks: list[Callable[[RunId], None]] = field(default_factory=list)


class LocalRuntime(Runtime):
    type = TYPE

    def __init__(self, root: Path, *, poll_interval: float = 0.05, sandbox: str = "none",
                 hide: tuple[Path, ...] = (), api_url: str | None = None, agent_user: str | None = None,
                 sandbox_reason: str | None = None) -> None:
        """``sandbox``: ``bwrap`` runs every agent under bubblewrap (``ValueError`` when it does not work
        here), ``auto`` does so when it works and otherwise logs a warning and runs agents as plain
        processes, ``none`` never sandboxes. ``hide``: paths the sandboxed agent sees empty, besides
        ``root``. ``api_url``: the Joch server as agents on this machine reach it, handed to each
        runner (``--api-url``) so its agent can report usage (None: agents get no callback).
        ``agent_user``: whom a sandboxed agent runs as when this process is root (``NAME|UID[:GID]``,
        default nobody: ``sandbox.AgentUser``; ``ValueError`` when there is no such user).
        ``sandbox_reason``: why agents are not sandboxed, for each run's record (``Sandbox.reason``),
        when ``sandbox`` is ``none`` because the caller's ``auto`` found no bubblewrap."""
        self.root = Path(root).resolve()
        self.api_url = api_url
        self.poll_interval = poll_interval
        self.sandbox, found = sandbox_choice(sandbox)
        self.sandbox_reason = sandbox_reason or found
        try:
            self.agent_user = str(parse_agent_user(agent_user)) if agent_user else None
        except SandboxError as exc:
            raise ValueError(str(exc)) from None
        self.hide = (self.root, *(Path(h).resolve() for h in hide))
        self._lock = threading.Lock()
        self._submitting: set[Path] = set()
        self._monitor = _Monitor()
        self._unwritten: dict[Path, RunState] = {}  # endings decided here that a full disk kept off disk
        self._stop = threading.Event()
        self._wake = threading.Event()  # a runner ended: look now rather than at the next poll
        self._forks = _ForkServer(on_exit=self._wake.set)
        self._thread = threading.Thread(target=self._watch, name="joch-local-runtime", daemon=True)
        self._thread.start()

    # --- paths --------------------------------------------------------------------------------------

    @property
    def mirrors(self) -> Path:
        return self.root / "mirrors"

    def files(self, run: RunId) -> runner.RunFiles:
        _check_run(run)
        return runner.RunFiles(self.root / "runs" / run_dir_name(run))

    def workspace_root(self, run: RunId) -> Path:
        _check_run(run)
        return self.root / "workspaces" / f"{run.uid}-{run.attempt}"

    def resumed_root(self, run: RunId, resume: Resume | None) -> Path:
        """The workspace root attempt ``run`` works in: its own (``workspace_root``), or with ``resume``
        the root of the attempt it continues (and that one's, if it continued another): the same
        directory, so a CLI that keys its sessions by working directory finds its session there."""
        while resume is not None and 1 <= resume.attempt < run.attempt:
            run = dataclasses.replace(run, attempt=resume.attempt)
            earlier = _spec_of(self.files(run))
            resume = earlier.resume if earlier is not None else None
        return self.workspace_root(run)

    def _root_of(self, files: runner.RunFiles) -> Path:
        """The workspace root of the attempt whose directory is ``files`` (``resumed_root``)."""
        spec = _spec_of(files)
        return self.resumed_root(_run_of(files), spec.resume if spec is not None else None)

    def workspace(self, run: RunId, git: GitSource | None, *, resume: Resume | None = None) -> Workspace:
        """The run's paths (``resume``: see ``resumed_root``); ``ValueError`` when ``git.path`` leaves
        the checkout or the uid cannot name a directory."""
        if git is not None and (inside := self._in_data_dir(git.url)) is not None:
            raise ValueError(f'repository "{git.url}" is inside this server\'s data directory ({inside}): its '
                             "mirrors and other runs' worktrees are not repositories a run may check out")
        try:
            return runner.workspace_of(self.files(run), self.resumed_root(run, resume), git)
        except workspace.WorkspaceError as exc:
            raise ValueError(str(exc)) from None

    def _in_data_dir(self, url: str) -> Path | None:
        """The part of the data directory (mirrors, workspaces, runs) that ``url``, a local path or
        ``file://`` URL, is in; else None."""
        if url.startswith("file://"):
            url = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
        if not os.path.isabs(url):
            return None
        where = Path(url).resolve()
        return next((part for part in (self.mirrors, self.root / "workspaces", self.root / "runs")
                     if where.is_relative_to(part)), None)

    # --- submit -------------------------------------------------------------------------------------

    def submit(self, spec: RunnerSpec, *, secrets: Mapping[str, str] | None = None) -> Ref:
        """Start a runner for the attempt, or return the reference of the one started already.

        Only ``secrets`` named in ``spec.secret_env`` are passed on; others are ignored."""
        files = self.files(spec.run)
        # Logs, artifacts and runner records are this user's only (other users of the host included),
        # and so are worktrees and mirrors: a root server's agents own theirs (sandbox.AgentUser), and
        # another process of that uid on the host (nobody's) must not get to them.
        for private in (self.root / "runs", self.root / "workspaces", self.mirrors):
            private.mkdir(mode=0o700, parents=True, exist_ok=True)
            if private.stat().st_mode & 0o077:
                private.chmod(0o700)
        files.dir.parent.mkdir(mode=0o700, exist_ok=True)
        try:
            os.mkdir(files.dir, 0o700)
        except FileExistsError:
            existing = self._existing_ref(spec.run, files)
            self._track(spec.run, files, existing)
            return existing
        with self._lock:
            self._submitting.add(files.dir)
        try:
            return self._start(spec, files, secrets)
        finally:
            with self._lock:
                self._submitting.discard(files.dir)

    def _start(self, spec: RunnerSpec, files: runner.RunFiles, secrets: Mapping[str, str] | None) -> Ref:
        env = runner.runner_env(os.environ)
        args = ["--workspace", str(self.resumed_root(spec.run, spec.resume)), "--cache", str(self.mirrors)]
        if self.api_url:
            args += ["--api-url", self.api_url]
        if self.sandbox == "bwrap":
            args += ["--sandbox", "bwrap"]
            for path in self.hide:
                args += ["--hide", str(path)]
            if self.agent_user:
                args += ["--agent-user", self.agent_user]
        elif self.sandbox_reason:
            args += ["--sandbox-reason", self.sandbox_reason]
        given = {name: value for name, value in (secrets or {}).items() if name in spec.secret_env}
        child: subprocess.Popen[bytes] | None = None
        pid: int | None
        try:
            runner.write_durably(files.spec, spec.to_json().encode())
            try:
                pid, start = self._forks.spawn(spec=files.spec, log=files.dir / "runner.log", env=env, args=args,
                                               secrets=given)
            except _NotStarted as exc:
                if exc.reason:
                    logger.warning("local runtime: the runner fork server failed (%s); starting runners directly",
                                   exc.reason)
                child = self._start_runner(files, env, args, given)
                pid, start = child.pid, runner.process_start(child.pid)
        except _Unanswered:
            # The fork server took the request and died: a runner may exist. Starting another could run
            # the attempt twice, so look for the record a runner writes first; without one, it is Lost.
            pid, start = _recorded_runner(files)
        except BaseException:
            shutil.rmtree(files.dir, ignore_errors=True)  # give the claim back: nothing was started
            raise
        ref: Ref = {"type": TYPE, "id": _ref_id(spec.run), "runnerPid": pid, "runnerStart": start,
                    "dir": str(files.dir), "host": socket.gethostname()}
        runner.write_durably(files.dir / "ref.json", json.dumps(ref, sort_keys=True).encode())
        self._track(spec.run, files, ref, child=child)
        return ref

    @staticmethod
    def _start_runner(files: runner.RunFiles, env: Mapping[str, str], args: list[str],
                      secrets: Mapping[str, str]) -> subprocess.Popen[bytes]:
        with open(files.dir / "runner.log", "ab") as runner_log:
            child = subprocess.Popen(
                [sys.executable, "-m", "joch.runtime.runner", "--spec", str(files.spec), *args, "--secrets-stdin"],
                cwd=files.dir, env=env, stdin=subprocess.PIPE, stdout=runner_log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )
        # The secrets go through a pipe the runner reads at once: not its environment or command line
        # (which the agent can read in /proc), not a file.
        assert child.stdin is not None
        with contextlib.suppress(BrokenPipeError), child.stdin:
            child.stdin.write(json.dumps(dict(secrets)).encode())
        return child

    def _existing_ref(self, run: RunId, files: runner.RunFiles) -> Ref:
        waited_until = time.monotonic() + _REF_WAIT
        while True:
            saved = _read_json(files.dir / "ref.json")
            if saved is not None:
                return saved
            if time.monotonic() >= waited_until:
                # The claimant died before it started a runner: status() will say Lost.
                return {"type": TYPE, "id": _ref_id(run), "runnerPid": None, "dir": str(files.dir)}
            time.sleep(0.02)

    # --- status -------------------------------------------------------------------------------------

    def elsewhere(self, ref: Ref) -> str | None:
        """Why ``ref`` is not this runtime's to see (another host, or another data dir on this one),
        or None. Such a run's runner may well be alive: it is not Lost, only out of reach."""
        host = ref.get("host")
        if isinstance(host, str) and host != socket.gethostname():
            return f"it runs on host {host}, and this server runs on {socket.gethostname()}"
        where = ref.get("dir")
        if isinstance(where, str) and not Path(where).is_relative_to(self.root):
            return f"its files are under {where}, outside this server's data dir {self.root}"
        return None

    def status(self, ref: Ref) -> RunState:
        away = self.elsewhere(ref)
        if away is not None:
            return RunState(phase="Running", reason="Unreachable",
                            message=f"the local runtime cannot see this run: {away}")
        files = self._files_of(ref)
        state = runner.read_state(files.state)
        if state is not None and state.finished:
            return state
        if ref.get("runnerPid") is None and self._starting(files):
            # Claimed, runner not recorded yet: a submit is under way (here, or in a process that
            # started it moments ago). Judging it Lost now would record an end the runner then obeys.
            return state or RunState(phase="Preparing")
        if not files.spec.exists():
            return RunState(phase="Lost", reason="RunnerLost",
                            message=f"no record of run {ref.get('id')} under {self.root} (was it removed?)")
        if self._runner_alive(ref, files):
            with self._lock:
                tracked = _ref_id_of(files) in self._monitor.tracked
            if not tracked:  # a run this instance did not submit: adopt it
                self._track(_run_of(files), files, ref)
            return state or RunState(phase="Preparing")
        return self._runner_gone(files)

    def _starting(self, files: runner.RunFiles) -> bool:
        if (files.dir / "ref.json").exists():
            return False
        with self._lock:
            if files.dir in self._submitting:
                return True
        try:
            age = time.time() - files.dir.stat().st_mtime
        except FileNotFoundError:
            return False
        return age < _REF_WAIT

    def _runner_alive(self, ref: Ref, files: runner.RunFiles) -> bool:
        pid, start = _runner_identity(ref, files)
        return pid is not None and _is_runner(pid, files.spec, start)

    def _runner_gone(self, files: runner.RunFiles) -> RunState:
        """The runner is gone without a finished record: record Lost, DiskFull or Cancelled."""
        with _record_lock(files):
            record = runner.read_record(files.state) or {}
            with self._lock:
                unwritten = self._unwritten.get(files.dir)
            if unwritten is not None:  # decided before (by another thread, maybe): the same answer
                return self._record_ending(files, unwritten, record)
            state = runner.read_state(files.state)
            if state is not None and state.finished:
                return state  # it finished after all, just before it exited
            state = state or RunState(phase="Preparing")
            if state.pid is not None:
                runner.signal_group(state.pid, signal.SIGKILL)
            if files.cancel.exists():
                said = "cancelled before the agent started" if state.pid is None else "cancelled; the agent was stopped"
                ended = dataclasses.replace(state, phase="Cancelled", reason="Cancelled", message=said,
                                            finished_at=time.time())
            elif (full := _full_disk(files, self._root_of(files))) is not None:
                where = "before it started the agent" if state.pid is None else "while the agent ran; agent killed"
                said = f"the runner ended without recording an outcome {where}, and {full}"
                ended = dataclasses.replace(state, phase="Failed", reason=disks.REASON, message=said,
                                            finished_at=time.time())
            else:
                where = "before it started the agent" if state.pid is None else "while the agent ran; agent killed"
                said = f"the runner process vanished {where}{_last_words(files)}"
                ended = dataclasses.replace(state, phase="Lost", reason="RunnerLost", message=said,
                                            finished_at=time.time())
            return self._record_ending(files, ended, record)

    def _record_ending(self, files: runner.RunFiles, ended: RunState, record: dict[str, Any]) -> RunState:
        """Write the ending decided here; on a full disk keep it (once logged) to write it later."""
        try:
            runner.record_state(files, ended, runner_pid=record.get("runner_pid"))
        except OSError as exc:
            if not disks.is_full_error(exc):
                raise
            with self._lock:
                first = files.dir not in self._unwritten
                kept = self._unwritten.setdefault(files.dir, ended)
            if first:
                logger.warning("local runtime: run %s ended %s (%s), but %s; it is recorded once space returns",
                               _ref_id_of(files), ended.reason, ended.message, disks.describe(files.state))
            return kept
        with self._lock:
            self._unwritten.pop(files.dir, None)
        return ended

    def storage_problem(self) -> str | None:
        free = disks.free_bytes(self.root)
        if free is None or free >= disks.LOW_SPACE:
            return None
        return f"the disk holding the runs' files is full: {self.root} has {free} bytes free; free space there"

    # --- cancel -------------------------------------------------------------------------------------

    def cancel(self, ref: Ref) -> None:
        if self.elsewhere(ref) is not None:
            return
        files = self._files_of(ref)
        state = runner.read_state(files.state)
        if (state is not None and state.finished) or not files.dir.is_dir():
            return
        files.cancel.touch()
        pid, start = _runner_identity(ref, files)
        if pid is not None and _is_runner(pid, files.spec, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            return
        self._runner_gone(files)

    # --- logs and artifacts -------------------------------------------------------------------------

    def logs(self, ref: Ref, *, follow: bool = False, offset: int = 0) -> Iterator[bytes]:
        files = self._files_of(ref)
        position = offset
        quiet_since = time.monotonic()
        while True:
            finished = not follow or self.status(ref).finished
            try:
                with open(files.log, "rb") as log:
                    log.seek(position)
                    while chunk := log.read(65536):
                        position += len(chunk)
                        quiet_since = time.monotonic()
                        yield chunk
            except FileNotFoundError:
                pass
            if finished:
                return  # everything written before the record ended has been read
            if time.monotonic() - quiet_since >= LOG_IDLE_SECONDS:
                quiet_since = time.monotonic()
                yield b""  # the reader may have gone: let it stop here (see Runtime.logs)
            time.sleep(self.poll_interval)

    def open_artifact(self, ref: Ref, name: str) -> tuple[ArtifactRecord, BinaryIO]:
        files = self._files_of(ref)
        state = runner.read_state(files.state)
        for record in state.artifacts if state is not None else ():
            if record.name == name:
                return record, open(files.artifacts / record.path, "rb")  # the caller closes it
        raise KeyError(f"run {ref.get('id')} has no artifact {name!r}")

    # --- cleanup ------------------------------------------------------------------------------------

    def cleanup(self, ref: Ref, *, keep_records: bool = True) -> None:
        if self.elsewhere(ref) is not None:
            return
        files = self._files_of(ref)
        if not files.dir.is_dir():
            return
        if not self.status(ref).finished:
            self.cancel(ref)
            self._wait_finished(ref, files)
        run = _run_of(files)
        spec = _spec_of(files)
        workspace.remove(cache=self.mirrors, git=spec.git if spec else None, root=self._root_of(files))
        # The attempt's HOME goes with its worktree: CLIs keep what they were given there (Codex's
        # shell snapshots hold its API key), and a later attempt that resumes copied it already.
        shutil.rmtree(files.home, ignore_errors=True)
        if not keep_records:
            # The run is going away: every attempt's records go with it (earlier attempts of a
            # retried run are not named by the latest reference).
            for attempt_dir in sorted(files.dir.parent.iterdir()):
                if not attempt_dir.name.isdigit():
                    continue
                earlier = RunId(namespace="", name="", uid=run.uid, attempt=int(attempt_dir.name))
                if earlier.attempt != run.attempt:
                    earlier_spec = _spec_of(self.files(earlier))
                    workspace.remove(cache=self.mirrors, git=earlier_spec.git if earlier_spec else None,
                                     root=self.workspace_root(earlier))
                with self._lock:
                    self._monitor.tracked.pop(_ref_id(earlier), None)
                shutil.rmtree(attempt_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                files.dir.parent.rmdir()

    def _wait_finished(self, ref: Ref, files: runner.RunFiles) -> None:
        spec = _spec_of(files)
        until = time.monotonic() + (spec.grace_seconds if spec else 10.0) + _CLEANUP_WAIT
        while time.monotonic() < until and not self.status(ref).finished:
            time.sleep(self.poll_interval)

    # --- watching -----------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[RunId], None]) -> None:
        with self._lock:
            self._monitor.callbacks.append(callback)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._forks.close()

    def _track(self, run: RunId, files: runner.RunFiles, ref: Ref,
               child: subprocess.Popen[bytes] | None = None) -> None:
        with self._lock:
            if child is not None:
                self._monitor.children.append(child)
            key = _ref_id(run)
            if key not in self._monitor.tracked:
                self._monitor.tracked[key] = _Tracked(run=run, files=files, ref=ref, child=child)

    def _watch(self) -> None:
        failing: str | None = None  # the failure logged last: one that repeats every poll is logged once
        while True:
            self._wake.wait(self.poll_interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._poll()
            except Exception as exc:  # the monitor must outlive any one bad run directory
                said = f"{type(exc).__name__}: {exc}"
                if said != failing:
                    logger.exception("local runtime monitor: polling runs failed (logged once while it repeats)")
                failing = said
            else:
                failing = None

    def _poll(self) -> None:
        with self._lock:
            self._monitor.children = [c for c in self._monitor.children if c.poll() is None]
            tracked = list(self._monitor.tracked.values())
            callbacks = list(self._monitor.callbacks)
        for item in tracked:
            if not item.files.spec.exists():  # removed (cleanup without records): nothing left to watch
                with self._lock:
                    self._monitor.tracked.pop(_ref_id(item.run), None)
                continue
            seen = _signature(item.files.state)
            changed = seen != item.seen
            state = runner.read_state(item.files.state) if changed else None
            if state is None or not state.finished:
                gone = item.child is not None and item.child.returncode is not None
                if gone or not self._runner_alive(item.ref, item.files):
                    state = self._runner_gone(item.files)
                    seen = _signature(item.files.state)
                    changed = changed or seen != item.seen or not item.ended
                    item.ended = True
            item.seen = seen
            with self._lock:
                unwritten = item.files.dir in self._unwritten
            if state is not None and state.finished and not unwritten:
                with self._lock:
                    self._monitor.tracked.pop(_ref_id(item.run), None)
            if changed:
                for callback in callbacks:
                    try:
                        callback(item.run)
                    except Exception:  # one subscriber's bug must not stop the others
                        logger.exception("local runtime: a subscriber failed for run %s", _ref_id(item.run))

    # --- references ---------------------------------------------------------------------------------

    def _files_of(self, ref: Ref) -> runner.RunFiles:
        if ref.get("type") != TYPE:
            raise ValueError(f"not a local runtime reference: {ref!r}")
        uid, _, attempt = str(ref.get("id", "")).rpartition("/")
        if not uid or not attempt.isdigit():
            raise ValueError(f"malformed local runtime reference id: {ref.get('id')!r}")
        return self.files(RunId(namespace="", name="", uid=uid, attempt=int(attempt)))


def resolve_sandbox(sandbox: str) -> str:
    """``bwrap`` or ``none`` for a ``--sandbox`` choice; ``ValueError`` for ``bwrap`` where it cannot work."""
    return sandbox_choice(sandbox)[0]


def sandbox_choice(sandbox: str) -> tuple[str, str | None]:
    """``resolve_sandbox``'s answer, and why it is ``none`` (the run's ``Sandbox.reason``)."""
    if sandbox == "none":
        return sandbox, "the server was started with --sandbox none"
    if sandbox not in ("auto", "bwrap"):
        raise ValueError(f'--sandbox must be auto, bwrap or none (got "{sandbox}")')
    problem = sandbox_problem()
    if problem is None:
        return "bwrap", None
    if sandbox == "bwrap":
        raise ValueError(f"--sandbox bwrap: {problem}; install it, or choose --sandbox auto or none")
    logger.warning("local runtime: agents run without a sandbox: %s. They can read what this user can, "
                   "including other runs' files and this server's environment (--sandbox none to silence this)",
                   problem)
    return "none", f"--sandbox auto: {problem}"


def _check_run(run: RunId) -> None:
    if not run.uid or run.uid in (".", "..") or "/" in run.uid or os.sep in run.uid or run.attempt < 1:
        raise ValueError(f"run uid {run.uid!r} and attempt {run.attempt} cannot name a run directory")


def _ref_id(run: RunId) -> str:
    return f"{run.uid}/{run.attempt}"


def _runner_identity(ref: Ref, files: runner.RunFiles) -> tuple[int | None, int | None]:
    """The runner's pid and start time as this runtime recorded them in ``ref.json`` when it started
    it. Never the ones ``ref`` carries: a reference is kept in the run's status, which API clients can
    write, and a pid taken from there would have the server signal whatever process it names."""
    saved = _read_json(files.dir / "ref.json") or {}
    pid, start = saved.get("runnerPid"), saved.get("runnerStart")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return None, None
    recorded = (runner.read_record(files.state) or {}).get("runner_pid")
    if isinstance(recorded, int) and recorded != pid:
        return None, None  # the runner's own record names another process
    return pid, (start if isinstance(start, int) else None)


def _recorded_runner(files: runner.RunFiles) -> tuple[int | None, int | None]:
    """The pid and start time of the runner that wrote the run's first record, waiting for it a while."""
    until = time.monotonic() + _REF_WAIT
    while True:
        pid = (runner.read_record(files.state) or {}).get("runner_pid")
        if isinstance(pid, int):
            return pid, runner.process_start(pid)
        if time.monotonic() >= until:
            return None, None
        time.sleep(0.02)


def _ref_id_of(files: runner.RunFiles) -> str:
    return f"{files.dir.parent.name}/{files.dir.name}"


def _last_words(files: runner.RunFiles) -> str:
    """The last line the runner wrote to its stderr (a traceback's exception), to say why it died."""
    try:
        with open(files.dir / "runner.log", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f" (runner.log: {lines[-1][:200]})" if lines else ""


def _run_of(files: runner.RunFiles) -> RunId:
    spec = _spec_of(files)
    if spec is not None:
        return spec.run
    return RunId(namespace="", name="", uid=files.dir.parent.name, attempt=int(files.dir.name))


def _spec_of(files: runner.RunFiles) -> RunnerSpec | None:
    try:
        return RunnerSpec.from_json(files.spec.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _is_runner(pid: int, spec: Path, start: int | None) -> bool:
    """Whether ``pid`` is a live runner for ``spec`` (not a zombie, not a process that reused the pid):
    the process that started at ``start``, or without one, a process whose command line names ``spec``;
    and in both cases one whose working directory is the run directory (every runner works there),
    so that no pid and start time, wherever they came from, get another process signalled."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): a live pid is the best we know
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state ppid ... starttime is the 20th
    if not fields or fields[0] in (b"Z", b"X"):
        return False
    try:
        if os.readlink(f"/proc/{pid}/cwd") != str(spec.parent):
            return False
    except OSError:  # gone, or another user's: not our runner
        return False
    if start is not None:
        return len(fields) > 19 and int(fields[19]) == start
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return os.fsencode(str(spec)) in cmdline.split(b"\0")


class _NotStarted(Exception):
    """The fork server did not start the runner (and will not): start it another way."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason


class _Unanswered(Exception):
    """The fork server took the request but gave no answer: whether a runner started is unknown."""


@dataclass
class _Forker:
    proc: subprocess.Popen[bytes]
    replies: queue.SimpleQueue[dict[str, Any] | None] = field(default_factory=queue.SimpleQueue)
    ready: bool = False


class _ForkServer:
    """The ``joch runner --fork-server`` process this runtime starts runners through (started on first
    use, again if it dies; ``runner.serve_forks`` says why and how). Where it cannot be used (no /proc
    to tell a forked runner by its start time, or it fails to start), runners are executed directly."""

    def __init__(self, *, on_exit: Callable[[], None]) -> None:
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._current: _Forker | None = None
        self._usable = hasattr(os, "fork") and runner.process_start(os.getpid()) is not None
        self._closed = False

    def spawn(self, *, spec: Path, log: Path, env: Mapping[str, str], args: list[str],
              secrets: Mapping[str, str]) -> tuple[int, int | None]:
        """The new runner's pid and start time; ``_NotStarted`` when no runner was started,
        ``_Unanswered`` when it is unknown whether one was."""
        with self._lock:
            if not self._usable or self._closed:
                raise _NotStarted
            forker = self._forker(env)
            request = json.dumps({"spec": str(spec), "log": str(log), "args": args, "env": dict(env),
                                  "secrets": dict(secrets)}).encode() + b"\n"
            try:
                if forker.proc.stdin is None:
                    raise BrokenPipeError
                forker.proc.stdin.write(request)  # a request it did not read whole was never acted on
                forker.proc.stdin.flush()
            except OSError as exc:
                self._discard(forker)
                raise _NotStarted(f"could not send it a request: {exc}") from None
            try:
                reply = forker.replies.get(timeout=_REF_WAIT)
            except queue.Empty:
                reply = None
            if reply is None:
                self._discard(forker)
                if not forker.ready:  # it died before it served anything: it never forked
                    self._usable = False
                    raise _NotStarted("it exited before it was ready; see the server's log")
                raise _Unanswered
            if not isinstance(reply.get("pid"), int):
                raise _NotStarted(str(reply.get("error") or reply))
            start = reply.get("start")
            return reply["pid"], start if isinstance(start, int) else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._current is not None:
                self._discard(self._current)

    def _forker(self, env: Mapping[str, str]) -> _Forker:
        current = self._current
        if current is not None and current.proc.poll() is None:
            return current
        if current is not None:
            self._discard(current)
        try:
            # Its environment is every forked runner's /proc/<pid>/environ: the runner's, not this
            # server's (which may hold the store's password).
            proc = subprocess.Popen(
                [sys.executable, "-m", "joch.runtime.runner", runner.FORK_SERVER], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, cwd="/", env=env, start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            self._usable = False
            raise _NotStarted(f"could not start it: {exc}") from None
        forker = self._current = _Forker(proc)
        threading.Thread(target=self._read, args=(forker,), name="joch-runner-forks", daemon=True).start()
        return forker

    def _read(self, forker: _Forker) -> None:
        stdout = forker.proc.stdout
        try:
            for line in stdout or ():
                try:
                    message = json.loads(line)
                except ValueError:
                    logger.warning("runner fork server: unexpected output %r", line[:200])
                    continue
                if "exited" in message:
                    self._on_exit()
                elif "ready" in message:
                    forker.ready = True
                else:
                    forker.replies.put(message)
        except (OSError, ValueError):
            pass
        finally:
            forker.replies.put(None)
            if stdout is not None:
                stdout.close()

    def _discard(self, forker: _Forker) -> None:
        """Let the fork server go (the end of its stdin ends it; its runners go on)."""
        if self._current is forker:
            self._current = None
        with contextlib.suppress(OSError):
            if forker.proc.stdin is not None:
                forker.proc.stdin.close()
        try:
            forker.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            forker.proc.kill()
            forker.proc.wait()


@contextlib.contextmanager
def _record_lock(files: runner.RunFiles) -> Iterator[None]:
    try:
        fd = os.open(files.dir / "state.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if not disks.is_full_error(exc):
            raise
        yield  # no room even for the lock file: then nobody can write the record either
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _full_disk(files: runner.RunFiles, workspace_root: Path) -> str | None:
    """``the disk holding PATH is full (N bytes free)`` for the run's directory or its workspace."""
    for path in (files.dir, workspace_root):
        if disks.is_full(path):
            return f"the disk holding {path} is full ({disks.free_bytes(path)} bytes free)"
    return None
