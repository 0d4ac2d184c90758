"""``joch.telemetry.tracing``: which environment turns tracing on, that off costs no SDK, no thread
and no middleware, and the ids of a run's trace."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest
from starlette.types import Message, Receive, Scope, Send

from joch.server.app import create_app
from joch.store import open_store
from joch.telemetry import tracing
from support.otlp import otlp_receiver


@pytest.fixture
def traced() -> Iterator[None]:
    yield
    tracing.shutdown()


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, []),
    ({"OTEL_SERVICE_NAME": "x", "OTEL_RESOURCE_ATTRIBUTES": "a=b"}, []),  # naming the service is not asking
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ["otlp"]),
    ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, []),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, []),
])
def test_only_the_standard_variables_turn_tracing_on(environ: dict[str, str], expected: list[str]) -> None:
    assert tracing.exporters(environ) == expected


def test_an_exporter_or_protocol_joch_lacks_is_refused_with_what_to_do(traced: None) -> None:
    with pytest.raises(ValueError, match="zipkin is not supported; Joch exports traces with otlp or console"):
        tracing.exporters({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="grpc is not supported: Joch exports OTLP over HTTP"):
        tracing.setup(service_name="t", environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                                                 "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert not tracing.enabled()


@pytest.mark.parametrize(("environ", "message"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "not a url"}, "OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://collector/v1/traces"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT must"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://u:hunter2@collector:43x8"}, "must be an http:// or https:// URL"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "5s"}, "OTEL_BSP_SCHEDULE_DELAY must be a positive"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_MAX_QUEUE_SIZE": "-5"}, "OTEL_BSP_MAX_QUEUE_SIZE must be a positive"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TIMEOUT": "abc"}, "OTEL_EXPORTER_OTLP_TIMEOUT must be"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "must be gzip, deflate or none"),
])
def test_a_value_the_sdk_would_half_ignore_stops_the_start(environ: dict[str, str], message: str,
                                                            traced: None) -> None:
    """The SDK logs and carries on (a failed export every few seconds, a traceback, a default):
    the user learns of the typo only when the traces are missing."""
    with pytest.raises(ValueError, match=message) as raised:
        tracing.setup(service_name="t", environ=environ)
    assert "hunter2" not in str(raised.value)
    assert not tracing.enabled()


def test_off_is_a_shared_null_context_and_no_middleware(tmp_path: object) -> None:
    assert tracing.setup(service_name="t", environ={}) is False
    assert tracing.span("a", kind="Agent") is tracing.span("b") is tracing.object_span("c", {"kind": "Agent"})
    assert tracing.current_ids() is None
    store = open_store("sqlite:///:memory:")
    try:
        assert not any(m.cls is tracing.RequestSpans for m in create_app(store).user_middleware)
    finally:
        store.close()


def test_off_loads_no_sdk_and_starts_no_thread() -> None:
    """In a fresh interpreter: the server's modules imported and ``setup`` called without configuration."""
    code = ("import sys, threading; import joch.server.app, joch.controllers.runs; from joch.telemetry import tracing; "
            "assert tracing.setup(service_name='t') is False; "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')), threading.active_count())")
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    assert done.stdout.split() == ["[]", "1"], done.stdout


def test_on_starts_the_exporter_thread_and_shutdown_stops_it(traced: None) -> None:
    assert tracing.setup(service_name="t", environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert any(t.name.startswith("OtelBatchSpan") for t in threading.enumerate())
    with tracing.span("a", kind="Agent", namespace="default", name="x"):
        ids = tracing.current_ids()
    assert ids is not None and len(ids[0]) == 32 and len(ids[1]) == 16
    tracing.shutdown()
    assert not tracing.enabled()
    assert not any(t.name.startswith("OtelBatchSpan") for t in threading.enumerate())


def test_an_exception_leaving_a_span_reaches_the_collector_without_the_credentials_it_quotes(
        traced: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the logs mask (``logs.JsonFormatter``) must not go out in a span's status and exception event."""
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)  # the SDK reads it from os.environ
        assert tracing.setup(service_name="t")
        with pytest.raises(RuntimeError), tracing.run_span("joch.run.reconcile", uid=str(uuid.uuid4())):
            raise RuntimeError("git clone https://x-access-token:ghp_s3cret@github.com/o/r failed")
        tracing.shutdown()
        (failed,) = receiver.wait_for(lambda spans: len(spans) == 1)
    assert failed.status_code == 2  # ERROR
    assert failed.status_message == "RuntimeError: git clone https://x-access-token:***@github.com/o/r failed"
    ((name, attributes),) = failed.events
    assert name == "exception" and attributes["exception.type"] == "builtins.RuntimeError"
    assert "Traceback" in attributes["exception.stacktrace"]
    assert "ghp_s3cret" not in repr(failed)


def test_a_request_span_is_named_after_a_method_joch_serves_or_other(
        traced: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client choosing the method must not choose the span's name (a tracing UI's list of operations)."""
    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def nothing() -> Message:
        return {"type": "http.request", "body": b""}

    async def drop(message: Message) -> None:
        pass

    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        assert tracing.setup(service_name="t")
        for method in ("GET", "X-RANDOM-1234"):
            scope = {"type": "http", "method": method, "path": "/x", "headers": []}
            asyncio.run(tracing.RequestSpans(refuse)(scope, nothing, drop))
        tracing.shutdown()
        spans = receiver.wait_for(lambda spans: len(spans) == 2)
    assert sorted(s.name for s in spans) == ["GET", "_OTHER"]


def test_a_runs_trace_id_is_its_uid_and_its_root_span_id_follows_from_it() -> None:
    uid = str(uuid.uuid4())
    trace_id, span_id = tracing.run_ids(uid)
    assert trace_id == uuid.UUID(uid).int and tracing.run_ids(uid) == (trace_id, span_id)
    assert 0 < span_id < 2**64 and tracing.run_ids(str(uuid.uuid4()))[1] != span_id
    other_trace, _ = tracing.run_ids("not-a-uuid")  # a store whose uids are not UUIDs still gets 128 bits
    assert 0 < other_trace < 2**128
