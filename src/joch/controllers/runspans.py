"""The spans of a run's life, recorded from the status transitions the run controller writes.

A run outlives processes (a restart, another replica taking the lease), so nothing about its trace
is kept in memory: the trace id is the run's uid and every span is a child of a root span whose id
is derived from the uid too (``joch.telemetry.tracing.run_ids``). Each span is emitted once the
transition that ends it has been written, with the times the run's status records (seconds, as
Kubernetes writes them), so the replica that writes the transition emits the span, whoever wrote
its start:

* ``joch.run.pending`` — creation until the run was first queued (resolution, dispatch policies,
  approval), emitted with the first attempt's queueing span;
* ``joch.run.queued`` — queued (the ``Queued`` condition's time) until an attempt starts;
* ``joch.run.attempt`` — each attempt, from ``status.startedAt`` until it ended (retried or final);
* ``joch.run`` — the root: creation until ``status.finishedAt``, with the phase and reason, once
  the run is Succeeded, Failed or Cancelled.

The controller's reconciles add live ``joch.run.reconcile`` spans under the same root
(``tracing.run_span``), so the run's trace shows what was done to it and when.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from joch.api.meta import epoch
from joch.store.base import Obj
from joch.telemetry import tracing

TERMINAL = frozenset({"Succeeded", "Failed", "Cancelled"})


def record(before: Obj, after: Obj) -> None:
    """The spans the write from ``before`` to ``after`` ends."""
    if not tracing.enabled():
        return
    old, new = before.get("status") or {}, after.get("status") or {}
    was, now = old.get("phase"), new.get("phase")
    m = after["metadata"]
    ids = {"uid": str(m.get("uid") or ""), "namespace": m.get("namespace"), "name": m.get("name")}
    if not ids["uid"] or was in TERMINAL:
        return
    created = epoch(m.get("creationTimestamp")) or time.time()
    attempt = int(new.get("attempt") or old.get("attempt") or 1)
    if now == "Running" and was != "Running":
        _queued(old, new, created, attempt, ids)
    if was == "Running" and now != "Running":
        started = epoch(old.get("startedAt"))
        if started is not None:
            tracing.record_span("joch.run.attempt", start=started, end=_end(new), **ids,
                                attributes={"joch.run.attempt": int(old.get("attempt") or 1),
                                            "joch.run.reason": str(new.get("reason") or "")})
    if now in TERMINAL:
        error = f"{new.get('reason')}: {new.get('message')}" if now == "Failed" else None
        tracing.record_span("joch.run", start=created, end=_end(new), root=True, error=error, **ids,
                            attributes={"joch.run.phase": str(now), "joch.run.reason": str(new.get("reason") or ""),
                                        "joch.run.attempts": attempt,
                                        "joch.agent": str(((after.get("spec") or {}).get("agentRef") or {})
                                                          .get("name") or "")})


def _queued(old: Mapping[str, Any], new: Mapping[str, Any], created: float, attempt: int,
            ids: dict[str, Any]) -> None:
    queued = _condition_time(old, "Queued") or created
    started = epoch(new.get("startedAt")) or time.time()
    if attempt == 1 and queued > created:
        tracing.record_span("joch.run.pending", start=created, end=queued, **ids)
    tracing.record_span("joch.run.queued", start=queued, end=started, **ids,
                        attributes={"joch.run.attempt": attempt})


def _end(status: Mapping[str, Any]) -> float:
    return epoch(status.get("finishedAt")) or time.time()


def _condition_time(status: Mapping[str, Any], type_: str) -> float | None:
    for condition in status.get("conditions") or ():
        if condition.get("type") == type_ and condition.get("status") == "True":
            return epoch(condition.get("lastTransitionTime"))
    return None
