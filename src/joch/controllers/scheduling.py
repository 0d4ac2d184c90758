"""The run scheduler: which queued runs may start now, under the three concurrency limits.

The scheduler is in memory and the leader's alone. ``active`` holds the runs that occupy a slot
(submitted, or about to be, and not yet seen to finish); the run controller seeds it from the cache
when it starts, and it is the only count a claim looks at, so two workers can never both take the
last slot (every claim and release holds one lock).

Queued runs are ordered by creation time, then by the order the controller first saw them (a
creationTimestamp has whole seconds). A run may start only if it fits after every older queued run
that fits has taken its slot: younger runs never overtake older ones competing for the same limit,
while a run held by its agent's limit does not hold back other agents' runs. A release wakes only
the queued runs that could take the freed capacity, in the same order; a run it misses is found by
the periodic resync.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from joch.controllers.base import Key
from joch.controllers.options import ControllerOptions
from joch.store.base import Obj


@dataclass(frozen=True)
class Slot:
    namespace: str
    agent: str

    @classmethod
    def of(cls, run: Obj) -> Slot:
        return cls(run["metadata"].get("namespace") or "", run["spec"]["agentRef"]["name"])


@dataclass(frozen=True)
class Hold:
    """Why a run must wait: the limit that holds it, and a message for its ``Queued`` condition."""

    limit: Literal["global", "namespace", "agent"]
    message: str


AgentLimit = Callable[[str, str], int | None]
"""``(namespace, agent name) → spec.maxConcurrentRuns`` (None: no limit of its own)."""


class Scheduler:
    def __init__(self, options: ControllerOptions, agent_limit: AgentLimit) -> None:
        self.options = options
        self.agent_limit = agent_limit
        self._lock = threading.Lock()
        self._active: dict[Key, Slot] = {}
        self._order: dict[Key, int] = {}
        self._next = 0

    def seed(self, running: Iterable[Obj]) -> None:
        with self._lock:
            self._active = {Key.of(run): Slot.of(run) for run in running}

    def clear(self) -> None:
        with self._lock:
            self._active.clear()
            self._order.clear()

    def remember(self, key: Key) -> None:
        with self._lock:
            if key not in self._order:
                self._order[key] = self._next
                self._next += 1

    def forget(self, key: Key) -> None:
        with self._lock:
            self._order.pop(key, None)

    def occupy(self, key: Key, run: Obj) -> None:
        """Count a run found running (after a restart, say) as holding its slot."""
        with self._lock:
            self._active.setdefault(key, Slot.of(run))

    def claim(self, key: Key, run: Obj, queued: Iterable[Obj]) -> Hold | None:
        """Take a slot for ``run`` (None), or say why it must wait; ``queued`` are the waiting runs."""
        slot = Slot.of(run)
        with self._lock:
            if key in self._active:
                return None
            taken = list(self._active.values())
            for other in sorted(queued, key=self._fifo):
                other_key = Key.of(other)
                if other_key == key:
                    break
                if other_key not in self._active and self._hold(Slot.of(other), taken) is None:
                    taken.append(Slot.of(other))
            hold = self._hold(slot, taken)
            if hold is None:
                self._active[key] = slot
            return hold

    def release(self, key: Key, queued: Iterable[Obj]) -> list[Key]:
        """Free ``key``'s slot; the queued runs that can take the freed capacity, oldest first."""
        with self._lock:
            if self._active.pop(key, None) is None:
                return []
            taken = list(self._active.values())
            waking: list[Key] = []
            for run in sorted(queued, key=self._fifo):
                if Key.of(run) in self._active:
                    continue  # claimed already, counted in taken
                slot = Slot.of(run)
                hold = self._hold(slot, taken)
                if hold is not None and hold.limit == "global":
                    break  # nobody younger can start either
                if hold is None:
                    waking.append(Key.of(run))
                    taken.append(slot)
            return waking

    def _hold(self, slot: Slot, taken: list[Slot]) -> Hold | None:
        limit = self.options.max_concurrent_runs
        if limit is not None and len(taken) >= limit:
            return Hold("global", _waiting(f"{len(taken)} of {limit} runs are running (--max-concurrent-runs)"))
        limit = self.options.max_concurrent_runs_per_namespace
        in_namespace = sum(1 for s in taken if s.namespace == slot.namespace)
        if limit is not None and in_namespace >= limit:
            return Hold("namespace", _waiting(f'{in_namespace} of {limit} runs in namespace "{slot.namespace}" are '
                                              "running (--max-concurrent-runs-per-namespace)"))
        limit = self.agent_limit(slot.namespace, slot.agent)
        of_agent = sum(1 for s in taken if s == slot)
        if limit is not None and of_agent >= limit:
            return Hold("agent", _waiting(f'{of_agent} of {limit} runs of Agent "{slot.agent}" are running '
                                          "(its spec.maxConcurrentRuns)"))
        return None

    def _fifo(self, run: Obj) -> tuple[str, int]:
        return (run["metadata"].get("creationTimestamp") or "", self._order.get(Key.of(run), 1 << 62))


def _waiting(why: str) -> str:
    return f"waiting for a run slot: {why}"
