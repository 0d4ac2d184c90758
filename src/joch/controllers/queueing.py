"""Rate-limited work queues of keys, with client-go's ``workqueue`` semantics.

Why a queue of keys and not of events: reconcile is level-triggered, so ten events about one object
need one reconcile, not ten. A key waiting in the queue absorbs every further ``add`` (it is *dirty*
once), and the worker that finally takes it reads the latest state.

Why *processing* and *dirty* are separate sets: a key is never handed to two workers at once. An
``add`` while a worker holds the key only marks it dirty; ``done`` puts it back in the queue, so the
change that arrived meanwhile is still seen — by one worker, after the first has finished.

Delays (``add_after``, and ``add_rate_limited`` with per-key exponential backoff) wait in a heap
ordered by due time and move into the queue when a getter sees they are due. The time comes from
an injectable ``Clock``: tests advance a fake clock and call ``get(timeout=0)`` instead of sleeping.
A getter never waits longer than ``max_wait`` of real time before looking at the clock again, which
is what lets a fake clock's jumps be noticed by blocked worker threads too.

``shutdown`` wakes every getter; ``get`` then returns None, and adds are ignored. Work in flight is
abandoned, not drained: the manager stops its queues when it loses leadership, and another replica
picks the same keys up from its own informers.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import random
import threading
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

from joch.controllers.base import Clock
from joch.telemetry import metrics

K = TypeVar("K", bound=Hashable)


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Clock = SystemClock()


class Backoff(Generic[K]):
    """Per-key exponential backoff: ``base * factor ** failures`` capped at ``cap``, times a random
    factor in ``[1 - jitter, 1 + jitter]`` (and never above ``cap``), so keys that failed together do
    not retry together. ``forget`` resets a key."""

    def __init__(
        self, *, base: float = 0.05, cap: float = 60.0, factor: float = 2.0, jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        if base <= 0 or cap < base or factor < 1 or not 0 <= jitter < 1:
            raise ValueError("backoff needs base > 0, cap >= base, factor >= 1 and 0 <= jitter < 1")
        self.base, self.cap, self.factor, self.jitter = base, cap, factor, jitter
        self._rng = rng or random.Random()  # noqa: S311 - spreading retries, not cryptography
        self._failures: dict[K, int] = {}
        self._lock = threading.Lock()

    def when(self, key: K) -> float:
        """The delay before the next retry of ``key``, counting this failure."""
        with self._lock:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
            spread = self._rng.uniform(1 - self.jitter, 1 + self.jitter)
        return min(self.cap, self.ceiling(failures) * spread)

    def ceiling(self, failures: int) -> float:
        """The delay without jitter after ``failures`` earlier failures."""
        # Exponent capped so a key failing for days does not overflow a float.
        return min(self.cap, self.base * self.factor ** min(failures, 64))

    def retries(self, key: K) -> int:
        with self._lock:
            return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        with self._lock:
            self._failures.pop(key, None)


class WorkQueue(Generic[K]):
    """A FIFO of distinct keys; see the module docstring for the processing/dirty rules."""

    def __init__(
        self, *, clock: Clock = SYSTEM_CLOCK, backoff: Backoff[K] | None = None, max_wait: float = 1.0,
        name: str = "",
    ) -> None:
        self.name = name
        self.clock = clock
        self.backoff: Backoff[K] = backoff or Backoff()
        self._max_wait = max_wait
        self._cond = threading.Condition()
        self._queue: collections.deque[K] = collections.deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._waiting: list[tuple[float, int, K]] = []  # (due, sequence, key): a heap
        self._due: dict[K, float] = {}  # the earliest due time of each waiting key
        self._sequence = itertools.count()
        self._shutting_down = False
        self._adds = metrics.WORKQUEUE_ADDS.labels(name)
        self._retries = metrics.WORKQUEUE_RETRIES.labels(name)

    # --- adding ----------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: K) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        self._adds.inc()
        if key in self._processing:
            return  # ``done`` re-queues it
        self._queue.append(key)
        self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutting_down:
                return
            due = self.clock.monotonic() + delay
            if key in self._due and self._due[key] <= due:
                return  # an earlier retry is already scheduled; it will see the latest state
            self._due[key] = due
            heapq.heappush(self._waiting, (due, next(self._sequence), key))
            self._cond.notify()  # a getter may have to wait less now

    def add_rate_limited(self, key: K) -> None:
        self._retries.inc()
        self.add_after(key, self.backoff.when(key))

    def forget(self, key: K) -> None:
        self.backoff.forget(key)

    def retries(self, key: K) -> int:
        return self.backoff.retries(key)

    # --- taking ----------------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> K | None:
        """The next key, now marked processing (call ``done`` with it); None on timeout or shutdown.
        ``timeout`` is real seconds; ``timeout=0`` only looks."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._shutting_down:
                    return None
                self._promote_due()
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                wait = self._max_wait
                if self._waiting:
                    wait = min(wait, max(0.0, self._waiting[0][0] - self.clock.monotonic()))
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    wait = min(wait, left)
                self._cond.wait(wait)

    def _promote_due(self) -> None:
        now = self.clock.monotonic()
        while self._waiting and self._waiting[0][0] <= now:
            due, _, key = heapq.heappop(self._waiting)
            if self._due.get(key) == due:
                del self._due[key]
                self._add_locked(key)

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty and not self._shutting_down:
                self._queue.append(key)
                self._cond.notify()

    # --- the rest --------------------------------------------------------------------------------

    def shutdown(self) -> None:
        with self._cond:
            self._shutting_down = True
            self._cond.notify_all()

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def __len__(self) -> int:
        """Keys ready to be taken (not those waiting for a delay or being processed)."""
        with self._cond:
            return len(self._queue)

    def waiting(self) -> int:
        """Keys waiting for a delay to pass."""
        with self._cond:
            return len(self._due)
