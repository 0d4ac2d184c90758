"""The controller manager: leader election, then informers, work queues and workers per controller.

A ``Manager`` runs in background threads next to whatever else the process does (``joch server``
serves HTTP meanwhile; ``joch controller`` only waits in ``run``). Its life is a series of *terms*:

* Without leader election a single term runs from ``start`` to ``stop``.
* With it, a ``LeaderElector`` campaigns for the Lease. Each time it becomes leader a new term
  starts; when leadership is lost the term is stopped (workers, informers, ``stopped()``) and the
  elector campaigns again. A term never outlives the leadership it began under, and a fresh term
  gets fresh informers and queues: nothing from a previous leadership is trusted.

A term (``_Term``, which is also the ``Context`` controllers get) builds one shared informer per
kind — a controller's primary kind and every secondary kind, one informer whoever asks — and one
work queue per controller. Events become keys: a primary object's own key, and for a secondary
object the keys its mapper returns (for a change, those of both the old and the new object, so a
reference that moved concerns both sides). Then, in order: ``setup(ctx)`` for every controller
(so ``ctx.cache`` may still add informers), the informers start, the term waits until every one
has synced, ``started()`` for every controller, and ``controller.workers`` worker threads each.
A controller whose ``setup`` raises sits the term out (logged with its traceback) rather than
keeping the others from running. Stopping a term shuts its queues (idle workers return at once),
waits a few seconds for reconciles in flight and then abandons them on their daemon threads
(``base``: in-flight work is abandoned; reconcile is idempotent, so the next leader redoes it).

Workers take keys and call ``reconcile``. A raise retries the key with per-key exponential backoff
(``Conflict`` quietly, at debug; anything else at warning with the key and the message, the
traceback at debug); ``Result(requeue_after=s)`` forgets the backoff and looks again after ``s``
seconds; ``None`` forgets the backoff. Every ``resync_period`` every cached primary key is queued
again, which is what catches what no event reports (a deadline passing, a process vanishing).

The supervisor thread is the only one that starts and stops terms; callbacks from the elector and
``stop`` only change what it should want and wake it, so a slow informer sync never blocks the
elector's renewals.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from joch.api import errors
from joch.api.registry import KindInfo
from joch.controllers.base import Cache, Clock, Controller, Key, Mapper, Result
from joch.controllers.informers import Change, Handler, Informer
from joch.controllers.leader import LeaderElector
from joch.controllers.options import ControllerOptions
from joch.controllers.queueing import SYSTEM_CLOCK, WorkQueue
from joch.runtime.base import Runtime
from joch.store.base import Obj, Store
from joch.telemetry import metrics

log = logging.getLogger("joch.controllers")

_TICK = 0.5  # real seconds between looks at the (possibly fake) clock while waiting
_JOIN = 5.0  # real seconds a stopping term waits for reconciles in flight before abandoning them

_Predicate = Callable[[], bool]
_Target = Callable[..., None]


class Manager:
    """Runs ``controllers`` over ``store``; see the module docstring."""

    def __init__(
        self, store: Store, controllers: Sequence[Controller], options: ControllerOptions, *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        names = [c.name for c in controllers]
        if len(set(names)) != len(names):
            raise ValueError(f"controller names must be unique (got {', '.join(names)})")
        self.store = store
        self.controllers = list(controllers)
        self.options = options
        self.clock = clock
        self._cond = threading.Condition()
        self._terms = 0            # counts leaderships won: each one gets a fresh term
        self._leading = False
        self._stopping = False
        self._stop_requested = False  # set from signal handlers: a plain store, no lock
        self._running = threading.Event()
        self._done = threading.Event()
        self._stop_lock = threading.Lock()
        self._term: _Term | None = None
        self._supervisor: threading.Thread | None = None
        self._elector: LeaderElector | None = None
        if options.leader_election:
            self._elector = LeaderElector(
                store, identity=options.identity, namespace=options.lease_namespace, name=options.lease_name,
                lease_duration=options.lease_duration, renew_deadline=options.renew_deadline,
                retry_period=options.retry_period, clock=clock,
                on_started_leading=self._won, on_stopped_leading=self._lost,
            )

    # --- public ----------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        if self._elector is None:
            return self._leading and not self._stopping
        return self._elector.is_leader

    @property
    def is_running(self) -> bool:
        """Controllers are running: every informer synced and the workers started."""
        return self._running.is_set()

    def wait_started(self, timeout: float | None = None) -> bool:
        """Wait until controllers run (this replica leads and its informers synced)."""
        return self._running.wait(timeout)

    def cache(self, kind: KindInfo) -> Cache | None:
        """The current term's cache of ``kind`` (None when not running or not watched)."""
        term = self._term
        return term.informers.get(kind.key) if term is not None else None

    def start(self) -> None:
        """Start in the background and return at once."""
        if self._supervisor is not None:
            return
        self._supervisor = threading.Thread(target=self._supervise, name="joch-controller-manager", daemon=True)
        self._supervisor.start()
        if self._elector is not None:
            log.info("%s campaigning for the lease %s/%s", self.options.identity, self.options.lease_namespace,
                     self.options.lease_name)
            self._elector.start()
        else:
            self._won()

    def stop(self, *, release_lease: bool = True, timeout: float = 10.0) -> None:
        """Stop the controllers, then give the lease up (``release_lease=False`` leaves it to expire,
        as a crash would). Idempotent; returns once everything has stopped."""
        with self._stop_lock:
            if self._done.is_set():
                return
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            if self._supervisor is not None:
                self._supervisor.join(timeout)
            if self._elector is not None:
                self._elector.stop(release=release_lease)
            self._done.set()

    def request_stop(self) -> None:
        """Ask ``run`` to stop; safe to call from a signal handler."""
        self._stop_requested = True

    def run(self) -> None:
        """Start, then block until ``stop`` or ``request_stop``; stops before returning."""
        self.start()
        try:
            while not self._stop_requested and not self._done.is_set():
                self._done.wait(0.2)
        finally:
            self.stop()

    # --- leadership → terms ----------------------------------------------------------------------

    def _won(self) -> None:
        with self._cond:
            self._terms += 1
            self._leading = True
            self._cond.notify_all()

    def _lost(self) -> None:
        with self._cond:
            self._leading = False
            self._cond.notify_all()

    def _wanted_term(self) -> int:
        """The term that should run now: 0 for none."""
        return self._terms if self._leading and not self._stopping else 0

    def _supervise(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and self._wanted_term() == (self._term.epoch if self._term else 0):
                    self._cond.wait()
                wanted, stopping = self._wanted_term(), self._stopping
            if self._term is not None:
                self._end_term()
            if stopping:
                return
            if wanted:
                self._begin_term(wanted)

    def _begin_term(self, epoch: int) -> None:
        elector = self._elector
        term = _Term(self.store, self.controllers, self.options, self.clock, epoch,
                     holds_lease=(lambda: True) if elector is None else elector.holds_lease)
        self._term = term
        try:
            started = term.start(lambda: self._wanted_term() == epoch)
        except Exception:  # a controller's secondary() raising, say: try again later, do not wedge
            log.exception("controllers failed to start; retrying in %gs", self.options.retry_period)
            self._end_term()
            with self._cond:
                self._cond.wait(self.options.retry_period)
            return
        if started:
            self._running.set()
            log.info("controllers running: %s", ", ".join(c.name for c in term.controllers) or "none")

    def _end_term(self) -> None:
        term, self._term = self._term, None
        self._running.clear()
        if term is not None:
            term.stop()
            log.info("controllers stopped")


class _Term:
    """One leadership term's informers, queues and workers; the ``Context`` controllers get."""

    def __init__(
        self, store: Store, controllers: Sequence[Controller], options: ControllerOptions, clock: Clock, epoch: int,
        holds_lease: _Predicate = lambda: True,
    ) -> None:
        self.store = store
        self.clock = clock
        self.options = options
        self.epoch = epoch
        self._holds_lease = holds_lease
        self.controllers: list[Controller] = []  # those whose setup succeeded
        self._candidates = list(controllers)
        self.informers: dict[str, Informer] = {}
        self.queues: dict[str, WorkQueue[Key]] = {
            c.name: WorkQueue(clock=clock, max_wait=_TICK, name=c.name) for c in controllers
        }
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._informers_started = False

    # --- Context ---------------------------------------------------------------------------------

    def cache(self, kind: KindInfo) -> Cache:
        return self._informer(kind)

    def leading(self) -> bool:
        return not self._stop.is_set() and self._holds_lease()

    def enqueue(self, controller: str, key: Key, *, after: float = 0.0) -> None:
        queue = self.queues.get(controller)
        if queue is None:
            raise KeyError(f"no controller named {controller!r} (known: {', '.join(self.queues)})")
        queue.add_after(key, after)

    # --- start and stop --------------------------------------------------------------------------

    def start(self, wanted: _Predicate) -> bool:
        """Set everything up and start it; False when ``wanted`` turned false on the way."""
        for controller in self._candidates:
            try:
                controller.setup(self)
            except Exception:
                log.exception("controller %s failed to set up; it will not run in this term", controller.name)
                continue
            self._wire(controller)
            self.controllers.append(controller)
        self._informers_started = True
        for informer in list(self.informers.values()):
            informer.start()
        if not self._wait_synced(wanted):
            return False
        for controller in self.controllers:
            try:
                controller.started()
            except Exception:
                log.exception("controller %s: started() failed", controller.name)
        for controller in self.controllers:
            for n in range(max(1, controller.workers)):
                self._spawn(self._work, (controller, self.queues[controller.name]), f"joch-{controller.name}-{n}")
        if self.options.resync_period > 0:
            self._spawn(self._resync, (), "joch-resync")
        metrics.WORKQUEUE_DEPTH.track(self, self._depths)
        return wanted()

    def stop(self) -> None:
        self._stop.set()
        metrics.WORKQUEUE_DEPTH.untrack(self)
        for queue in self.queues.values():
            queue.shutdown()
        for informer in list(self.informers.values()):
            informer.stop()
        deadline = time.monotonic() + _JOIN
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("%s is still busy; abandoning it", thread.name)
        for controller in self.controllers:
            try:
                controller.stopped()
            except Exception:
                log.exception("controller %s: stopped() failed", controller.name)

    def _depths(self) -> metrics.Sample:
        return {(name,): float(len(queue)) for name, queue in self.queues.items()}

    def _wait_synced(self, wanted: _Predicate) -> bool:
        for informer in list(self.informers.values()):
            while not informer.wait_for_sync(_TICK):
                if not wanted() or self._stop.is_set():
                    return False
        return True

    def _spawn(self, target: _Target, args: tuple[object, ...], name: str) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    # --- events → keys ---------------------------------------------------------------------------

    def _informer(self, kind: KindInfo) -> Informer:
        informer = self.informers.get(kind.key)
        if informer is None:
            informer = self.informers[kind.key] = Informer(self.store, kind)
            if self._informers_started:  # asked for after the start: it syncs on its own
                informer.start()
        return informer

    def _wire(self, controller: Controller) -> None:
        queue = self.queues[controller.name]

        def primary(change: Change, old: Obj | None, new: Obj | None) -> None:
            obj = new if new is not None else old
            if obj is not None:
                queue.add(Key.of(obj))

        self._informer(controller.kind).add_handler(primary)
        for kind, mapper in controller.secondary():
            self._informer(kind).add_handler(_mapped(queue, mapper))

    # --- threads ---------------------------------------------------------------------------------

    def _work(self, controller: Controller, queue: WorkQueue[Key]) -> None:
        while True:
            key = queue.get()
            if key is None:
                return
            try:
                self._reconcile(controller, queue, key)
            finally:
                queue.done(key)

    def _reconcile(self, controller: Controller, queue: WorkQueue[Key], key: Key) -> None:
        started = time.perf_counter()
        outcome = self._attempt(controller, queue, key)
        metrics.RECONCILE_DURATION.labels(controller.name).observe(time.perf_counter() - started)
        metrics.RECONCILES.labels(controller.name, outcome).inc()

    def _attempt(self, controller: Controller, queue: WorkQueue[Key], key: Key) -> str:
        """Reconcile ``key`` once and queue what follows; the outcome, as ``joch_reconcile_total`` counts it."""
        try:
            result: Result | None = controller.reconcile(key)
        except errors.Conflict as exc:
            log.debug("%s: %s changed meanwhile, retrying: %s", controller.name, key, exc.message)
            queue.add_rate_limited(key)
            return "conflict"
        except Exception as exc:
            log.warning("%s: reconciling %s failed (attempt %d): %s: %s", controller.name, key,
                        queue.retries(key) + 1, type(exc).__name__, exc)
            log.debug("%s: reconciling %s failed", controller.name, key, exc_info=True)
            metrics.RECONCILE_ERRORS.labels(controller.name).inc()
            queue.add_rate_limited(key)
            return "error"
        queue.forget(key)
        if result is not None and result.requeue_after is not None:
            queue.add_after(key, result.requeue_after)
            return "requeue_after"
        return "success"

    def _resync(self) -> None:
        period = self.options.resync_period
        due = self.clock.monotonic() + period
        while True:
            if self._stop.wait(max(0.0, min(_TICK, due - self.clock.monotonic()))):
                return
            if self.clock.monotonic() < due:
                continue
            due = self.clock.monotonic() + period
            for controller in self.controllers:
                queue = self.queues[controller.name]
                for obj in self._informer(controller.kind).list():
                    queue.add(Key.of(obj))


def _mapped(queue: WorkQueue[Key], mapper: Mapper) -> Handler:
    def secondary(change: Change, old: Obj | None, new: Obj | None) -> None:
        keys: set[Key] = set()
        for obj in (old, new):
            if obj is not None:
                keys.update(mapper(obj))
        for key in keys:
            queue.add(key)

    return secondary


@contextmanager
def running(store: Store, runtime: Runtime, options: ControllerOptions) -> Iterator[Manager]:
    """The controllers of ``assembly.build_controllers`` under a started Manager, stopped on exit
    (``joch server`` and ``joch controller`` both run them this way)."""
    from joch.controllers.assembly import build_controllers

    manager = Manager(store, build_controllers(store, runtime, options), options)
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()
