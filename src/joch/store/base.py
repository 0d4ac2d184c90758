"""The Store contract every backend implements, and the shapes it returns.

Objects are plain JSON dicts (``apiVersion, kind, metadata, spec, status``). The store is
synchronous and thread-safe; the HTTP server calls it from worker threads and consumes watches
through ``Watch.aget``. Semantics (they hold for every backend and the contract tests check them):

* One global revision per store, strictly increasing; each write takes the next revision, and an
  object's ``metadata.resourceVersion`` is the revision of its last write (as a decimal string).
* ``create`` sets uid, creationTimestamp, generation=1 and resolves ``metadata.generateName``.
* ``update`` replaces metadata (labels, annotations, finalizers, ownerReferences) and spec, never
  status; a ``metadata.resourceVersion`` on the input is a precondition (stale → ``Conflict``).
  ``generation`` increments only when spec changes (for a ``body="top"`` kind such as a
  RoleBinding, its top-level fields: ``KindInfo.body_of``). An update that changes nothing writes nothing
  and returns the stored object with its old resourceVersion.
* ``update_status`` replaces status only; same precondition rule.
* ``delete`` on an object with finalizers sets ``deletionTimestamp`` (a MODIFIED event); the object
  is removed (DELETED) once an update leaves its finalizers empty.
* ``watch(resource_version=R)`` replays every change after R in revision order, then follows;
  R older than the compaction horizon raises ``Gone``. Without R it first emits the current
  objects as ADDED, then follows. BOOKMARK events carry only ``metadata.resourceVersion``.
  For a kind whose ``history`` is ``latest`` only each object's newest change is kept, so a replay
  gives its latest state (``sql`` explains the semantics).
* A kind's ``sensitive`` fields (a Secret's ``spec.data``) are never in what a read, a watch event or
  a write returns: those show the public view (``joch.api.secrets``: the keys and their sizes under
  ``status.keys``). The store keeps the values sealed (``joch.store.sealing``: AES-256-GCM with the
  key ring ``open_store`` was given) and ``reveal`` returns them decrypted. An update that names no
  sensitive field keeps the stored values; one that names it replaces them.
* A watch whose consumer falls behind by more than its buffer (``WatchOptions.buffer_events`` or
  ``buffer_bytes``) while following live ends with an ERROR event carrying a 410 ``Expired``
  Status, as if its revision had been compacted: list again.
* Every write and its change-log row commit in one transaction (``transaction()`` groups several
  writes: all of them commit or none does).
* **Audit.** Every object written while an HTTP request is current (``joch.api.identity``) gets an
  audit row in the same transaction (actor, groups, request id, source IP and verb from the
  request; decision ``allowed``): a write that rolls back (a failed apply, a dry run) leaves none,
  a committed one always has its row. Writes outside any request (controllers) get no automatic
  row; they call ``audit`` where a decision must be recorded. Rows are append-only: only
  ``prune_audit`` (retention) deletes them.
* A write that fails because the disk is full raises ``InsufficientStorage`` naming the disk (never
  a bare driver error), and nothing of it is committed; writes succeed again once space returns.
* Metered usage (``record_usage``, ``usage_totals``) is a table beside the objects, not an object:
  one row per (run uid, event id), so recording an event twice records it once; rows written in a
  transaction commit with it (the run's ``status.costUsd`` and the rows that add up to it move
  together). ``shared_key`` is a random key every server of the store sees, made on first use.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from joch.api.audit import AuditEntry, AuditPage, AuditQuery
from joch.api.registry import KindInfo

Obj = dict[str, Any]
EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]


@dataclass(frozen=True)
class WatchEvent:
    type: EventType
    object: Obj
    revision: int

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "object": self.object}


@dataclass
class ListResult:
    items: list[Obj]
    resource_version: str
    continue_token: str | None = None


@dataclass
class ListOptions:
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    limit: int | None = None
    continue_token: str | None = None


@dataclass
class WatchOptions:
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    resource_version: str | None = None
    allow_bookmarks: bool = False
    bookmark_interval: float = 10.0  # seconds without an event before a BOOKMARK is sent
    # What the watch holds for a consumer that has not read it yet; past either bound a consumer
    # that follows live is ended with a 410 ``Expired`` ERROR event (None: the store's default).
    buffer_events: int | None = None
    buffer_bytes: int | None = None


class Watch(abc.ABC):
    """A stream of events. ``get`` blocks (threads); ``aget`` awaits (asyncio); both return None
    on timeout. ``close`` is idempotent and ends the stream."""

    @abc.abstractmethod
    def get(self, timeout: float | None = None) -> WatchEvent | None: ...

    @abc.abstractmethod
    async def aget(self, timeout: float | None = None) -> WatchEvent | None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def __iter__(self) -> Iterator[WatchEvent]:
        while True:
            event = self.get(timeout=None)
            if event is None:
                return
            yield event

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class UsageRecord:
    """One metered usage event of a run (``joch.controllers.metering`` fills it in)."""

    run_uid: str
    event_id: str
    namespace: str
    run_name: str
    agent: str
    team: str
    model: str
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost_usd: float
    recorded_at: float  # epoch seconds


UsageGroup = Literal["agent", "namespace", "team", "model", "run"]


@dataclass(frozen=True)
class UsageFilter:
    """Which usage rows to sum: each field narrows (None: any). ``since`` is inclusive, epoch seconds."""

    since: float | None = None
    namespace: str | None = None
    agent: str | None = None
    team: str | None = None
    run_uid: str | None = None


@dataclass(frozen=True)
class UsageTotal:
    """Sums over the rows of one group; ``group`` holds the grouping columns' values (``agent``:
    namespace and agent; ``run``: namespace, run name and run uid; none when not grouped)."""

    group: tuple[str, ...]
    cost_usd: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    runs: int
    events: int


class Writer(abc.ABC):
    """The write half of the contract; a ``transaction()`` hands one out."""

    @abc.abstractmethod
    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj: ...

    @abc.abstractmethod
    def list(self, kind: KindInfo, options: ListOptions | None = None) -> ListResult:
        """In a transaction, the list sees the transaction's own writes, and (the transaction holding
        the write lock) nobody else's can interleave: a uniqueness check here cannot race."""

    @abc.abstractmethod
    def create(self, kind: KindInfo, obj: Obj) -> Obj: ...

    @abc.abstractmethod
    def update(self, kind: KindInfo, obj: Obj) -> Obj: ...

    @abc.abstractmethod
    def update_status(self, kind: KindInfo, obj: Obj) -> Obj: ...

    @abc.abstractmethod
    def delete(
        self, kind: KindInfo, namespace: str | None, name: str, *, resource_version: str | None = None,
        uid: str | None = None,
    ) -> Obj: ...

    def list_many(self, queries: Sequence[tuple[KindInfo, str | None]]) -> builtins.list[builtins.list[Obj]]:
        """Several whole lists at once, each ``(kind, namespace)`` (``None``: every namespace, or a
        cluster-scoped kind) as ``list(kind, ListOptions(namespace=...)).items`` would give it, in the
        same order. A transaction answers them with one statement (admission reads the Policies of
        two namespaces and the Environments on every write); this default lists each."""
        return [self.list(kind, ListOptions(namespace=namespace)).items for kind, namespace in queries]

    def reveal(self, kind: KindInfo, namespace: str | None, name: str) -> Obj:
        """The object *with* its sensitive fields (a Secret's ``spec.data``), decrypted: for Joch's
        own code that needs the values (the run controller handing a run its secrets, at the last
        moment). Never answer a request with it. Every other read returns the public view
        (``joch.api.secrets``); a store that keeps nothing sealed returns what ``get`` returns."""
        return self.get(kind, namespace, name)

    def audit(self, entry: AuditEntry) -> None:
        """Append ``entry`` to the audit log, in this transaction when inside one (so the record
        commits or rolls back with the change it describes); ``Store.audit`` outside a transaction
        commits it on its own. Empty actor, groups, request id and source IP are taken from the
        current request (``joch.api.audit.filled``). A backend without an audit log does nothing."""
        del entry

    def record_usage(self, record: UsageRecord) -> bool:
        """Add a usage row; False (and nothing written) when the run already has an event of that id."""
        raise NotImplementedError(f"{type(self).__name__} does not meter usage")

    def usage_totals(self, where: UsageFilter, by: UsageGroup | None = None) -> builtins.list[UsageTotal]:
        """Sums of the usage rows ``where`` selects, one per group of ``by`` (one row, of zeros when
        nothing matched, without it), largest cost first."""
        raise NotImplementedError(f"{type(self).__name__} does not meter usage")


class Store(Writer):
    """A versioned object store. See the module docstring for the semantics."""

    @abc.abstractmethod
    def watch(self, kind: KindInfo | None, options: WatchOptions | None = None) -> Watch: ...

    @abc.abstractmethod
    def transaction(self) -> AbstractContextManager[Writer]: ...

    @abc.abstractmethod
    def current_revision(self) -> int: ...

    def audit_events(self, query: AuditQuery) -> AuditPage:
        """Audit rows matching ``query``, newest first (a backend without an audit log has none)."""
        del query
        return AuditPage(items=[], more=False)

    def prune_audit(self, before: datetime) -> int:
        """Delete the audit rows older than ``before`` (retention; nothing else deletes them);
        returns how many. Runs in small transactions so writers never wait long."""
        del before
        return 0

    @abc.abstractmethod
    def compacted_revision(self) -> int: ...

    @abc.abstractmethod
    def compact(self, revision: int) -> int:
        """Drop change-log entries at or below ``revision``; returns the new horizon."""

    def storage_problem(self) -> str | None:
        """Why writes cannot succeed now for want of disk space (a sentence naming the disk), or
        None. Readiness asks this; a backend that cannot tell says None."""
        return None

    def shared_key(self, name: str) -> bytes:
        """A random 32-byte key named ``name``, the same for every server of this store and across
        restarts; created on first use. Never served by any route."""
        raise NotImplementedError(f"{type(self).__name__} keeps no shared keys")

    @abc.abstractmethod
    def stop_watches(self) -> None:
        """End every open watch as if it had been closed (a server shutting down calls this so its
        streams finish instead of being cancelled)."""

    @abc.abstractmethod
    def close(self) -> None: ...
