"""OpenTelemetry traces: configured only by the standard environment variables, off otherwise.

Design decisions:

* **Off is free.** Unless ``setup`` found a configuration, ``span`` returns one shared null context
  manager: no tracer, no span objects, no exporter thread, no context switching — a function call
  and a test. Call sites pass attributes as keyword arguments (no dict is built when off), and
  ``joch server`` installs the request middleware (``RequestSpans``) only when tracing is on.
* **Only the standard variables.** Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT``,
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``) is set,
  and ``OTEL_SDK_DISABLED`` is not ``true``. ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
  name the service (``joch-server`` or ``joch-controller`` when they do not); everything else
  (headers, timeouts, ``OTEL_BSP_*``) is read by the SDK itself. Spans go out over OTLP/HTTP
  (protobuf) from a batch processor, which ``shutdown`` flushes. A value Joch cannot honour
  (another exporter, ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``) stops the start with a ``ValueError``
  saying what to set instead, rather than silently exporting nothing.
* **A run's trace id is its uid.** An AgentRun lives longer than any process: created by a request,
  reconciled by whichever replica leads, maybe across restarts. So its spans do not hang off an
  in-memory parent: the run's trace id is the run's uid (a UUID's 128 bits, so a uid pasted into a
  trace search finds the run), and its root span's id is derived from the uid too (``run_ids``).
  Every span about the run — each reconcile, each attempt, the queueing — is a child of that root,
  whenever and wherever it is recorded; the root itself (creation to end) is emitted once the run
  has ended (``record_span`` with ``root=True``), with the times the store recorded. The SDK's id
  generator is replaced by one that hands out those ids for that one span (``_run_ids``).
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import traceback
import uuid
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from joch.telemetry.scrubbing import scrub

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.util.types import AttributeValue
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
EXPORTERS = ("otlp", "console", "none")
RUN_UID = "joch.run.uid"
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "WATCH"})

_OFF: AbstractContextManager[None] = nullcontext()
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None
_forced: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("joch_forced_ids", default=None)


def enabled() -> bool:
    return _tracer is not None


def exporters(environ: Mapping[str, str]) -> list[str]:
    """The exporters the environment asks for: none unless a variable of ``ENDPOINT_VARIABLES`` or
    ``OTEL_TRACES_EXPORTER`` is set (and ``OTEL_SDK_DISABLED`` is not ``true``)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not named:
        return ["otlp"] if any(environ.get(v, "").strip() for v in ENDPOINT_VARIABLES) else []
    chosen = [n.strip().lower() for n in named.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in EXPORTERS]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER={named}: {', '.join(unknown)} is not supported; Joch exports "
                         f"traces with {' or '.join(EXPORTERS[:2])} (none turns tracing off)")
    return [n for n in chosen if n != "none"]


def setup(*, service_name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Start tracing when the environment configures it; True when it did. Call ``shutdown`` at exit.
    ``environ`` (default ``os.environ``) decides whether; the SDK reads its own settings from ``os.environ``."""
    global _tracer, _provider
    environ = os.environ if environ is None else environ
    chosen = exporters(environ)
    if not chosen or _tracer is not None:
        return _tracer is not None
    _check_protocol(environ)
    _check_settings(environ)
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource, id_generator=_run_ids())
    for name in chosen:
        exporter: SpanExporter
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        else:
            exporter = ConsoleSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _provider, _tracer = provider, provider.get_tracer("joch")
    return True


def shutdown() -> None:
    """Flush what is buffered and stop the exporter threads; tracing is off afterwards."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def _check_protocol(environ: Mapping[str, str]) -> None:
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = environ.get(variable, "").strip()
        if protocol:
            if protocol != "http/protobuf":
                raise ValueError(f"{variable}={protocol} is not supported: Joch exports OTLP over HTTP "
                                 "(http/protobuf, a collector's port 4318); unset it or set http/protobuf")
            return


# variable -> (least value, whole numbers only, what it must be)
_NUMBERS = {
    "OTEL_BSP_SCHEDULE_DELAY": (1, True, "a positive number of milliseconds"),
    "OTEL_BSP_EXPORT_TIMEOUT": (0, True, "a number of milliseconds"),
    "OTEL_BSP_MAX_QUEUE_SIZE": (1, True, "a positive whole number"),
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": (1, True, "a positive whole number"),
    "OTEL_EXPORTER_OTLP_TIMEOUT": (0, False, "a number of seconds"),
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": (0, False, "a number of seconds"),
}
_COMPRESSIONS = ("gzip", "deflate", "none")


def _check_settings(environ: Mapping[str, str]) -> None:
    """The values the SDK would otherwise half-ignore: an endpoint that is no URL (it logs a failed
    export every few seconds, forever), a number that is none (a traceback, then its default), an
    unknown compression (a warning, then none). An endpoint's value is not repeated: it may hold a
    password."""
    for variable in ENDPOINT_VARIABLES:
        value = environ.get(variable, "").strip()
        if value and not _http_url(value):
            raise ValueError(f"{variable} must be an http:// or https:// URL with a host, such as "
                             "http://localhost:4318")
    for variable, (least, whole, what) in _NUMBERS.items():
        value = environ.get(variable, "").strip()
        if value and not _number(value, least, whole=whole):
            raise ValueError(f"{variable} must be {what} (got {value!r})")
    for variable in ("OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"):
        value = environ.get(variable, "").strip().lower()
        if value and value not in _COMPRESSIONS:
            raise ValueError(f"{variable} must be {', '.join(_COMPRESSIONS[:-1])} or {_COMPRESSIONS[-1]} "
                             f"(got {value!r})")


def _http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  # raises on a port that is not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _number(value: str, least: int, *, whole: bool) -> bool:
    try:
        number = int(value) if whole else float(value)
    except ValueError:
        return False
    return number >= least


# --- spans ---------------------------------------------------------------------------------------

def span(
    span_name: str, /, *, kind: str | None = None, namespace: str | None = None, name: str | None = None,
    run_uid: str | None = None, action: str | None = None, attributes: Mapping[str, AttributeValue] | None = None,
) -> AbstractContextManager[Any]:
    """A span around a block, child of the current one, carrying the object it is about
    (``joch.kind``, ``joch.namespace``, ``joch.name``, ``joch.run.uid``) and what is done to it
    (``joch.action``: ``create``, ``update``...); a null context when off."""
    if _tracer is None:
        return _OFF
    attrs = _attributes(kind, namespace, name, run_uid, attributes)
    if action:
        attrs["joch.action"] = action
    return _current_span(span_name, attributes=attrs)


@contextmanager
def _current_span(span_name: str, **given: Any) -> Iterator[trace.Span]:
    """``start_as_current_span``, but an exception escaping the block is recorded scrubbed: its
    message and stack trace go to the collector, and a message can quote a URL with a password
    (a failed clone of ``https://x-access-token:…@github.com/…``) that the logs would have masked."""
    assert _tracer is not None
    with _tracer.start_as_current_span(span_name, record_exception=False, set_status_on_exception=False,
                                       **given) as current:
        try:
            yield current
        except BaseException as exc:
            message = scrub(str(exc))
            current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {message}"))
            current.add_event("exception", {
                "exception.type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                "exception.message": message,
                "exception.stacktrace": scrub("".join(traceback.format_exception(exc))),
            })
            raise


def object_span(span_name: str, /, obj: object) -> AbstractContextManager[Any]:
    """``span`` about a Kubernetes-shaped object (a dict with ``kind`` and ``metadata``), whose
    attributes are read only when tracing is on; a ``generateName`` stands in for a missing name."""
    if _tracer is None:
        return _OFF
    given = obj if isinstance(obj, dict) else {}
    metadata = given.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    kind, namespace = given.get("kind"), metadata.get("namespace")
    name = metadata.get("name") or metadata.get("generateName")
    return span(span_name, kind=_text(kind), namespace=_text(namespace), name=_text(name))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _attributes(
    kind: str | None, namespace: str | None, name: str | None, run_uid: str | None,
    extra: Mapping[str, AttributeValue] | None,
) -> dict[str, AttributeValue]:
    out: dict[str, AttributeValue] = {}
    for key, value in (("joch.kind", kind), ("joch.namespace", namespace), ("joch.name", name), (RUN_UID, run_uid)):
        if value:
            out[key] = value
    if extra:
        out.update({k: v for k, v in extra.items() if v is not None})
    return out


def current_ids() -> tuple[str, str] | None:
    """The current span's trace and span id as hex (for log records), or None."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


# --- runs ----------------------------------------------------------------------------------------

def run_ids(uid: str) -> tuple[int, int]:
    """The trace id and root span id of a run: the uid's 128 bits (a hash of it when it is not a
    UUID) and 64 bits of its hash."""
    digest = hashlib.sha256(uid.encode()).digest()
    try:
        trace_id = uuid.UUID(uid).int
    except ValueError:
        trace_id = int.from_bytes(digest[:16], "big")
    return trace_id or 1, int.from_bytes(digest[16:24], "big") or 1


def _run_parent(uid: str) -> otel_context.Context:
    trace_id, span_id = run_ids(uid)
    parent = SpanContext(trace_id=trace_id, span_id=span_id, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(parent), otel_context.Context())


def run_span(
    span_name: str, /, *, uid: str, namespace: str | None = None, name: str | None = None,
) -> AbstractContextManager[Any]:
    """A live span in the run's trace (a reconcile of it), child of the run's root span."""
    if _tracer is None:
        return _OFF
    return _current_span(
        span_name, context=_run_parent(uid), attributes=_attributes("AgentRun", namespace, name, uid, None))


def record_span(
    span_name: str, /, *, uid: str, start: float, end: float, root: bool = False, namespace: str | None = None,
    name: str | None = None, attributes: Mapping[str, AttributeValue] | None = None, error: str | None = None,
) -> None:
    """A span of the run's life at recorded times (seconds since the epoch): its root (``root``,
    creation to end) or a child of it (queueing, an attempt)."""
    if _tracer is None:
        return
    attrs = _attributes("AgentRun", namespace, name, uid, attributes)
    start_ns, end_ns = int(start * 1e9), int(max(end, start) * 1e9)
    if root:
        token = _forced.set(run_ids(uid))
        try:
            recorded = _tracer.start_span(span_name, context=otel_context.Context(), attributes=attrs,
                                          start_time=start_ns)
        finally:
            _forced.reset(token)
    else:
        recorded = _tracer.start_span(span_name, context=_run_parent(uid), attributes=attrs, start_time=start_ns)
    if error:
        recorded.set_status(Status(StatusCode.ERROR, scrub(error)))
    recorded.end(end_time=end_ns)


def _run_ids() -> IdGenerator:
    """Random ids, except for a run's root span, whose ids ``record_span`` sets (``run_ids``). Built
    when tracing starts: the SDK is not imported while tracing is off."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIds(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            forced = _forced.get()
            return forced[0] if forced is not None else super().generate_trace_id()

        def generate_span_id(self) -> int:
            forced = _forced.get()
            return forced[1] if forced is not None else super().generate_span_id()

    return RunIds()


# --- HTTP ----------------------------------------------------------------------------------------

class RequestSpans:
    """An ASGI middleware: a server span per HTTP request, child of the caller's ``traceparent``,
    named after the route's template (``POST /v1/resources/apply``) once routing found it. Install
    it only when tracing is on (``enabled``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _tracer is None:
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "")
        if method not in HTTP_METHODS:  # a span's name must not be whatever a client sends (semantic conventions)
            method = "_OTHER"
        parent = extract({k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or ()})
        with _current_span(
            method, context=parent, kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope.get("path", "")},
        ) as current:

            async def send_traced(message: Message) -> None:
                if message["type"] == "http.response.start":
                    code = int(message["status"])
                    current.set_attribute("http.response.status_code", code)
                    if code >= 500:
                        current.set_status(Status(StatusCode.ERROR))
                await send(message)

            try:
                await self.app(scope, receive, send_traced)
            finally:
                template = getattr(scope.get("route"), "path", None)
                if isinstance(template, str):
                    current.update_name(f"{method} {template}")
                    current.set_attribute("http.route", template)
