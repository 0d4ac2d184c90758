"""A real uvicorn server over the real store (SQLite and Postgres, via the ``store`` fixture),
talked to over a socket with httpx. Intervals are short so bookmarks and heartbeats show up fast."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from joch.api.namespaces import NAMESPACE, namespace_object
from joch.server import ServerOptions
from joch.server.testing import LiveServer, live_server
from joch.store import Store

FAST = ServerOptions(bookmark_interval=0.3, sse_heartbeat_interval=0.3)
NAMESPACES = ("team-a", "team-b", "team-0", "team-1", "team-2", "elsewhere", "other")
"""The namespaces these tests write into besides ``default`` (a namespace must exist before anything
is created in it)."""


@pytest.fixture
def namespaces(store: Store) -> Store:
    with store.transaction() as writer:
        for name in NAMESPACES:
            writer.create(NAMESPACE, namespace_object(name))
    return store


@pytest.fixture
def server(namespaces: Store) -> Iterator[LiveServer]:
    with live_server(namespaces, FAST) as running:
        yield running


@pytest.fixture
def server_with(namespaces: Store) -> Iterator[Callable[..., LiveServer]]:
    """Start another server over the same store with other options; stopped after the test."""
    with ExitStack() as stack:
        yield lambda options: stack.enter_context(live_server(namespaces, options))
