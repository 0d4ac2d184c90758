"""Informers: one kind listed into an in-memory cache, then kept current by a watch.

An informer runs one thread. It lists the kind, replaces its cache with the result (telling its
handlers what changed), and watches from the list's resourceVersion. Every event updates the cache
first and then goes to the handlers, so a handler that reads the cache sees the object the event is
about. Handlers get ``(type, old, new)``: ``ADDED`` has no old object, ``DELETED`` no new one (its
old one is the last state the cache held), ``MODIFIED`` both. Handlers run on the informer's
thread, one event at a time, in revision order: keep them short (enqueue a key and return).

How nothing is missed:

* A watch that simply ends (the server stopped watches, the connection dropped) is resumed from the
  last revision seen; the store replays everything after it.
* A resume point older than the store's compaction horizon (``Gone``, or an ``ERROR`` event in the
  stream) cannot be replayed. The informer lists again and emits the *difference* between its cache
  and the new list: adds, updates (resourceVersion changed) and deletes. Handlers see the same kind
  of events they would have seen from the watch, only coalesced.
* A kind that keeps only its latest change (Leases, Secrets; ``KindInfo.history``) replays only
  each object's newest state: a MODIFIED for an object the cache lacks is an add, and a DELETED of
  one it never held (created and deleted while the informer was away) is dropped, as client-go's
  informers do.
* Watches ask for bookmarks, so a quiet kind's resume point moves with the store's revision and a
  resume after a long quiet spell is still inside the retained history.

``has_synced`` turns true once the first list has been applied and its handlers called; the manager
waits for every informer to sync before the first reconcile, so a controller never mistakes "not in
the cache yet" for "does not exist".

An informer can be stopped and started again: it keeps its cache and resume point, and a restart
after a long stop is exactly the lagging case above. The objects in the cache are the stored dicts
the store returned; nobody may mutate them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

from joch.api import errors
from joch.api.registry import KindInfo
from joch.store.base import ListOptions, Obj, Store, Watch, WatchEvent, WatchOptions

log = logging.getLogger(__name__)

Change = Literal["ADDED", "MODIFIED", "DELETED"]
Handler = Callable[[Change, Obj | None, Obj | None], None]

_POLL = 1.0  # seconds a watch read blocks before the thread looks at its stop flag again
_RETRY_FIRST, _RETRY_CAP = 0.2, 10.0


def key_of(obj: Obj) -> tuple[str, str]:
    m = obj.get("metadata") or {}
    return m.get("namespace") or "", m["name"]


class Informer:
    """The ``Cache`` of one kind (``get``/``list``), kept current by a thread; see the module
    docstring."""

    def __init__(
        self, store: Store, kind: KindInfo, *, namespace: str | None = None, bookmark_interval: float = 5.0,
    ) -> None:
        self.store = store
        self.kind = kind
        self.namespace = namespace
        self.bookmark_interval = bookmark_interval
        self._handlers: list[Handler] = []
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Obj]] = {}  # namespace → name → object
        self._resource_version: str | None = None
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self.relists = 0  # lists after the first: how often a resume point had expired

    # --- the Cache protocol ----------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._objects.get(namespace or "", {}).get(name)

    def list(self, namespace: str | None = None) -> list[Obj]:
        with self._lock:
            if namespace is None:
                return [obj for names in self._objects.values() for obj in names.values()]
            return list(self._objects.get(namespace, {}).values())

    # --- life cycle ------------------------------------------------------------------------------

    def add_handler(self, handler: Handler) -> None:
        """Register before ``start``: a handler added later misses the objects already listed."""
        self._handlers.append(handler)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    @property
    def resource_version(self) -> str | None:
        """The revision the cache reflects (None before the first list)."""
        return self._resource_version

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"joch-informer-{self.kind.plural}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # --- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        delay = _RETRY_FIRST
        while not self._stop.is_set():
            try:
                if self._resource_version is None:
                    self._relist()
                self._follow()
                delay = _RETRY_FIRST
            except errors.Gone as exc:
                log.info("%s informer: %s; listing again", self.kind.plural, exc.message)
                self._resource_version = None
            except Exception as exc:  # a database hiccup must not end the informer
                if isinstance(exc, errors.BadRequest):  # a resume point the store never had (it was reset)
                    self._resource_version = None
                log.warning("%s informer: %s; retrying in %.1fs", self.kind.plural, exc, delay,
                            exc_info=log.isEnabledFor(logging.DEBUG))
                self._stop.wait(delay)
                delay = min(_RETRY_CAP, delay * 2)

    def _relist(self) -> None:
        result = self.store.list(self.kind, ListOptions(namespace=self.namespace))
        fresh: dict[str, dict[str, Obj]] = {}
        for obj in result.items:
            namespace, name = key_of(obj)
            fresh.setdefault(namespace, {})[name] = obj
        with self._lock:
            old, self._objects = self._objects, fresh
            self._resource_version = result.resource_version
        if self._synced.is_set():
            self.relists += 1
        self._dispatch_difference(old, fresh)
        self._synced.set()

    def _dispatch_difference(self, old: dict[str, dict[str, Obj]], new: dict[str, dict[str, Obj]]) -> None:
        for namespace, names in new.items():
            before = old.get(namespace, {})
            for name, obj in names.items():
                previous = before.get(name)
                if previous is None:
                    self._emit("ADDED", None, obj)
                elif _rv(previous) != _rv(obj):
                    self._emit("MODIFIED", previous, obj)
        for namespace, names in old.items():
            after = new.get(namespace, {})
            for name, obj in names.items():
                if name not in after:
                    self._emit("DELETED", obj, None)

    def _follow(self) -> None:
        """Apply watch events until the watch ends (return: resume) or expires (raise ``Gone``)."""
        options = WatchOptions(namespace=self.namespace, resource_version=self._resource_version,
                               allow_bookmarks=True, bookmark_interval=self.bookmark_interval)
        watch = self.store.watch(self.kind, options)
        self._watch = watch
        try:
            if self._stop.is_set():  # stop() ran before the watch existed to be closed
                return
            while not self._stop.is_set():
                started = time.monotonic()
                event = watch.get(timeout=_POLL)
                if event is None:
                    if time.monotonic() - started < _POLL / 2:
                        return  # closed early: the stream ended, not the wait
                    continue
                self._apply(event)
        finally:
            self._watch = None
            watch.close()

    def _apply(self, event: WatchEvent) -> None:
        if event.type == "ERROR":
            status = event.object
            raise errors.Gone(str(status.get("message") or f"watch error {status.get('code')}"))
        if event.type == "BOOKMARK":
            self._resource_version = str(event.object.get("metadata", {}).get("resourceVersion") or event.revision)
            return
        obj = event.object
        namespace, name = key_of(obj)
        with self._lock:
            names = self._objects.setdefault(namespace, {})
            old = names.get(name)
            if event.type == "DELETED":
                names.pop(name, None)
                if not names:
                    del self._objects[namespace]
            else:
                names[name] = obj
            self._resource_version = str(event.revision)
        if event.type == "DELETED":
            if old is not None:  # as client-go: a deletion of an object never held is no news
                self._emit("DELETED", old, None)
        else:
            self._emit("ADDED" if old is None else "MODIFIED", old, obj)

    def _emit(self, change: Change, old: Obj | None, new: Obj | None) -> None:
        for handler in self._handlers:
            try:
                handler(change, old, new)
            except Exception:  # one broken handler must not stop the cache
                log.exception("%s informer: a %s handler failed", self.kind.plural, change)


def _rv(obj: Obj) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv is not None else None
