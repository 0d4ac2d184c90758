"""Kubernetes watch streams: ``?watch=1`` on a list route.

The response is a chunked ``application/json`` stream of newline-delimited
``{"type": ..., "object": ...}`` events, as the apiserver writes it. The store watch is opened in
the (sync) route handler, in a threadpool thread; the stream itself runs on the event loop and
waits with ``await watch.aget(...)``, so an idle watch pins no thread. The watch is closed when the
stream ends for any reason: its timeout, an error event, or the client going away (Starlette
cancels the body iterator on ``http.disconnect``; the ``finally`` in ``follow`` closes the watch).

Decisions:

* Compacted ``resourceVersion``: by default the answer is what the apiserver sends — HTTP 200 and
  a stream whose only event is ``{"type": "ERROR", "object": <Status 410 Expired>}``, then the
  end. client-go's reflector and ``kubectl get -w`` read it as "relist". ``ServerOptions(
  watch_expired="status")`` instead answers a plain 410 Status before any streaming, which
  simple HTTP clients handle with their ordinary error path; kubectl accepts both. A revision
  compacted while a watch is already streaming always ends with the ERROR event.
* ``resourceVersion`` absent, ``""`` or ``"0"``: the store first sends the current objects as
  ADDED, then follows (Kubernetes' "get state and start at most recent").
* Bookmarks: with ``allowWatchBookmarks=true`` the store emits a BOOKMARK after every
  ``ServerOptions.bookmark_interval`` seconds without an event (passed to it as
  ``WatchOptions.bookmark_interval``), at a revision it has fully delivered, so resuming
  from a bookmark never misses an event. The store knows that revision and the server does not
  (events filtered out by a selector still advance it), so the server only forwards them.
* After an ERROR event (such as a revision compacted while replaying) the stream ends.
* ``Accept: ...;as=Table`` (``kubectl get -w``): ``respond`` is handed a ``transform`` that turns
  each event's object into a one-row Table (``tables.WatchTables``); the framing is unchanged.
* Limits (``joch.server.limits``): past ``ServerOptions.max_watches`` open streams a new watch is a
  429 ``TooManyRequests`` Status with ``Retry-After``. A watcher that leaves more than
  ``watch_buffer_events`` (or ``watch_buffer_bytes``) unread while following live is ended with
  an ERROR event carrying a 410 ``Expired`` Status, and lists again.
* Watch-list (``sendInitialEvents=true``, what kubectl 1.37's ``wait`` and client-go's reflector
  send): ``respond_list`` lists the current objects, sends them as ADDED, then a BOOKMARK at the
  list's revision annotated ``k8s.io/initial-events-end: "true"``, then follows from that revision
  (a store watch resumed there, so nothing between the list and the watch is lost). As the
  apiserver, it requires ``resourceVersionMatch=NotOlderThan`` and ``allowWatchBookmarks=true``
  (422 naming the parameter otherwise); the list is at least as new as any ``resourceVersion``
  given. ``sendInitialEvents=false`` starts at the given revision, or now, with no initial events.
* ``timeoutSeconds`` ends the stream cleanly (a complete chunked body) at the deadline; absent or
  0 means no deadline.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from joch.api import errors
from joch.api.registry import KindInfo
from joch.server import limits, wire
from joch.server.options import ServerOptions
from joch.store.base import ListOptions, Obj, Store, Watch, WatchEvent, WatchOptions
from joch.telemetry import metrics

logger = logging.getLogger("joch.server")
YIELD_EVERY = 64
Transform = Callable[[str, Any], Any]
"""What a stream sends for an event's object, given the event type (e.g. ``tables.WatchTables``)."""
Keep = Callable[[Any], bool]
"""Whether an event's object is sent at all (a selector the store cannot evaluate)."""


async def follow(
    watch: Watch, *, timeout: float | None, idle: float | None
) -> AsyncGenerator[WatchEvent | None, None]:
    """The watch's events as they arrive, ``None`` after every ``idle`` seconds without one, until
    ``timeout`` seconds have passed or the watch ends. Closes the watch however it stops."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout if timeout else None
    streak = 0
    try:
        while True:
            wait = idle
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                wait = remaining if wait is None else min(wait, remaining)
            started = loop.time()
            event = await watch.aget(wait)
            if event is not None:
                yield event
                streak += 1
                if streak % YIELD_EVERY == 0:
                    # aget returns buffered events without awaiting, and so may the send: give the
                    # loop a turn so a client that went away is noticed before the backlog is written.
                    await asyncio.sleep(0)
                continue
            now = loop.time()
            if wait is None or now - started < wait / 2:
                return  # aget answered None without waiting: the watch was closed under us
            if deadline is not None and now >= deadline:
                return
            yield None
    finally:
        watch.close()


def event_line(event_type: str, obj: Any) -> bytes:
    return wire.dumps({"type": event_type, "object": obj}) + b"\n"


def with_bookmarks(watch_options: WatchOptions, interval: float) -> WatchOptions:
    if watch_options.allow_bookmarks:
        watch_options.bookmark_interval = interval
    return watch_options


def with_buffer(watch_options: WatchOptions, options: ServerOptions) -> WatchOptions:
    watch_options.buffer_events = options.watch_buffer_events
    watch_options.buffer_bytes = options.watch_buffer_bytes
    return watch_options


def open_watch(
    store: Store, kind: KindInfo | None, watch_options: WatchOptions, options: ServerOptions,
    slots: limits.WatchSlots,
) -> tuple[Watch, Callable[[], None]]:
    """The store watch and the function that ends it and gives its slot back (429 past the cap)."""
    release = slots.acquire()
    try:
        watch = store.watch(kind, with_buffer(watch_options, options))
    except BaseException:
        release()
        raise
    opened = metrics.OPEN_WATCHES.labels(kind.kind if kind is not None else "all")
    opened.inc()
    ended = False

    def end() -> None:
        nonlocal ended
        watch.close()
        release()
        if not ended:
            ended = True
            opened.dec()

    return watch, end


def respond(
    store: Store, kind: KindInfo, watch_options: WatchOptions, *, timeout_seconds: int | None,
    options: ServerOptions, slots: limits.WatchSlots, transform: Transform | None = None, keep: Keep | None = None,
) -> Response:
    opened = _opened(store, kind, watch_options, options, slots)
    if isinstance(opened, Response):
        return opened
    watch, end = opened
    return streaming(_stream(watch, kind, timeout=timeout_seconds, transform=transform, keep=keep), end,
                     media_type=wire.JSON)


def _opened(
    store: Store, kind: KindInfo, watch_options: WatchOptions, options: ServerOptions, slots: limits.WatchSlots,
) -> tuple[Watch, Callable[[], None]] | Response:
    """The watch and its release, or, when its revision is compacted and the server answers that
    in the stream (``watch_expired``), the one-event ERROR stream a client relists on."""
    try:
        return open_watch(store, kind, with_bookmarks(watch_options, options.bookmark_interval), options, slots)
    except errors.Gone as exc:
        if options.watch_expired == "status":
            raise
        return StreamingResponse(_single(event_line("ERROR", exc.to_status())), media_type=wire.JSON)


INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def check_watch_list(send_initial: bool | None, match: str | None, bookmarks: bool) -> None:
    """The apiserver's rules for ``sendInitialEvents`` (a 422 naming the parameter)."""
    if send_initial is None:
        return
    causes = []
    if match != "NotOlderThan":
        causes.append(errors.Cause("resourceVersionMatch", "sendInitialEvents requires setting "
                                   "resourceVersionMatch to NotOlderThan", "FieldValueForbidden"))
    if send_initial and not bookmarks:
        causes.append(errors.Cause("allowWatchBookmarks", "sendInitialEvents requires setting "
                                   "allowWatchBookmarks to true", "FieldValueForbidden"))
    if causes:
        shown = ", ".join(f"{c.field}: {c.message}" for c in causes)
        raise errors.Invalid(f"ListOptions.meta.k8s.io \"\" is invalid: {shown}", causes=causes)


def respond_list(
    store: Store, kind: KindInfo, watch_options: WatchOptions, *, send_initial: bool,
    timeout_seconds: int | None, options: ServerOptions, slots: limits.WatchSlots,
    transform: Transform | None = None, keep: Keep | None = None,
) -> Response:
    """A watch-list stream (see the module docstring): the initial ADDED events and the
    initial-events-end BOOKMARK first when ``send_initial``, then the live stream."""
    initial: list[Obj] = []
    if send_initial:
        listed = store.list(kind, ListOptions(namespace=watch_options.namespace,
                                              label_selector=watch_options.label_selector,
                                              field_selector=watch_options.field_selector))
        initial = [obj for obj in listed.items if keep is None or keep(obj)]
        revision = listed.resource_version
    else:
        revision = watch_options.resource_version or str(store.current_revision())
    watch_options.resource_version = revision
    opened = _opened(store, kind, watch_options, options, slots)
    if isinstance(opened, Response):
        return opened
    watch, end = opened
    head: list[bytes] = []
    if send_initial:
        head = [event_line("ADDED", transform("ADDED", obj) if transform else obj) for obj in initial]
        bookmark: Obj = {"kind": kind.kind, "apiVersion": kind.api_version,
                         "metadata": {"resourceVersion": revision, "annotations": {INITIAL_EVENTS_END: "true"}}}
        shown = transform("BOOKMARK", bookmark) if transform else bookmark
        if isinstance(shown, dict) and isinstance(shown.get("metadata"), dict):
            shown["metadata"]["annotations"] = {INITIAL_EVENTS_END: "true"}
        head.append(event_line("BOOKMARK", shown))
    live = _stream(watch, kind, timeout=timeout_seconds, transform=transform, keep=keep)
    return streaming(_prefixed(head, live), end, media_type=wire.JSON)


async def _prefixed(head: list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for line in head:
        yield line
    async for line in rest:
        yield line


def streaming(body: AsyncIterator[bytes], end: Callable[[], None], **kwargs: Any) -> StreamingResponse:
    """A ``StreamingResponse`` that calls ``end`` once, however the stream stops: finished, cancelled
    on disconnect, or never started because the client left first (Starlette then runs neither the
    body nor the background task, and a watch slot would leak for good)."""

    async def guarded() -> AsyncIterator[bytes]:
        try:
            async for chunk in body:
                yield chunk
        finally:
            end()

    stream = guarded()
    weakref.finalize(stream, end)
    return StreamingResponse(stream, background=BackgroundTask(end), **kwargs)


async def _single(line: bytes) -> AsyncIterator[bytes]:
    yield line


async def _stream(
    watch: Watch, kind: KindInfo, *, timeout: int | None, transform: Transform | None,
    keep: Keep | None = None,
) -> AsyncIterator[bytes]:
    try:
        async with aclosing(follow(watch, timeout=timeout, idle=None)) as events:
            async for event in events:
                if event is None:
                    continue
                if keep is not None and event.type in ("ADDED", "MODIFIED", "DELETED") and not keep(event.object):
                    continue
                obj = transform(event.type, event.object) if transform else event.object
                yield event_line(event.type, obj)
                if event.type == "ERROR":
                    return
    except errors.JochError as exc:
        yield event_line("ERROR", exc.to_status())
    except Exception:
        logger.exception("watch of %s failed", kind.resource)
        yield event_line("ERROR", errors.Internal(f"the watch of {kind.resource} failed").to_status())
