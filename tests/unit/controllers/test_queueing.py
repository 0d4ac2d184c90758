"""Work queue semantics (client-go's): dedupe, processing/dirty, delays and per-key backoff, on a
fake clock so nothing sleeps."""

from __future__ import annotations

import random
import threading

import pytest
from prometheus_client import REGISTRY

from joch.controllers.queueing import Backoff, WorkQueue
from support import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def drain(queue: WorkQueue[str]) -> list[str]:
    keys = []
    while (key := queue.get(timeout=0)) is not None:
        keys.append(key)
    return keys


def test_adds_are_deduplicated_and_served_in_order(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    for key in ("a", "b", "a", "c", "b"):
        queue.add(key)
    assert len(queue) == 3
    assert drain(queue) == ["a", "b", "c"]


def test_a_key_being_processed_is_not_handed_out_again_until_done(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add("a")
    assert queue.get(timeout=0) == "a"
    queue.add("a")  # a change arrives while a worker holds the key: dirty, not queued
    queue.add("a")
    assert queue.get(timeout=0) is None
    queue.done("a")  # now it comes back, once
    assert drain(queue) == ["a"]
    queue.done("a")
    assert queue.get(timeout=0) is None


def test_done_without_a_new_add_does_not_requeue(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add("a")
    assert queue.get(timeout=0) == "a"
    queue.done("a")
    assert queue.get(timeout=0) is None


def test_add_after_waits_for_the_clock_and_keeps_the_earliest_time(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add_after("a", 10)
    queue.add_after("a", 5)   # earlier: wins
    queue.add_after("a", 30)  # later: an earlier look is already due
    queue.add_after("b", 0)   # no delay: at once
    assert drain(queue) == ["b"]
    assert queue.waiting() == 1
    clock.advance(4.9)
    assert queue.get(timeout=0) is None
    clock.advance(0.1)
    assert drain(queue) == ["a"]
    clock.advance(100)
    queue.done("a")
    assert queue.get(timeout=0) is None and queue.waiting() == 0


def test_a_delayed_key_already_queued_is_not_queued_twice(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add("a")
    queue.add_after("a", 1)
    clock.advance(1)
    assert drain(queue) == ["a"]


def test_backoff_grows_exponentially_within_jitter_bounds_and_forget_resets_it() -> None:
    backoff: Backoff[str] = Backoff(base=0.05, cap=60.0, factor=2.0, jitter=0.2, rng=random.Random(7))
    delays = [backoff.when("k") for _ in range(14)]
    for failures, delay in enumerate(delays):
        ceiling = min(60.0, 0.05 * 2**failures)
        assert ceiling * 0.8 <= delay <= min(60.0, ceiling * 1.2), (failures, delay)
    assert delays[-1] <= 60.0 and delays[-1] >= 48.0  # capped
    assert len({round(d / min(60.0, 0.05 * 2**i), 6) for i, d in enumerate(delays[:8])}) > 1  # jittered
    assert backoff.retries("k") == 14 and backoff.retries("other") == 0
    backoff.forget("k")
    assert backoff.retries("k") == 0
    assert 0.04 <= backoff.when("k") <= 0.06


def test_backoff_is_per_key() -> None:
    backoff: Backoff[str] = Backoff(base=1.0, cap=100.0, jitter=0.0)
    assert [backoff.when("a") for _ in range(3)] == [1.0, 2.0, 4.0]
    assert backoff.when("b") == 1.0


def test_add_rate_limited_schedules_by_backoff_on_the_fake_clock(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock, backoff=Backoff(base=1.0, cap=8.0, jitter=0.0))
    expected = [1.0, 2.0, 4.0, 8.0, 8.0]
    for delay in expected:
        queue.add_rate_limited("k")
        clock.advance(delay - 0.01)
        assert queue.get(timeout=0) is None
        clock.advance(0.01)
        assert queue.get(timeout=0) == "k"
        queue.done("k")
    assert queue.retries("k") == 5
    queue.forget("k")
    queue.add_rate_limited("k")
    clock.advance(1.0)
    assert queue.get(timeout=0) == "k"


def test_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        Backoff(base=0)
    with pytest.raises(ValueError):
        Backoff(base=2, cap=1)


def test_shutdown_wakes_every_blocked_getter_and_ignores_later_adds(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    results: list[str | None] = []
    getters = [threading.Thread(target=lambda: results.append(queue.get())) for _ in range(3)]
    for thread in getters:
        thread.start()
    queue.shutdown()
    for thread in getters:
        thread.join(5)
        assert not thread.is_alive()
    assert results == [None, None, None]
    queue.add("a")
    queue.add_after("b", 1)
    assert queue.get(timeout=0) is None and len(queue) == 0 and queue.shutting_down


def test_a_blocked_getter_wakes_for_an_add_from_another_thread(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    got: list[str | None] = []
    getter = threading.Thread(target=lambda: got.append(queue.get(timeout=10)))
    getter.start()
    queue.add("a")
    getter.join(5)
    assert got == ["a"]


def test_a_blocked_getter_notices_the_fake_clock_passing_a_delay(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock, max_wait=0.01)
    queue.add_after("a", 60)
    got: list[str | None] = []
    getter = threading.Thread(target=lambda: got.append(queue.get(timeout=10)))
    getter.start()
    clock.advance(60)
    getter.join(5)
    assert got == ["a"]


def test_concurrent_workers_never_hold_one_key_at_once(clock: FakeClock) -> None:
    queue: WorkQueue[int] = WorkQueue(clock=clock)
    held: set[int] = set()
    lock = threading.Lock()
    overlaps: list[int] = []
    processed = [0]

    def worker() -> None:
        while (key := queue.get()) is not None:
            with lock:
                if key in held:
                    overlaps.append(key)
                held.add(key)
                processed[0] += 1
            if key % 2:
                queue.add(key)  # re-added while held: dirty
            with lock:
                held.discard(key)
            queue.done(key)
            if processed[0] >= 2000:
                queue.shutdown()

    workers = [threading.Thread(target=worker) for _ in range(4)]
    for thread in workers:
        thread.start()
    for i in range(200):
        queue.add(i % 10)
    for thread in workers:
        thread.join(10)
    assert overlaps == []


def test_adds_and_retries_are_counted_per_queue(clock: FakeClock) -> None:
    queue: WorkQueue[str] = WorkQueue(clock=clock, name="counted-queue")

    def count(family: str) -> float | None:
        return REGISTRY.get_sample_value(family, {"name": "counted-queue"})

    for key in ("a", "a", "b"):
        queue.add(key)  # "a" twice is one key waiting: one add
    assert count("joch_workqueue_adds_total") == 2
    assert drain(queue) == ["a", "b"]
    queue.add_rate_limited("a")
    assert count("joch_workqueue_retries_total") == 1
