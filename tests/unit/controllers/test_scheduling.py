"""The scheduler on its own: limits, oldest-first claims, and what a release wakes."""

from __future__ import annotations

from typing import Any

from joch.controllers.base import Key
from joch.controllers.options import ControllerOptions
from joch.controllers.scheduling import Scheduler


def run(name: str, agent: str = "a", namespace: str = "default", created: str = "2026-11-22T00:00:00Z") -> Any:
    return {"metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
            "spec": {"agentRef": {"name": agent}}}


def scheduler(limits: dict[str, int] | None = None, **options: Any) -> Scheduler:
    return Scheduler(ControllerOptions(**options), lambda ns, agent: (limits or {}).get(agent))


def test_the_global_limit_holds_and_says_so() -> None:
    s = scheduler(max_concurrent_runs=1)
    first, second = run("r1"), run("r2")
    assert s.claim(Key.of(first), first, [first, second]) is None
    hold = s.claim(Key.of(second), second, [second])
    assert hold is not None and hold.limit == "global"
    assert hold.message == "waiting for a run slot: 1 of 1 runs are running (--max-concurrent-runs)"
    assert s.release(Key.of(first), [second]) == [Key.of(second)]
    assert s.claim(Key.of(second), second, [second]) is None


def test_an_older_queued_run_goes_first_but_one_held_by_its_agent_does_not_block_others() -> None:
    s = scheduler({"slow": 1}, max_concurrent_runs=2)
    busy = run("s0", "slow")
    s.occupy(Key.of(busy), busy)
    older_same_agent = run("s1", "slow", created="2026-11-22T00:00:01Z")
    younger_other = run("q1", "quick", created="2026-11-22T00:00:02Z")
    queued = [older_same_agent, younger_other]
    hold = s.claim(Key.of(older_same_agent), older_same_agent, queued)
    assert hold is not None and hold.limit == "agent" and 'Agent "slow"' in hold.message
    assert s.claim(Key.of(younger_other), younger_other, queued) is None


def test_a_younger_run_does_not_overtake_an_older_one_for_the_last_slot() -> None:
    s = scheduler(max_concurrent_runs=1)
    older, younger = run("b", created="2026-11-22T00:00:01Z"), run("a", created="2026-11-22T00:00:02Z")
    hold = s.claim(Key.of(younger), younger, [older, younger])
    assert hold is not None and hold.limit == "global"
    assert s.claim(Key.of(older), older, [older, younger]) is None


def test_a_release_wakes_only_what_can_start() -> None:
    s = scheduler({"x": 1}, max_concurrent_runs=2, max_concurrent_runs_per_namespace=None)
    running = [run("x0", "x"), run("y0", "y")]
    s.seed(running)
    waiting = [run(f"x{i}", "x", created=f"2026-11-22T00:00:0{i}Z") for i in (1, 2)] + [
        run("y1", "y", created="2026-11-22T00:00:05Z"), run("y2", "y", created="2026-11-22T00:00:06Z")]
    # y0 ends: x1/x2 are held by agent x's limit (x0 still runs), so y1 — and only y1 — is woken.
    assert s.release(Key.of(running[1]), waiting) == [Key("default", "y1")]
    assert s.release(Key("default", "never-claimed"), waiting) == []
