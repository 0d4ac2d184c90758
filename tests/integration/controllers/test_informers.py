"""Informers over the real store (SQLite and Postgres): list then watch into a cache, resume after a
watch ends, relist and emit the difference after the resume point was compacted away."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from joch.api import kinds
from joch.controllers.informers import Informer
from joch.store import Store, Watch, WatchOptions
from support import provider

Seen = list[tuple[str, str | None, str | None]]


def wait_until(check: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def name(obj: dict[str, Any] | None) -> str | None:
    return obj["metadata"]["name"] if obj is not None else None


def rv(obj: dict[str, Any] | None) -> str | None:
    return obj["metadata"]["resourceVersion"] if obj is not None else None


class Recorder:
    def __init__(self) -> None:
        self.seen: Seen = []
        self.lock = threading.Lock()

    def __call__(self, change: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        with self.lock:
            self.seen.append((change, name(old), name(new)))

    def take(self) -> Seen:
        with self.lock:
            seen, self.seen = self.seen, []
        return seen


@pytest.fixture
def informers(store: Store) -> Iterator[Callable[..., Informer]]:
    made: list[Informer] = []

    def make(kind: kinds.KindInfo = kinds.AGENT_PROVIDER, **options: Any) -> Informer:
        informer = Informer(store, kind, **options)
        made.append(informer)
        return informer

    yield make
    for informer in made:
        informer.stop()


def create(store: Store, obj_name: str, binary: str = "echo") -> dict[str, Any]:
    return store.create(kinds.AGENT_PROVIDER, provider(obj_name, binary=binary, namespace="default"))


def modify(store: Store, obj_name: str, binary: str) -> dict[str, Any]:
    current = store.get(kinds.AGENT_PROVIDER, "default", obj_name)
    return store.update(kinds.AGENT_PROVIDER, {**current, "spec": {"binary": binary}})


def cache_matches_store(store: Store, informer: Informer) -> bool:
    stored = {(o["metadata"]["name"], rv(o)) for o in store.list(kinds.AGENT_PROVIDER).items}
    return {(o["metadata"]["name"], rv(o)) for o in informer.list()} == stored


def test_lists_then_follows_changes_into_the_cache_and_to_handlers(
    store: Store, informers: Callable[..., Informer],
) -> None:
    create(store, "a")
    create(store, "b")
    informer = informers()
    recorder = Recorder()
    informer.add_handler(recorder)
    assert not informer.has_synced
    informer.start()
    assert informer.wait_for_sync(10)
    assert sorted(recorder.take()) == [("ADDED", None, "a"), ("ADDED", None, "b")]
    assert name(informer.get("default", "a")) == "a" and informer.get("default", "zzz") is None

    create(store, "c")
    modified = modify(store, "a", "cat")
    store.delete(kinds.AGENT_PROVIDER, "default", "b")
    wait_until(lambda: len(recorder.seen) == 3, what="three events")
    assert recorder.take() == [("ADDED", None, "c"), ("MODIFIED", "a", "a"), ("DELETED", "b", None)]
    assert rv(informer.get("default", "a")) == rv(modified)
    assert informer.get("default", "b") is None
    assert sorted(name(o) or "" for o in informer.list("default")) == ["a", "c"]
    assert informer.list("elsewhere") == []
    assert informer.relists == 0


def test_a_handler_reading_the_cache_sees_the_object_of_its_event(
    store: Store, informers: Callable[..., Informer],
) -> None:
    informer = informers()
    looked: list[str | None] = []
    informer.add_handler(lambda change, old, new: looked.append(rv(informer.get("default", name(new or old) or ""))
                                                               if change != "DELETED" else "gone"))
    informer.start()
    assert informer.wait_for_sync(10)
    obj = create(store, "a")
    wait_until(lambda: looked, what="the ADDED event")
    assert looked == [rv(obj)]


def test_a_compacted_resume_point_relists_and_emits_the_difference(
    store: Store, informers: Callable[..., Informer],
) -> None:
    for n in ("keep", "change", "remove"):
        create(store, n)
    informer = informers()
    recorder = Recorder()
    informer.add_handler(recorder)
    informer.start()
    assert informer.wait_for_sync(10)
    recorder.take()
    informer.stop()  # the informer lags: everything below happens while it is not watching
    stale = informer.resource_version

    create(store, "new")
    modify(store, "change", "cat")
    store.delete(kinds.AGENT_PROVIDER, "default", "remove")
    create(store, "brief")
    store.delete(kinds.AGENT_PROVIDER, "default", "brief")  # came and went: never seen, never reported
    assert store.compact(store.current_revision()) > int(stale or 0)

    informer.start()
    wait_until(lambda: informer.relists == 1, what="a relist")
    wait_until(lambda: cache_matches_store(store, informer), what="the cache to converge")
    assert sorted(recorder.take()) == [("ADDED", None, "new"), ("DELETED", "remove", None),
                                       ("MODIFIED", "change", "change")]
    assert int(informer.resource_version or 0) >= store.compacted_revision()

    create(store, "after")  # and it follows the store again from the new list
    wait_until(lambda: informer.get("default", "after") is not None, what="the object after the relist")
    assert recorder.take() == [("ADDED", None, "after")]


def test_an_error_event_in_the_stream_relists_too(
    store: Store, informers: Callable[..., Informer], monkeypatch: pytest.MonkeyPatch,
) -> None:
    create(store, "a")
    informer = informers()
    recorder = Recorder()
    informer.add_handler(recorder)
    informer.start()
    assert informer.wait_for_sync(10)
    informer.stop()
    create(store, "b")
    store.delete(kinds.AGENT_PROVIDER, "default", "a")
    real_watch = store.watch
    compacted: list[int] = []

    def watch_then_compact(kind: kinds.KindInfo | None, options: WatchOptions | None = None) -> Watch:
        # Compaction lands after the watch was accepted and before its replay reads the log: the
        # stream then carries an ERROR event (410 Expired) instead of raising Gone.
        watch = real_watch(kind, options)
        if not compacted and options is not None and options.resource_version:
            compacted.append(store.compact(store.current_revision()))
        return watch

    monkeypatch.setattr(store, "watch", watch_then_compact)
    recorder.take()
    informer.start()
    wait_until(lambda: informer.relists == 1, what="a relist after the ERROR event")
    wait_until(lambda: cache_matches_store(store, informer), what="the cache to converge")
    assert compacted
    assert sorted(recorder.take()) == [("ADDED", None, "b"), ("DELETED", "a", None)]


def test_a_watch_that_ends_is_resumed_from_the_last_revision_without_a_relist(
    store: Store, informers: Callable[..., Informer],
) -> None:
    informer = informers()
    recorder = Recorder()
    informer.add_handler(recorder)
    informer.start()
    assert informer.wait_for_sync(10)
    create(store, "a")
    wait_until(lambda: informer.get("default", "a") is not None, what="a")
    store.stop_watches()  # as a shutting-down server does: the stream ends, the informer goes on
    create(store, "b")
    wait_until(lambda: informer.get("default", "b") is not None, what="b after the watch ended")
    assert recorder.take() == [("ADDED", None, "a"), ("ADDED", None, "b")]
    assert informer.relists == 0


def test_bookmarks_keep_a_quiet_informer_resumable_after_compaction(
    store: Store, informers: Callable[..., Informer],
) -> None:
    informer = informers(kinds.AGENT, bookmark_interval=0.1)  # nothing of this kind is ever written
    informer.start()
    assert informer.wait_for_sync(10)
    for n in range(5):
        create(store, f"p{n}")
    target = store.current_revision()
    wait_until(lambda: int(informer.resource_version or 0) >= target, what="a bookmark")
    informer.stop()
    store.compact(store.current_revision())
    informer.start()
    time.sleep(0.3)  # real time for a watch to (not) fail; there is no event to wait for
    assert informer.relists == 0


def test_an_informer_can_be_scoped_to_a_namespace(store: Store, informers: Callable[..., Informer]) -> None:
    store.create(kinds.AGENT_PROVIDER, provider("x", namespace="team-a"))
    store.create(kinds.AGENT_PROVIDER, provider("y", namespace="team-b"))
    informer = informers(namespace="team-a")
    informer.start()
    assert informer.wait_for_sync(10)
    store.create(kinds.AGENT_PROVIDER, provider("z", namespace="team-b"))
    store.create(kinds.AGENT_PROVIDER, provider("w", namespace="team-a"))
    wait_until(lambda: informer.get("team-a", "w") is not None, what="w")
    assert sorted(name(o) or "" for o in informer.list()) == ["w", "x"]


def test_an_informer_resumes_across_changes_the_log_no_longer_holds(
    store: Store, informers: Callable[..., Informer],
) -> None:
    def secret(obj_name: str, value: str) -> dict[str, Any]:
        return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret",
                "metadata": {"name": obj_name, "namespace": "default"}, "spec": {"data": {"k": value}}}

    def change(obj_name: str, value: str) -> dict[str, Any]:
        current = store.get(kinds.SECRET, "default", obj_name)
        return store.update(kinds.SECRET, {**current, "spec": {"data": {"k": value}}})

    informer = informers(kinds.SECRET)
    recorder = Recorder()
    informer.add_handler(recorder)
    store.create(kinds.SECRET, secret("a", "YQ=="))
    informer.start()
    assert informer.wait_for_sync(10)
    informer.stop()
    # Secrets keep only each object's newest change: a's first value, b's ADDED and c's whole
    # life before its deletion are gone from the log by the time the informer resumes.
    change("a", "Yg==")
    latest_a = change("a", "Yw==")
    store.create(kinds.SECRET, secret("b", "YQ=="))
    latest_b = change("b", "Yg==")
    store.create(kinds.SECRET, secret("c", "YQ=="))
    store.delete(kinds.SECRET, "default", "c")
    target = store.current_revision()
    informer.start()
    wait_until(lambda: int(informer.resource_version or 0) >= target, what="the resumed watch to catch up")
    assert informer.get("default", "b") == latest_b
    assert informer.get("default", "a") == latest_a and informer.get("default", "c") is None
    assert recorder.take() == [("ADDED", None, "a"), ("MODIFIED", "a", "a"), ("ADDED", None, "b")]
    assert informer.relists == 0


def test_an_informer_that_falls_behind_its_watch_buffer_relists_and_converges(
    store: Store, informers: Callable[..., Informer], monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_watch = store.watch

    def small_buffer(kind: kinds.KindInfo | None, options: WatchOptions | None = None) -> Watch:
        options = options or WatchOptions()
        options.buffer_events = 5
        return real_watch(kind, options)

    monkeypatch.setattr(store, "watch", small_buffer)
    informer = informers()
    release = threading.Event()
    informer.add_handler(lambda change, old, new: release.wait(10) if name(new) == "first" else None)
    informer.start()
    assert informer.wait_for_sync(10)
    create(store, "first")  # its handler blocks: the informer stops reading its watch
    wait_until(lambda: informer.get("default", "first") is not None, what="the blocking event")
    for i in range(30):
        create(store, f"p{i}")
    release.set()
    # The watch was ended with a 410 when its buffer overflowed; the informer lists again.
    wait_until(lambda: informer.relists >= 1, what="a relist after the watch fell behind")
    wait_until(lambda: cache_matches_store(store, informer), what="the cache to converge")
