"""Traces and JSON logs of a real ``joch server``: spans exported over OTLP/HTTP to a local receiver
(``support.otlp``) when ``OTEL_EXPORTER_OTLP_ENDPOINT`` points at it, nothing when tracing is turned
off, and ``--log-format json``: every line of the server's output JSON, carrying the request id and
the run uid."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import jochserver, ports, stop_server
from support.jochserver import Joch
from support.otlp import Span, otlp_receiver

JOCH = Path(sys.executable).with_name("joch")
QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart"
RUN = "hello-readme"


@contextmanager
def joch_server(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Joch]:
    """A ``joch server`` (``support.jochserver``) with no ``OTEL_*`` variable but those of ``env``."""
    with jochserver.joch_server(tmp_path, "none", ("OTEL_",), *args, env=env) as joch:
        yield joch


def quickstart(joch: Joch) -> str:
    """The quickstart's manifests, the run's repository the server's test repository."""
    texts = [(QUICKSTART / f"{name}.yaml").read_text() for name in ("provider", "agent", "implementation", "run")]
    texts[-1] = texts[-1].replace("url: ../..", f"url: {joch.repo}")
    return "\n---\n".join(texts)


def succeeded(joch: Joch) -> dict[str, Any]:
    status = joch.wait_ended(RUN)
    assert status["phase"] == "Succeeded", status
    return joch.run(RUN)


def named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def test_an_apply_and_a_demo_run_arrive_as_traces_and_json_log_lines(tmp_path: Path) -> None:
    caller_trace, caller_span = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    with otlp_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        with joch_server(tmp_path, "--log-format", "json", env=env) as joch:
            r = joch.apply(quickstart(joch),
                           headers={"traceparent": f"00-{caller_trace}-{caller_span}-01", "x-request-id": "apply-1"})
            assert r.headers["audit-id"] == "apply-1"
            run = succeeded(joch)
            uid = run["metadata"]["uid"]
            _create_and_replace_one_object(joch.base)
            spans = receiver.wait_for(lambda got: bool(named(got, "joch.run")) and bool(named(got, "joch.update")))
        spans = receiver.spans  # flushed at shutdown: the last reconciles too

    _apply_is_one_trace(spans, caller_trace, caller_span)
    _run_is_its_own_trace(spans, uid)
    _log_lines_carry_ids(joch.log, uid)
    _single_object_writes_are_traced(spans)


PROVIDERS = "/apis/joch.dev/v1alpha1/namespaces/default/agentproviders"


def _create_and_replace_one_object(base: str) -> None:
    provider = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "single"},
                "spec": {"binary": "echo"}}
    created = httpx.post(f"{base}{PROVIDERS}", json=provider, timeout=10)
    assert created.status_code == 201, created.text
    replaced = httpx.put(f"{base}{PROVIDERS}/single", json={**created.json(), "spec": {"binary": "true"}}, timeout=10)
    assert replaced.status_code == 200, replaced.text


def _single_object_writes_are_traced(spans: list[Span]) -> None:
    for route, operation, action in (("POST /apis/joch.dev/v1alpha1/namespaces/{namespace}/agentproviders",
                                      "joch.create", "created"),
                                     ("PUT /apis/joch.dev/v1alpha1/namespaces/{namespace}/agentproviders/{name}",
                                      "joch.update", "updated")):
        (request,) = named(spans, route)
        (write,) = [s for s in spans if s.name == operation and s.parent_id == request.span_id]
        assert write.attributes["joch.kind"] == "AgentProvider" and write.attributes["joch.name"] == "single"
        below = {s.name: s for s in spans if s.parent_id == write.span_id}
        assert below.keys() >= {"joch.admission.validate", "joch.store.write", "joch.admission.policies"}
        assert below["joch.store.write"].attributes["joch.action"] == action


def _apply_is_one_trace(spans: list[Span], caller_trace: str, caller_span: str) -> None:
    traced = [s for s in spans if s.trace_id == caller_trace]
    (request,) = [s for s in traced if s.name == "POST /v1/resources/apply"]
    assert request.parent_id == caller_span  # the caller's traceparent was honoured
    assert request.attributes["http.response.status_code"] == 200 and request.service == "joch-server"
    (batch,) = named(traced, "joch.apply")
    assert batch.parent_id == request.span_id and batch.attributes["joch.documents"] == 4
    objects = {(s.name, s.attributes.get("joch.kind"), s.attributes.get("joch.name")): s for s in traced}
    for kind, name in (("AgentProvider", "demo-agent"), ("Agent", "demo"), ("ImplementationSpec", "hello-readme"),
                       ("AgentRun", "hello-readme")):
        admitted = objects[("joch.admission.validate", kind, name)]
        written = objects[("joch.store.write", kind, name)]
        checked = objects[("joch.admission.policies", kind, name)]
        assert admitted.parent_id == batch.span_id and checked.parent_id == batch.span_id
        assert written.attributes["joch.namespace"] == "default" and written.attributes["joch.action"] == "created"
        assert batch.start_ns <= admitted.start_ns <= admitted.end_ns <= written.start_ns <= batch.end_ns


def _run_is_its_own_trace(spans: list[Span], uid: str) -> None:
    of_run = [s for s in spans if s.attributes.get("joch.run.uid") == uid]
    assert {s.trace_id for s in of_run} == {uuid.UUID(uid).hex}  # its uid is its trace id
    (root,) = named(of_run, "joch.run")
    assert root.parent_id == "" and root.attributes["joch.run.phase"] == "Succeeded"
    assert root.attributes["joch.agent"] == "demo" and root.status_code != 2  # not an error
    children = [s for s in of_run if s is not root]
    assert {s.parent_id for s in children} == {root.span_id}
    names = [s.name for s in children]
    assert names.count("joch.run.attempt") == 1 and names.count("joch.run.queued") == 1
    assert names.count("joch.run.reconcile") >= 3  # Pending, Queued, Running, ended at least
    (attempt,) = named(children, "joch.run.attempt")
    assert attempt.attributes["joch.run.reason"] == "Completed" and attempt.attributes["joch.run.attempt"] == 1
    assert root.start_ns <= attempt.start_ns <= attempt.end_ns <= root.end_ns
    # The reconciles' store writes are in the run's trace too.
    assert any(s.name == "joch.store.write" and s.attributes.get("joch.name") == "hello-readme"
               and s.trace_id == root.trace_id for s in spans)


def _log_lines_carry_ids(log: Path, uid: str) -> None:
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    assert any(line.get("logger", "").startswith("uvicorn") for line in lines)  # uvicorn's lines too
    applied = [line for line in lines if line["message"] == "agentrun.runtime.joch.dev/hello-readme created by "
               "system:anonymous"]
    assert applied and applied[0]["request_id"] == "apply-1" and len(applied[0]["trace_id"]) == 32
    ran = [line for line in lines if line.get("run_uid") == uid]
    assert any("Started" in line["message"] for line in ran), lines
    assert all(line["trace_id"] == uuid.UUID(uid).hex for line in ran)


def test_joch_controller_traces_the_runs_it_reconciles_and_logs_json(tmp_path: Path) -> None:
    """The API in a ``joch server --no-controllers``, the controllers in a ``joch controller`` on the
    same SQLite store: the controller's spans say so (``service.name``) and carry the run's uid."""
    with otlp_receiver() as receiver, joch_server(tmp_path, "--no-controllers") as joch:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JOCH_", "OTEL_"))}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
        stderr = tmp_path / "controller.stderr"
        with stderr.open("w") as err:
            controller = subprocess.Popen(
                [str(JOCH), "controller", "--data-dir", str(tmp_path / "data"), "--sandbox", "none",
                 "--api-url", joch.base, "--log-format", "json"], stdout=subprocess.DEVNULL, stderr=err, text=True,
                env=env, cwd=tmp_path)
        try:
            joch.apply(quickstart(joch))
            uid = succeeded(joch)["metadata"]["uid"]
            spans = receiver.wait_for(lambda got: bool(named(got, "joch.run")))
        finally:
            stop_server(controller)
    (root,) = named(spans, "joch.run")
    assert root.service == "joch-controller" and root.trace_id == uuid.UUID(uid).hex
    assert not any(s.name.startswith("POST ") for s in spans)  # the server exports nothing: no variable set
    lines = [json.loads(line) for line in stderr.read_text().splitlines()]
    assert any(line.get("run_uid") == uid and "Succeeded" in line["message"] for line in lines), lines


@pytest.mark.parametrize("off", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}])
def test_tracing_turned_off_exports_nothing(tmp_path: Path, off: dict[str, str]) -> None:
    """The endpoint is set, but so is what turns tracing off. (With no variable at all, no exporter
    thread runs and the SDK is not even imported: tests/unit/telemetry/test_tracing.py.)"""
    with otlp_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100", **off}
        with joch_server(tmp_path, env=env) as joch:
            joch.apply(quickstart(joch), headers={"traceparent": f"00-{uuid.uuid4().hex}-{'1' * 16}-01"})
            succeeded(joch)
    assert receiver.requests == 0 and receiver.spans == []
    text_lines = joch.log.read_text().splitlines()
    assert any(" INFO joch.server.v1: agentrun.runtime.joch.dev/hello-readme created" in line for line in text_lines)


def test_a_configuration_joch_cannot_honour_stops_the_start(tmp_path: Path) -> None:
    done = subprocess.run([str(JOCH), "server", "--data-dir", str(tmp_path), "--port", str(ports.free_port())],
                          env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                               "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported" in done.stderr
    done = subprocess.run([str(JOCH), "server", "--data-dir", str(tmp_path), "--log-format", "xml"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--log-format must be text or json" in done.stderr


def test_with_json_logs_an_error_that_stops_the_start_is_a_json_line_too(tmp_path: Path) -> None:
    """A collector reading the server's stderr gets the reason it stopped as a record, not stray text."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([str(JOCH), "server", "--data-dir", str(tmp_path), "--port", str(port),
                               "--log-format", "json"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line a JSON object
    error = lines[-1]
    assert error["level"] == "ERROR" and error["message"].startswith(f"error: cannot listen on 127.0.0.1:{port}")
