"""Leader election on the real store, one step at a time: electors are driven by hand
(``try_acquire_or_renew``) on a fake clock, so lease expiry needs no waiting. The threaded
take-over timings are in ``test_manager``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest

from joch.api import kinds
from joch.api.meta import parse_time
from joch.controllers.leader import LeaderElector, pid_alive
from joch.store import Store, open_store
from support import FakeClock

NS, NAME = "joch-system", "joch-controller-manager"



def elector(store: Store, identity: str, clock: FakeClock, **options: Any) -> LeaderElector:
    settings: dict[str, Any] = {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 2.0, **options}
    return LeaderElector(store, identity=identity, namespace=NS, name=NAME, clock=clock,
                         on_started_leading=lambda: None, on_stopped_leading=lambda: None, **settings)


def lease(store: Store) -> dict[str, Any]:
    spec: dict[str, Any] = store.get(kinds.LEASE, NS, NAME)["spec"]
    return spec


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_first_candidate_creates_the_lease_and_others_wait(store: Store) -> None:
    clock = FakeClock()
    a, b = elector(store, "host-a/1/aaaa", clock), elector(store, "host-b/2/bbbb", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    spec = lease(store)
    assert spec["holderIdentity"] == "host-a/1/aaaa" and spec["leaseTransitions"] == 0
    assert spec["leaseDurationSeconds"] == 15
    assert spec["renewTime"] == "2023-11-14T22:13:20.000000Z" == spec["acquireTime"]  # RFC 3339, microseconds
    assert b.holder == "host-a/1/aaaa"

    clock.advance(2.5)
    assert a.try_acquire_or_renew()  # a renewal moves renewTime, not acquireTime
    spec = lease(store)
    assert parse_time(spec["renewTime"]).timestamp() == pytest.approx(clock.now, abs=1e-6)
    assert spec["acquireTime"] == "2023-11-14T22:13:20.000000Z" and spec["leaseTransitions"] == 0


def test_an_expired_lease_is_taken_over_and_the_old_holder_cannot_renew(store: Store) -> None:
    clock = FakeClock()
    a, b = elector(store, "host-a/1/aaaa", clock), elector(store, "host-b/2/bbbb", clock)
    assert a.try_acquire_or_renew()
    clock.advance(14.9)
    assert not b.try_acquire_or_renew()
    clock.advance(0.2)  # renewTime + leaseDurationSeconds is now in the past
    assert b.try_acquire_or_renew()
    spec = lease(store)
    assert spec["holderIdentity"] == "host-b/2/bbbb" and spec["leaseTransitions"] == 1
    assert parse_time(spec["acquireTime"]).timestamp() == pytest.approx(clock.now, abs=1e-6)
    assert not a.try_acquire_or_renew()
    assert a.holder == "host-b/2/bbbb"


def test_a_holder_whose_clock_runs_ahead_still_expires_by_local_observation(store: Store) -> None:
    clock = FakeClock()
    ahead = FakeClock()
    ahead.advance(3600)
    a, b = elector(store, "host-a/1/aaaa", ahead), elector(store, "host-b/2/bbbb", clock)
    assert a.try_acquire_or_renew()  # renewTime an hour in b's future
    assert not b.try_acquire_or_renew()
    clock.advance(15)  # b watched the record not change for a lease duration
    assert b.try_acquire_or_renew()


def test_release_clears_the_holder_and_keeps_the_object_so_the_next_takes_it_at_once(store: Store) -> None:
    clock = FakeClock()
    a, b = elector(store, "host-a/1/aaaa", clock), elector(store, "host-b/2/bbbb", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release()
    assert "holderIdentity" not in lease(store)
    assert not a.release()  # not the holder any more
    assert b.try_acquire_or_renew()
    spec = lease(store)
    assert spec["holderIdentity"] == "host-b/2/bbbb" and spec["leaseTransitions"] == 1


def test_a_dead_holder_on_this_host_is_replaced_at_once(store: Store) -> None:
    clock = FakeClock()
    host = socket.gethostname()
    crashed = elector(store, f"{host}/{dead_pid()}/dead", clock)
    assert crashed.try_acquire_or_renew()
    restarted = elector(store, f"{host}/{os.getpid()}/new1", clock)
    assert restarted.try_acquire_or_renew()  # no waiting out the lease
    assert lease(store)["leaseTransitions"] == 1


def test_a_live_holder_on_this_host_or_one_elsewhere_is_not_replaced(store: Store) -> None:
    clock = FakeClock()
    host = socket.gethostname()
    live = elector(store, f"{host}/{os.getpid()}/live", clock)  # same process: alive
    assert live.try_acquire_or_renew()
    assert not elector(store, f"{host}/{os.getpid()}/other", clock).try_acquire_or_renew()
    clock.advance(20)
    elsewhere = elector(store, f"elsewhere-host/{dead_pid()}/far", clock)
    assert elsewhere.try_acquire_or_renew()  # expired: taken
    # Its pid is dead here, but it ran on another host: nobody on this host may judge it.
    assert not elector(store, f"{host}/{os.getpid()}/mine", clock).try_acquire_or_renew()


def test_a_killed_but_unreaped_process_counts_as_dead() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        deadline = 50
        while pid_alive(proc.pid) and deadline:  # becomes a zombie within milliseconds
            threading.Event().wait(0.02)
            deadline -= 1
        assert not pid_alive(proc.pid)
    finally:
        proc.wait()
    assert not pid_alive(proc.pid)
    assert pid_alive(os.getpid())


@pytest.mark.parametrize("setup", ["absent", "expired"])
def test_of_many_racing_candidates_exactly_one_wins(store: Store, setup: str) -> None:
    clock = FakeClock()
    if setup == "expired":
        assert elector(store, "host-old/1/old", clock).try_acquire_or_renew()
        clock.advance(60)
    candidates = [elector(store, f"host-{n}/{n}/race", clock) for n in range(8)]
    start = threading.Barrier(len(candidates))
    won: list[str] = []

    def run(candidate: LeaderElector) -> None:
        start.wait()
        if candidate.try_acquire_or_renew():
            won.append(candidate.identity)

    threads = [threading.Thread(target=run, args=(c,)) for c in candidates]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(won) == 1, won
    assert lease(store)["holderIdentity"] == won[0]


def test_timings_that_allow_two_leaders_are_refused(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    try:
        with pytest.raises(ValueError, match="renew_deadline < lease_duration"):
            elector(store, "x/1/x", FakeClock(), lease_duration=5.0, renew_deadline=10.0)
    finally:
        store.close()


def test_a_leader_that_was_paused_past_its_renew_deadline_does_not_hold_the_lease(store: Store) -> None:
    """``holds_lease`` counts from the last renewal by the monotonic clock, which keeps counting while
    a process is stopped: a leader resuming from SIGSTOP must not start anything before it renews."""
    clock = FakeClock()
    elector = LeaderElector(store, identity="host/1/a", namespace="joch-system", name="l", lease_duration=15,
                            renew_deadline=10, retry_period=2, clock=clock,
                            on_started_leading=lambda: None, on_stopped_leading=lambda: None)
    assert elector.try_acquire_or_renew() and not elector.holds_lease()  # is_leader is set by the loop
    elector._leader = True
    assert elector._attempt()
    assert elector.holds_lease()
    clock.advance(9.9)
    assert elector.holds_lease()
    clock.advance(0.2)
    assert not elector.holds_lease()
    assert elector._attempt() and elector.holds_lease()
