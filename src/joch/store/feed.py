"""The change feed: one reader of the change log per store, fanning events out to watches.

Why one reader: a hundred watches on one kind should cost one query per commit, not a hundred. The
feed thread sleeps until a local commit or a Postgres NOTIFY wakes it (or ``poll_interval`` passes,
for writers nobody told us about), reads every change after its position in revision order, and
offers each to the subscriptions whose filter matches.

How a watch from revision R misses nothing and repeats nothing: the subscription registers with the
feed *first*, so it receives every change the feed reads from then on; it then replays the log from
R itself. Both streams are merged by revision — an event at or below the last revision delivered is
dropped — and since the log is in revision order and commit order equals revision order (see
``sql``), the result is gap-free and ordered.

With no subscription the feed reads nothing (a commit then costs only a wake-up); the first new
subscription sets its position to the current revision.

Kinds that keep only their latest change (``KindInfo.history``, see ``sql``): a change row may
have replaced the object's previous one. Each change is decoded knowing the revision its reader
read after (the feed's position, or the replay's), so a change whose ``superseded`` row lies
beyond it is known to follow a change this watch never saw (``Filter.decode``).

Compaction: a subscription replaying below the compaction horizon ends with an ERROR event carrying
a 410 ``Expired`` Status, as a Kubernetes watch does.

Slow consumers: each subscription buffers at most ``BufferLimits.events`` events and
``BufferLimits.bytes`` of change bodies that its consumer has not taken yet. A consumer that is
still replaying loses nothing when its buffer overflows: the buffer is dropped and the replay,
which reads the log up to its end, delivers those changes again. A consumer that is following
live and falls that far behind (a stuck HTTP client, a handler that blocks) is ended, as the
apiserver ends an unresponsive watcher: its buffer is freed at once, it leaves the feed, and its
next event is an ERROR carrying a 410 ``Expired`` Status, after which clients list again (or, with
a resume point such as an SSE id, resume from the last event they got; the change log still holds
what they missed). Without the bound, five stuck watchers held every change of a 100,000-write
burst, decoded, five times over.

Buffered changes are kept as the feed read them: one body string shared by every subscription,
decoded only when the consumer takes it (a subscription with a label or field selector decodes
on arrival, to decide whether the change concerns it at all).

A field selector on a field that changes (``status.phase=Running``) makes the subscription
remember, per object, whether its consumer has it (``Selection``): a change that takes an object
into the selection is ADDED, one that takes it out DELETED, one that leaves it out nothing, as the
apiserver's watch cache reports them. The snapshot of a fresh watch says which objects are in; a
watch replaying from a revision does not know, so an object it has not seen that changes outside
the selection is DELETED once (the consumer may have had it from its list; one that did not
ignores the DELETED). Such a subscription decodes on the consumer's side, in revision order.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from joch.api import errors, selectors
from joch.store.base import Obj, Watch, WatchEvent

log = logging.getLogger(__name__)

Wake = Callable[[], None]
_REPLAY_PAGE = 500
_COMPACT_EVERY = 30.0
DEFAULT_BUFFER_EVENTS = 10_000
DEFAULT_BUFFER_BYTES = 32 * 1024 * 1024


class Change(NamedTuple):
    revision: int
    kind: str
    namespace: str
    name: str
    type: str
    body: str
    prev_labels: str | None = None  # JSON of the labels before a MODIFIED that changed them
    superseded: int | None = None  # the revision of this object's previous change, removed from the log


ReadChanges = Callable[[int, str | None, int], tuple[int, list[Change]]]


@dataclass
class Selection:
    """Which objects a watch with a changing field selector has delivered as in the selection."""

    known: dict[tuple[str, str], bool] = field(default_factory=dict)
    complete: bool = False  # a snapshot said which are in: an object not in ``known`` is out


@dataclass(frozen=True)
class Filter:
    kind: str | None = None
    namespace: str | None = None
    labels: tuple[selectors.Requirement, ...] = ()
    fields: tuple[selectors.Requirement, ...] = ()
    selection: Selection = field(default_factory=Selection, compare=False, repr=False)

    @property
    def stateful(self) -> bool:
        return selectors.mutable(self.fields)

    def match_key(self, change: Change) -> bool:
        if self.kind is not None and change.kind != self.kind:
            return False
        return self.namespace is None or change.namespace == self.namespace

    @property
    def selects(self) -> bool:
        return bool(self.labels or self.fields)

    def decode(self, change: Change, after: int) -> WatchEvent | None:
        """The event for ``change`` as this watch sees it, or None (the body is parsed per watch,
        so each consumer owns its dicts). ``after`` is the revision the change was read after.

        With a label selector, a relabel that moves an object into the selection is ADDED and one
        that moves it out is DELETED, as a Kubernetes watch reports them; the DELETED carries the
        object as it is now (Kubernetes sends its previous content), at the change's revision.
        A field selector on name and namespace only needs no more (they never change); one on a field
        that changes is tracked per object (``_moved``).

        A change whose previous change was removed from the log after ``after`` (``superseded``)
        follows a state this watch never saw, so the labels it had there are unknown: an object
        that matches now is MODIFIED, one that does not is DELETED (it may have matched before;
        a watcher that never had it ignores the DELETED).
        """
        if not self.match_key(change):
            return None
        obj = json.loads(change.body)
        if not (self.labels or self.fields):
            return WatchEvent(change.type, obj, change.revision)  # type: ignore[arg-type]
        now = selectors.matches(obj, self.labels, self.fields)
        if self.stateful:
            return self._moved(change, obj, now)
        if self.labels and change.superseded is not None and change.superseded > after:
            # Only MODIFIED and DELETED rows supersede (see ``sql``).
            return WatchEvent("MODIFIED" if now and change.type == "MODIFIED" else "DELETED", obj, change.revision)
        if change.type != "MODIFIED" or not self.labels or change.prev_labels is None:
            return WatchEvent(change.type, obj, change.revision) if now else None  # type: ignore[arg-type]
        before_labels = json.loads(change.prev_labels)
        before_obj = {"metadata": {**obj.get("metadata", {}), "labels": before_labels}}
        before = selectors.matches(before_obj, self.labels, self.fields)
        if now and before:
            return WatchEvent("MODIFIED", obj, change.revision)
        if now:
            return WatchEvent("ADDED", obj, change.revision)
        if before:
            return WatchEvent("DELETED", obj, change.revision)
        return None

    def _moved(self, change: Change, obj: Obj, now: bool) -> WatchEvent | None:
        key = (change.namespace, change.name)
        was = self.selection.known.get(key, False if self.selection.complete else None)
        if change.type == "DELETED":
            self.selection.known.pop(key, None)
            return WatchEvent("DELETED", obj, change.revision) if now or was is not False else None
        self.selection.known[key] = now
        if now:
            kind = "ADDED" if change.type == "ADDED" or was is False else "MODIFIED"
            return WatchEvent(kind, obj, change.revision)  # type: ignore[arg-type]
        return WatchEvent("DELETED", obj, change.revision) if was is not False and change.type != "ADDED" else None


def bookmark_object(api_version: str, kind: str) -> Obj:
    return {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": "0"}}


def gone_status(message: str) -> Obj:
    return errors.Gone(message).to_status()


@dataclass(frozen=True)
class BufferLimits:
    """How much a subscription holds for a consumer that has not read it yet (see the module
    docstring): at most ``events`` events and ``bytes`` of change bodies."""

    events: int = DEFAULT_BUFFER_EVENTS
    bytes: int = DEFAULT_BUFFER_BYTES


Buffered = Change | WatchEvent  # a change not decoded yet, or an event a selector already decoded


class Subscription(Watch):
    def __init__(
        self, feed: Feed, flt: Filter, *, after: int | None, bookmarks: bool, bookmark_interval: float,
        bookmark_template: Obj, limits: BufferLimits | None = None,
    ) -> None:
        self._feed = feed
        self._limits = limits or BufferLimits()
        self._buffered_bytes = 0
        self._filter = flt
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: collections.deque[tuple[Buffered, int]] = collections.deque()  # (item, body size)
        self._dropped = False  # the buffer was dropped during the replay: read the log once more
        self._ready: collections.deque[WatchEvent] = collections.deque()
        self._last = after if after is not None else -1
        self._replaying = after is not None
        self._closed = False
        self._bookmarks = bookmarks
        self._bookmark_interval = bookmark_interval
        self._bookmark_template = bookmark_template
        self._last_emit = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_wake: asyncio.Event | None = None
        self._error: WatchEvent | None = None
        self._replay_lock = threading.Lock()
        self._released = False

    # --- fed by the feed thread ------------------------------------------------------------------

    def offer(self, change: Change, after: int) -> None:
        if not self._filter.match_key(change):
            return
        item: Buffered = change
        if self._filter.selects and not self._filter.stateful:  # a stateful one decodes in order, on taking
            try:
                event = self._filter.decode(change, after)
            except Exception:  # one undecodable body must not wedge the feed for every watch
                log.exception("watch: cannot decode change %s; ending this watch", change.revision)
                self._undecodable(change)
                return
            if event is None:
                return
            item = event
        with self._cond:
            if self._error is not None or self._closed:
                return  # ended: nothing more is delivered, so nothing more is kept
            if not self._replaying and change.revision <= self._last:
                return  # the replay delivered it already (the feed can lag behind a replay)
            self._queue.append((item, len(change.body)))
            self._buffered_bytes += len(change.body)
            overflow = (len(self._queue) > self._limits.events or self._buffered_bytes > self._limits.bytes)
            if overflow and self._replaying:
                # The replay reads the log to its end, these changes included: drop, do not end.
                self._queue.clear()
                self._buffered_bytes = 0
                self._dropped = True
                overflow = False
            self._cond.notify_all()
        if overflow:
            self._fell_behind(change.revision)
            return
        self._wake_async()

    def _fell_behind(self, revision: int) -> None:
        limits = self._limits
        log.warning("watch: a consumer fell more than %d events or %d bytes behind; ending its watch",
                    limits.events, limits.bytes)
        self.expire(gone_status(
            f"the watch fell behind: its consumer left more than {limits.events} events or "
            f"{limits.bytes} bytes unread; list again (or resume from the last event received) and "
            "watch from there"), revision)
        self._feed.unsubscribe(self)

    def _undecodable(self, change: Change) -> None:
        self.expire(errors.Internal(f"cannot decode change {change.revision}").to_status(), change.revision)

    def expire(self, status: Obj, revision: int) -> None:
        """End the watch with an ERROR event carrying ``status`` (delivered before anything else;
        what was buffered is dropped)."""
        with self._cond:
            if self._error is None:
                self._error = WatchEvent("ERROR", status, revision)
            self._queue.clear()
            self._buffered_bytes = 0
            self._cond.notify_all()
        self._wake_async()

    def _wake_async(self) -> None:
        loop, wake = self._loop, self._async_wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
                loop.call_soon_threadsafe(wake.set)

    def start_live(self, revision: int, bodies: list[str]) -> None:
        """Begin with the current objects as ADDED events, then follow from ``revision``.

        Each synthetic event carries the snapshot's revision (not the object's own, older one): a
        client resuming from any of them — an SSE ``Last-Event-ID`` — must resume after the
        snapshot, not from a revision compaction may already have removed."""
        selection = self._filter.selection
        selection.complete = True
        for body in bodies:
            obj = json.loads(body)
            if selectors.matches(obj, self._filter.labels, self._filter.fields):
                self._ready.append(WatchEvent("ADDED", obj, revision))
                meta = obj.get("metadata") or {}
                selection.known[(meta.get("namespace") or "", meta.get("name") or "")] = True
        self._last = revision
        self._replaying = False

    # --- consumed by the watcher -----------------------------------------------------------------

    def _replay_step(self) -> None:
        """Read the next page of the replay into ``_ready``. Safe to run in a worker thread whose
        awaiting task was cancelled: it only appends, and one step runs at a time."""
        with self._replay_lock:
            if self._replaying and not self._ready and not self._closed:
                self._replay_page()

    def _replay_page(self) -> None:
        with self._lock:
            self._dropped = False
        after = self._last
        compacted, changes = self._feed.read_changes(after, self._filter.kind, _REPLAY_PAGE)
        if compacted > self._last:
            status = gone_status(
                f"too old resource version: {self._last} ({compacted}); list again and watch from there"
            )
            self._ready.append(WatchEvent("ERROR", status, compacted))
            self._replaying = False
            self._closed = True
            return
        for change in changes:
            event = self._filter.decode(change, after)
            if event is not None:
                self._ready.append(event)
        if changes:
            self._last = changes[-1].revision
        if len(changes) < _REPLAY_PAGE:
            with self._lock:
                # A buffer dropped after this page was read may hold changes past its end.
                self._replaying = self._dropped

    def _poll(self, *, replay: bool = True) -> WatchEvent | None:
        """Next event without waiting. With ``replay`` it reads the database while replaying;
        without, it returns None when the next event needs a read (``aget`` does that read in a
        thread)."""
        while True:
            if self._error is not None:
                event, self._error = self._error, None
                self._closed = True
                self._replaying = False
                return event
            if self._ready:
                event = self._ready.popleft()
                self._last = max(self._last, event.revision) if event.type != "ERROR" else self._last
                self._last_emit = time.monotonic()
                return event
            if self._closed:
                return None
            if self._replaying:
                if not replay:
                    return None
                self._replay_step()
                continue
            item = self._take()
            if item is None:
                return None
            if isinstance(item, WatchEvent):
                return item
            try:
                # Only a selecting filter reads ``after``, and it decoded on arrival (``offer``).
                decoded = self._filter.decode(item, item.revision)
            except Exception:
                log.exception("watch: cannot decode change %s; ending this watch", item.revision)
                self._undecodable(item)
                continue
            if decoded is not None:
                return decoded

    def _take(self) -> Buffered | None:
        """The next buffered item after the last revision delivered, which it becomes."""
        with self._lock:
            while self._queue:
                item, size = self._queue.popleft()
                self._buffered_bytes -= size
                if item.revision > self._last:
                    self._last = item.revision
                    self._last_emit = time.monotonic()
                    return item
        return None

    def _bookmark_due(self) -> WatchEvent | None:
        if not self._bookmarks or self._replaying:
            return None
        if time.monotonic() - self._last_emit < self._bookmark_interval:
            return None
        # Read the position before looking at the queue: the feed offers a change before it advances
        # its position, so an empty queue afterwards means every change up to it was consumed.
        position = self._feed.position
        with self._lock:
            if self._queue:
                return None
        revision = max(self._last, position)
        self._last = revision
        self._last_emit = time.monotonic()
        obj = json.loads(json.dumps(self._bookmark_template))
        obj["metadata"]["resourceVersion"] = str(revision)
        return WatchEvent("BOOKMARK", obj, revision)

    def _wait_budget(self, deadline: float | None) -> float | None:
        budget = None if deadline is None else max(0.0, deadline - time.monotonic())
        if self._bookmarks:
            until_bookmark = max(0.0, self._last_emit + self._bookmark_interval - time.monotonic())
            budget = until_bookmark if budget is None else min(budget, until_bookmark)
        return budget

    def get(self, timeout: float | None = None) -> WatchEvent | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            event = self._poll() or self._bookmark_due()
            if event is not None or self._closed:
                return event
            budget = self._wait_budget(deadline)
            if budget is not None and budget <= 0 and deadline is not None and time.monotonic() >= deadline:
                return None
            with self._cond:
                if not self._queue and not self._closed:
                    self._cond.wait(budget)

    async def aget(self, timeout: float | None = None) -> WatchEvent | None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._async_wake = asyncio.Event()
        wake = self._async_wake
        if wake is None:  # pragma: no cover - set just above
            raise RuntimeError("watch has no event loop")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wake.clear()
            event = self._poll(replay=False)
            if event is None and self._replaying and not self._closed:
                # Only the database read runs in the thread; events are popped here, on the loop,
                # so a cancelled aget loses nothing.
                await asyncio.to_thread(self._replay_step)
                continue
            event = event or self._bookmark_due()
            if event is not None or self._closed:
                return event
            budget = self._wait_budget(deadline)
            if deadline is not None and time.monotonic() >= deadline:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), budget)

    def close(self) -> None:
        with self._cond:
            if self._released:
                return
            self._released = True
            self._closed = True
            self._cond.notify_all()
        self._wake_async()
        self._feed.unsubscribe(self)


class Feed:
    def __init__(
        self, *, read_changes: ReadChanges, current: Callable[[], int], poll_interval: float,
        compact: Callable[[], None] | None = None, compact_interval: float = _COMPACT_EVERY,
    ) -> None:
        self.read_changes = read_changes
        self._compact_interval = compact_interval
        self._current = current
        self._poll_interval = poll_interval
        self._compact = compact
        self._lock = threading.Lock()
        self._subs: set[Subscription] = set()
        self._event = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.position = 0

    def wake(self) -> None:
        if self._subs:  # unlocked read: a subscriber added just after starts from the current revision
            self._event.set()

    def subscribe(self, flt: Filter, *, after: int | None, bookmarks: bool, bookmark_interval: float,
                  bookmark_template: Obj, limits: BufferLimits | None = None) -> Subscription:
        self._ensure_started()
        sub = Subscription(self, flt, after=after, bookmarks=bookmarks, bookmark_interval=bookmark_interval,
                           bookmark_template=bookmark_template, limits=limits)
        with self._lock:
            idle = not self._subs
        current = self._current() if idle else None
        with self._lock:
            if current is not None and not self._subs:
                # Nobody was listening, so the feed stopped reading: start from now. Changes up to
                # here reach the new watch through its own replay or snapshot.
                self.position = max(self.position, current)
            self._subs.add(sub)
        return sub

    def subscribers_count(self) -> int:
        with self._lock:
            return len(self._subs)

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.discard(sub)

    def start(self) -> None:
        self._ensure_started()

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self.position = self._current()
            self._thread = threading.Thread(target=self._run, name="joch-change-feed", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        last_compact = time.monotonic()
        while not self._stop:
            wait = self._poll_interval if self._compact is None else min(self._poll_interval, self._compact_interval)
            self._event.wait(wait)
            self._event.clear()
            if self._stop:
                return
            try:
                self._pump()
                if self._compact is not None and time.monotonic() - last_compact > self._compact_interval:
                    last_compact = time.monotonic()
                    self._compact()
            except Exception:  # the feed must survive a transient database error
                log.exception("change feed: reading the change log failed; retrying")
                time.sleep(self._poll_interval)

    def _pump(self) -> None:
        while True:
            with self._lock:
                if not self._subs:
                    return  # no watcher: a commit costs the feed nothing
                position = self.position
            compacted, changes = self.read_changes(position, None, _REPLAY_PAGE)
            if compacted > position:
                self._expire_all(position, compacted)
                continue
            if not changes:
                return
            # Decode and queue outside the feed lock, so subscribing and closing never wait on it.
            # The position moves only afterwards: a bookmark taken at a position is then safe.
            with self._lock:
                subs = list(self._subs)
            for change in changes:
                for sub in subs:
                    sub.offer(change, position)
            with self._lock:
                # A subscription may have moved the position on meanwhile: never move it back.
                self.position = max(self.position, changes[-1].revision)
            if len(changes) < _REPLAY_PAGE:
                return

    def _expire_all(self, position: int, compacted: int) -> None:
        """The feed fell behind compaction (another replica compacted, or the feed lagged): the
        changes in between are gone, so every live watch ends with 410 and must list again."""
        message = (f"the watch fell behind compaction: changes after {position} up to {compacted} are gone; "
                   "list again and watch from there")
        log.warning("change feed: %s", message)
        with self._lock:
            subs = list(self._subs)
            self.position = max(self.position, compacted)
        for sub in subs:
            sub.expire(gone_status(message), compacted)

    def close_subscriptions(self) -> None:
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            sub.close()

    def close(self) -> None:
        self._stop = True
        self._event.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.close_subscriptions()
