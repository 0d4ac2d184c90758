"""A watch buffers a bounded amount for its consumer (``WatchOptions.buffer_events/buffer_bytes``):
a live consumer that falls further behind is ended with a 410, a replaying one loses nothing."""

from __future__ import annotations

from typing import Any

from joch.api.kinds import AGENT
from joch.store import Store, WatchOptions
from joch.store.sql import SqlStore


def agent(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"providerRef": {"name": "p"}, **spec}}


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def live_watch(store: Store, **options: Any) -> Any:
    w = store.watch(AGENT, WatchOptions(resource_version=str(store.current_revision()), **options))
    assert w.get(timeout=0.2) is None  # the (empty) replay is over: the watch follows live
    return w


def test_a_stuck_live_consumer_is_ended_with_410_and_its_buffer_freed(store: Store) -> None:
    assert isinstance(store, SqlStore)
    stuck = live_watch(store, buffer_events=20)
    reading = live_watch(store, buffer_events=20)
    with store.transaction() as tx:  # one commit: the feed offers all 15 before anyone reads
        for i in range(15):
            tx.create(AGENT, agent(f"a{i}"))
    assert [reading.get(timeout=5).object["metadata"]["name"] for _ in range(15)] == [  # type: ignore[union-attr]
        f"a{i}" for i in range(15)]
    for i in range(15, 40):
        store.create(AGENT, agent(f"a{i}"))
        event = reading.get(timeout=5)
        assert event is not None and event.type == "ADDED"  # a consumer that keeps up goes on
    # The stuck one left the feed as soon as it overflowed: nothing more is kept for it.
    wait_for(lambda: store.feed.subscribers_count() == 1)
    event = stuck.get(timeout=1)
    assert event is not None and event.type == "ERROR"
    assert event.object["code"] == 410 and event.object["reason"] == "Expired"
    assert "fell behind" in event.object["message"] and "20 events" in event.object["message"]
    assert stuck.get(timeout=0.2) is None
    stuck.close()
    reading.close()


def test_the_byte_bound_ends_a_consumer_holding_large_changes(store: Store) -> None:
    assert isinstance(store, SqlStore)
    stuck = live_watch(store, buffer_bytes=64 * 1024)
    for i in range(10):
        store.create(AGENT, agent(f"big{i}", systemPrompt="x" * 10_000))
    # Read nothing until the feed has dropped it: a consumer reading while a slow follower thread hands
    # out one commit at a time keeps up, and is rightly never ended (CI saw that on a loaded machine).
    wait_for(lambda: store.feed.subscribers_count() == 0, timeout=30)
    event = stuck.get(timeout=30)
    while event is not None and event.type != "ERROR":  # what was read before the overflow
        event = stuck.get(timeout=30)
    assert event is not None and event.object["code"] == 410
    assert "65536 bytes" in event.object["message"]
    stuck.close()


def test_a_replaying_consumer_whose_buffer_overflows_loses_nothing(store: Store) -> None:
    rv = int(store.create(AGENT, agent("seed"))["metadata"]["resourceVersion"])  # not 0: "list, then follow"
    with store.transaction() as tx:
        for i in range(700):  # more than a replay page
            tx.create(AGENT, agent(f"old{i}"))
    w = store.watch(AGENT, WatchOptions(resource_version=str(rv), buffer_events=10))
    first = w.get(timeout=5)  # the replay has started
    assert first is not None and first.object["metadata"]["name"] == "old0"
    for i in range(60):  # live changes while it replays: the buffer overflows, and is dropped
        store.create(AGENT, agent(f"new{i}"))
    revisions = [first.revision]
    while (event := w.get(timeout=1)) is not None:
        assert event.type == "ADDED", event.object
        revisions.append(event.revision)
    w.close()
    assert revisions == list(range(rv + 1, rv + 761))
