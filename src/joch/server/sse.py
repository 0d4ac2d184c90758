"""Server-Sent Events over the store's watch: the seed's ``WATCH /v1/resources``.

Each change is one event::

    event: MODIFIED
    id: 42
    data: {"apiVersion": ..., "kind": ..., "metadata": ..., ...}

``id`` is the store revision, so a browser ``EventSource`` that reconnects sends
``Last-Event-ID: 42`` and resumes after it; ``?resourceVersion=`` does the same for clients that
start fresh. A comment line (``: heartbeat``) is written every
``ServerOptions.sse_heartbeat_interval`` seconds without an event so proxies keep the connection
and dead clients are noticed. ``X-Accel-Buffering: no`` stops nginx from buffering the stream.

A resume point older than the compaction horizon is refused with a plain 410 Status before the
stream starts, unlike the Kubernetes watch: ``EventSource`` treats any non-200 answer as final and
stops reconnecting, whereas an ERROR event followed by the end of the stream would make it
reconnect with the same stale ``Last-Event-ID`` forever. A revision compacted while the stream
replays still ends it with an ``ERROR`` event (no ``id``) carrying the 410 Status. Bookmarks are
not requested: the ``id`` of every event already is the resume point.

A client that leaves more than ``ServerOptions.watch_buffer_events`` unread is cut off the same
way: an ``ERROR`` event carrying a 410 Status that says it fell behind, then the end. An
``EventSource`` reconnects with the ``Last-Event-ID`` of the last event it got, which the change log
still holds, so it resumes where it stopped; past ``max_watches`` open streams the reconnection is a
429 with ``Retry-After``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from starlette.responses import StreamingResponse

from joch.api import errors
from joch.api.registry import KindInfo
from joch.server import limits, wire
from joch.server.options import ServerOptions
from joch.server.watch import follow, open_watch, streaming
from joch.store.base import Store, Watch, WatchOptions

logger = logging.getLogger("joch.server")

MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
HEARTBEAT = b": heartbeat\n\n"


def respond(
    store: Store, kind: KindInfo | None, watch_options: WatchOptions, *, timeout_seconds: int | None,
    options: ServerOptions, slots: limits.WatchSlots,
) -> StreamingResponse:
    watch, end = open_watch(store, kind, watch_options, options, slots)
    return streaming(_stream(watch, timeout=timeout_seconds, heartbeat=options.sse_heartbeat_interval), end,
                     media_type=MEDIA_TYPE, headers=HEADERS)


def frame(event_type: str, data: object, event_id: int | None = None) -> bytes:
    head = f"event: {event_type}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return head.encode() + b"data: " + wire.dumps(data) + b"\n\n"


async def _stream(watch: Watch, *, timeout: int | None, heartbeat: float) -> AsyncIterator[bytes]:
    try:
        async with aclosing(follow(watch, timeout=timeout, idle=heartbeat)) as events:
            async for event in events:
                if event is None:
                    yield HEARTBEAT
                elif event.type == "ERROR":
                    yield frame("ERROR", event.object)
                    return
                elif event.type != "BOOKMARK":
                    yield frame(event.type, event.object, event.revision)
    except errors.JochError as exc:
        yield frame("ERROR", exc.to_status())
    except Exception:
        logger.exception("server-sent event stream failed")
        yield frame("ERROR", errors.Internal("the event stream failed").to_status())
