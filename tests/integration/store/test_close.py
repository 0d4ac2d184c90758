"""Closing a Postgres store ends its LISTEN thread at once (every test and every replica shutdown
closes one), instead of waiting out the listener's 0.5 s notification timeout."""

from __future__ import annotations

import time

import pytest

from joch.api.kinds import AGENT
from joch.store import open_store


@pytest.mark.postgres
def test_closing_a_postgres_store_with_a_listener_is_quick(postgres_url: str) -> None:
    store = open_store(postgres_url)
    time.sleep(0.1)  # the listener (started at open) is waiting for a notification
    store.create(AGENT, {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
                         "metadata": {"name": "a", "namespace": "default"}, "spec": {"providerRef": {"name": "p"}}})
    time.sleep(0.05)  # its NOTIFY has started a fresh 0.5 s wait
    started = time.monotonic()
    store.close()
    assert time.monotonic() - started < 0.25
