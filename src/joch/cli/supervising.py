"""``joch server --workers N``: a supervisor process and N server processes sharing one socket.

One server process runs on one core; creates over HTTP spend most of their time in Python (routing,
admission, auth, audit), so more processes serve more of them, as uvicorn's and gunicorn's workers
do. The supervisor serves nothing itself:

* **It binds the listening socket** (after the same checks and with the same errors as one process,
  ``serving.check_port``), **accepts the connections and hands each to the next ready worker in
  turn** over a Unix ``SOCK_SEQPACKET`` pair per worker (the descriptor as ``SCM_RIGHTS``;
  ``HANDOFF_FD_ENV`` names the worker's end). Workers accepting from one shared socket would leave
  the spread to the kernel: with the bench's 4 keep-alive clients, 3 went to one worker in every
  sample, which then ran flat out while the other idled. Handing over costs the supervisor one
  ``accept`` and one ``sendmsg`` per connection, not per request; a worker that is not ready (still
  starting, or being restarted) is passed over, and one whose queue is full is skipped for the next.
  When none can take it (every queue full, or none ready), the connection waits until one can, and
  the next ones wait in the backlog: none is closed for want of a worker.
* **Workers are ``python -m joch`` with the supervisor's own arguments**, so every option carries
  over, and ``WORKER_ENV`` saying which worker they are. Worker 0 is the full server of one process
  (manifests, controllers, runtime, audit retention); the others serve HTTP only. Worker 0 writes a
  line on a pipe (``READY_FD_ENV``) once it accepts connections, and only then do the others start:
  ``make run``'s quickstart is applied before any request is served. If worker 0 exits before that
  (a bad store URL, a bad manifest), it has said why on the shared stderr and the supervisor exits
  with its exit code: the same message and code as one process.
* **Metrics**: each worker writes its samples to files in a fresh private directory
  (``PROMETHEUS_MULTIPROC_DIR``; ``joch.telemetry.metrics`` sums them at scrape time). The directory
  is removed when the supervisor exits; a worker that exits is reported to
  ``metrics.process_exited`` so its live gauges (open watches) stop counting.
* **Lifecycle**: SIGINT or SIGTERM to the supervisor sends SIGTERM to each worker (each shuts down as
  one process does; workers run in a process group of their own, so a terminal's Ctrl-C reaches the
  supervisor alone), waits ``STOP_SECONDS`` for them, kills those left and exits 0. A worker that
  exits otherwise is started again after a backoff (``RESTART_BACKOFF`` doubling up to
  ``MAX_BACKOFF`` while it keeps dying young), with one log line each time. Should the supervisor
  itself be killed (``kill -9``), workers get SIGTERM from the kernel (Linux
  ``prctl(PR_SET_PDEATHSIG)``) or, failing that, notice within a second that their parent changed.

``worker_role`` is the worker's side: it reads (and removes, so agents and other children do not
inherit them) the variables the supervisor set.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

logger = logging.getLogger("joch.server.workers")

WORKER_ENV = "JOCH_SERVER_WORKER"
HANDOFF_FD_ENV = "JOCH_SERVER_HANDOFF_FD"
READY_FD_ENV = "JOCH_SERVER_READY_FD"
SUPERVISOR_ENV = "JOCH_SERVER_SUPERVISOR"
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
STOP_SECONDS = 10.0
"""How long workers get to stop (uvicorn's 3 s grace, then the controllers and the store close)."""
RESTART_BACKOFF = 0.5
MAX_BACKOFF = 30.0
STABLE_SECONDS = 30.0
"""A worker that ran this long before exiting is restarted after the first backoff again."""
BACKLOG = 2048  # uvicorn's
_PR_SET_PDEATHSIG = 1
_TICK = 0.1


@dataclass
class WorkerRole:
    """What a worker process was told: its number, where its connections come from, where to say it
    is ready."""

    index: int
    handoff: socket.socket
    ready_fd: int | None

    @property
    def primary(self) -> bool:
        return self.index == 0

    def ready(self) -> None:
        if self.ready_fd is not None:
            with contextlib.suppress(OSError):  # a supervisor that is gone stops us anyway
                os.write(self.ready_fd, b"ready\n")
                os.close(self.ready_fd)
            self.ready_fd = None


def worker_role() -> WorkerRole | None:
    """This process's role when a ``joch server --workers`` supervisor started it, else None."""
    index = os.environ.pop(WORKER_ENV, None)
    if index is None:
        return None
    fd = int(os.environ.pop(HANDOFF_FD_ENV))
    ready = os.environ.pop(READY_FD_ENV, None)
    _die_with(int(os.environ.pop(SUPERVISOR_ENV)))
    return WorkerRole(index=int(index), handoff=socket.socket(fileno=fd), ready_fd=int(ready) if ready else None)


def _die_with(supervisor: int) -> None:
    """Stop (SIGTERM: a graceful shutdown) when the supervisor dies, even by ``kill -9``."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the thread below notices
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != supervisor:  # it died before prctl: nothing would tell us
        raise SystemExit("joch server: the supervisor has exited; this worker stops")

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="joch-worker-parent", daemon=True).start()


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound as uvicorn binds it (``serving.check_port`` checked it can be)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None  # the pipe it says "ready" on, until it did (or exited)
    ready: bool = False
    started: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    channel: socket.socket | None = None  # the supervisor's end of the pair its connections go over


class Supervisor:
    def __init__(self, *, workers: int, sock: socket.socket, argv: Sequence[str], url: str) -> None:
        self.sock = sock
        self.argv = [sys.executable, "-m", "joch", *argv]
        self.url = url
        self.workers = [_Worker(i) for i in range(workers)]
        self._stopping = False
        self._announced = False
        self._metrics_dir = ""
        self._process_exited: Callable[[int], None] | None = None
        self._lock = threading.Lock()  # the workers' channels and readiness, read by the accepting thread
        self._turn = 0
        self._acceptor: threading.Thread | None = None

    def run(self) -> int:
        """Serve until SIGINT or SIGTERM (0), or until worker 0 fails to start (its exit code)."""
        from joch.telemetry import metrics  # before the variable is set: this process keeps no files

        self._process_exited = getattr(metrics, "process_exited", None)
        self._metrics_dir = tempfile.mkdtemp(prefix="joch-metrics-")
        os.environ[METRICS_DIR_ENV] = self._metrics_dir  # for the workers, and process_exited here
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = self._start_first()
            if code is None:
                self._acceptor = threading.Thread(target=self._accept, name="joch-accept", daemon=True)
                self._acceptor.start()
                for worker in self.workers[1:]:
                    self._start(worker)
                self._watch()
                code = 0
            self._stopping = True
            if self._acceptor is not None:
                self._acceptor.join()
            self._stop_all()
            return code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for worker in self.workers:
                self._forget_ready(worker)
            self.sock.close()
            shutil.rmtree(self._metrics_dir, ignore_errors=True)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        self._stopping = True

    def _start(self, worker: _Worker) -> None:
        read, write = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, WORKER_ENV: str(worker.index), HANDOFF_FD_ENV: str(theirs.fileno()),
               SUPERVISOR_ENV: str(os.getpid()), READY_FD_ENV: str(write)}
        try:
            # A process group of its own: the terminal's Ctrl-C (SIGINT to the foreground group) reaches
            # the supervisor alone, which stops each worker with one SIGTERM. In the supervisor's group a
            # worker got both: the second, once uvicorn had put the default handlers back, could kill it
            # as it stopped the controllers and closed the store; a starting one raised KeyboardInterrupt.
            worker.proc = subprocess.Popen(self.argv, env=env, pass_fds=[theirs.fileno(), write], process_group=0)
        except BaseException:
            os.close(read)
            mine.close()
            raise
        finally:
            os.close(write)
            theirs.close()
        mine.setblocking(False)
        with self._lock:
            worker.channel = mine
            worker.ready = False
        worker.ready_fd = read
        worker.started = time.monotonic()
        worker.restart_at = None

    def _start_first(self) -> int | None:
        """Start worker 0 and wait until it serves: None then, else the code to exit with."""
        first = self.workers[0]
        self._start(first)
        while not self._stopping:
            self._read_ready(_TICK)
            proc = first.proc
            if first.ready:
                return None
            if proc is not None and proc.poll() is not None:
                code = proc.wait()
                self._exited(first)
                return code if code > 0 else 1
        return 0

    def _read_ready(self, timeout: float) -> None:
        waiting = {w.ready_fd: w for w in self.workers if w.ready_fd is not None}
        if not waiting:
            time.sleep(timeout)
            return
        readable, _, _ = select.select(list(waiting), [], [], timeout)
        for fd in readable:
            worker = waiting[fd]
            said = bool(os.read(fd, 64))  # else the pipe closed: it exited, as its poll will say
            with self._lock:
                worker.ready = said
            self._forget_ready(worker)
        if not self._announced and all(w.ready for w in self.workers):
            self._announced = True
            logger.info("serving on %s with %d worker processes (pids %s)", self.url, len(self.workers),
                        " ".join(str(w.proc.pid) for w in self.workers if w.proc is not None))

    def _accept(self) -> None:
        """Accept connections until stopping, each handed to the next ready worker."""
        self.sock.settimeout(_TICK)
        while not self._stopping:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:  # out of descriptors, say: say so, wait, go on (as asyncio does)
                logger.warning("accepting a connection failed: %s", exc)
                time.sleep(1.0)
                continue
            with conn:
                while not self._hand(conn) and not self._stopping:
                    self._wait_for_room()

    def _hand(self, conn: socket.socket) -> bool:
        """Whether a ready worker took ``conn``, the next in turn whose queue has room."""
        with self._lock:
            ready = [w for w in self.workers if w.ready and w.channel is not None]
            for i in range(len(ready)):
                worker = ready[(self._turn + i) % len(ready)]
                assert worker.channel is not None
                try:
                    socket.send_fds(worker.channel, [b"c"], [conn.fileno()])
                except OSError:  # its queue is full, or it has just exited: the next one
                    continue
                self._turn = (self._turn + i + 1) % len(ready)
                return True
        return False

    def _wait_for_room(self) -> None:
        """Until a ready worker's queue has room (or a tick passed): no worker is ready (all being
        restarted) or every queue is full (their loops are busy). The connection in hand waits, and
        those behind it wait in the listening socket's backlog, as they would for one process;
        closing them would answer a burst of clients with resets."""
        with self._lock:
            channels = [w.channel for w in self.workers if w.ready and w.channel is not None]
        if not channels:
            time.sleep(_TICK)
            return
        with contextlib.suppress(OSError, ValueError):  # a channel closed meanwhile: look again
            select.select([], channels, [], _TICK)

    def _forget_ready(self, worker: _Worker) -> None:
        if worker.ready_fd is not None:
            os.close(worker.ready_fd)
            worker.ready_fd = None

    def _watch(self) -> None:
        while not self._stopping:
            self._read_ready(_TICK)
            now = time.monotonic()
            for worker in self.workers:
                if worker.proc is not None and worker.proc.poll() is not None and not self._stopping:
                    self._died(worker, worker.proc, now)
                elif worker.restart_at is not None and now >= worker.restart_at and not self._stopping:
                    self._start(worker)

    def _died(self, worker: _Worker, proc: subprocess.Popen[bytes], now: float) -> None:
        self._exited(worker)
        worker.failures = 1 if now - worker.started >= STABLE_SECONDS else worker.failures + 1
        delay = min(MAX_BACKOFF, RESTART_BACKOFF * 2 ** (worker.failures - 1))
        code = proc.returncode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        logger.warning("worker %d (pid %d) %s; starting it again in %.1fs", worker.index, proc.pid, how, delay)
        worker.restart_at = now + delay

    def _exited(self, worker: _Worker) -> None:
        if worker.proc is not None and self._process_exited is not None:
            self._process_exited(worker.proc.pid)
        worker.proc = None
        self._forget_ready(worker)
        with self._lock:
            worker.ready = False
            if worker.channel is not None:
                worker.channel.close()
                worker.channel = None
    def _stop_all(self) -> None:
        running = [(w, w.proc) for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for _, proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for worker, proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("worker %d (pid %d) did not stop in %.0fs; killing it", worker.index, proc.pid,
                               STOP_SECONDS)
                proc.kill()
                proc.wait()
        for worker in self.workers:
            if worker.proc is not None:
                worker.proc.wait()
                self._exited(worker)
