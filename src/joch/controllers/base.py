"""What a controller is, as the manager sees it.

A controller owns one primary kind. The manager keeps an informer (a list + watch cache) for it
and for every secondary kind it declares, turns every event into keys of the primary kind on a
rate-limited work queue, and calls ``reconcile(key)`` from worker threads — never concurrently for
one key. Reconcile is level-triggered: it reads the current state from the caches (or the store)
and moves the world one step towards the desired state; it must be safe to call any number of times.

* Returning ``Result(requeue_after=s)`` asks for another look after ``s`` seconds (deadlines, TTLs).
* Raising asks for a retry with per-key exponential backoff and jitter; ``Conflict`` is the
  ordinary case (someone wrote the object since the cache saw it) and is retried quietly.
* Returning ``None`` (or ``Result()``) forgets the key's backoff.

Controllers get a ``Context`` in ``setup``: the store to write to, the caches to read from, and
``enqueue`` for keys that events alone would not produce (the runtime telling a run finished).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from joch.api.registry import KindInfo
from joch.store.base import Obj, Store


class Key(NamedTuple):
    namespace: str
    name: str

    @classmethod
    def of(cls, obj: Obj) -> Key:
        m = obj.get("metadata") or {}
        return cls(m.get("namespace") or "", m["name"])

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class Result:
    requeue_after: float | None = None


class Cache(Protocol):
    """An informer's in-memory view of one kind. Objects are the stored dicts: never mutate them."""

    def get(self, namespace: str, name: str) -> Obj | None: ...

    def list(self, namespace: str | None = None) -> list[Obj]: ...


Mapper = Callable[[Obj], Iterable[Key]]
"""Maps an object of a secondary kind to the primary keys it concerns."""


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class Context(Protocol):
    store: Store
    clock: Clock

    def cache(self, kind: KindInfo) -> Cache: ...

    def enqueue(self, controller: str, key: Key, *, after: float = 0.0) -> None: ...

    def leading(self) -> bool:
        """This replica holds the leader lease right now (always true without leader election).
        Ask right before a side effect that must happen once, such as starting a process."""
        ...


class Controller(abc.ABC):
    name: str
    kind: KindInfo
    workers: int = 1

    def secondary(self) -> Sequence[tuple[KindInfo, Mapper]]:
        """Other kinds whose changes concern objects of ``kind``, with the mapping to their keys."""
        return ()

    def setup(self, ctx: Context) -> None:  # noqa: B027 - optional hook
        """Called once before the informers start; keep ``ctx``."""

    def started(self) -> None:  # noqa: B027 - optional hook
        """Called once every informer has synced, before the first reconcile."""

    def stopped(self) -> None:  # noqa: B027 - optional hook
        """Called when the manager stops or loses leadership; in-flight work is abandoned."""

    @abc.abstractmethod
    def reconcile(self, key: Key) -> Result | None: ...
