"""The embedded SQLite backend: WAL mode, one serialized writer, a pool of reader connections.

SQLite allows one writer at a time anyway; taking ``BEGIN IMMEDIATE`` on a single write connection
behind a lock serializes writers in-process without busy-retries, while WAL lets readers run on
their own connections without blocking it. ``synchronous`` defaults to NORMAL (durable across a
process crash; the last commits may be lost on power loss) and can be set with
``sqlite:///path/joch.db?synchronous=FULL``.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from joch.api.meta import now
from joch.store import exhaustion, migrations
from joch.store.sql import Backend, Conn

_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self, path: Path, *, synchronous: str = "NORMAL") -> None:
        if synchronous.upper() not in _SYNC_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(_SYNC_MODES)}, got {synchronous!r}")
        self.path = path
        self.synchronous = synchronous.upper()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._write_lock = threading.Lock()
        self._writer = self._connect()
        self._writer.execute("PRAGMA journal_mode=WAL")
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._readers_lock = threading.Lock()
        self._all_readers: list[sqlite3.Connection] = []
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
        with self._write_lock:
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # a failed COMMIT may already have rolled back
                    conn.execute("ROLLBACK")
                raise

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

    def close(self) -> None:
        with self._write_lock, self._readers_lock:
            for conn in [*self._all_readers, self._writer]:
                conn.close()
            self._all_readers.clear()
