"""Joch's Prometheus metrics: every family in one place, recorded by the layers above.

The families live in prometheus-client's default registry, so one process exposes them all at
once: ``joch server`` serves them at ``/metrics`` (``joch.server.metrics``) with the controllers it
runs in-process, ``joch controller --metrics-port`` on a port of its own. Names follow Prometheus'
conventions: the ``joch_`` prefix, base units (``_seconds``; money in ``_usd``), ``_total`` on
counters.

Label values are bounded, so a scrape stays small however much a store holds:

* ``phase`` is one of the AgentRun phases; ``reason`` a run's reason (a CamelCase word the
  controllers write, e.g. ``Completed``, ``RunnerLost``, one of the first hundred seen); anything
  else is counted as ``Other``.
* ``controller`` and ``name`` (a work queue) are the controllers' names; ``kind`` a registry kind.
* ``route`` is the route's template (``/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents/{name}``),
  never the requested path; ``method`` one of the HTTP methods Joch serves, else ``OTHER``.
* ``namespace`` and ``agent`` (spend) name objects that exist: a run's namespace and its Agent.

Recording is cheap enough for the hot paths: a labelled child is looked up once and kept by the
caller (``HTTP`` keeps one pair per method, route and code). What is costly to keep current (runs
per phase, queue depths, the store's revision) is read at scrape time from a ``Callback``
registered by whoever owns the data.

Several processes (``joch server --workers N``): when the environment names a directory in
``PROMETHEUS_MULTIPROC_DIR`` (the supervisor makes a fresh one for its workers; prometheus-client
reads it at import), every process writes its counters, histograms and gauges to files there, and
a scrape of any one of them (``registry()``) is the sum over all of them, merged by
prometheus-client's ``MultiProcessCollector``: counters and histograms are summed over every process
that ever ran (a worker's counts outlive it), gauges over the live ones (``livesum``, or ``livemax``
for a reading every owner would give alike), a process that exited being marked by whoever noticed
(``process_exited``, the supervisor) or by itself at a clean exit. A ``Callback`` reading something
every process sees alike (the store's revision) is read by the scraping process alone, so it
appears once; one reading what only its owner holds (the run controller's cache, a work queue) is
copied by the owner to a shared gauge before each of its scrapes and every ``PUBLISH_INTERVAL``
seconds, so another worker's scrape sees it at most that old. The processes' own ``process_*`` and
``python_*`` families are not exposed then: they would be one worker's, whichever answered.
Without the variable nothing of this happens.
"""

from __future__ import annotations

import atexit
import glob
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Literal, get_args

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, multiprocess, start_http_server
from prometheus_client import values as prometheus_values
from prometheus_client.core import REGISTRY, CollectorRegistry, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from joch.api.kinds import RunPhase
from joch.telemetry import tracing

log = logging.getLogger("joch.telemetry")
disable_created_metrics()  # type: ignore[no-untyped-call]  # no ``_created`` series: they double a scrape and no dashboard reads them
# (the multiprocess files never hold them, so a merged scrape has none either way)

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The files' directory when prometheus-client chose its multiprocess values at import, else None.
MULTIPROCESS_DIR: str | None = (os.environ.get(MULTIPROCESS_ENV) or os.environ.get(MULTIPROCESS_ENV.lower())
                                if getattr(prometheus_values.ValueClass, "_multiprocess", False) else None)
PUBLISH_INTERVAL = 1.0  # seconds between an owner's copies of its readings to the shared files
if MULTIPROCESS_DIR is not None:
    os.makedirs(MULTIPROCESS_DIR, exist_ok=True)  # the first family below writes its file there

PHASES = frozenset(get_args(RunPhase))
OTHER = "Other"
_REASON = re.compile(r"^[A-Z][A-Za-z0-9]{0,63}$")

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_DISPATCH = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_RUN = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0)


# --- runs ------------------------------------------------------------------------------------------

RUN_PHASE_TRANSITIONS = Counter(
    "joch_run_phase_transitions_total", "AgentRun phase changes written by the run controller, by the new "
    "phase and its reason.", ("phase", "reason"))
RUN_DISPATCH = Histogram(
    "joch_run_dispatch_latency_seconds", "Seconds from an AgentRun's creation to its first attempt Running.",
    buckets=_DISPATCH)
RUN_DURATION = Histogram(
    "joch_run_duration_seconds", "Seconds from an AgentRun's start to its end, by the phase it ended in.",
    ("phase",), buckets=_RUN)
SPEND = Counter(
    "joch_spend_usd_total", "US dollars of metered usage recorded for runs, by namespace and Agent.",
    ("namespace", "agent"))
TOKENS = Counter(
    "joch_usage_tokens_total", "Model tokens of metered usage recorded for runs, by namespace, Agent and type "
    "(input, output, cached: the input tokens served from the provider's cache).", ("namespace", "agent", "type"))

# --- controllers -----------------------------------------------------------------------------------

RECONCILE_DURATION = Histogram(
    "joch_reconcile_duration_seconds", "Seconds one reconcile took, by controller.", ("controller",),
    buckets=_LATENCY)
RECONCILES = Counter(
    "joch_reconcile_total", "Reconciles by controller and result (success, requeue_after, conflict, error).",
    ("controller", "result"))
RECONCILE_ERRORS = Counter(
    "joch_reconcile_errors_total", "Reconciles that raised (a Conflict is a retry, not counted here), by "
    "controller.", ("controller",))
WORKQUEUE_ADDS = Counter("joch_workqueue_adds_total", "Keys added to a controller's work queue.", ("name",))
WORKQUEUE_RETRIES = Counter(
    "joch_workqueue_retries_total", "Keys put back in a controller's work queue with backoff after a failed "
    "reconcile.", ("name",))

# --- store and server ------------------------------------------------------------------------------

STORE_WRITE = Histogram(
    "joch_store_write_duration_seconds", "Seconds a store write transaction took, from taking the write lock "
    "to the commit, by backend.", ("backend",), buckets=_LATENCY)
OPEN_WATCHES = Gauge(
    "joch_open_watches", "Watch streams open on this server, by kind (all: a watch of every kind).", ("kind",),
    multiprocess_mode="livesum")
HTTP_REQUESTS = Counter(
    "joch_http_requests_total", "HTTP requests answered, by method, route template and status code.",
    ("method", "route", "code"))
HTTP_DURATION = Histogram(
    "joch_http_request_duration_seconds", "Seconds from a request's arrival to its response's start (a watch or "
    "a followed log counts until its headers), by method and route template.", ("method", "route"),
    buckets=_LATENCY)
WEBHOOK_DELIVERIES = Counter(
    "joch_webhook_deliveries_total", "Webhook deliveries received, by provider (github, linear, generic) and "
    "outcome (accepted, duplicate, refused: the signature did not verify, invalid, error).",
    ("provider", "outcome"))


def phase_label(phase: object) -> str:
    return phase if isinstance(phase, str) and phase in PHASES else OTHER


_reasons: set[str] = set()
_reasons_lock = threading.Lock()
MAX_REASONS = 100


def reason_label(reason: object) -> str:
    """``reason`` when it is a CamelCase word among the first ``MAX_REASONS`` seen, else ``Other``:
    reasons are the controllers' words, but a runner's record can carry its own, and a hostile one
    must not grow the series without bound."""
    if not isinstance(reason, str) or not _REASON.match(reason):
        return OTHER
    if reason in _reasons:
        return reason
    with _reasons_lock:
        if len(_reasons) >= MAX_REASONS:
            return OTHER
        _reasons.add(reason)
    return reason


# --- read at scrape time ---------------------------------------------------------------------------

Sample = Mapping[tuple[str, ...], float]
Shared = Literal["livesum", "livemax"]


class Callback(Collector):
    """A gauge family whose samples are read at scrape time from functions registered by owner.

    ``track(owner, read)`` registers ``read`` (answering ``{label values: value}``) under ``owner``,
    replacing what that owner registered before; ``untrack(owner)`` drops it. A ``read`` that raises
    (a store closed under a scrape) contributes nothing rather than failing the scrape.

    ``shared`` is for several processes (``MULTIPROCESS_DIR``): None when any process reads the same
    (the scrape reads it itself, once); else how the owners' readings combine (``livesum``: each
    holds its own part; ``livemax``: each would read the same), the owners copying them to a gauge
    in the shared files (``publish``)."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...] = (), *,
                 registry: CollectorRegistry = REGISTRY, shared: Shared | None = None) -> None:
        self.name, self.documentation, self.labels, self.shared = name, documentation, labels, shared
        self._reads: dict[object, Callable[[], Sample]] = {}
        self._lock = threading.Lock()
        self._gauge: Gauge | None = None
        self._published: set[tuple[str, ...]] = set()
        self._publish_lock = threading.Lock()
        if shared is not None and MULTIPROCESS_DIR is not None:
            self._gauge = Gauge(name, documentation, labels, registry=None, multiprocess_mode=shared)
            _shared.append(self)
        registry.register(self)

    def track(self, owner: object, read: Callable[[], Sample]) -> None:
        with self._lock:
            self._reads[owner] = read
        if self._gauge is not None:
            self.publish()
            _start_publishing()

    def untrack(self, owner: object) -> None:
        with self._lock:
            self._reads.pop(owner, None)
        self.publish()

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, value in sorted(self._totals().items()):
            family.add_metric(list(labels), value)
        yield family

    def publish(self) -> None:
        """Copy this process's readings to the shared files (nothing unless ``shared`` in
        multiprocess mode). A label set no owner answers any more is set to 0: a series cannot leave
        the files, but the process's gauges do when it exits."""
        if self._gauge is None:
            return
        with self._publish_lock:
            totals = self._totals()
            for labels in sorted(self._published - totals.keys()):
                self._child(labels).set(0.0)
            for labels, value in totals.items():
                self._child(labels).set(value)
            self._published |= totals.keys()

    def _child(self, labels: tuple[str, ...]) -> Gauge:
        assert self._gauge is not None
        return self._gauge.labels(*labels) if labels else self._gauge

    def _totals(self) -> dict[tuple[str, ...], float]:
        totals: dict[tuple[str, ...], float] = {}
        with self._lock:
            reads = list(self._reads.values())
        for read in reads:
            try:
                sample = read()
            except Exception:  # one owner's trouble must not fail the whole scrape
                log.debug("%s: a reading failed", self.name, exc_info=True)
                continue
            for labels, value in sample.items():
                totals[labels] = totals.get(labels, 0.0) + value
        return {labels: value for labels, value in totals.items() if not math.isnan(value)}


_shared: list[Callback] = []  # the Callbacks copying their readings to the shared files
_publishing: threading.Thread | None = None
_publishing_lock = threading.Lock()


def _start_publishing() -> None:
    """The daemon thread copying the shared Callbacks' readings every ``PUBLISH_INTERVAL`` (once per
    process, when something is first tracked), for the scrapes other processes answer."""
    global _publishing
    with _publishing_lock:
        if _publishing is None:
            _publishing = threading.Thread(target=_publish_forever, name="joch-metrics-publish", daemon=True)
            _publishing.start()


def _publish_forever() -> None:
    while True:
        time.sleep(PUBLISH_INTERVAL)
        for callback in list(_shared):
            try:
                callback.publish()
            except Exception:  # the files closed under it at exit: nothing left to tell
                log.debug("%s: publishing failed", callback.name, exc_info=True)


RUNS = Callback("joch_runs", "AgentRuns by phase, as the run controller's cache holds them now.", ("phase",),
                shared="livemax")
WORKQUEUE_DEPTH = Callback("joch_workqueue_depth", "Keys ready in a controller's work queue, not yet taken.",
                           ("name",), shared="livesum")
STORE_REVISION = Callback("joch_store_revision", "The store's current revision (resourceVersion).")


def count_phases(phases: Iterable[object]) -> dict[tuple[str, ...], float]:
    """``RUNS``' sample from the phases of the runs: every phase present, at 0 when no run is in it."""
    counts: dict[tuple[str, ...], float] = {(phase,): 0.0 for phase in sorted(PHASES)}
    for phase in phases:
        key = (phase_label(phase) if phase is not None else "Pending",)
        counts[key] = counts.get(key, 0.0) + 1
    return counts


# --- HTTP ------------------------------------------------------------------------------------------

METHODS = tracing.HTTP_METHODS


class HTTP:
    """The labelled children of the HTTP families, made once per (method, route, code) and kept,
    so answering a request costs two dictionary lookups, not building label sets."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, str, int], Counter] = {}
        self._durations: dict[tuple[str, str], Histogram] = {}

    def observe(self, method: str, route: str, code: int, seconds: float) -> None:
        if method not in METHODS:
            method = "OTHER"
        key = (method, route, code)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = HTTP_REQUESTS.labels(method, route, str(code))
        counter.inc()
        duration = self._durations.get((method, route))
        if duration is None:
            duration = self._durations[(method, route)] = HTTP_DURATION.labels(method, route)
        duration.observe(seconds)


# --- several processes ------------------------------------------------------------------------------


class _Merged(Collector):
    """Every process's families from the files in ``directory``, merged (after this process copied
    its shared readings there), and the families no process has a sample of yet, empty, as one
    process's registry shows them."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        for callback in list(_shared):
            callback.publish()
        files = glob.glob(os.path.join(self.directory, "*.db"))
        seen: set[str] = set()
        for family in multiprocess.MultiProcessCollector.merge(files, accumulate=True):  # type: ignore[no-untyped-call]
            seen.add(family.name)
            yield family
        empty = [f for m in _FAMILIES for f in m.describe()] + [f for c in _shared for f in c.describe()]
        yield from (family for family in empty if family.name not in seen)


_FAMILIES = [m for m in list(globals().values()) if isinstance(m, MetricWrapperBase)]
_registry: CollectorRegistry | None = None
_registry_lock = threading.Lock()


def registry() -> CollectorRegistry:
    """What a scrape exposes: prometheus-client's default registry, or with ``MULTIPROCESS_DIR`` a
    registry of the merge of every process's files and the Callbacks read by the scraping process."""
    global _registry
    if MULTIPROCESS_DIR is None:
        return REGISTRY
    with _registry_lock:
        if _registry is None:
            merged = CollectorRegistry(auto_describe=False)
            merged.register(_Merged(MULTIPROCESS_DIR))
            merged.register(STORE_REVISION)
            _registry = merged
        return _registry


def process_exited(pid: int, directory: str | None = None) -> None:
    """Forget the live gauges of the process ``pid``, which exited (``joch server --workers``'
    supervisor calls it for each worker it sees exit): its open watches and shared readings stop
    counting; its counters and histograms stay in the sums. Nothing without multiprocess files
    (``directory``, by default ``PROMETHEUS_MULTIPROC_DIR`` as the environment says now)."""
    path = directory or os.environ.get(MULTIPROCESS_ENV)
    if path:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


if MULTIPROCESS_DIR is not None:
    atexit.register(process_exited, os.getpid(), MULTIPROCESS_DIR)  # a clean exit marks itself


def serve(host: str, port: int) -> None:
    """Serve every family at ``http://host:port/metrics`` from a daemon thread, without
    authentication (``joch controller --metrics-port``: it has no API server to mount them on)."""
    start_http_server(port, addr=host, registry=registry())
