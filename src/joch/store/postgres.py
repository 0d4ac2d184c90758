"""The shared Postgres backend (psycopg 3): a connection pool, a row lock for revision order, and
LISTEN/NOTIFY so every replica's watchers wake on every replica's commits.

Writers lock the ``revision`` row of ``joch_meta`` (``SELECT … FOR UPDATE``) before writing, so
commits are serialized in revision order across every server sharing the database (see ``sql``).
The NOTIFY is sent inside the write transaction; Postgres delivers it only on commit.
Migrations run under an advisory lock so replicas starting together apply each file once.

A full disk on the database server (SQLSTATE 53100, ``DiskFull``) becomes ``InsufficientStorage``
with the server's own words (which file could not be extended). The server's filesystem cannot be
seen from here, so readiness fails only after a write failed that way, and a probe write that
succeeds (space returned) makes the store ready again.

A pooled connection can be dead: after a PostgreSQL restart, or a backend terminated by an
administrator, every idle connection in the pool is. ``read`` and ``write`` find that out from the
statement that opens their transaction, before anything of the caller has run, so they drop that
connection and take the next (the pool replaces it), and a restart costs no request. This is
instead of the pool's ``check`` callback, which would cost every checkout a round trip and, on
finding a dead connection, sleeps with backoff before trying the next (1 s, 2 s, 4 s…: seconds of
stall after a restart).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from joch.api import errors
from joch.api.meta import now
from joch.store import feed as feeds
from joch.store import migrations
from joch.store.sql import Backend, ChangeRow, Conn, Cursor

log = logging.getLogger(__name__)
_MIGRATION_LOCK = 0x6A6F6368  # "joch"


Begin = Callable[[psycopg.Connection[Any]], AbstractContextManager[Any]]


@contextmanager
def _read_only(raw: psycopg.Connection[Any]) -> Iterator[None]:
    raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        yield
    finally:
        raw.execute("COMMIT")


class _PgConn:
    """Adapts ``?`` placeholders to psycopg's ``%s`` (cached per statement)."""

    _cache: dict[str, str] = {}

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Any = ()) -> Cursor:
        query = self._cache.get(sql)
        if query is None:
            query = self._cache.setdefault(sql, sql.replace("?", "%s"))
        return self.conn.execute(query, params, prepare=True)


def describe(conninfo: str) -> str:
    """``user@host:port/db`` of a connection string, without its password."""
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "the given URL"
    host = parts.get("host") or "localhost"
    return f"{parts.get('user') or ''}{'@' if parts.get('user') else ''}{host}:{parts.get('port') or 5432}" + (
        f"/{parts['dbname']}" if parts.get("dbname") else "")


def _probe(conninfo: str) -> None:
    """Fail fast, with a message a person can act on, before a pool would retry for 30 seconds."""
    where = describe(conninfo)
    try:
        with psycopg.connect(conninfo, connect_timeout=5, autocommit=True) as conn:
            row = conn.execute("SELECT current_schema(), current_setting('search_path')").fetchone()
    except psycopg.ProgrammingError as exc:
        raise errors.BadRequest(f"invalid PostgreSQL URL for {where}: {exc}") from None
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise errors.ServiceUnavailable(f"cannot connect to PostgreSQL at {where}: {reason}") from None
    if row is None or row[0] is None:
        search_path = row[1] if row else "?"
        raise errors.BadRequest(
            f"PostgreSQL at {where} has no schema to keep Joch's tables in: search_path is {search_path!r} "
            "and none of it exists; create the schema (CREATE SCHEMA ...) or fix options=-csearch_path in the URL"
        )


class PostgresBackend(Backend):
    name = "postgres"
    lock_revision_sql = "SELECT value FROM joch_meta WHERE key = 'revision' FOR UPDATE"

    def __init__(self, conninfo: str, *, max_connections: int = 10) -> None:
        self.conninfo = conninfo
        self.where = describe(conninfo)
        _probe(conninfo)
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            conninfo, min_size=1, max_size=max_connections, kwargs={"autocommit": True}, open=True,
            name="joch-store",
        )
        self._listener: threading.Thread | None = None
        self._full: str | None = None  # why the last write failed for want of space, until one succeeds
        self._stop = threading.Event()
        try:
            self.channel = self._channel()
            self._migrate()
        except BaseException:
            self._pool.close()
            raise

    def _channel(self) -> str:
        """A NOTIFY channel per database and schema: NOTIFY is database-wide, and stores in other
        schemas of the same database (tests, tenants) must not wake each other's watchers."""
        with self._pool.connection() as raw:
            row = raw.execute("SELECT current_database(), current_schema()").fetchone()
        where = f"{row[0] if row else ''}.{row[1] if row else ''}"
        return "joch_" + hashlib.sha256(where.encode()).hexdigest()[:20]

    def _migrate(self) -> None:
        with self._pool.connection() as raw:
            conn = _PgConn(raw)
            conn.execute("SELECT pg_advisory_lock(?)", (_MIGRATION_LOCK,))
            try:
                with raw.transaction():
                    conn.execute(migrations.CREATE_TABLE)
                    (applied,) = conn.execute(
                        "SELECT COALESCE(MAX(version), 0) FROM joch_schema_migrations"
                    ).fetchone()
                    known = migrations.load("postgres")
                    migrations.check_not_newer(int(applied), known, describe(self.conninfo))
                    for migration in known:
                        if migration.version <= applied:
                            continue
                        for statement in migration.statements():
                            raw.execute(statement.encode())
                        conn.execute(
                            "INSERT INTO joch_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                            (migration.version, migration.name, now()),
                        )
            finally:
                conn.execute("SELECT pg_advisory_unlock(?)", (_MIGRATION_LOCK,))

    @contextmanager
    def write(self) -> Iterator[Conn]:
        try:
            with self._live(lambda raw: raw.transaction()) as raw:
                yield _PgConn(raw)
        except psycopg.errors.DiskFull as exc:
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else "DiskFull"
            self._full = (f"the disk of the PostgreSQL server at {describe(self.conninfo)} is full ({said}); "
                          "free space on the database server, then retry")
            raise errors.InsufficientStorage(self._full) from None
        self._full = None

    def storage_problem(self) -> str | None:
        if self._full is None:
            return None
        try:
            with self.write() as conn:  # a probe: succeeds once the server has room again
                conn.execute("UPDATE joch_meta SET value = value WHERE key = 'compacted'")
        except errors.InsufficientStorage as exc:
            return exc.message
        return None

    @contextmanager
    def read(self) -> Iterator[Conn]:
        with self._live(_read_only) as raw:
            yield _PgConn(raw)

    @contextmanager
    def _live(self, begin: Begin) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection inside the transaction ``begin`` opened on it; a connection found
        dead by that first statement is dropped and the next one tried (module docstring)."""
        for attempt in range(self._pool.max_size + 1):
            with ExitStack() as stack:
                raw = stack.enter_context(self._pool.connection())
                try:
                    stack.enter_context(begin(raw))
                except psycopg.OperationalError:
                    if not raw.broken or attempt == self._pool.max_size:
                        raise
                    log.info("dropping a dead pooled PostgreSQL connection")
                    continue  # the pool discards a broken connection given back to it
                yield raw
                return

    def record(self, conn: Conn, event: str, row: ChangeRow) -> bool:
        """The object row and its change-log row in one statement (a data-modifying CTE): one
        round trip per object instead of two. An existing object makes the CTE insert nothing."""
        if event == "ADDED":
            write = ("INSERT INTO joch_objects (kind, namespace, name, uid, revision, body) "
                     "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (kind, namespace, name) DO NOTHING RETURNING 1")
            params: tuple[Any, ...] = (row.kind, row.namespace, row.name, row.uid, row.revision, row.body)
        elif event == "MODIFIED":
            write = ("UPDATE joch_objects SET revision = ?, body = ? "
                     "WHERE kind = ? AND namespace = ? AND name = ? RETURNING 1")
            params = (row.revision, row.body, row.kind, row.namespace, row.name)
        else:
            write = "DELETE FROM joch_objects WHERE kind = ? AND namespace = ? AND name = ? RETURNING 1"
            params = (row.kind, row.namespace, row.name)
        done = conn.execute(
            f"WITH written AS ({write}) "
            "INSERT INTO joch_changes (revision, kind, namespace, name, type, body, prev_labels, superseded) "
            "SELECT ?::bigint, ?::text, ?::text, ?::text, ?::text, ?::text, ?::text, ?::bigint "
            "FROM written RETURNING revision",
            (*params, row.revision, row.kind, row.namespace, row.name, event, row.log_body, row.prev_labels,
             row.superseded),
        ).fetchone()
        return done is not None

    def notify(self, conn: Conn, revision: int) -> None:
        conn.execute("SELECT pg_notify(?, ?)", (self.channel, str(revision)))

    @property
    def poll_interval(self) -> float:
        return 2.0

    def listen(self, wake: feeds.Wake, active: Callable[[], bool] = lambda: True) -> None:
        self._listener = threading.Thread(target=self._listen, args=(wake,), name="joch-pg-listen",
                                          daemon=True)
        self._listener.start()

    def _listen(self, wake: feeds.Wake) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {self.channel}")
                    wake()  # catch up on anything committed while we were not listening
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            wake()
            except psycopg.Error:
                if not self._stop.is_set():
                    log.warning("postgres LISTEN connection lost; reconnecting", exc_info=True)
                    self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._wake_listener()
            self._listener.join(timeout=5)
        self._pool.close()

    def _wake_listener(self) -> None:
        """End the listener's wait for a notification now, not at its next 0.5 s timeout: every store
        close (each test, each replica shutdown) would otherwise wait that out."""
        try:
            with self._pool.connection(timeout=1) as raw:
                raw.execute("SELECT pg_notify(%s, '')", (self.channel,))
        except psycopg.Error:  # PoolTimeout too
            pass  # the listener then stops at its timeout, as before
