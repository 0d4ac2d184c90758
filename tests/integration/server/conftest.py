"""A real uvicorn server over the real store (SQLite and Postgres, via the ``store`` fixture),
talked to over a socket with httpx. Intervals are short so bookmarks and heartbeats show up fast."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from joch.server import ServerOptions
from joch.server.testing import LiveServer, live_server
from joch.store import Store

FAST = ServerOptions(bookmark_interval=0.3, sse_heartbeat_interval=0.3)


@pytest.fixture
def server(store: Store) -> Iterator[LiveServer]:
    with live_server(store, FAST) as running:
        yield running


@pytest.fixture
def server_with(store: Store) -> Iterator[Callable[..., LiveServer]]:
    """Start another server over the same store with other options; stopped after the test."""
    with ExitStack() as stack:
        yield lambda options: stack.enter_context(live_server(store, options))
