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
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import get_args

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server
from prometheus_client.core import REGISTRY, CollectorRegistry, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from joch.api.kinds import RunPhase
from joch.telemetry import tracing

log = logging.getLogger("joch.telemetry")
disable_created_metrics()  # type: ignore[no-untyped-call]  # no ``_created`` series: they double a scrape and no dashboard reads them

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
    "joch_open_watches", "Watch streams open on this server, by kind (all: a watch of every kind).", ("kind",))
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


class Callback(Collector):
    """A gauge family whose samples are read at scrape time from functions registered by owner.

    ``track(owner, read)`` registers ``read`` (answering ``{label values: value}``) under ``owner``,
    replacing what that owner registered before; ``untrack(owner)`` drops it. A ``read`` that raises
    (a store closed under a scrape) contributes nothing rather than failing the scrape."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...] = (), *,
                 registry: CollectorRegistry = REGISTRY) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self._reads: dict[object, Callable[[], Sample]] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def track(self, owner: object, read: Callable[[], Sample]) -> None:
        with self._lock:
            self._reads[owner] = read

    def untrack(self, owner: object) -> None:
        with self._lock:
            self._reads.pop(owner, None)

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
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
        for labels, value in sorted(totals.items()):
            if not math.isnan(value):
                family.add_metric(list(labels), value)
        yield family


RUNS = Callback("joch_runs", "AgentRuns by phase, as the run controller's cache holds them now.", ("phase",))
WORKQUEUE_DEPTH = Callback("joch_workqueue_depth", "Keys ready in a controller's work queue, not yet taken.",
                           ("name",))
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


def serve(host: str, port: int) -> None:
    """Serve every family at ``http://host:port/metrics`` from a daemon thread, without
    authentication (``joch controller --metrics-port``: it has no API server to mount them on)."""
    start_http_server(port, addr=host)
