"""The approval controller over a real store and manager, on a fake clock: a new Approval becomes
Pending, and a Pending one expires at ``spec.expiresAt`` — woken by its own requeue, not a resync."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from joch.api import kinds
from joch.controllers.approvals import ApprovalController
from joch.controllers.manager import Manager
from joch.controllers.options import ControllerOptions
from joch.store import Store
from support import FakeClock

NOW = 1_700_000_000.0


def at(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def clock(store: Store) -> Iterator[FakeClock]:
    fake = FakeClock(NOW)
    # resync_period 0: no periodic resync, so only the controller's own requeue can expire it
    manager = Manager(store, [ApprovalController()], ControllerOptions(leader_election=False, resync_period=0.0),
                      clock=fake)
    manager.start()
    assert manager.wait_started(10)
    yield fake
    manager.stop()


def approval(store: Store, name: str, **spec: Any) -> None:
    store.create(kinds.APPROVAL, {"metadata": {"name": name, "namespace": "default"},
                                  "spec": {"runRef": {"name": "r"}, "action": "dispatch", **spec}})


def phase(store: Store, name: str) -> str | None:
    value = (store.get(kinds.APPROVAL, "default", name).get("status") or {}).get("phase")
    return value if isinstance(value, str) else None


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_pending_approval_expires_at_its_time(store: Store, clock: FakeClock) -> None:
    approval(store, "gate", expiresAt=at(NOW + 100))
    approval(store, "forever")
    wait_for(lambda: phase(store, "gate") == "Pending" and phase(store, "forever") == "Pending", "Pending")
    clock.advance(99)
    time.sleep(0.8)  # the manager looks at the clock every 0.5 s
    assert phase(store, "gate") == "Pending"
    clock.advance(1)
    wait_for(lambda: phase(store, "gate") == "Expired", "the expiry")
    gate = store.get(kinds.APPROVAL, "default", "gate")
    [condition] = [c for c in gate["status"]["conditions"] if c["type"] == "Expired"]
    assert condition["message"] == f"expired at {at(NOW + 100)} without a decision"
    assert "decidedBy" not in gate["status"]
    events = [e["spec"] for e in store.list(kinds.EVENT).items if e["spec"]["involvedObject"]["name"] == "gate"]
    assert [(e["reason"], e["type"]) for e in events] == [("Expired", "Warning")]
    assert phase(store, "forever") == "Pending"


def test_a_decided_approval_never_expires(store: Store, clock: FakeClock) -> None:
    approval(store, "gate", expiresAt=at(NOW + 10))
    wait_for(lambda: phase(store, "gate") == "Pending", "Pending")
    current = store.get(kinds.APPROVAL, "default", "gate")
    store.update_status(kinds.APPROVAL, {**current, "status": {"phase": "Approved", "decidedBy": "dave"}})
    clock.advance(20)
    time.sleep(0.8)
    assert phase(store, "gate") == "Approved"


def test_one_already_past_its_time_expires_at_once(store: Store, clock: FakeClock) -> None:
    approval(store, "late", expiresAt=at(NOW - 1))
    wait_for(lambda: phase(store, "late") == "Expired", "the expiry")
