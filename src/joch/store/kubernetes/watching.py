"""Watches on a Kubernetes API server behind the store's ``Watch``.

Each stream is a thread reading the apiserver's newline-delimited events into one queue that
``get`` (threads) and ``aget`` (asyncio) take from. ``aget`` takes an event without awaiting
between looking and taking, so a read cancelled by ``asyncio.wait_for`` loses nothing.

A watch of every kind (``Store.watch(None)``) is one stream per kind into the same queue: the
apiserver has no cross-resource watch, so events of *different* kinds may arrive out of revision
order. Such a watch holds each event a moment (``merge_window``) and hands out the held ones lowest
revision first: events written close together come out in order; streams more than the window apart
can still interleave (each kind's own events are always in order).

When the apiserver ends a stream (the ``timeoutSeconds`` the store asks for, a load balancer), the
thread reopens it from the last resourceVersion it saw (events and bookmarks, which it always asks
for and passes on only when the consumer did), as client-go's reflector does; a 410 on reopening, or
an ERROR event, is passed on as the ERROR event the contract describes and the watch ends. A
consumer that leaves more than its buffer unread is ended the same way (410 ``Expired``).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from joch.api import errors
from joch.store.base import Obj, Watch, WatchEvent

log = logging.getLogger("joch.store")

RETRY_FIRST, RETRY_MAX = 0.2, 5.0  # seconds between attempts to reopen a stream, doubling
Open = Callable[[str | None], Any]
"""Opens a stream from a resourceVersion (None: from where the apiserver chooses); raises its error."""
Convert = Callable[[Obj], Obj]


def expired(message: str) -> WatchEvent:
    return WatchEvent("ERROR", errors.Gone(message).to_status(), 0)


class KubeWatch(Watch):
    def __init__(self, *, buffer_events: int, merge_window: float = 0.0) -> None:
        self._events: deque[WatchEvent] = deque()
        # Several streams (a watch of every kind): each event is held ``merge_window`` seconds so one
        # of a lower revision arriving a little later on another stream still goes out before it.
        self._window = merge_window
        self._held: list[tuple[int, int, float, WatchEvent]] = []  # heap of (revision, seq, due, event)
        self._seq = 0
        self._lock = threading.Condition()
        self._closed = False
        self._ended = False
        self._buffer = buffer_events
        self._streams: list[Stream] = []
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    # --- producers -------------------------------------------------------------------------------

    def push(self, event: WatchEvent) -> bool:
        """Queue ``event``; False when the watch is over (closed, or ended by an error)."""
        with self._lock:
            if self._closed or self._ended:
                return False
            if len(self._events) + len(self._held) >= self._buffer and event.type != "ERROR":
                self._events.clear()
                self._held.clear()
                event = expired(f"the watch fell more than {self._buffer} events behind: list again")
            if event.type == "ERROR":
                self._release(None)
                self._events.append(event)
                self._ended = True
            elif self._window:
                self._seq += 1
                heapq.heappush(self._held, (event.revision, self._seq, time.monotonic() + self._window, event))
            else:
                self._events.append(event)
            self._lock.notify_all()
            waiters = list(self._waiters)
        for loop, ready in waiters:
            loop.call_soon_threadsafe(ready.set)
        if event.type == "ERROR":
            for stream in self._streams:
                stream.stop()
        return True

    def gone_at_start(self, timeout: float) -> str | None:
        """The message of a 410 the apiserver sent as the stream's first event within ``timeout``
        (a watch from a compacted resourceVersion: kube-apiserver answers 200 and an ERROR event)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._events and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._lock.wait(remaining)
            first = self._events[0] if self._events else None
        if first is not None and first.type == "ERROR" and first.object.get("code") == 410:
            return str(first.object.get("message") or "too old resource version")
        return None

    def attach(self, stream: Stream) -> None:
        self._streams.append(stream)

    # --- consumers -------------------------------------------------------------------------------

    def _release(self, now: float | None) -> float | None:
        """Move the held events that are due (all, with ``now`` None) to the queue, lowest revision
        first; the time the next one is due, if any is still held. Called with the lock held."""
        while self._held and (now is None or self._held[0][2] <= now):
            self._events.append(heapq.heappop(self._held)[3])
        return self._held[0][2] if self._held else None

    def _wait_for(self, deadline: float | None, due: float | None) -> float | None:
        """How long to wait: until the deadline or until a held event is due, whichever is first."""
        ends = [t for t in (deadline, due) if t is not None]
        return max(0.0, min(ends) - time.monotonic()) if ends else None

    def get(self, timeout: float | None = None) -> WatchEvent | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                due = self._release(time.monotonic())
                if self._events:
                    return self._events.popleft()
                if self._closed or self._ended:
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                self._lock.wait(self._wait_for(deadline, due))

    async def aget(self, timeout: float | None = None) -> WatchEvent | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = asyncio.Event()
            with self._lock:
                due = self._release(time.monotonic())
                if self._events:
                    return self._events.popleft()
                if self._closed or self._ended:
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                self._waiters.add((loop, ready))
            try:
                try:
                    await asyncio.wait_for(ready.wait(), self._wait_for(deadline, due))
                except TimeoutError:
                    pass  # the deadline (checked above) or a held event due: look again
            finally:
                with self._lock:
                    self._waiters.discard((loop, ready))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._events.clear()
            self._held.clear()
            self._lock.notify_all()
            waiters = list(self._waiters)
        for loop, ready in waiters:
            loop.call_soon_threadsafe(ready.set)
        for stream in self._streams:
            stream.stop()


class Stream:
    """One apiserver watch stream feeding a ``KubeWatch``: see the module docstring."""

    def __init__(self, watch: KubeWatch, open_stream: Open, convert: Convert, *, first: Any,
                 resource_version: str | None, bookmarks: bool) -> None:
        self.watch = watch
        self._bookmarks = bookmarks
        self._open = open_stream
        self._convert = convert
        self._response: Any = first
        self._rv = resource_version
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="joch-kube-watch", daemon=True)
        watch.attach(self)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            unblock(response)


    def _run(self) -> None:
        pause = RETRY_FIRST
        while not self._stop.is_set():
            try:
                if self._response is None:
                    self._response = self._open(self._rv)
                    if self._stop.is_set():
                        self._response.close()
                        return
                pause = RETRY_FIRST
                self._read(self._response)
            except errors.Gone as exc:
                self.watch.push(expired(exc.message))
                return
            except errors.ServiceUnavailable as exc:  # the apiserver is away: wait for it, the watch lives on
                log.warning("Kubernetes watch: %s; retrying in %gs", exc.message, pause)
                self._stop.wait(pause)
                pause = min(pause * 2, RETRY_MAX)
            except errors.JochError as exc:
                self.watch.push(WatchEvent("ERROR", exc.to_status(), 0))
                return
            except Exception as exc:  # noqa: BLE001 - the connection broke: reopen from the last revision delivered
                if self._stop.is_set():
                    return
                log.info("Kubernetes watch stream ended (%s): reopening from %s", exc, self._rv)
                self._stop.wait(pause)
            finally:
                response, self._response = self._response, None
                if response is not None:
                    response.close()

    def _read(self, response: Any) -> None:
        for line in response.iter_lines():
            if self._stop.is_set():
                return
            if not line.strip():
                continue
            raw = json.loads(line)
            kind, obj = raw.get("type"), raw.get("object") or {}
            if kind == "ERROR":
                code = int(obj.get("code") or 500)
                if code == 410:
                    raise errors.Gone(str(obj.get("message") or "too old resource version"))
                self.watch.push(WatchEvent("ERROR", obj, 0))
                self._stop.set()
                return
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            revision = int(rv) if isinstance(rv, str) and rv.isdigit() else 0
            if kind != "BOOKMARK":
                obj = self._convert(obj)
            else:
                obj = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                       "metadata": {"resourceVersion": rv}}
                obj = self._convert(obj)
            if rv:
                self._rv = rv
            if kind == "BOOKMARK" and not self._bookmarks:
                continue
            if not self.watch.push(WatchEvent(kind, obj, revision)):
                self._stop.set()
                return


def unblock(response: Any) -> None:
    """End a streaming response another thread is blocked reading. Closing the response does not wake
    a blocked ``recv``; shutting its socket down does (the reader sees the connection end at once)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        else:
            response.close()
    except OSError:
        pass  # already closed
