"""Closing a Postgres store ends its LISTEN thread at once (every test and every replica shutdown
closes one), instead of waiting out the listener's notification timeout."""

from __future__ import annotations

import time

import pytest

from joch.store import open_store


@pytest.mark.postgres
def test_closing_a_postgres_store_with_a_listener_is_quick(postgres_url: str) -> None:
    store = open_store(postgres_url)
    time.sleep(0.2)  # the listener (started at open) is now waiting for a notification
    started = time.monotonic()
    store.close()
    assert time.monotonic() - started < 0.3
