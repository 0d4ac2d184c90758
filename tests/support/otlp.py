"""An OTLP/HTTP trace receiver for tests: a real HTTP server on 127.0.0.1 that accepts what an
OpenTelemetry SDK exports to ``POST /v1/traces`` (``ExportTraceServiceRequest``, protobuf, maybe
gzip-compressed), decodes it with ``opentelemetry-proto`` and keeps the spans, flattened to
``Span`` records, for the test to look at."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from support import ports


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    service: str
    status_code: int
    status_message: str = ""
    events: tuple[tuple[str, dict[str, Any]], ...] = ()  # (name, attributes)


@dataclass
class Receiver:
    endpoint: str
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(self, found: Callable[[list[Span]], bool], seconds: float = 30) -> list[Span]:
        """The spans received, once ``found`` says they are enough; fails after ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            with self.lock:
                spans = list(self.spans)
            if found(spans):
                return spans
            assert time.monotonic() < deadline, sorted({s.name for s in spans})
            time.sleep(0.1)


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def _spans(body: bytes) -> Iterator[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                yield Span(name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                           parent_id=s.parent_span_id.hex(), start_ns=s.start_time_unix_nano,
                           end_ns=s.end_time_unix_nano, attributes={a.key: _value(a.value) for a in s.attributes},
                           service=str(resource.get("service.name", "")), status_code=s.status.code,
                           status_message=s.status.message,
                           events=tuple((e.name, {a.key: _value(a.value) for a in e.attributes}) for e in s.events))


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver listening on a free port until the block ends; ``endpoint`` is what
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes."""
    port = ports.free_port()
    receiver = Receiver(endpoint=f"http://127.0.0.1:{port}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_error(404 if self.path != "/v1/traces" else 415)
                return
            spans = list(_spans(body))
            with receiver.lock:
                receiver.requests += 1
                receiver.spans.extend(spans)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
