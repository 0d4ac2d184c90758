"""The controller manager over the real store: the order of a controller's hooks, events (primary and
secondary) becoming reconciles, resync, retries with backoff, requeues — timing on a fake clock — and
leader election between managers sharing one Postgres database, in threads and as processes."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from joch.api import errors, kinds
from joch.api.registry import KindInfo
from joch.controllers.base import Context, Controller, Key, Mapper, Result
from joch.controllers.leader import stamp
from joch.controllers.manager import Manager
from joch.controllers.options import ControllerOptions
from joch.store import Store, open_store
from support import FakeClock, ports, provider, wait_ready

NS = "default"
FAST_LEASE = {"lease_duration": 1.0, "renew_deadline": 0.7, "retry_period": 0.2}



def wait_until(check: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def agent_to_provider(agent: dict[str, Any]) -> list[Key]:
    ref = (agent.get("spec") or {}).get("providerRef") or {}
    return [Key(agent["metadata"]["namespace"], ref["name"])] if ref.get("name") else []


class Recording(Controller):
    """Reconciles AgentProviders (and Agents, through their providerRef); records everything and
    misbehaves as scripted: ``script[name]`` is a list of outcomes, one per call, each an exception
    to raise or a ``Result`` to return."""

    name = "providers"
    kind = kinds.AGENT_PROVIDER

    def __init__(self, script: dict[str, list[BaseException | Result]] | None = None, *, workers: int = 2) -> None:
        self.workers = workers
        self.script = script or {}
        self.calls: list[Key] = []
        self.hooks: list[str] = []
        self.cached_at: dict[str, int] = {}
        self.ctx: Context | None = None
        self.lock = threading.Lock()
        self.active = 0
        self.overlap = False

    def secondary(self) -> Sequence[tuple[KindInfo, Mapper]]:
        return [(kinds.AGENT, agent_to_provider)]

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.hooks.append("setup")
        self.cached_at["setup"] = len(ctx.cache(self.kind).list())

    def started(self) -> None:
        self.hooks.append("started")
        if self.ctx is not None:
            self.cached_at["started"] = len(self.ctx.cache(self.kind).list())

    def stopped(self) -> None:
        self.hooks.append("stopped")

    def reconcile(self, key: Key) -> Result | None:
        with self.lock:
            self.calls.append(key)
            outcomes = self.script.get(key.name) or []
            outcome = outcomes.pop(0) if outcomes else None
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def count(self, name: str) -> int:
        with self.lock:
            return sum(1 for key in self.calls if key.name == name)


def options(**overrides: Any) -> ControllerOptions:
    settings: dict[str, Any] = {"leader_election": False, "resync_period": 0.0, **overrides}
    return ControllerOptions(**settings)


@pytest.fixture
def managers() -> Iterator[Callable[..., Manager]]:
    made: list[Manager] = []

    def make(store: Store, controllers: Sequence[Controller], opts: ControllerOptions, **kw: Any) -> Manager:
        manager = Manager(store, controllers, opts, **kw)
        made.append(manager)
        manager.start()
        return manager

    yield make
    for manager in made:
        manager.stop()


def create(store: Store, name: str) -> None:
    store.create(kinds.AGENT_PROVIDER, provider(name, namespace=NS))


def create_agent(store: Store, name: str, provider_name: str) -> dict[str, Any]:
    return store.create(kinds.AGENT, {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
                                      "metadata": {"name": name, "namespace": NS},
                                      "spec": {"providerRef": {"name": provider_name}}})


# --- one manager ----------------------------------------------------------------------------------


def test_hooks_run_in_order_and_every_object_is_reconciled(
    store: Store, managers: Callable[..., Manager],
) -> None:
    create(store, "a")
    create(store, "b")
    controller = Recording()
    manager = managers(store, [controller], options())
    assert manager.wait_started(10) and manager.is_leader and manager.is_running
    assert controller.hooks == ["setup", "started"]
    assert controller.cached_at == {"setup": 0, "started": 2}  # started() comes after the sync
    wait_until(lambda: controller.count("a") and controller.count("b"), what="the first reconciles")

    before = controller.count("a")
    create_agent(store, "fixer", "a")  # a secondary object concerns its provider
    wait_until(lambda: controller.count("a") > before, what="a reconcile of a for its agent")

    manager.stop()
    manager.stop()  # idempotent
    assert controller.hooks == ["setup", "started", "stopped"]
    assert not manager.is_running and not manager.is_leader


def test_a_secondary_object_that_moves_concerns_both_old_and_new_targets(
    store: Store, managers: Callable[..., Manager],
) -> None:
    create(store, "a")
    create(store, "b")
    agent = create_agent(store, "fixer", "a")
    controller = Recording()
    managers(store, [controller], options()).wait_started(10)
    wait_until(lambda: controller.count("a") and controller.count("b"), what="the first reconciles")
    a, b = controller.count("a"), controller.count("b")
    store.update(kinds.AGENT, {**agent, "spec": {"providerRef": {"name": "b"}}})
    wait_until(lambda: controller.count("a") > a and controller.count("b") > b, what="both providers")


def test_one_informer_per_kind_is_shared_by_every_controller(
    store: Store, managers: Callable[..., Manager],
) -> None:
    class Other(Recording):
        name = "agents-view"

    first, second = Recording(), Other()
    manager = managers(store, [first, second], options())
    assert manager.wait_started(10)
    assert first.ctx is not None and second.ctx is not None
    assert first.ctx.cache(kinds.AGENT_PROVIDER) is second.ctx.cache(kinds.AGENT_PROVIDER)
    assert manager.cache(kinds.AGENT) is first.ctx.cache(kinds.AGENT)
    create(store, "a")
    wait_until(lambda: first.count("a") and second.count("a"), what="both controllers")


def test_controller_names_must_be_unique(store: Store) -> None:
    with pytest.raises(ValueError, match="unique"):
        Manager(store, [Recording(), Recording()], options())


def test_resync_requeues_every_cached_key(store: Store, managers: Callable[..., Manager]) -> None:
    clock = FakeClock()
    for name in ("a", "b", "c"):
        create(store, name)
    controller = Recording()
    managers(store, [controller], options(resync_period=30.0), clock=clock).wait_started(10)
    wait_until(lambda: all(controller.count(n) == 1 for n in "abc"), what="the first reconciles")
    clock.advance(29)
    clock.advance(1)
    wait_until(lambda: all(controller.count(n) == 2 for n in "abc"), what="a resync")
    clock.advance(30)
    wait_until(lambda: all(controller.count(n) == 3 for n in "abc"), what="another resync")


def test_a_failing_reconcile_is_retried_with_backoff_on_the_clock(
    store: Store, managers: Callable[..., Manager], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="joch.controllers")
    clock = FakeClock()
    conflict = errors.Conflict('Operation cannot be fulfilled on agentproviders "bad": modified')
    controller = Recording({"bad": [RuntimeError("boom"), RuntimeError("boom"), conflict]})
    before = reconcile_metrics()
    create(store, "bad")
    managers(store, [controller], options(), clock=clock).wait_started(10)
    wait_until(lambda: controller.count("bad") == 1, what="the first attempt")
    time.sleep(0.2)  # the retry waits for the (fake) clock, not for real time
    assert controller.count("bad") == 1
    for attempt in (2, 3, 4):
        # Advance until the retry happened: the worker schedules it (at "now" + backoff) only after
        # the failing reconcile returns, so one advance made as the count ticks over could come
        # before the scheduling, and the retry would wait for a clock that never moves again.
        def due(attempt: int = attempt) -> bool:
            if controller.count("bad") >= attempt:
                return True
            clock.advance(60)  # the backoff cap: whatever the jitter, the retry is due
            return False

        wait_until(due, what=f"attempt {attempt}")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "joch.controllers"]
    assert len(warnings) == 2 and all("default/bad" in w and "boom" in w for w in warnings), warnings
    assert any("default/bad" in r.getMessage() and r.levelno == logging.DEBUG and "modified" in r.getMessage()
               for r in caplog.records)
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.DEBUG)  # the traceback, at debug
    clock.advance(120)
    time.sleep(0.2)
    assert controller.count("bad") == 4  # succeeded: no more retries
    counted = {name: value - before[name] for name, value in reconcile_metrics().items()}
    assert counted == {"error": 2, "conflict": 1, "success": 1, "requeue_after": 0, "errors": 2, "retries": 3,
                       "reconciles": 4}, counted


def reconcile_metrics() -> dict[str, float]:
    """What ``joch_reconcile_*`` and ``joch_workqueue_retries_total`` hold for the controller ``providers``."""
    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, {"controller": "providers", **labels}) or 0.0

    results = {r: value("joch_reconcile_total", result=r) for r in ("success", "requeue_after", "conflict", "error")}
    return {**results, "errors": value("joch_reconcile_errors_total"),
            "reconciles": value("joch_reconcile_duration_seconds_count"),
            "retries": REGISTRY.get_sample_value("joch_workqueue_retries_total", {"name": "providers"}) or 0.0}


def test_requeue_after_and_enqueue_use_the_clock(store: Store, managers: Callable[..., Manager]) -> None:
    clock = FakeClock()
    controller = Recording({"a": [Result(requeue_after=10)]})
    create(store, "a")
    managers(store, [controller], options(), clock=clock).wait_started(10)
    wait_until(lambda: controller.count("a") == 1, what="the first reconcile")
    clock.advance(9.9)
    time.sleep(0.1)
    assert controller.count("a") == 1
    clock.advance(0.1)
    wait_until(lambda: controller.count("a") == 2, what="the requeue")

    assert controller.ctx is not None
    controller.ctx.enqueue("providers", Key(NS, "not-cached"), after=5)
    controller.ctx.enqueue("providers", Key(NS, "now"))
    wait_until(lambda: controller.count("now") == 1, what="the immediate enqueue")
    assert controller.count("not-cached") == 0
    clock.advance(5)
    wait_until(lambda: controller.count("not-cached") == 1, what="the delayed enqueue")
    with pytest.raises(KeyError):
        controller.ctx.enqueue("nobody", Key(NS, "x"))


def test_a_key_is_never_reconciled_by_two_workers_at_once(store: Store, managers: Callable[..., Manager]) -> None:
    class Slow(Recording):
        def reconcile(self, key: Key) -> Result | None:
            with self.lock:
                self.active += 1
                self.overlap = self.overlap or self.active > 1
            time.sleep(0.02)
            with self.lock:
                self.active -= 1
            return super().reconcile(key)

    controller = Slow(workers=4)
    create(store, "a")
    manager = managers(store, [controller], options())
    assert manager.wait_started(10)
    assert controller.ctx is not None
    for _ in range(50):
        controller.ctx.enqueue("providers", Key(NS, "a"))
        time.sleep(0.002)
    wait_until(lambda: controller.count("a") >= 3, what="several reconciles")
    assert not controller.overlap


# --- leader election between managers -------------------------------------------------------------


@pytest.fixture
def replica_stores(postgres_url: str) -> Iterator[tuple[Store, Store]]:
    first, second = open_store(postgres_url), open_store(postgres_url)
    yield first, second
    first.close()
    second.close()


def leader_options(name: str, **overrides: Any) -> ControllerOptions:
    return options(leader_election=True, identity=f"test-host/{os.getpid()}/{name}", **{**FAST_LEASE, **overrides})


def holder(store: Store) -> str | None:
    try:
        spec = store.get(kinds.LEASE, "joch-system", "joch-controller-manager").get("spec") or {}
    except errors.NotFound:
        return None
    value = spec.get("holderIdentity")
    return str(value) if value else None


def one_leader(managers: Sequence[Manager]) -> Manager:
    wait_until(lambda: any(m.is_running for m in managers), what="a leader")
    leaders = [m for m in managers if m.is_leader]
    assert len(leaders) == 1
    return leaders[0]


def test_of_two_managers_exactly_one_leads_and_a_crashed_leader_is_replaced_after_the_lease(
    replica_stores: tuple[Store, Store], managers: Callable[..., Manager],
) -> None:
    (s1, s2) = replica_stores
    c1, c2 = Recording(), Recording()
    m1, m2 = managers(s1, [c1], leader_options("one")), managers(s2, [c2], leader_options("two"))
    leader = one_leader([m1, m2])
    follower = m2 if leader is m1 else m1
    time.sleep(0.5)  # a few renewals: the follower stays out
    assert leader.is_leader and not follower.is_leader and not follower.is_running
    assert holder(s1) == leader.options.identity

    leader.stop(release_lease=False)  # a crash: nobody releases the lease
    crashed = time.monotonic()
    assert holder(s1) == leader.options.identity
    wait_until(lambda: follower.is_leader, timeout=5, what="the take-over")
    took = time.monotonic() - crashed
    assert took <= FAST_LEASE["lease_duration"] + 2 * FAST_LEASE["retry_period"] + 0.5, took
    assert follower.wait_started(5)
    assert holder(s1) == follower.options.identity
    spec = s1.get(kinds.LEASE, "joch-system", "joch-controller-manager")["spec"]
    assert spec["leaseTransitions"] == 1


def test_a_clean_stop_releases_the_lease_and_the_other_takes_over_at_once(
    replica_stores: tuple[Store, Store], managers: Callable[..., Manager],
) -> None:
    (s1, s2) = replica_stores
    long_lease = {"lease_duration": 30.0, "renew_deadline": 20.0, "retry_period": 0.2}
    c1, c2 = Recording(), Recording()
    m1 = managers(s1, [c1], leader_options("one", **long_lease))
    assert m1.wait_started(10)
    m2 = managers(s2, [c2], leader_options("two", **long_lease))
    time.sleep(0.3)
    assert not m2.is_leader
    m1.stop()
    assert c1.hooks == ["setup", "started", "stopped"]
    assert holder(s1) in (None, m2.options.identity)  # released (or already taken)
    stopped = time.monotonic()
    assert m2.wait_started(5)
    assert time.monotonic() - stopped < 2.0  # not the 30 s lease
    assert c2.hooks == ["setup", "started"]


def test_a_leader_that_loses_the_lease_stops_its_controllers_and_campaigns_again(
    replica_stores: tuple[Store, Store], managers: Callable[..., Manager],
) -> None:
    (s1, _) = replica_stores
    controller = Recording()
    manager = managers(s1, [controller], leader_options("one"))
    assert manager.wait_started(10)
    # Another replica (elsewhere: its pid cannot be judged here) takes the lease over.
    lease = s1.get(kinds.LEASE, "joch-system", "joch-controller-manager")
    s1.update(kinds.LEASE, {**lease, "spec": {**lease["spec"], "holderIdentity": "elsewhere/1/thief",
                                              "renewTime": stamp(time.time()), "leaseDurationSeconds": 1}})
    wait_until(lambda: "stopped" in controller.hooks, timeout=5, what="stepping down")
    assert not manager.is_running
    # The thief never renews: the lease expires and the manager leads again, with a fresh term.
    wait_until(lambda: controller.hooks.count("started") == 2, timeout=5, what="leading again")
    assert controller.hooks == ["setup", "started", "stopped", "setup", "started"]
    assert manager.is_leader and holder(s1) == manager.options.identity


def test_a_leader_whose_lease_changed_hands_meanwhile_starts_a_fresh_term(
    replica_stores: tuple[Store, Store], managers: Callable[..., Manager],
) -> None:
    (s1, _) = replica_stores
    controller = Recording()
    manager = managers(s1, [controller], leader_options("one"))
    assert manager.wait_started(10)
    # Another replica held the lease and let it lapse between two of our renewals: we may take it
    # straight back, but not carry on as if nothing happened.
    lease = s1.get(kinds.LEASE, "joch-system", "joch-controller-manager")
    s1.update(kinds.LEASE, {**lease, "spec": {**lease["spec"], "holderIdentity": "elsewhere/1/thief",
                                              "renewTime": stamp(time.time() - 60), "leaseDurationSeconds": 1}})
    wait_until(lambda: controller.hooks.count("started") == 2, timeout=5, what="a fresh term")
    assert controller.hooks == ["setup", "started", "stopped", "setup", "started"]
    spec = s1.get(kinds.LEASE, "joch-system", "joch-controller-manager")["spec"]
    assert spec["holderIdentity"] == manager.options.identity and spec["leaseTransitions"] == 1


# --- processes ------------------------------------------------------------------------------------

def free_port() -> int:
    return ports.free_port()  # not an ephemeral port: see support/ports.py


def launch(store_url: str, data_dir: Path) -> subprocess.Popen[str]:
    joch = Path(sys.executable).parent / "joch"
    return subprocess.Popen(
        [str(joch), "controller", "--store", store_url, "--data-dir", str(data_dir), "--lease-duration", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_kill_9_of_the_leader_process_hands_the_lease_to_the_other_process(
    postgres_url: str, tmp_path: Path,
) -> None:
    store = open_store(postgres_url)
    procs = [launch(postgres_url, tmp_path / f"data-{n}") for n in range(2)]
    try:
        wait_until(lambda: holder(store) is not None, timeout=15, what="a leader process")
        for proc in procs:
            assert proc.poll() is None, proc.communicate()
        first = holder(store) or ""
        pid = int(first.split("/")[1])
        leader = next(p for p in procs if p.pid == pid)
        other = next(p for p in procs if p is not leader)
        leader.kill()  # SIGKILL: no release
        killed = time.monotonic()
        leader.wait(5)
        wait_until(lambda: holder(store) not in (None, first), timeout=6, what="the other process to lead")
        took = time.monotonic() - killed
        assert int((holder(store) or "").split("/")[1]) == other.pid
        # Within the lease and a retry (2 s and 2/15 of it), with a second of slack for a busy machine;
        # on one host it is about one retry: the killed holder's pid is dead, so nobody waits it out.
        assert took < 2.0 + 0.27 + 1.0, took
        # ... and it reconciles: an Agent applied now is compiled by the new leader's controller.
        store.create(kinds.AGENT_PROVIDER, {"metadata": {"name": "p", "namespace": "default"},
                                            "spec": {"binary": "true"}})
        store.create(kinds.AGENT, {"metadata": {"name": "after-failover", "namespace": "default"},
                                   "spec": {"providerRef": {"name": "p"}}})

        def ready() -> bool:
            status = store.get(kinds.AGENT, "default", "after-failover").get("status") or {}
            return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])

        wait_until(ready, timeout=10, what="the new leader to compile the Agent")
        other.send_signal(signal.SIGTERM)
        _, stderr = other.communicate(timeout=15)
        assert other.returncode == 0, stderr
        assert holder(store) is None  # a clean stop released the lease
        assert "Traceback" not in stderr, stderr
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        store.close()


def test_joch_server_runs_the_controllers_and_releases_the_lease_on_shutdown(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    joch = Path(sys.executable).parent / "joch"
    proc = subprocess.Popen([str(joch), "server", "--port", str(port), "--data-dir", str(data_dir),
                             "--identity", "test-server"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc)
        lease_url = f"{base}/apis/ops.joch.dev/v1alpha1/namespaces/joch-system/leases/joch-controller-manager"
        wait_until(lambda: httpx.get(lease_url).status_code == 200, what="the lease")
        assert httpx.get(lease_url).json()["spec"]["holderIdentity"] == "test-server"
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
    assert "test-server became the leader" in stderr and "released the lease" in stderr
    store = open_store(f"sqlite:///{data_dir / 'joch.db'}")
    try:
        assert holder(store) is None
    finally:
        store.close()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--lease-duration", "0", "--lease-duration must be a positive number of seconds (got 0)"),
    ("--max-concurrent-runs", "0", "--max-concurrent-runs must be at least 1 (got 0)"),
    ("--max-log-bytes", "12x", "--max-log-bytes must be a number of bytes, optionally with a suffix Ki, Mi, Gi, "
     "Ti (or k, M, G, T), such as 64Mi; 0 means no limit (got '12x')"),
    ("--max-log-bytes", "100", "--max-log-bytes must be at least 1024 (1Ki), or 0 for no limit (got 100)"),
    ("--max-artifact-bytes", "1.5Gi", "--max-artifact-bytes must be a number of bytes, optionally with a suffix "
     "Ki, Mi, Gi, Ti (or k, M, G, T), such as 64Mi; 0 means no limit (got '1.5Gi')"),
    ("--store", "sqlite:////nonexistent-joch-dir/x.db", 'the directory "/nonexistent-joch-dir" of the SQLite store '
     "in --store does not exist: create it (mkdir -p /nonexistent-joch-dir) or fix the URL"),
])
def test_joch_controller_refuses_nonsense_flags(tmp_path: Path, flag: str, value: str, message: str) -> None:
    joch = Path(sys.executable).parent / "joch"
    result = subprocess.run([str(joch), "controller", "--data-dir", str(tmp_path), flag, value],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stderr.strip() == f"error: {message}"
