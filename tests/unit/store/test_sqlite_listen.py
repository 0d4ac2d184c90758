"""Commits of another SQLite connection (another process: a server worker, ``joch controller``)
reach this store's watches at once through ``SqliteBackend.listen``'s ``PRAGMA data_version`` poll,
not at the change feed's 1 s poll. Two stores on one file stand for the two processes: each has its
own connections, which is all ``data_version`` looks at."""

from __future__ import annotations

import time
from pathlib import Path

from joch.api.kinds import AGENT
from joch.store import WatchOptions, open_store


def agent(name: str) -> dict[str, object]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name, "namespace": "default"},
            "spec": {"providerRef": {"name": "p"}}}


def test_a_commit_through_another_store_wakes_a_watch_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'joch.db'}"
    watching, writing = open_store(url), open_store(url)
    try:
        with watching.watch(AGENT, WatchOptions(resource_version=str(watching.current_revision()))) as w:
            delays = []
            for i in range(5):  # one after another: without the listener each waits for the next 1 s poll
                started = time.monotonic()
                writing.create(AGENT, agent(f"a{i}"))
                event = w.get(timeout=5)
                delays.append(time.monotonic() - started)
                assert event is not None and event.object["metadata"]["name"] == f"a{i}"
        assert max(delays) < 0.3, delays
    finally:
        writing.close()
        watching.close()


def test_closing_ends_the_listener_at_once(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'joch.db'}")
    started = time.monotonic()
    store.close()
    assert time.monotonic() - started < 0.25
    backend = store.backend  # type: ignore[attr-defined]
    assert backend._listener is not None and not backend._listener.is_alive()


def test_a_write_waits_on_the_lock_file_other_processes_hold_and_goes_on_once_it_is_free(tmp_path: Path) -> None:
    import fcntl
    import os
    import threading

    store = open_store(f"sqlite:///{tmp_path / 'joch.db'}")
    holder = os.open(tmp_path / "joch.db.lock", os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # as another process's write transaction holds it
        done = threading.Event()
        writer = threading.Thread(target=lambda: (store.create(AGENT, agent("waited")), done.set()), daemon=True)
        writer.start()
        assert not done.wait(0.5), "the write did not wait for the other process's transaction"
        fcntl.flock(holder, fcntl.LOCK_UN)
        assert done.wait(10)
        assert store.get(AGENT, "default", "waited")["metadata"]["name"] == "waited"
    finally:
        os.close(holder)
        store.close()
