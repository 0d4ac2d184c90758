"""The store's semantics, written once over SQL and shared by the SQLite and Postgres backends.

Contracts and pitfalls:

* **One revision, one writer at a time.** Every write transaction first reads the global revision
  under a lock (SQLite: ``BEGIN IMMEDIATE``; Postgres: ``SELECT … FOR UPDATE`` on the counter row)
  and hands out the next numbers itself. Holding that lock until commit makes commit order equal
  revision order, so a watcher that has seen revision N has seen every revision below N — a plain
  sequence cannot promise that, because a later value can commit before an earlier one.
* **Object row and change-log row commit together.** The counter row is written once at the end of
  the transaction, so a multi-object apply costs one counter update, not one per object.
* **No-op writes write nothing.** An update or status update that changes nothing returns the stored
  object unchanged: re-applying a file keeps every resourceVersion.
* Bodies are stored as JSON text in both dialects: the store never queries inside them, and text
  keeps the submitted key order, which ``-o yaml`` shows back to the user.

How long the change log keeps what (``KindInfo.history`` and ``KindInfo.sensitive``):

* ``full`` kinds keep every change until compaction. ``latest`` kinds keep only the newest change
  row of each object: a MODIFIED or DELETED deletes the object's earlier ADDED/MODIFIED rows in
  the same transaction, and records the newest revision it deleted in ``superseded``. DELETED rows
  themselves are never superseded, so an object deleted and created again under the same name
  still tells a watcher that the old one went away.
* A watch that resumes from R sees, for such an object, only its latest state (as etcd shows after
  compacting that key): per object the stream is still gap-free and ends at the right state, and
  its revisions still only grow, so resourceVersion bookkeeping and BOOKMARKs hold. What it does
  not give for those kinds is every intermediate state. When a row's ``superseded`` is above the
  position the watcher read from, the watcher missed that object's previous change, so the feed
  cannot know what it holds: the row arrives as MODIFIED (an informer adds an object it did not
  have), and a label-selector watch gets DELETED for an object that does not match now, since it
  may have matched before (see ``feed.Filter.decode``).
* ``sensitive`` fields (a Secret's ``spec.data``) never reach an object row or the change log:
  ``_Tx`` splits them off every write (``joch.api.secrets``), keeps the public view (the keys and
  their sizes under ``status.keys``) as the body, and seals the values into ``joch_sealed`` with the
  key ring (``joch.store.sealing``), in the same transaction. ``reveal`` reads them back; an update
  that names no sensitive field keeps them (and compares decrypted values, so an equal write writes
  nothing). At open every key id in ``joch_sealed`` is checked against the ring by decrypting one
  value, and values an older joch left in plain text are sealed (``reseal``). ``change_body`` still
  drops sensitive fields from a DELETED row, a second line of defence.
* Auto-compaction (``history``) counts the change rows that are kept, not revisions: a Lease
  renewed every two seconds costs the log one row, so it does not push user objects' changes
  past the horizon.

* **Audit rows ride in the write's transaction.** ``_Tx._record`` queues a row for every object
  written while a request is current, ``audit`` queues explicit entries, and ``flush_audit`` inserts
  them (80 per statement) just before the commit: a rollback drops them with the change. Rows are
  written only under the write lock (``Store.audit`` outside a transaction opens one), so on
  Postgres too an id commits after every smaller id and a reader paging by id skips nothing.
  Retention deletes in batches without the revision lock: it touches no row a writer needs.

* **A key with a NUL character names nothing.** Postgres text cannot hold NUL (the statement fails),
  SQLite can; admission refuses NUL in every string, so no stored object has one in its name or
  namespace. Lookups by such a key are answered here without asking the database — not found, an
  empty list, a continue token that is not ours — so both dialects answer alike whoever calls.
"""

from __future__ import annotations

import abc
import base64
import binascii
import builtins
import functools
import json
import secrets
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from joch.api import audit as audits
from joch.api import errors, selectors
from joch.api import secrets as views
from joch.api.audit import AuditEntry, AuditEvent, AuditPage, AuditQuery
from joch.api.identity import current_request
from joch.api.meta import has_huge_float, now
from joch.api.registry import REGISTRY, KindInfo
from joch.store import feed as feeds
from joch.store import namespaces
from joch.store.base import (
    ListOptions,
    ListResult,
    Obj,
    Store,
    UsageFilter,
    UsageGroup,
    UsageRecord,
    UsageTotal,
    Watch,
    WatchOptions,
    Writer,
)
from joch.store.sealing import IDENTITY, KeyRing, Sealer
from joch.telemetry import metrics, tracing

_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_USER_METADATA = ("labels", "annotations", "finalizers", "ownerReferences")
_LIST_CHUNK = 500
_AUDIT_COLUMNS = "time, actor, groups, verb, kind, namespace, name, decision, reason, request_id, source_ip"
_AUDIT_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_AUDIT_BATCH = 80  # rows per INSERT: 880 parameters, under SQLite's oldest limit of 999
_PRUNE_BATCH = 5000  # rows per pruning transaction, so writers never wait long for the lock


class Cursor(Protocol):
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Conn(Protocol):
    """The slice of a DB-API connection the store uses; SQL is written with ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...


@dataclass(frozen=True)
class ChangeRow:
    kind: str
    namespace: str
    name: str
    uid: str
    revision: int
    body: str
    prev_labels: str | None
    log_body: str  # what the change log keeps: see ``change_body``
    superseded: int | None = None


class Backend(abc.ABC):
    """What differs between dialects: connections, locking, notification and migrations."""

    name: str
    where: str = ""  # the database, for messages: a path, or user@host:port/db (never a password)
    lock_revision_sql = "SELECT value FROM joch_meta WHERE key = 'revision'"

    @abc.abstractmethod
    def write(self) -> AbstractContextManager[Conn]:
        """A connection inside a write transaction that commits on exit, rolls back on error."""

    @abc.abstractmethod
    def read(self) -> AbstractContextManager[Conn]:
        """A connection inside a read-only transaction with one consistent snapshot."""

    def record(self, conn: Conn, event: str, row: ChangeRow) -> bool:
        """Write an object row and its change-log row; False when an ADDED object already exists.
        Two statements here; a dialect may do both in one round trip."""
        if event == "ADDED":
            inserted = conn.execute(
                "INSERT INTO joch_objects (kind, namespace, name, uid, revision, body) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (kind, namespace, name) DO NOTHING RETURNING revision",
                (row.kind, row.namespace, row.name, row.uid, row.revision, row.body),
            ).fetchone()
            if inserted is None:
                return False
        elif event == "MODIFIED":
            conn.execute(
                "UPDATE joch_objects SET revision = ?, body = ? WHERE kind = ? AND namespace = ? AND name = ?",
                (row.revision, row.body, row.kind, row.namespace, row.name),
            )
        else:
            conn.execute(
                "DELETE FROM joch_objects WHERE kind = ? AND namespace = ? AND name = ?",
                (row.kind, row.namespace, row.name),
            )
        conn.execute(
            "INSERT INTO joch_changes (revision, kind, namespace, name, type, body, prev_labels, superseded) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (row.revision, row.kind, row.namespace, row.name, event, row.log_body, row.prev_labels,
             row.superseded),
        )
        return True

    def notify(self, conn: Conn, revision: int) -> None:  # noqa: B027 - optional hook
        """Tell other processes about new changes (called inside the write transaction)."""

    def listen(self, wake: feeds.Wake, active: Callable[[], bool] = lambda: True) -> None:  # noqa: B027
        """Start waking ``wake`` when another process commits changes (an optional hook); ``active``
        says whether anyone listens now (a backend may look less often while nobody does)."""

    @property
    def poll_interval(self) -> float:
        """How often the change feed looks for changes nobody told it about."""
        return 1.0

    def storage_problem(self) -> str | None:
        """See ``Store.storage_problem``."""
        return None

    def scrubbing(self) -> AbstractContextManager[None]:
        """Around a rewrite of sealed or formerly plain-text values: the dialect's way of not keeping
        the bytes it replaces (SQLite: zero freed space, then empty the WAL). None by default."""
        return nullcontext()

    @abc.abstractmethod
    def close(self) -> None: ...


def _nameable(*keys: str | None) -> bool:
    """Whether these keys (names, namespaces) can name a stored object: no NUL (module docstring)."""
    return not any(key and "\x00" in key for key in keys)


def object_key(kind: KindInfo, namespace: str | None) -> str:
    if not kind.namespaced:
        return ""
    if not namespace:
        raise errors.BadRequest(f"{kind.kind} is namespaced: a namespace is required")
    return namespace


# What orjson does differently from ``json`` is left to ``json``: subclasses of str, int, dict and
# list, datetimes and dataclasses (json refuses the last two), keys that are not strings and
# integers beyond 64 bits raise TypeError here; NaN and infinities, which orjson writes as null,
# are caught by the null check (an object holding a null is written by json, as before).
_ORJSON_PLAIN = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def dumps(obj: Obj) -> str:
    """An object as stored: compact JSON, UTF-8 characters as they are (``json.dumps`` with
    ``separators=(",", ":"), ensure_ascii=False``; by orjson, several times quicker, where that
    gives the same value — a float may be written in another notation, ``1e16`` for ``1e+16``)."""
    try:
        out = orjson.dumps(obj, option=_ORJSON_PLAIN)
    except TypeError:
        out = None
    if out is not None and b"null" not in out:
        return out.decode()
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def loads(body: str) -> Any:
    """A stored body read back: orjson, or ``json`` where orjson would read something else (an
    integer beyond 64 bits, which orjson reads as a float) or nothing (``NaN``, which ``json``
    wrote before writes went through orjson)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)
    return json.loads(body) if has_huge_float(value) else value



def change_body(kind: KindInfo, obj: Obj, event: str, body: str) -> str:
    """The change-log body of a write of ``obj`` (``body`` is its stored text): the one place where
    a kind's sensitive values are written to the change log. A DELETED change leaves them out; the
    newest change carries them, as a current read does."""
    if not kind.sensitive or event != "DELETED":
        return body
    return dumps(_without(obj, kind.sensitive))


def _without(obj: Obj, paths: tuple[str, ...]) -> Obj:
    """A copy of ``obj`` without the fields at dotted ``paths`` (``obj`` itself is left alone)."""
    out = dict(obj)
    for path in paths:
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                break
            child = dict(child)
            node[part] = child
            node = child
        else:
            node.pop(leaf, None)
    return out


def _supersede(conn: Conn, kind: str, namespace: str, name: str) -> int | None:
    """Delete the earlier ADDED/MODIFIED change rows of one object; the newest revision deleted."""
    rows = conn.execute(
        "DELETE FROM joch_changes WHERE kind = ? AND namespace = ? AND name = ? AND type <> 'DELETED' "
        "RETURNING revision",
        (kind, namespace, name),
    ).fetchall()
    return max((int(r[0]) for r in rows), default=None)


@functools.lru_cache(maxsize=256)
def _groups(groups: tuple[str, ...]) -> str:
    # Cached: every row of a request has the same groups, and an apply writes hundreds of rows.
    return json.dumps(list(groups), separators=(",", ":"), ensure_ascii=False)


def _aad(kind_key: str, namespace: str, name: str) -> bytes:
    """What a sealed value is bound to: the object it belongs to (``sealing``)."""
    return f"{kind_key}\0{namespace}\0{name}".encode()


_UPSERT_SEALED = ("INSERT INTO joch_sealed (kind, namespace, name, key_id, value) VALUES (?, ?, ?, ?, ?) "
                  "ON CONFLICT (kind, namespace, name) DO UPDATE SET key_id = excluded.key_id, value = excluded.value")
_SELECT_SEALED = "SELECT value FROM joch_sealed WHERE kind = ? AND namespace = ? AND name = ?"


def _sensitive_kinds() -> dict[str, KindInfo]:
    import joch.api.kinds  # noqa: F401 - registers the kinds (this module may be imported first)

    return {k.key: k for k in REGISTRY if k.sensitive}


def _open_sealed(
    sealer: Sealer, kind: KindInfo, namespace: str, name: str, envelope: str, what: str | None = None,
) -> views.Values:
    return sealer.open(envelope, _aad(kind.key, namespace, name),
                       what=what or f"cannot read the values of {_ident(kind, namespace, name)}")


def _ident(kind: KindInfo, namespace: str, name: str) -> str:
    return f'{kind.resource} "{name}"' + (f' in namespace "{namespace}"' if namespace else "")


def _not_found(kind: KindInfo, namespace: str, name: str) -> errors.NotFound:
    return errors.NotFound(f"{_ident(kind, namespace, name)} not found", kind=kind.plural, name=name)


def _conflict(kind: KindInfo, name: str, why: str) -> errors.Conflict:
    return errors.Conflict(
        f'Operation cannot be fulfilled on {kind.resource} "{name}": {why}', kind=kind.plural, name=name
    )


def _check_preconditions(
    kind: KindInfo, current: Obj, *, resource_version: str | None, uid: str | None
) -> None:
    m = current["metadata"]
    if resource_version and resource_version != m["resourceVersion"]:
        raise _conflict(
            kind, m["name"],
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    if uid and uid != m.get("uid"):
        raise _conflict(kind, m["name"], f"the UID in the precondition ({uid}) does not match ({m.get('uid')})")


class _Tx(Writer):
    """A write transaction: revisions are handed out in memory and the counter written at the end."""

    def __init__(self, conn: Conn, revision: int, backend: Backend, sealer: Sealer) -> None:
        self.conn = conn
        self.backend = backend
        self.sealer = sealer
        self._values_seen: dict[tuple[str, str, str], views.Values] = {}
        self.start = revision
        self.revision = revision
        # Rows this transaction has read or written, as stored text (None: no such object). The
        # transaction holds the write lock, so no one else can change them until it ends; an
        # apply of many objects naming the same provider, or an update that admission has just
        # read, costs no second round trip.
        self._seen: dict[tuple[str, str, str], str | None] = {}
        # Audit rows of this transaction, written by ``flush_audit`` just before it commits: one
        # statement per batch of rows instead of one round trip per object.
        self._audit: builtins.list[tuple[Any, ...]] = []

    def _load(self, kind: KindInfo, namespace: str, name: str) -> Obj | None:
        key = (kind.key, namespace, name)
        if not _nameable(namespace, name):
            return None
        if key in self._seen:
            body = self._seen[key]
        else:
            row = self.conn.execute(
                "SELECT body FROM joch_objects WHERE kind = ? AND namespace = ? AND name = ?", key
            ).fetchone()
            body = self._seen[key] = row[0] if row else None
        return loads(body) if body is not None else None

    def _record(self, kind: KindInfo, obj: Obj, event: str, previous: Obj | None = None, *, action: str) -> Obj:
        revision = self.revision + 1
        m = obj["metadata"]
        m["resourceVersion"] = str(revision)
        namespace, name = m.get("namespace") or "", m["name"]
        body = dumps(obj)
        prev_labels = None
        if previous is not None and event == "MODIFIED":
            before = (previous.get("metadata") or {}).get("labels") or {}
            if before != (m.get("labels") or {}):
                prev_labels = dumps(before)
        superseded = None
        if kind.history == "latest" and event != "ADDED":
            # An ADDED has nothing to supersede: the DELETED before it already did, and it is
            # refused (after this point) if the object exists, which must leave the log alone.
            superseded = _supersede(self.conn, kind.key, namespace, name)
        row = ChangeRow(kind.key, namespace, name, m["uid"], revision, body, prev_labels,
                        change_body(kind, obj, event, body), superseded)
        with tracing.span("joch.store.write", kind=kind.kind, namespace=namespace or None, name=name, action=action):
            recorded = self.backend.record(self.conn, event, row)
        if not recorded:
            # The primary key decided "already exists" in the same round trip as the insert.
            raise errors.AlreadyExists(f"{_ident(kind, namespace, name)} already exists",
                                       kind=kind.plural, name=name)
        self._seen[(kind.key, namespace, name)] = None if event == "DELETED" else body
        self.revision = revision
        if event == "DELETED" and kind.sensitive:
            self.conn.execute("DELETE FROM joch_sealed WHERE kind = ? AND namespace = ? AND name = ?",
                              (kind.key, namespace, name))
            self._values_seen.pop((kind.key, namespace, name), None)
        ctx = current_request()
        if ctx is not None:
            # Written during an HTTP request: its audit row, in this transaction (module docstring).
            self._audit.append((
                audits.format_time(datetime.now(UTC)), audits.text(ctx.user.name), _groups(ctx.user.groups), ctx.verb,
                kind.kind, namespace, name, "allowed", action, ctx.request_id, ctx.source_ip,
            ))
        return obj

    def audit(self, entry: AuditEntry) -> None:
        e = audits.filled(entry)
        self._audit.append((
            audits.format_time(datetime.now(UTC)), e.actor, _groups(e.groups), e.verb, e.kind,
            e.namespace or "", e.name or "", e.decision, e.reason, e.request_id, e.source_ip,
        ))

    def flush_audit(self) -> None:
        rows, self._audit = self._audit, []
        for start in range(0, len(rows), _AUDIT_BATCH):
            batch = rows[start:start + _AUDIT_BATCH]
            self.conn.execute(
                f"INSERT INTO joch_audit ({_AUDIT_COLUMNS}) VALUES "
                + ", ".join([_AUDIT_ROW] * len(batch)),
                [value for row in batch for value in row],
            )

    def _values(self, kind: KindInfo, namespace: str, name: str) -> views.Values:
        """The sensitive values of a stored object, decrypted ({} when it has none)."""
        key = (kind.key, namespace, name)
        if key not in self._values_seen:
            row = self.conn.execute(_SELECT_SEALED, key).fetchone()
            self._values_seen[key] = {} if row is None else _open_sealed(self.sealer, kind, namespace, name, row[0])
        return self._values_seen[key]

    def _seal(self, kind: KindInfo, namespace: str, name: str, values: views.Values) -> None:
        key_id, envelope = self.sealer.seal(values, _aad(kind.key, namespace, name))
        self.conn.execute(_UPSERT_SEALED, (kind.key, namespace, name, key_id, envelope))
        self._values_seen[(kind.key, namespace, name)] = values

    def reveal(self, kind: KindInfo, namespace: str | None, name: str) -> Obj:
        obj = self.get(kind, namespace, name)
        if not kind.sensitive:
            return obj
        return views.merged(obj, self._values(kind, object_key(kind, namespace), name))

    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj:
        ns = object_key(kind, namespace)
        obj = self._load(kind, ns, name)
        if obj is None:
            raise _not_found(kind, ns, name)
        return obj

    def list(self, kind: KindInfo, options: ListOptions | None = None) -> ListResult:
        # The transaction holds the revision (it locked the counter): no query for it per list.
        return _list(self.conn, kind, options or ListOptions(), revision=self.revision)

    def list_many(self, queries: Sequence[tuple[KindInfo, str | None]]) -> builtins.list[builtins.list[Obj]]:
        return _list_many(self.conn, queries)

    def create(self, kind: KindInfo, obj: Obj) -> Obj:
        m = dict(obj.get("metadata") or {})
        ns = object_key(kind, m.get("namespace"))
        name = m.get("name")
        if not name:
            prefix = m.get("generateName")
            if not prefix:
                raise errors.Invalid(
                    f"{kind.kind}: metadata.name or metadata.generateName is required", kind=kind.kind,
                    causes=[errors.Cause("metadata.name", "Required value: name or generateName is required",
                                         "FieldValueRequired")],
                )
            name = self._generate_name(kind, ns, prefix)
        if not _nameable(ns, name):  # admission refuses it first; this keeps Postgres from failing
            raise errors.Invalid(f"{kind.kind}: metadata.name and metadata.namespace must not contain NUL",
                                 kind=kind.kind, causes=[errors.Cause("metadata.name", "must not contain NUL")])
        m.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        m.pop("deletionTimestamp", None)
        if kind.namespaced:
            m["namespace"] = ns
        else:
            m.pop("namespace", None)
        new = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": m}
        new.update((k, v) for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata"))
        if not kind.sensitive:
            return self._record(kind, new, "ADDED", action="created")
        new, values = views.split(kind, new)
        out = self._record(kind, views.public(kind, new, values or {}), "ADDED", action="created")
        self._seal(kind, ns, name, values or {})
        return out

    def _generate_name(self, kind: KindInfo, namespace: str, prefix: str) -> str:
        for _ in range(8):
            name = prefix + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
            if self._load(kind, namespace, name) is None:
                return name
        raise errors.AlreadyExists(f"could not generate a unique name from prefix {prefix!r}; try again")

    def update(self, kind: KindInfo, obj: Obj) -> Obj:
        m = obj.get("metadata") or {}
        current = self.get(kind, m.get("namespace"), m.get("name") or "")
        _check_preconditions(kind, current, resource_version=m.get("resourceVersion"), uid=m.get("uid"))
        cm = current["metadata"]
        new_meta = {k: v for k, v in cm.items() if k not in _USER_METADATA}
        new_meta.update((k, m[k]) for k in _USER_METADATA if m.get(k))
        if m.get("managedFields") is not None:  # set by the server's field manager; kept when absent
            new_meta.pop("managedFields", None)
            if m["managedFields"]:
                new_meta["managedFields"] = m["managedFields"]
        new = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": new_meta}
        new.update((k, v) for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status"))
        if "status" in current:
            new["status"] = current["status"]
        sealed: views.Values | None = None  # new sensitive values to seal, when they change
        if kind.sensitive:
            # Named values replace the stored ones; none named keeps them (joch.api.secrets).
            new, given = views.split(kind, new)
            stored = self._values(kind, cm.get("namespace") or "", cm["name"]) if given is not None else {}
            if given is not None and {**stored, **given} != stored:
                sealed = {**stored, **given}
            new = views.public(kind, new, sealed)
            scrubbed = new["metadata"]  # a copy, when the view scrubbed an annotation
            if isinstance(scrubbed, dict):
                new_meta = scrubbed
        # the spec, or a RoleBinding's top-level fields
        if kind.body_of(new) != kind.body_of(current) or sealed is not None:
            new_meta["generation"] = int(cm.get("generation") or 0) + 1
        if cm.get("deletionTimestamp"):
            added = set(new_meta.get("finalizers") or ()) - set(cm.get("finalizers") or ())
            if added:
                raise errors.Invalid(
                    f"{_ident(kind, cm.get('namespace') or '', cm['name'])} is being deleted: no new "
                    f"finalizers can be added (tried {', '.join(sorted(added))})", kind=kind.kind, name=cm["name"],
                    causes=[errors.Cause("metadata.finalizers", "Forbidden: no new finalizers can be added if "
                                         "the object is being deleted", "FieldValueForbidden")],
                )
            if not new_meta.get("finalizers"):
                return self._record(kind, new, "DELETED", current, action="deleted (its last finalizer removed)")
        if new == current and sealed is None:
            return current
        out = self._record(kind, new, "MODIFIED", current, action="updated")
        if sealed is not None:
            self._seal(kind, cm.get("namespace") or "", cm["name"], sealed)
        return out

    def update_status(self, kind: KindInfo, obj: Obj) -> Obj:
        m = obj.get("metadata") or {}
        current = self.get(kind, m.get("namespace"), m.get("name") or "")
        _check_preconditions(kind, current, resource_version=m.get("resourceVersion"), uid=m.get("uid"))
        status = obj.get("status")
        if kind.sensitive:  # status.keys is the store's account of the sealed values: not writable
            status = {**(status or {}), "keys": (current.get("status") or {}).get("keys") or []}
        new = dict(current)
        managed = m.get("managedFields")  # set by the server's field manager; kept when absent
        if managed is not None and managed != (current["metadata"].get("managedFields") or []):
            new["metadata"] = {k: v for k, v in current["metadata"].items() if k != "managedFields"}
            if managed:
                new["metadata"]["managedFields"] = managed
        elif status == current.get("status"):
            return current
        if status is None:
            new.pop("status", None)
        else:
            new["status"] = status
        return self._record(kind, new, "MODIFIED", current, action="status updated")

    def delete(
        self, kind: KindInfo, namespace: str | None, name: str, *, resource_version: str | None = None,
        uid: str | None = None,
    ) -> Obj:
        current = self.get(kind, namespace, name)
        _check_preconditions(kind, current, resource_version=resource_version, uid=uid)
        cm = current["metadata"]
        if cm.get("finalizers"):
            if cm.get("deletionTimestamp"):
                return current
            marked = {**current, "metadata": {**cm, "deletionTimestamp": now()}}
            return self._record(kind, marked, "MODIFIED", current,
                                action="marked for deletion (waiting for its finalizers)")
        return self._record(kind, current, "DELETED", current, action="deleted")


    def record_usage(self, record: UsageRecord) -> bool:
        return _record_usage(self.conn, record)

    def usage_totals(self, where: UsageFilter, by: UsageGroup | None = None) -> builtins.list[UsageTotal]:
        return _usage_totals(self.conn, where, by)


_USAGE_GROUPS: dict[str, tuple[str, ...]] = {
    "agent": ("namespace", "agent"), "namespace": ("namespace",), "team": ("team",), "model": ("model",),
    "run": ("namespace", "run_name", "run_uid"),
}


def _record_usage(conn: Conn, r: UsageRecord) -> bool:
    row = conn.execute(
        "INSERT INTO joch_usage (run_uid, event_id, namespace, run_name, agent, team, model, input_tokens, "
        "output_tokens, cached_tokens, cost_usd, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (run_uid, event_id) DO NOTHING RETURNING run_uid",
        (r.run_uid, r.event_id, r.namespace, r.run_name, r.agent, r.team, r.model, r.input_tokens,
         r.output_tokens, r.cached_tokens, r.cost_usd, r.recorded_at),
    ).fetchone()
    return row is not None


def _usage_totals(conn: Conn, where: UsageFilter, by: UsageGroup | None) -> list[UsageTotal]:
    clauses: list[str] = []
    params: list[Any] = []
    if where.since is not None:
        clauses.append("recorded_at >= ?")
        params.append(where.since)
    for column, value in (("namespace", where.namespace), ("agent", where.agent), ("team", where.team),
                          ("run_uid", where.run_uid)):
        if value is not None:
            if not _nameable(value):
                return [] if by else [UsageTotal((), 0.0, 0, 0, 0, 0, 0)]
            clauses.append(f"{column} = ?")
            params.append(value)
    columns = _USAGE_GROUPS[by] if by else ()
    select = ", ".join(columns) + ", " if columns else ""
    sql = (f"SELECT {select}COALESCE(SUM(cost_usd), 0), COALESCE(SUM(input_tokens), 0), "
           "COALESCE(SUM(output_tokens), 0), COALESCE(SUM(cached_tokens), 0), COUNT(DISTINCT run_uid), COUNT(*) "
           "FROM joch_usage" + (f" WHERE {' AND '.join(clauses)}" if clauses else "")
           + (f" GROUP BY {', '.join(columns)}" if columns else ""))
    n = len(columns)
    totals = [UsageTotal(tuple(str(v) for v in row[:n]), float(row[n]), int(row[n + 1]), int(row[n + 2]),
                         int(row[n + 3]), int(row[n + 4]), int(row[n + 5]))
              for row in conn.execute(sql, params).fetchall()]
    return sorted(totals, key=lambda t: (-t.cost_usd, t.group))


def _encode_continue(revision: int, namespace: str, name: str) -> str:
    raw = json.dumps({"rv": revision, "ns": namespace, "n": name}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        decoded = int(data["rv"]), str(data["ns"]), str(data["n"])
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise errors.BadRequest(f"invalid continue token {token!r}: pass the token a list returned") from exc
    if not _nameable(decoded[1], decoded[2]):
        raise errors.BadRequest(f"invalid continue token {token!r}: pass the token a list returned")
    return decoded


def _list(conn: Conn, kind: KindInfo, opts: ListOptions, *, revision: int | None = None) -> ListResult:
    """One page of ``kind``. ``revision``: the store's revision when the caller knows it (a write
    transaction, which holds the counter and has counted its own writes), else it is read."""
    labels = selectors.parse_labels(opts.label_selector)
    fields = selectors.parse_fields(opts.field_selector, kind)
    if opts.limit is not None and opts.limit < 0:
        raise errors.BadRequest(f"limit must be a positive number, got {opts.limit}")
    limit = opts.limit or None
    namespace = (opts.namespace or None) if kind.namespaced else None
    after: tuple[str, str] | None = None
    first_revision: int | None = None
    if opts.continue_token:
        first_revision, ns_after, name_after = _decode_continue(opts.continue_token)
        after = (ns_after, name_after)
    where, params = _list_filter(kind, namespace, fields)
    if revision is None:
        (revision,) = conn.execute("SELECT value FROM joch_meta WHERE key = 'revision'").fetchone()
    if where is None:
        list_revision = first_revision if first_revision is not None else int(revision)
        return ListResult(items=[], resource_version=str(list_revision), continue_token=None)
    items: list[Obj] = []
    more = False
    while True:
        chunk = _LIST_CHUNK if limit is None else max(limit + 1 - len(items), 64)
        sql = f"SELECT namespace, name, body FROM joch_objects WHERE {where}"
        page_params = list(params)
        if after is not None:
            # A row-value comparison: both dialects turn it into an index range scan.
            sql += " AND (namespace, name) > (?, ?)"
            page_params += [after[0], after[1]]
        sql += " ORDER BY namespace, name LIMIT ?"
        rows = conn.execute(sql, [*page_params, chunk]).fetchall()
        for ns_row, name_row, body in rows:
            obj = loads(body)
            if (labels or fields) and not selectors.matches(obj, labels, fields):
                after = (ns_row, name_row)
                continue
            if limit is not None and len(items) == limit:
                more = True
                break
            items.append(obj)
            after = (ns_row, name_row)
        if more or len(rows) < chunk:
            break
    list_revision = first_revision if first_revision is not None else int(revision)
    token = _encode_continue(list_revision, *after) if more and after is not None else None
    # No remainingItemCount: it is optional in Kubernetes, and counting the rest of a large
    # collection on every page costs more than the page itself.
    return ListResult(items=items, resource_version=str(list_revision), continue_token=token)


def _list_many(conn: Conn, queries: Sequence[tuple[KindInfo, str | None]]) -> builtins.list[builtins.list[Obj]]:
    """Whole lists of ``(kind, namespace)`` in one statement: the filters OR'ed, each row handed to
    every query it matches (rows come ordered by namespace and name, as ``_list`` orders them)."""
    wanted: builtins.list[tuple[str, str | None]] = []
    clauses: builtins.list[str] = []
    params: builtins.list[Any] = []
    for kind, namespace in queries:
        namespace = (namespace or None) if kind.namespaced else None
        where, where_params = _list_filter(kind, namespace, ())
        if where is None:  # a namespace no row can have
            wanted.append(("", "\0"))
            continue
        wanted.append((kind.key, namespace))
        clauses.append(f"({where})")
        params += where_params
    out: builtins.list[builtins.list[Obj]] = [[] for _ in queries]
    if not clauses:
        return out
    rows = conn.execute(f"SELECT kind, namespace, body FROM joch_objects WHERE {' OR '.join(clauses)} "
                        "ORDER BY namespace, name", params).fetchall()
    for key, ns_row, body in rows:
        for i, (want_key, want_ns) in enumerate(wanted):
            if key == want_key and (want_ns is None or ns_row == want_ns):
                out[i].append(loads(body))  # each list its own objects, as separate lists would be
    return out


def _list_filter(
    kind: KindInfo, namespace: str | None, fields: tuple[selectors.Requirement, ...]
) -> tuple[str | None, list[Any]]:
    """The WHERE clause and its parameters; None when nothing can match (a key with NUL)."""
    where, params = ["kind = ?"], [kind.key]
    if namespace is not None:
        if not _nameable(namespace):
            return None, []
        where.append("namespace = ?")
        params.append(namespace)
    for req in fields:
        if req.key not in selectors.FIELDS:
            continue  # a field of the body (status.phase): matched on each row, as labels are
        value = req.values[0]
        if not _nameable(value):
            if req.op == "=":
                return None, []
            continue  # every stored key differs from it
        column = "name" if req.key == "metadata.name" else "namespace"
        where.append(f"{column} {'=' if req.op == '=' else '<>'} ?")
        params.append(value)
    return " AND ".join(where), params


def _audit_filter(query: AuditQuery) -> tuple[builtins.list[str], builtins.list[Any]]:
    where: builtins.list[str] = []
    params: builtins.list[Any] = []
    if query.before_id is not None:
        where.append("id < ?")
        params.append(query.before_id)
    if query.since is not None:
        where.append("time >= ?")
        params.append(audits.format_time(query.since))
    if query.until is not None:
        where.append("time < ?")
        params.append(audits.format_time(query.until))
    for column, value in (("actor", query.actor), ("verb", query.verb), ("kind", query.kind),
                          ("namespace", query.namespace), ("name", query.name), ("decision", query.decision)):
        if value is not None:
            # Postgres text cannot hold NUL: no row has one, so such a filter matches nothing.
            if not _nameable(value):
                return ["1 = 0"], []
            where.append(f"{column} = ?")
            params.append(value)
    return where, params


class SqlStore(Store):
    def __init__(self, backend: Backend, *, history: int | None = None, compact_interval: float = 30.0,
                 keys: KeyRing | None = None) -> None:
        self.backend = backend
        self.history = history
        self.sealer = Sealer(keys)
        try:
            self._check_sealed()
        except BaseException:
            backend.close()
            raise
        self._local = threading.local()
        self._write_seconds = metrics.STORE_WRITE.labels(backend.name)
        metrics.STORE_REVISION.track(metrics.STORE_REVISION, _revision_of(weakref.ref(self)))  # the newest store
        self.feed = feeds.Feed(
            read_changes=self._changes_after, current=self.current_revision,
            poll_interval=backend.poll_interval, compact=self._auto_compact if history else None,
            compact_interval=compact_interval,
        )
        backend.listen(self.feed.wake, lambda: self.feed.subscribers_count() > 0)
        if history:
            self.feed.start()  # the feed thread also compacts, so it runs even with no watcher
        try:
            namespaces.ensure(self, self._used_namespaces)
        except BaseException:
            self.close()
            raise

    def _used_namespaces(self) -> set[str]:
        with self.backend.read() as conn:
            rows = conn.execute("SELECT DISTINCT namespace FROM joch_objects WHERE namespace <> ''").fetchall()
        return {str(row[0]) for row in rows}

    # --- writes -----------------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Writer]:
        if getattr(self._local, "writing", False):
            # The write lock is not re-entrant (and on Postgres the counter row is locked): a nested
            # write on the same thread would wait for itself forever. Use the Writer you were given.
            raise RuntimeError(
                "store write inside a store transaction on the same thread: use the transaction's Writer"
            )
        self._local.writing = True
        try:
            with self._transaction() as tx:
                self._local.tx = tx
                yield tx
        finally:
            self._local.writing = False
            self._local.tx = None

    @contextmanager
    def _transaction(self) -> Iterator[_Tx]:
        started = time.perf_counter()
        with self.backend.write() as conn:
            (revision,) = conn.execute(self.backend.lock_revision_sql).fetchone()
            tx = _Tx(conn, int(revision), self.backend, self.sealer)
            yield tx
            tx.flush_audit()
            if tx.revision != tx.start:
                conn.execute("UPDATE joch_meta SET value = ? WHERE key = 'revision'", (tx.revision,))
                self.backend.notify(conn, tx.revision)
        self._write_seconds.observe(time.perf_counter() - started)
        if tx.revision != tx.start:
            self.feed.wake()

    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj:
        ns = object_key(kind, namespace)
        if not _nameable(ns, name):
            raise _not_found(kind, ns, name)
        with self.backend.read() as conn:
            row = conn.execute(
                "SELECT body FROM joch_objects WHERE kind = ? AND namespace = ? AND name = ?",
                (kind.key, ns, name),
            ).fetchone()
        if row is None:
            raise _not_found(kind, ns, name)
        result: Obj = json.loads(row[0])
        return result

    def reveal(self, kind: KindInfo, namespace: str | None, name: str) -> Obj:
        ns = object_key(kind, namespace)
        if not _nameable(ns, name):
            raise _not_found(kind, ns, name)
        with self.backend.read() as conn:
            row = conn.execute("SELECT body FROM joch_objects WHERE kind = ? AND namespace = ? AND name = ?",
                               (kind.key, ns, name)).fetchone()
            sealed = conn.execute(_SELECT_SEALED, (kind.key, ns, name)).fetchone() if kind.sensitive else None
        if row is None:
            raise _not_found(kind, ns, name)
        obj: Obj = json.loads(row[0])
        if sealed is None:
            return obj
        return views.merged(obj, _open_sealed(self.sealer, kind, ns, name, sealed[0]))

    # --- sealed values ----------------------------------------------------------------------------

    def _check_sealed(self) -> None:
        """At open: every key the stored values need must be in the ring and decrypt one of them
        (a wrong key is an error now, not at the first run that needs a Secret); values an older
        joch left in plain text, or a keyless store kept unencrypted, are sealed with the ring."""
        kinds = _sensitive_kinds()
        if not kinds:
            return
        with self.backend.read() as conn:
            key_ids = [r[0] for r in conn.execute("SELECT DISTINCT key_id FROM joch_sealed").fetchall()]
            samples = [conn.execute("SELECT kind, namespace, name, value FROM joch_sealed WHERE key_id = ? LIMIT 1",
                                    (kid,)).fetchone() for kid in key_ids]
            marks = ", ".join("?" for _ in kinds)
            legacy = conn.execute(
                f"SELECT 1 FROM joch_objects o WHERE o.kind IN ({marks}) AND NOT EXISTS (SELECT 1 FROM joch_sealed s "
                "WHERE s.kind = o.kind AND s.namespace = o.namespace AND s.name = o.name) LIMIT 1", list(kinds),
            ).fetchone()
        for kind_key, namespace, name, envelope in samples:
            if kind_key in kinds:
                kind = kinds[kind_key]
                what = (f"cannot open the store {self.backend.where}: its {kind.kind}s (first "
                        f"{_ident(kind, namespace, name)})")
                _open_sealed(self.sealer, kind, namespace, name, envelope, what)
        if legacy is not None or (self.sealer.ring is not None and IDENTITY in key_ids):
            self.reseal(rotate=False)

    def reseal(self, *, rotate: bool = True) -> int:
        """Seal again, in one transaction, every stored value not sealed with the ring's first key
        (``rotate``; without it only unencrypted ones), and seal the plain-text values an older joch
        left in object rows and the change log. Returns how many objects' values were (re)sealed.
        Revisions do not change: what a reader sees of the objects stays the same."""
        kinds = _sensitive_kinds()
        if not kinds:
            return 0
        count = 0
        marks = ", ".join("?" for _ in kinds)
        with self.backend.scrubbing(), self.backend.write() as conn:
            conn.execute(self.backend.lock_revision_sql).fetchone()
            legacy = conn.execute(
                f"SELECT o.kind, o.namespace, o.name, o.body FROM joch_objects o WHERE o.kind IN ({marks}) AND NOT "
                "EXISTS (SELECT 1 FROM joch_sealed s WHERE s.kind = o.kind AND s.namespace = o.namespace AND "
                "s.name = o.name)", list(kinds),
            ).fetchall()
            for kind_key, namespace, name, body in legacy:
                kind = kinds[kind_key]
                obj, values = views.split(kind, json.loads(body))
                conn.execute("UPDATE joch_objects SET body = ? WHERE kind = ? AND namespace = ? AND name = ?",
                             (dumps(views.public(kind, obj, values or {})), kind_key, namespace, name))
                key_id, envelope = self.sealer.seal(values or {}, _aad(kind_key, namespace, name))
                conn.execute(_UPSERT_SEALED, (kind_key, namespace, name, key_id, envelope))
                count += 1
            for revision, kind_key, body in conn.execute(
                f"SELECT revision, kind, body FROM joch_changes WHERE kind IN ({marks})", list(kinds)
            ).fetchall():
                obj, values = views.split(kinds[kind_key], json.loads(body))
                if values is not None:
                    conn.execute("UPDATE joch_changes SET body = ? WHERE revision = ?",
                                 (dumps(views.public(kinds[kind_key], obj, values)), revision))
            current = IDENTITY if self.sealer.ring is None else self.sealer.ring.primary.id
            if rotate:
                rows = conn.execute("SELECT kind, namespace, name, value FROM joch_sealed WHERE key_id <> ?",
                                    (current,)).fetchall()
            else:
                rows = conn.execute("SELECT kind, namespace, name, value FROM joch_sealed WHERE key_id = ? AND "
                                    "key_id <> ?", (IDENTITY, current)).fetchall()
            for kind_key, namespace, name, envelope in rows:
                if kind_key not in kinds:
                    continue
                values = _open_sealed(self.sealer, kinds[kind_key], namespace, name, envelope)
                key_id, sealed = self.sealer.seal(values, _aad(kind_key, namespace, name))
                conn.execute("UPDATE joch_sealed SET key_id = ?, value = ? WHERE kind = ? AND namespace = ? AND "
                             "name = ?", (key_id, sealed, kind_key, namespace, name))
                count += 1
        return count

    def sealed_key_ids(self) -> dict[str, int]:
        """How many objects' values each key id seals (``identity``: unencrypted)."""
        with self.backend.read() as conn:
            rows = conn.execute("SELECT key_id, COUNT(*) FROM joch_sealed GROUP BY key_id").fetchall()
        return {str(k): int(n) for k, n in rows}

    def create(self, kind: KindInfo, obj: Obj) -> Obj:
        with self.transaction() as tx:
            return tx.create(kind, obj)

    def update(self, kind: KindInfo, obj: Obj) -> Obj:
        with self.transaction() as tx:
            return tx.update(kind, obj)

    def update_status(self, kind: KindInfo, obj: Obj) -> Obj:
        with self.transaction() as tx:
            return tx.update_status(kind, obj)

    def delete(
        self, kind: KindInfo, namespace: str | None, name: str, *, resource_version: str | None = None,
        uid: str | None = None,
    ) -> Obj:
        with self.transaction() as tx:
            return tx.delete(kind, namespace, name, resource_version=resource_version, uid=uid)

    def audit(self, entry: AuditEntry) -> None:
        """In this thread's open transaction if there is one (the row commits or rolls back with
        it), else in a transaction of its own, from any thread."""
        tx: _Tx | None = getattr(self._local, "tx", None)
        if tx is not None:
            tx.audit(entry)
            return
        with self.transaction() as writer:
            writer.audit(entry)

    def prune_audit(self, before: datetime) -> int:
        cutoff = audits.format_time(before)
        pruned = 0
        while True:
            # Small transactions without the revision lock: writers wait for one batch at most.
            with self.backend.write() as conn:
                deleted = conn.execute(
                    "DELETE FROM joch_audit WHERE id IN "
                    "(SELECT id FROM joch_audit WHERE time < ? ORDER BY id LIMIT ?) RETURNING id",
                    (cutoff, _PRUNE_BATCH),
                ).fetchall()
            pruned += len(deleted)
            if len(deleted) < _PRUNE_BATCH:
                return pruned

    # --- reads ------------------------------------------------------------------------------------

    def list(self, kind: KindInfo, options: ListOptions | None = None) -> ListResult:
        with self.backend.read() as conn:
            return _list(conn, kind, options or ListOptions())

    def audit_events(self, query: AuditQuery) -> AuditPage:
        where, params = _audit_filter(query)
        sql = f"SELECT id, {_AUDIT_COLUMNS} FROM joch_audit"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        with self.backend.read() as conn:
            rows = conn.execute(sql, [*params, query.limit + 1]).fetchall()
        items = [
            AuditEvent(int(r[0]), r[1], r[2], tuple(json.loads(r[3])), r[4], r[5], r[6], r[7], r[8], r[9],
                       r[10], r[11])
            for r in rows[: query.limit]
        ]
        return AuditPage(items=items, more=len(rows) > query.limit)

    def current_revision(self) -> int:
        with self.backend.read() as conn:
            (revision,) = conn.execute("SELECT value FROM joch_meta WHERE key = 'revision'").fetchone()
        return int(revision)

    def compacted_revision(self) -> int:
        with self.backend.read() as conn:
            (revision,) = conn.execute("SELECT value FROM joch_meta WHERE key = 'compacted'").fetchone()
        return int(revision)

    def compact(self, revision: int) -> int:
        return self._compact(lambda conn: int(revision))

    def _auto_compact(self) -> None:
        """Keep the newest ``history`` change rows (rows, not revisions: see the module docstring)."""
        if self.history:
            self._compact(self._horizon_keeping(self.history))

    @staticmethod
    def _horizon_keeping(rows: int) -> Callable[[Conn], int]:
        def horizon(conn: Conn) -> int:
            row = conn.execute(
                "SELECT revision FROM joch_changes ORDER BY revision DESC LIMIT 1 OFFSET ?", (rows,)
            ).fetchone()
            return 0 if row is None else int(row[0])
        return horizon

    def _compact(self, target_of: Callable[[Conn], int]) -> int:
        """Compact up to the revision ``target_of`` picks, reading it under the write lock (so a
        write that removes superseded rows meanwhile cannot make it remove more than it meant)."""
        with self.backend.write() as conn:
            (current,) = conn.execute(self.backend.lock_revision_sql).fetchone()
            (compacted,) = conn.execute("SELECT value FROM joch_meta WHERE key = 'compacted'").fetchone()
            target = min(target_of(conn), int(current))
            if target <= int(compacted):
                return int(compacted)
            conn.execute("DELETE FROM joch_changes WHERE revision <= ?", (target,))
            conn.execute("UPDATE joch_meta SET value = ? WHERE key = 'compacted'", (target,))
        return target

    def _changes_after(
        self, revision: int, kind: str | None, limit: int
    ) -> tuple[int, builtins.list[feeds.Change]]:
        """Changes after ``revision`` (oldest first) and the compaction horizon, in one snapshot."""
        with self.backend.read() as conn:
            (compacted,) = conn.execute("SELECT value FROM joch_meta WHERE key = 'compacted'").fetchone()
            if kind is None:
                rows = conn.execute(
                    "SELECT revision, kind, namespace, name, type, body, prev_labels, superseded "
                    "FROM joch_changes WHERE revision > ? ORDER BY revision LIMIT ?",
                    (revision, limit),
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT revision, kind, namespace, name, type, body, prev_labels, superseded "
                    "FROM joch_changes WHERE kind = ? AND revision > ? ORDER BY revision LIMIT ?",
                    (kind, revision, limit),
                ).fetchall()
        return int(compacted), [
            feeds.Change(int(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], None if r[7] is None else int(r[7]))
            for r in rows
        ]

    def _snapshot(self, kind: KindInfo | None, namespace: str | None) -> tuple[int, builtins.list[str]]:
        """The current revision and the bodies a watch from "now" starts with: the objects of
        ``kind`` (of every kind when None) in ``namespace`` (everywhere when None), in one snapshot."""
        where: builtins.list[str] = []
        params: builtins.list[Any] = []
        if kind is not None:
            where.append("kind = ?")
            params.append(kind.key)
        if namespace:
            if not _nameable(namespace):
                return self.current_revision(), []
            where.append("namespace = ?")
            params.append(namespace)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        with self.backend.read() as conn:
            (revision,) = conn.execute("SELECT value FROM joch_meta WHERE key = 'revision'").fetchone()
            rows = conn.execute(f"SELECT body FROM joch_objects {clause}ORDER BY kind, namespace, name",
                                params).fetchall()
        return int(revision), [r[0] for r in rows]

    def watch(self, kind: KindInfo | None, options: WatchOptions | None = None) -> Watch:
        opts = options or WatchOptions()
        flt = feeds.Filter(
            kind=kind.key if kind else None,
            namespace=(opts.namespace or None) if (kind is None or kind.namespaced) else None,
            labels=selectors.parse_labels(opts.label_selector),
            fields=selectors.parse_fields(opts.field_selector, kind),
        )
        interval = opts.bookmark_interval
        bookmark = feeds.bookmark_object(kind.api_version, kind.kind) if kind else feeds.bookmark_object("", "")
        limits = feeds.BufferLimits(
            events=opts.buffer_events or feeds.DEFAULT_BUFFER_EVENTS,
            bytes=opts.buffer_bytes or feeds.DEFAULT_BUFFER_BYTES,
        )
        rv = opts.resource_version
        if rv in (None, "", "0"):
            sub = self.feed.subscribe(flt, after=None, bookmarks=opts.allow_bookmarks,
                                      bookmark_interval=interval, bookmark_template=bookmark, limits=limits)
            try:
                revision, bodies = self._snapshot(kind, flt.namespace)
                sub.start_live(revision, bodies)
            except BaseException:
                sub.close()
                raise
            return sub
        try:
            after = int(rv)
        except ValueError as exc:
            raise errors.BadRequest(f"invalid resourceVersion {rv!r}: it must be a number") from exc
        compacted, current = self.compacted_revision(), self.current_revision()
        if after > current:
            # A revision no commit has produced: Kubernetes answers "too large resource version".
            raise errors.BadRequest(
                f"too large resource version: {after}, the store is at {current}; watch from a "
                "resourceVersion a list or an object returned"
            )
        if after < compacted:
            raise errors.Gone(
                f"too old resource version: {after} ({compacted}); list again to get a current "
                "resourceVersion and watch from there",
            )
        return self.feed.subscribe(flt, after=after, bookmarks=opts.allow_bookmarks,
                                   bookmark_interval=interval, bookmark_template=bookmark, limits=limits)

    def storage_problem(self) -> str | None:
        return self.backend.storage_problem()

    # --- usage and keys ---------------------------------------------------------------------------

    def record_usage(self, record: UsageRecord) -> bool:
        with self.transaction() as tx:
            return tx.record_usage(record)

    def usage_totals(self, where: UsageFilter, by: UsageGroup | None = None) -> builtins.list[UsageTotal]:
        with self.backend.read() as conn:
            return _usage_totals(conn, where, by)

    def shared_key(self, name: str) -> bytes:
        select = "SELECT value FROM joch_keys WHERE name = ?"
        with self.backend.read() as conn:
            row = conn.execute(select, (name,)).fetchone()
        if row is None:
            # Two servers creating it at once: one insert wins, and both read the winner's.
            with self.backend.write() as conn:
                conn.execute("INSERT INTO joch_keys (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                             (name, secrets.token_hex(32)))
                row = conn.execute(select, (name,)).fetchone()
        return bytes.fromhex(str(row[0]))

    def stop_watches(self) -> None:
        self.feed.close_subscriptions()

    def close(self) -> None:
        self.feed.close()
        self.backend.close()


def _revision_of(store: weakref.ref[SqlStore]) -> Callable[[], metrics.Sample]:
    """``joch_store_revision``'s reading of ``store``: nothing once it is gone (a closed one raises)."""
    def read() -> metrics.Sample:
        current = store()
        return {(): float(current.current_revision())} if current is not None else {}
    return read


__all__ = ["REGISTRY", "Backend", "Conn", "SqlStore", "change_body", "dumps", "object_key"]
