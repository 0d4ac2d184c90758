"""The embedded SQLite backend: WAL mode, one serialized writer, a pool of reader connections.

SQLite allows one writer at a time anyway; taking ``BEGIN IMMEDIATE`` on a single write connection
behind a lock serializes writers in-process without busy-retries, while WAL lets readers run on
their own connections without blocking it. Between processes (``joch server --workers``, or a
``joch controller`` beside a server) a write transaction also holds an exclusive ``flock`` on
``<file>.lock`` from before ``BEGIN IMMEDIATE`` to after ``COMMIT``: a process waiting for the other's
transaction polls that lock every 0.2 ms and goes on within a fraction of a millisecond of its
release, where SQLite's own busy handler sleeps 1, 2, 5, 10… ms between tries — with two server
processes writing, that left most of the second core idle. The wait is bounded by the same 30 s as
``busy_timeout`` (then SQLite decides, as before). ``synchronous`` defaults to NORMAL (durable across a
process crash; the last commits may be lost on power loss) and can be set with
``sqlite:///path/joch.db?synchronous=FULL``.

A full disk: SQLite answers ``SQLITE_FULL`` (or an I/O error while the filesystem has no room),
which becomes ``InsufficientStorage`` naming the file and the space left; the transaction is rolled
back whole. Readiness (``storage_problem``) looks at the filesystem (below ``LOW_SPACE`` free it
counts as full) and, after a write failed for want of space, commits a probe until one succeeds, so
a server reports ready again by itself once space returns.

Other processes' commits (another ``joch server`` worker, a ``joch controller``, a tool) wake this
process's change feed through ``listen``: SQLite has no NOTIFY, so a daemon thread on a connection of
its own reads ``PRAGMA data_version`` every ``LISTEN_INTERVAL`` and wakes the feed when it changed
(it changes when any *other* connection commits, so this process's own writer counts too; the feed
was woken for those already, and a wake with no watcher costs nothing). The pragma reads the WAL
index in shared memory: about a microsecond, no disk I/O. Without it, such commits reached watchers
only at the feed's 1 s poll.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from joch.api import errors
from joch.api.meta import now
from joch.store import exhaustion, migrations
from joch.store import feed as feeds
from joch.store.sql import Backend, Conn

log = logging.getLogger(__name__)

_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
_SQLITE_IOERR = 10
_SQLITE_FULL = 13
_LOCK_WAIT_SECONDS = 30.0  # as the connections' busy_timeout
_LOCK_POLL = 0.0002
LOW_SPACE = 1024 * 1024
"""Below this many free bytes the store's filesystem counts as full (readiness fails)."""
LISTEN_INTERVAL = 0.01
IDLE_INTERVAL = 0.05
"""How often the listener asks whether anyone watches while nobody does (every process's store has
a listener, most of them with no watcher most of the time)."""
"""How often ``listen``'s thread looks for commits of other connections (seconds)."""


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self, path: Path, *, synchronous: str = "NORMAL") -> None:
        if synchronous.upper() not in _SYNC_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(_SYNC_MODES)}, got {synchronous!r}")
        self.path = path
        self.where = str(path)
        self.synchronous = synchronous.upper()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._write_lock = threading.Lock()
        self._between_processes = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._writer = self._connect()
        self._writer.execute("PRAGMA journal_mode=WAL")
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._readers_lock = threading.Lock()
        self._all_readers: list[sqlite3.Connection] = []
        self._full: str | None = None  # why the last write failed for want of space, until one succeeds
        self._listener: threading.Thread | None = None
        self._stop = threading.Event()
        with self._disk_errors():
            self._migrate()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _migrate(self) -> None:
        with self._write_lock:
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(migrations.CREATE_TABLE)
                (applied,) = conn.execute("SELECT COALESCE(MAX(version), 0) FROM joch_schema_migrations").fetchone()
                known = migrations.load("sqlite")
                migrations.check_not_newer(int(applied), known, str(self.path))
                for migration in known:
                    if migration.version <= applied:
                        continue
                    for statement in migration.statements():
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO joch_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                        (migration.version, migration.name, now()),
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    @contextmanager
    def write(self) -> Iterator[Conn]:
        with self._write_lock, self._other_processes_waiting(), self._disk_errors():
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # a failed COMMIT may already have rolled back
                    conn.execute("ROLLBACK")
                raise
            self._full = None

    @contextmanager
    def _other_processes_waiting(self) -> Iterator[None]:
        """The lock between processes (see the module docstring); released however the block ends.

        The wait is bounded: a process stopped inside its transaction (Ctrl-Z on a ``joch controller``)
        must not hang every writer for ever. Past ``busy_timeout`` the write goes on without the lock
        and SQLite's own busy handler decides, which ends in its "database is locked" error as before.
        The lock is polled every ``_LOCK_POLL`` seconds (a blocking ``flock`` cannot be given a deadline),
        which still wakes a waiter well within a millisecond of the release."""
        held = _try_lock(self._between_processes)
        deadline = time.monotonic() + _LOCK_WAIT_SECONDS
        while not held and time.monotonic() < deadline:
            time.sleep(_LOCK_POLL)
            held = _try_lock(self._between_processes)
        try:
            yield
        finally:
            if held:
                fcntl.flock(self._between_processes, fcntl.LOCK_UN)

    @contextmanager
    def scrubbing(self) -> Iterator[None]:
        """Freed space is zeroed while the rewrite runs (``secure_delete``), and the WAL, which holds
        the page images it replaced, is checkpointed and truncated afterwards."""
        with self._write_lock:
            (previous,) = self._writer.execute("PRAGMA secure_delete").fetchone()
            self._writer.execute("PRAGMA secure_delete=ON")
        try:
            yield
        finally:
            with self._write_lock:
                self._writer.execute(f"PRAGMA secure_delete={int(previous)}")
                self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()

    @contextmanager
    def _disk_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            free = _free_bytes(self.path.parent)
            if not _out_of_space(exc, free):
                raise
            self._full = self._full_message(free)
            raise errors.InsufficientStorage(self._full) from None

    def _full_message(self, free: int | None) -> str:
        left = f" ({free} bytes free on its filesystem)" if free is not None else ""
        return f"the disk holding the store is full: cannot write {self.path}{left}; free space there, then retry"

    def storage_problem(self) -> str | None:
        free = _free_bytes(self.path.parent)
        if free is not None and free < LOW_SPACE:
            return self._full_message(free)
        if self._full is not None:
            try:
                with self.write() as conn:  # a probe: a real commit, so it needs what a write needs
                    conn.execute("UPDATE joch_meta SET value = value WHERE key = 'compacted'")
            except errors.InsufficientStorage as exc:
                return exc.message
        return None

    @contextmanager
    def read(self) -> Iterator[Conn]:
        try:
            conn = self._readers.get_nowait()
        except queue.Empty:
            try:
                conn = self._connect()
            except sqlite3.OperationalError:
                if exhaustion.confirm():
                    raise exhaustion.unavailable("opening a database connection") from None
                raise
            conn.execute("PRAGMA query_only=1")
            with self._readers_lock:  # not the write lock: a read never waits for a write
                self._all_readers.append(conn)
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")
            self._readers.put(conn)

    def listen(self, wake: feeds.Wake, active: Callable[[], bool] = lambda: True) -> None:
        conn = self._connect()
        (seen,) = conn.execute("PRAGMA data_version").fetchone()  # before returning: no commit is missed
        self._listener = threading.Thread(target=self._listen, args=(conn, int(seen), wake, active),
                                          name="joch-sqlite-listen", daemon=True)
        self._listener.start()

    def _listen(self, conn: sqlite3.Connection, seen: int, wake: feeds.Wake, active: Callable[[], bool]) -> None:
        failing = False  # a failure that repeats every 10 ms is logged once
        try:
            while not self._stop.wait(LISTEN_INTERVAL):
                if not active():  # no watcher: nothing to wake; look again in a moment, without a query
                    if self._stop.wait(IDLE_INTERVAL):
                        return
                    continue
                try:
                    (version,) = conn.execute("PRAGMA data_version").fetchone()
                except sqlite3.Error:
                    if not failing:
                        log.warning("sqlite: looking for other processes' commits failed; retrying", exc_info=True)
                    failing = True
                    continue
                failing = False
                if version != seen:
                    seen = int(version)
                    wake()
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.join(timeout=5)
        with self._write_lock, self._readers_lock:
            for conn in [*self._all_readers, self._writer]:
                conn.close()
            self._all_readers.clear()
            if self._between_processes >= 0:
                os.close(self._between_processes)
                self._between_processes = -1


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _free_bytes(directory: Path) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _out_of_space(exc: sqlite3.Error, free: int | None) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return "disk is full" in str(exc)
    # SQLite reports a failed write()/fallocate() as an I/O error: that is ENOSPC when nothing is free.
    return code & 0xFF == _SQLITE_FULL or (code & 0xFF == _SQLITE_IOERR and free is not None and free < LOW_SPACE)
