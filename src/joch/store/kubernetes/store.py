"""``KubernetesStore``: the Store contract on a Kubernetes API server, objects as custom resources.

What passes straight through (the apiserver already does what the contract asks):

* resourceVersions: an object's ``metadata.resourceVersion`` is the apiserver's (etcd's global
  revision on a real cluster), and ``current_revision`` is the revision a fresh list reports;
* preconditions: a ``resourceVersion`` on an update, ``uid``/``resourceVersion`` on a delete
  (``DeleteOptions.preconditions``) → 409 ``Conflict``; create of a taken name → ``AlreadyExists``;
* server fields (uid, creationTimestamp, generation — bumped only when the body changes, with the
  status subresource — ``generateName``), finalizers and ``deletionTimestamp``, no-op updates that
  write nothing, update never touching status and ``/status`` never touching the rest;
* label and field selectors, ``limit`` and ``continue`` (the token is the apiserver's);
* watches from a resourceVersion, bookmarks (at the apiserver's interval, not
  ``WatchOptions.bookmark_interval``) and 410 → ``errors.Gone`` (``watching``).

Done on the client side: an update without ``resourceVersion`` (custom resources refuse
unconditional updates) reads the current version and retries on conflict; a watch without a
resourceVersion lists and then watches from the list's revision, so its ADDED events carry the
snapshot revision as the contract says; keys with NUL (or characters that would change the URL)
name nothing. A create that carries a status is two writes on a real cluster (the apiserver drops
status on create when the CRD has the status subresource; the store then writes ``/status``).

What a Kubernetes store cannot do, and where it goes instead (README "Kubernetes store"):

* **Transactions across objects.** The apiserver has no multi-object transaction. ``transaction()``
  serialises this process's transactions (a lock: uniqueness checks of one replica cannot race) and
  writes through at once; when the block fails, the objects it created are deleted again (best
  effort), but its updates and deletions stay and other clients may have seen every write.
* **Compaction.** etcd's history is compacted by the apiserver; ``compact`` is refused and
  ``compacted_revision`` is 0 (unknown). A too-old resourceVersion still comes back as ``Gone``.
* **Audit log.** No audit rows: ``audit`` records nothing, ``prune_audit`` has nothing to prune and
  ``audit_events`` (``joch audit``) is refused with ``MethodNotAllowed`` naming where to look instead:
  the apiserver's audit log (its audit policy) is where who-changed-what is kept on a cluster.
* **Usage rows.** ``record_usage``/``usage_totals`` need a table beside the objects: refused with
  ``MethodNotAllowed`` naming the fix (metering reports and Budgets need a SQL store,
  ``--store postgresql://...``); a run's ``status.costUsd`` is therefore not kept either.
* **Shared keys** (``shared_key``: the per-run token key) live in one Kubernetes Secret,
  ``joch-shared-keys`` in the store's namespace (``?namespace=``, ``joch-system`` by default), made on
  first use with create-or-conflict so replicas agree.
* **Sealed Secrets.** A custom resource is readable by whoever may read it, and Joch cannot encrypt
  it at rest: writing a Joch Secret's values (``spec.data``) is refused with the fix — keep the
  values in a Kubernetes Secret (encrypted at rest by the apiserver's EncryptionConfiguration).
* **Disk space.** ``storage_problem`` says nothing: etcd's quota is the apiserver's to report.
"""

from __future__ import annotations

import base64
import builtins
import os
import random
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from lightkube.resources import core_v1

from joch.api import errors, registry
from joch.api.audit import AuditPage, AuditQuery
from joch.api.registry import KindInfo
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
    WatchEvent,
    WatchOptions,
    Writer,
)
from joch.store.kubernetes import api, watching
from joch.store.kubernetes.resources import Mapping, mapping

ALL_NAMESPACES = "*"
SERVER_FIELDS = ("resourceVersion", "uid", "creationTimestamp", "generation", "deletionTimestamp",
                 "deletionGracePeriodSeconds", "managedFields", "selfLink")
UPDATE_ATTEMPTS = 20
GONE_PROBE = 0.1  # seconds a watch from a resourceVersion waits for the apiserver's 410 ERROR event
MERGE_WINDOW = 0.05  # seconds a watch of every kind holds each event to put its streams in revision order
DEFAULT_BUFFER_EVENTS = 10_000
SHARED_KEYS = "joch-shared-keys"
URL_SIGNIFICANT = "\x00/?#%"
WATCH_TIMEOUT = (300, 600)
"""Each watch stream asks the apiserver to end it after a random time in this range (seconds), as
client-go's reflector does; the store reopens it from where it was. Without a bound a connection that
died silently (a NAT or load balancer dropping it) would leave the watch waiting forever."""


def _nameable(*keys: str | None) -> bool:
    """Whether these names and namespaces can name an object: no NUL (as on every backend), and none of
    the characters that would change the URL they go into (no Kubernetes name has one), nor ``.``/``..``."""
    return not any(key and (key in (".", "..") or any(c in key for c in URL_SIGNIFICANT)) for key in keys)


def _selector_without_nul(selector: str | None) -> tuple[str | None, bool]:
    """A field selector whose terms name NUL values (no object has one): ``x!=v`` terms match every
    object and are dropped, ``x=v`` terms match none (False)."""
    if not selector or "\x00" not in selector:
        return selector, True
    kept = []
    for term in selector.split(","):
        if "\x00" not in term:
            kept.append(term)
        elif "!=" not in term:
            return None, False
    return ",".join(kept) or None, True


class KubernetesStore(Store):
    """See the module docstring. ``url``: ``kubernetes://[?kubeconfig=PATH&context=NAME]``."""

    def __init__(self, url: str, *, buffer_events: int = DEFAULT_BUFFER_EVENTS,
                 watch_timeout: tuple[int, int] = WATCH_TIMEOUT) -> None:
        self.url = url
        self._watch_timeout = watch_timeout
        config, self.namespace = api.config_from_url(url)
        self.api = api.Api(config)
        self._buffer_events = buffer_events
        self._tx_lock = threading.Lock()
        self._local = threading.local()
        self._watches: weakref.WeakSet[watching.KubeWatch] = weakref.WeakSet()
        self._rng = random.Random()  # noqa: S311 - spreading reconnections, not cryptography

    # --- reads -----------------------------------------------------------------------------------

    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj:
        m = mapping(kind)
        if not _nameable(namespace, name):
            raise self._not_found(kind, name)
        return m.incoming(self.api.request("get", m.resource, namespace=self._ns(kind, namespace), name=name,
                                           what=m.crd))

    def list(self, kind: KindInfo, options: ListOptions | None = None) -> ListResult:
        options = options or ListOptions()
        m = mapping(kind)
        fields, possible = _selector_without_nul(options.field_selector)
        if not possible or not _nameable(options.namespace):
            return ListResult(items=[], resource_version=str(self.current_revision()))
        params = {"labelSelector": options.label_selector or None, "fieldSelector": fields,
                  "limit": options.limit, "continue": options.continue_token}
        namespace = (options.namespace or ALL_NAMESPACES) if kind.namespaced else None
        data = self.api.request("list", m.resource, namespace=namespace, params=params, what=m.crd)
        meta = data.get("metadata") or {}
        return ListResult(items=[m.incoming(item) for item in data.get("items") or []],
                          resource_version=str(meta.get("resourceVersion") or ""),
                          continue_token=meta.get("continue") or None)

    def current_revision(self) -> int:
        from joch.api import kinds

        m = mapping(kinds.AGENT)
        data = self.api.request("list", m.resource, namespace=ALL_NAMESPACES, params={"limit": 1}, what=m.crd)
        rv = str((data.get("metadata") or {}).get("resourceVersion") or "0")
        return int(rv) if rv.isdigit() else 0

    def compacted_revision(self) -> int:
        return 0  # the apiserver compacts etcd and does not say up to where

    def compact(self, revision: int) -> int:
        raise errors.MethodNotAllowed(
            "a Kubernetes store cannot compact: the apiserver compacts etcd's history itself "
            "(kube-apiserver --etcd-compaction-interval)")

    # --- writes ----------------------------------------------------------------------------------

    def create(self, kind: KindInfo, obj: Obj) -> Obj:
        self._outside_transaction()
        return self._create(kind, obj)

    def update(self, kind: KindInfo, obj: Obj) -> Obj:
        self._outside_transaction()
        return self._update(kind, obj, status=False)

    def update_status(self, kind: KindInfo, obj: Obj) -> Obj:
        self._outside_transaction()
        return self._update(kind, obj, status=True)

    def delete(self, kind: KindInfo, namespace: str | None, name: str, *, resource_version: str | None = None,
               uid: str | None = None) -> Obj:
        self._outside_transaction()
        return self._delete(kind, namespace, name, resource_version=resource_version, uid=uid)

    def _create(self, kind: KindInfo, obj: Obj) -> Obj:
        m = mapping(kind)
        self._refuse_sensitive(kind, obj)
        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in SERVER_FIELDS}
        namespace = self._ns(kind, meta.get("namespace"))
        if not meta.get("name") and not meta.get("generateName"):
            raise errors.Invalid(
                f"{kind.kind}: metadata.name or metadata.generateName is required", kind=kind.kind,
                causes=[errors.Cause("metadata.name", "Required value: name or generateName is required",
                                     "FieldValueRequired")])
        if any("\x00" in (key or "") for key in (namespace, meta.get("name"), meta.get("generateName"))):
            raise errors.Invalid(f"{kind.kind}: metadata.name and metadata.namespace must not contain NUL",
                                 kind=kind.kind, causes=[errors.Cause("metadata.name", "must not contain NUL")])
        if namespace is not None:
            meta["namespace"] = namespace
        body = m.outgoing({**obj, "metadata": meta})
        created = m.incoming(self.api.request("post", m.resource, namespace=namespace, body=body, what=m.crd))
        status = obj.get("status")
        if status and m.status is not None and created.get("status") != status:
            # The apiserver drops status on create when the CRD has the status subresource.
            created = self._update(kind, {**created, "status": status}, status=True)
        tx = self._transaction_log()
        if tx is not None:
            tx.append((kind, created))
        return created

    def _update(self, kind: KindInfo, obj: Obj, *, status: bool) -> Obj:
        m = mapping(kind)
        if not status:
            self._refuse_sensitive(kind, obj)
        meta = dict(obj.get("metadata") or {})
        namespace, name = self._ns(kind, meta.get("namespace")), meta.get("name") or ""
        if not _nameable(namespace, name):
            raise self._not_found(kind, name)
        res = m.resource
        if status:
            if m.status is None:
                raise errors.MethodNotAllowed(f"{kind.resource} has no status subresource on Kubernetes")
            res = m.status
        pinned = meta.get("resourceVersion")
        for _ in range(UPDATE_ATTEMPTS):
            if not pinned:
                current = self.api.request("get", m.resource, namespace=namespace, name=name, what=m.crd)
                meta["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
            body = m.outgoing({**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}})
            try:
                return m.incoming(self.api.request("put", res, namespace=namespace, name=name, body=body,
                                                   what=m.crd))
            except errors.Conflict:
                if pinned:
                    raise
        raise errors.Conflict(f'{kind.resource} "{name}": too many concurrent writers, try again',
                              kind=kind.plural, name=name)

    def _delete(self, kind: KindInfo, namespace: str | None, name: str, *, resource_version: str | None,
                uid: str | None) -> Obj:
        m = mapping(kind)
        if not _nameable(namespace, name):
            raise self._not_found(kind, name)
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if preconditions:
            body["preconditions"] = preconditions
        answer = self.api.request("delete", m.resource, namespace=self._ns(kind, namespace), name=name, body=body,
                                  what=m.crd)
        return m.incoming(answer) if answer.get("kind") != "Status" else answer

    # --- watches ---------------------------------------------------------------------------------

    def watch(self, kind: KindInfo | None, options: WatchOptions | None = None) -> Watch:
        options = options or WatchOptions()
        kinds = [kind] if kind is not None else list(registry.REGISTRY)
        if kind is None and options.namespace:  # as a SQL store: a namespace holds no cluster-scoped object
            kinds = [k for k in kinds if k.namespaced]
        w = watching.KubeWatch(buffer_events=options.buffer_events or self._buffer_events,
                               merge_window=MERGE_WINDOW if len(kinds) > 1 else 0.0)
        fields, possible = _selector_without_nul(options.field_selector)
        if not possible or not _nameable(options.namespace):
            w.close()
            return w
        rv = options.resource_version if options.resource_version not in (None, "", "0") else None
        starts: list[tuple[KindInfo, str | None]] = []
        if rv is None:  # list, then follow from the list's revision: ADDED events at the snapshot revision
            listed: builtins.list[tuple[KindInfo, Obj]] = []
            revisions = []
            for k in kinds:
                result = self._list_all(k, options, fields)
                revisions.append(int(result.resource_version or 0))
                listed += [(k, obj) for obj in result.items]
                starts.append((k, result.resource_version))
            snapshot = max(revisions, default=0)
            listed.sort(key=lambda item: (item[0].key, item[1]["metadata"].get("namespace") or "",
                                          item[1]["metadata"]["name"]))
            for _, obj in listed:
                w.push(WatchEvent("ADDED", obj, snapshot))
        else:
            starts = [(k, rv) for k in kinds]
        streams = []
        try:
            for k, start in starts:
                streams.append(self._stream(w, k, options, fields, start))
        except BaseException:
            w.close()
            raise
        for stream in streams:
            stream.start()
        if rv is not None:
            gone = w.gone_at_start(GONE_PROBE)
            if gone is not None:
                w.close()
                raise errors.Gone(gone)
        self._watches.add(w)
        return w

    def _list_all(self, kind: KindInfo, options: WatchOptions, fields: str | None) -> ListResult:
        items: builtins.list[Obj] = []
        token: str | None = None
        first_rv = ""
        while True:
            page = self.list(kind, ListOptions(namespace=options.namespace, label_selector=options.label_selector,
                                               field_selector=fields, limit=500, continue_token=token))
            items += page.items
            first_rv = first_rv or page.resource_version
            token = page.continue_token
            if token is None:
                return ListResult(items=items, resource_version=first_rv)

    def _stream(self, w: watching.KubeWatch, kind: KindInfo, options: WatchOptions, fields: str | None,
                start: str | None) -> watching.Stream:
        m = mapping(kind)
        namespace = (options.namespace or ALL_NAMESPACES) if kind.namespaced else None
        # Bookmarks always: they keep a quiet stream's resume point fresh (reopening from an old one would
        # be a 410); the consumer sees them only when it asked.
        params: dict[str, Any] = {"labelSelector": options.label_selector or None, "fieldSelector": fields,
                                  "allowWatchBookmarks": "true"}

        def open_stream(rv: str | None) -> Any:
            timeout = self._rng.randint(*self._watch_timeout)
            return self.api.open_watch(m.resource, namespace=namespace,
                                       params={**params, "resourceVersion": rv, "timeoutSeconds": timeout})

        return watching.Stream(w, open_stream, m.incoming, first=open_stream(start), resource_version=start,
                               bookmarks=options.allow_bookmarks)

    def stop_watches(self) -> None:
        for w in list(self._watches):
            w.close()

    # --- transactions ----------------------------------------------------------------------------

    def transaction(self) -> AbstractContextManager[Writer]:
        return self._transaction()

    @contextmanager
    def _transaction(self) -> Iterator[Writer]:
        self._outside_transaction()
        with self._tx_lock:
            created: builtins.list[tuple[KindInfo, Obj]] = []
            self._local.created = created
            try:
                yield _Writer(self)
            except BaseException:
                self._undo(created)
                raise
            finally:
                self._local.created = None

    def _transaction_log(self) -> builtins.list[tuple[KindInfo, Obj]] | None:
        log: builtins.list[tuple[KindInfo, Obj]] | None = getattr(self._local, "created", None)
        return log

    def _outside_transaction(self) -> None:
        if self._transaction_log() is not None:
            raise RuntimeError("store write inside a store transaction on the same thread: use the transaction's "
                               "Writer")

    def _undo(self, created: builtins.list[tuple[KindInfo, Obj]]) -> None:
        for kind, obj in reversed(created):
            meta = obj["metadata"]
            try:
                self._delete(kind, meta.get("namespace"), meta["name"], resource_version=None, uid=meta.get("uid"))
            except errors.JochError:
                pass  # gone already, or replaced by someone else's: theirs now

    # --- what Kubernetes cannot keep -------------------------------------------------------------

    def _refuse_sensitive(self, kind: KindInfo, obj: Obj) -> None:
        for path in kind.sensitive:
            value: Any = obj
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if value:
                raise errors.Invalid(
                    f"{kind.kind} {(obj.get('metadata') or {}).get('name')!r}: a Kubernetes store cannot keep "
                    f"{path} sealed (a custom resource is stored unencrypted and readable by whoever may read it): "
                    "keep the values in a Kubernetes Secret instead",
                    kind=kind.kind, causes=[errors.Cause(path, "not stored by the Kubernetes store")])

    def audit_events(self, query: AuditQuery) -> AuditPage:
        raise errors.MethodNotAllowed("a Kubernetes store keeps no audit log: read the Kubernetes apiserver's audit "
                                      "log (kube-apiserver --audit-policy-file) for who changed what")

    def record_usage(self, record: UsageRecord) -> bool:
        raise self._no_usage()

    def usage_totals(self, where: UsageFilter, by: UsageGroup | None = None) -> builtins.list[UsageTotal]:
        raise self._no_usage()

    def _no_usage(self) -> errors.JochError:
        return errors.MethodNotAllowed("a Kubernetes store keeps no usage rows: metering and Budgets need a SQL "
                                       "store (joch server --store postgresql://...)")

    def shared_key(self, name: str) -> bytes:
        for _ in range(UPDATE_ATTEMPTS):
            try:
                secret: Obj | None = self.api.request("get", core_v1.Secret, namespace=self.namespace,
                                                      name=SHARED_KEYS, what="secrets")
            except errors.NotFound:
                secret = None
            data = dict((secret or {}).get("data") or {})
            if name in data:
                return base64.b64decode(data[name])
            key = os.urandom(32)
            data[name] = base64.b64encode(key).decode()
            meta: Obj = {"name": SHARED_KEYS, "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/managed-by": "joch"}}
            body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta, "data": data}
            try:
                if secret is None:
                    self.api.request("post", core_v1.Secret, namespace=self.namespace, body=body, what="secrets")
                else:
                    meta["resourceVersion"] = secret["metadata"]["resourceVersion"]
                    self.api.request("put", core_v1.Secret, namespace=self.namespace, name=SHARED_KEYS, body=body,
                                     what="secrets")
            except (errors.AlreadyExists, errors.Conflict):
                continue  # another replica made one first: read theirs
            return key
        raise errors.Conflict(f"could not create the shared key {name!r} in Secret {self.namespace}/{SHARED_KEYS}")

    # --- helpers ---------------------------------------------------------------------------------

    def _ns(self, kind: KindInfo, namespace: str | None) -> str | None:
        if not kind.namespaced:
            return None
        if not namespace:
            raise errors.BadRequest(f"{kind.kind} is namespaced: a namespace is required")
        return namespace

    def _not_found(self, kind: KindInfo, name: str) -> errors.NotFound:
        return errors.NotFound(f'{kind.resource} "{name}" not found', kind=kind.plural, name=name)

    def close(self) -> None:
        self.stop_watches()
        self.api.close()


class _Writer(Writer):
    """What ``KubernetesStore.transaction()`` hands out: writes go through at once (module docstring)."""

    def __init__(self, store: KubernetesStore) -> None:
        self.store = store

    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj:
        return self.store.get(kind, namespace, name)

    def list(self, kind: KindInfo, options: ListOptions | None = None) -> ListResult:
        return self.store.list(kind, options)

    def list_many(self, queries: Sequence[tuple[KindInfo, str | None]]) -> builtins.list[builtins.list[Obj]]:
        return self.store.list_many(queries)

    def create(self, kind: KindInfo, obj: Obj) -> Obj:
        return self.store._create(kind, obj)

    def update(self, kind: KindInfo, obj: Obj) -> Obj:
        return self.store._update(kind, obj, status=False)

    def update_status(self, kind: KindInfo, obj: Obj) -> Obj:
        return self.store._update(kind, obj, status=True)

    def delete(self, kind: KindInfo, namespace: str | None, name: str, *, resource_version: str | None = None,
               uid: str | None = None) -> Obj:
        return self.store._delete(kind, namespace, name, resource_version=resource_version, uid=uid)


__all__ = ["KubernetesStore", "Mapping"]
