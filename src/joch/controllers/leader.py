"""Leader election through a Lease object in the store, so replicas can run side by side.

Only the holder of the Lease (``ops.joch.dev/v1alpha1``, by default ``joch-system/joch-controller-
manager``) runs controllers. Every write goes through the store's optimistic concurrency: a create
that meets ``AlreadyExists`` or an update carrying ``metadata.resourceVersion`` that meets
``Conflict`` means another replica got there first, so at most one replica ever holds the lease.

A candidate takes the lease when it is free (no holder: created now, or released by a replica that
stopped cleanly), or when its holder is gone:

* expired: ``renewTime + leaseDurationSeconds`` is in the past (wall clocks; replicas' clocks must
  agree to within ``lease_duration - retry_period``), or the record has not changed for
  ``lease_duration`` as this candidate has watched it (local monotonic time; this covers a holder
  whose clock runs ahead);
* dead on this host: identities are ``host/pid/random`` (``options.default_identity``), so a server
  restarted after ``kill -9`` sees that the holder ran on its own host under a pid that no longer
  exists (or is a zombie) and takes over at once instead of waiting out the lease.

The leader renews every ``retry_period``. If no renewal has succeeded for ``renew_deadline`` (the
store is unreachable), or the record shows another holder — even one whose lease has lapsed again,
so that the leader could take it straight back — it steps down: ``on_stopped_leading`` runs and the
elector campaigns again (a leadership that was interrupted is never silently continued).
``renew_deadline < lease_duration`` is what keeps two leaders from overlapping: the old one gives
up before anyone may take over. ``stop()`` releases the lease
(the holder is cleared, the object kept), so another replica takes over at its next retry;
``stop(release=False)`` is how a test plays a crash.

``leaseTransitions`` counts changes of holder; ``acquireTime`` is when the current holder took it.
Times are RFC 3339 UTC with microseconds (Kubernetes' MicroTime).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import random
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from joch.api import errors, kinds
from joch.api.meta import parse_time
from joch.controllers.base import Clock
from joch.controllers.queueing import SYSTEM_CLOCK
from joch.store.base import Obj, Store

log = logging.getLogger("joch.controllers")

Callback = Callable[[], None]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process on this host; a zombie (killed, not yet reaped) is dead."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # no procfs: trust kill(0)
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state not in (["Z"], ["X"])


def stamp(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for the lease in a thread; see the module docstring."""

    def __init__(
        self, store: Store, *, identity: str, namespace: str, name: str, lease_duration: float,
        renew_deadline: float, retry_period: float, on_started_leading: Callback, on_stopped_leading: Callback,
        clock: Clock = SYSTEM_CLOCK, alive: Callable[[int], bool] = pid_alive, hostname: str | None = None,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs 0 < retry_period < renew_deadline < lease_duration "
                             f"(got {retry_period}, {renew_deadline}, {lease_duration})")
        self.store = store
        self.identity = identity
        self.namespace, self.name = namespace, name
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.clock = clock
        self._on_started, self._on_stopped = on_started_leading, on_stopped_leading
        self._alive = alive
        self._hostname = hostname if hostname is not None else socket.gethostname()
        self._leader = False
        self._holder: str | None = None
        self._changed_hands = False  # the last successful attempt took the lease from someone else
        self._observed: tuple[str | None, float] = (None, 0.0)  # (resourceVersion, when we saw it change)
        self._stop = threading.Event()
        self._renewed_at: float | None = None
        self._thread: threading.Thread | None = None
        self._rng = random.Random()  # noqa: S311 - spreading retries, not cryptography

    @property
    def is_leader(self) -> bool:
        return self._leader

    def holds_lease(self) -> bool:
        """Leader, and the lease was renewed less than ``renew_deadline`` ago by the monotonic clock.

        Controllers ask this right before a side effect that must not happen twice (starting an
        agent). ``is_leader`` alone is not enough: a process that was paused (SIGSTOP, a VM freeze)
        resumes believing it leads until its elector's next renewal fails, while another replica
        has taken over meanwhile; the monotonic clock kept counting while it was paused."""
        renewed = self._renewed_at
        return self._leader and renewed is not None and self.clock.monotonic() - renewed < self.renew_deadline

    @property
    def holder(self) -> str | None:
        """The holder the last look at the lease saw (None: free or not looked yet)."""
        return self._holder

    # --- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="joch-leader-election", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True, timeout: float = 10.0) -> None:
        """Stop campaigning and renewing; with ``release`` give the lease up if we hold it."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if self._leader and release:
            try:
                self.release()
            except Exception as exc:  # the lease then simply expires
                log.warning("could not release the leader lease %s/%s: %s", self.namespace, self.name, exc,
                            exc_info=log.isEnabledFor(logging.DEBUG))
        self._leader = False

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._campaign():
                return
            self._leader = True
            log.info("%s became the leader (lease %s/%s)", self.identity, self.namespace, self.name)
            self._on_started()
            reason = self._keep()
            if reason is None:
                return  # stopped while leading: stop() releases (or not) and the manager cleans up
            self._leader = False
            log.info("%s lost leadership: %s", self.identity, reason)
            self._on_stopped()

    def _campaign(self) -> bool:
        while not self._stop.is_set():
            if self._attempt():
                return True
            self._stop.wait(self.retry_period * self._rng.uniform(1.0, 1.2))
        return False

    def _keep(self) -> str | None:
        """Renew until stopped (None) or until leadership is lost (the reason)."""
        renewed = self.clock.monotonic()
        while not self._stop.wait(self.retry_period):
            if self._attempt():
                if self._changed_hands:  # someone held it in between and may have acted: start afresh
                    return "another replica held the lease meanwhile"
                renewed = self.clock.monotonic()
                continue
            if self._holder not in (None, self.identity):
                return f"the lease is held by {self._holder}"
            if self.clock.monotonic() - renewed >= self.renew_deadline:
                return f"the lease was not renewed for {self.renew_deadline:g}s"
        return None

    def _attempt(self) -> bool:
        before = self.clock.monotonic()
        try:
            held = self.try_acquire_or_renew()
            if held:
                self._renewed_at = before  # the renewal counts from when it was asked for
            return held
        except Exception as exc:  # the store is unreachable: count it as a failed attempt
            log.warning("leader election: cannot read or write the lease %s/%s: %s", self.namespace, self.name,
                        exc, exc_info=log.isEnabledFor(logging.DEBUG))
            return False

    # --- one step --------------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One look at the lease: take or renew it when allowed. True when we hold it afterwards."""
        try:
            current = self.store.get(kinds.LEASE, self.namespace, self.name)
        except errors.NotFound:
            return self._create()
        self._observe(current)
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity") or None
        if holder not in (None, self.identity) and not self._expired(spec) and not self._holder_dead(holder):
            return False
        return self._take(current, holder)

    def _create(self) -> bool:
        now = stamp(self.clock.time())
        lease = {"apiVersion": kinds.LEASE.api_version, "kind": kinds.LEASE.kind,
                 "metadata": {"name": self.name, "namespace": self.namespace},
                 "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self._duration_seconds(),
                          "acquireTime": now, "renewTime": now, "leaseTransitions": 0}}
        try:
            created = self.store.create(kinds.LEASE, lease)
        except errors.AlreadyExists:
            return False
        self._observe(created)
        self._changed_hands = True
        return True

    def _take(self, current: Obj, holder: str | None) -> bool:
        now = stamp(self.clock.time())
        spec = dict(current.get("spec") or {})
        if holder != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            if holder is not None:
                log.info("%s takes over the lease from %s", self.identity, holder)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self._duration_seconds(), renewTime=now)
        m = current["metadata"]
        update = {"apiVersion": current["apiVersion"], "kind": current["kind"],
                  "metadata": {**m, "resourceVersion": m["resourceVersion"]}, "spec": spec}
        try:
            updated = self.store.update(kinds.LEASE, update)
        except errors.Conflict:
            return False
        self._observe(updated)
        self._changed_hands = holder != self.identity
        return True

    def release(self) -> bool:
        """Clear the holder if it is us, keeping the object; True when released."""
        current = self.store.get(kinds.LEASE, self.namespace, self.name)
        spec = dict(current.get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            return False
        spec.pop("holderIdentity", None)
        spec["renewTime"] = stamp(self.clock.time())
        try:
            released = self.store.update(kinds.LEASE, {**current, "spec": spec})
        except errors.Conflict:
            return False
        self._observe(released)
        self._leader = False
        log.info("%s released the lease %s/%s", self.identity, self.namespace, self.name)
        return True

    # --- judging a holder ------------------------------------------------------------------------

    def _observe(self, lease: Obj) -> None:
        rv = (lease.get("metadata") or {}).get("resourceVersion")
        if rv != self._observed[0]:
            self._observed = (rv, self.clock.monotonic())
        holder = (lease.get("spec") or {}).get("holderIdentity") or None
        if holder != self._holder and holder not in (None, self.identity):
            log.info("the leader is %s (lease %s/%s)", holder, self.namespace, self.name)
        self._holder = holder

    def _expired(self, spec: Obj) -> bool:
        duration = spec.get("leaseDurationSeconds") or self.lease_duration
        renewed = spec.get("renewTime")
        if isinstance(renewed, str):
            try:
                if parse_time(renewed).timestamp() + float(duration) <= self.clock.time():
                    return True
            except ValueError:
                return True  # an unreadable renewTime cannot keep anyone out
        return self.clock.monotonic() - self._observed[1] >= self.lease_duration

    def _holder_dead(self, holder: str) -> bool:
        host, _, rest = holder.partition("/")
        pid_text = rest.partition("/")[0]
        if host != self._hostname or not pid_text.isdigit():
            return False
        pid = int(pid_text)
        return pid != os.getpid() and not self._alive(pid)

    def _duration_seconds(self) -> int:
        return max(1, math.ceil(self.lease_duration))
