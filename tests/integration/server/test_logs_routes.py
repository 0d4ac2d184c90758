"""``GET .../agentruns/{name}/log`` (and the ``/v1 .../executions/{name}/log`` alias) over a real
server, a real store (SQLite and Postgres) and real ``joch runner`` processes (``LocalRuntime``).

No run controller runs here: a test submits the agent to the runtime itself and writes the run's
``status.runtimeRef`` through the store, as the controller would."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from joch.api import kinds
from joch.runtime.base import Output, RunId, RunnerSpec, RunState
from joch.runtime.local import LocalRuntime
from joch.server import ServerOptions
from joch.server.app import create_app
from joch.server.testing import LiveServer, ServerThread, is_status
from joch.store import Store
from support import provider

PY = sys.executable
FAST = ServerOptions(bookmark_interval=0.3, sse_heartbeat_interval=0.3)


@dataclass
class RunServer(LiveServer):
    runtime: LocalRuntime

    def run(self, name: str, **status: Any) -> dict[str, Any]:
        """A new AgentRun (its agent created on first use), with ``status`` written if given."""
        if not self.http.get(self.path("agents", "a")).is_success:
            self.create(provider("p"))
            self.create({"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
                         "spec": {"providerRef": {"name": "p"}}})
        run = self.create({"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
                           "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}}}})
        return self.set_status(run, **status) if status else run

    def set_status(self, run: dict[str, Any], **status: Any) -> dict[str, Any]:
        current = self.store.get(kinds.AGENT_RUN, "default", run["metadata"]["name"])
        return self.store.update_status(kinds.AGENT_RUN, {**current, "status": {**(current.get("status") or {}),
                                                                                  **status}})

    def running(self, name: str, code: str) -> dict[str, Any]:
        """A new run whose agent ``python -c code`` has started, recorded as Running; its runtime ref."""
        run = self.run(name)
        ref = self.submit(run, code)
        self.set_status(run, phase="Running", runtimeRef=ref, attempt=1)
        return ref

    def submit(self, run: dict[str, Any], code: str, *, attempt: int = 1,
               outputs: tuple[Output, ...] = ()) -> dict[str, Any]:
        """Start ``python -c code`` as the run's agent; its outputs directory is ``$OUT``."""
        rid = RunId(namespace="default", name=run["metadata"]["name"], uid=run["metadata"]["uid"], attempt=attempt)
        outdir = self.runtime.workspace(rid, None).outputs
        spec = RunnerSpec(run=rid, argv=(PY, "-c", code), env={"OUT": outdir}, outputs=outputs,
                          timeout_seconds=60, grace_seconds=1)
        return self.runtime.submit(spec)

    def finish(self, ref: dict[str, Any], timeout: float = 30) -> RunState:
        deadline = time.monotonic() + timeout
        while not (state := self.runtime.status(ref)).finished:
            assert time.monotonic() < deadline, f"the agent did not finish: {state}"
            time.sleep(0.05)
        return state

    def executed(self, name: str, code: str, **kwargs: Any) -> dict[str, Any]:
        """A run whose agent ran ``code`` to its end, with status as the run controller writes it."""
        run = self.run(name)
        ref = self.submit(run, code, **kwargs)
        state = self.finish(ref)
        artifacts = [{"name": a.name, "path": a.path, "sha256": a.sha256, "size": a.size} for a in state.artifacts]
        return self.set_status(run, phase="Succeeded" if state.phase == "Succeeded" else "Failed", runtimeRef=ref,
                               attempt=kwargs.get("attempt", 1), artifacts=artifacts, reason=state.reason)

    def log(self, name: str, **params: str) -> httpx.Response:
        return self.http.get(self.path("agentruns", name, sub="log"), params=params)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = LocalRuntime(tmp_path / "runtime")
    yield rt
    rt.close()


@pytest.fixture
def server(store: Store, runtime: LocalRuntime) -> Iterator[RunServer]:
    with ServerThread(create_app(store, options=FAST, runtime=runtime)) as thread, httpx.Client(
        base_url=thread.url, timeout=httpx.Timeout(60.0)
    ) as http:
        yield RunServer(thread.url, http, store, runtime)


def in_background(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def test_the_log_of_a_finished_run_and_its_v1_alias(server: RunServer) -> None:
    server.executed("done", "print('hi'); import sys; print('oops', file=sys.stderr)")
    r = server.log("done")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    assert sorted(r.text.splitlines()) == ["hi", "oops"]
    alias = server.http.get("/v1/namespaces/default/executions/done/log")
    assert alias.status_code == 200 and alias.text == r.text
    followed = server.log("done", follow="true")
    assert followed.status_code == 200 and followed.text == r.text


def test_a_run_that_has_not_started_is_a_400_naming_its_phase(server: RunServer) -> None:
    server.run("waiting", phase="Queued")
    r = server.log("waiting")
    assert is_status(r.json(), 400, "BadRequest")
    assert r.json()["message"] == 'run "waiting" has not started (phase Queued); use --follow to wait'
    server.run("fresh")
    assert 'run "fresh" has not started (phase Pending)' in server.log("fresh").json()["message"]


def test_an_unknown_run_is_a_404(server: RunServer) -> None:
    r = server.log("ghost")
    assert is_status(r.json(), 404, "NotFound") and "ghost" in r.json()["message"]
    v1 = server.http.get("/v1/namespaces/default/executions/ghost/log", params={"follow": "true"})
    assert is_status(v1.json(), 404, "NotFound")


def test_follow_streams_bytes_as_the_agent_writes_them(server: RunServer, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    code = ("import os, sys, time\nprint('first', flush=True)\n"
            f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\nprint('second', flush=True)\n")
    ref = server.running("live", code)
    with server.http.stream("GET", server.path("agentruns", "live", sub="log"), params={"follow": "true"},
                            timeout=httpx.Timeout(10.0, read=20.0)) as r:
        assert r.status_code == 200
        chunks = r.iter_bytes()
        assert next(chunks) == b"first\n"  # arrives while the agent is still running
        assert server.runtime.status(ref).phase == "Running"
        gate.touch()
        rest = b"".join(chunks)  # ends when the run has ended and everything was read
    assert rest == b"second\n"
    assert server.runtime.status(ref).finished


def test_tail_lines_and_limit_bytes_cut_the_log_as_kubernetes_does(server: RunServer) -> None:
    server.executed("many", "for i in range(1, 1001): print(f'line{i}')")
    assert server.log("many", tailLines="2").text == "line999\nline1000\n"
    assert server.log("many", tailLines="0").text == ""
    assert server.log("many", tailLines="5000").text.count("\n") == 1000
    assert server.log("many", limitBytes="12").text == "line1\nline2\n"
    assert server.log("many", tailLines="2", limitBytes="4").text == "line"
    assert server.log("many", tailLines="1", follow="true").text == "line1000\n"
    for bad in ({"tailLines": "-1"}, {"limitBytes": "0"}, {"tailLines": "x"}):
        r = server.log("many", **bad)
        assert r.status_code in (400, 422) and r.json()["kind"] == "Status", (bad, r.text)
        assert next(iter(bad)) in r.text


def test_a_followed_tail_goes_on_from_the_byte_where_it_ended(server: RunServer, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    code = ("import os, time\nfor i in range(1, 6): print(f'early{i}', flush=True)\n"
            f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\nprint('late', flush=True)\n")
    ref = server.running("tailed", code)
    deadline = time.monotonic() + 20
    while server.log("tailed").text.count("\n") < 5:
        assert time.monotonic() < deadline, "the agent did not print its first lines"
        time.sleep(0.05)
    with server.http.stream("GET", server.path("agentruns", "tailed", sub="log"),
                            params={"follow": "true", "tailLines": "2"}, timeout=httpx.Timeout(10.0, read=20.0)) as r:
        assert r.status_code == 200
        chunks = r.iter_bytes()
        assert next(chunks) == b"early4\nearly5\n"
        assert server.runtime.status(ref).phase == "Running"
        gate.touch()
        assert b"".join(chunks) == b"late\n"


def test_follow_waits_for_the_run_to_start(server: RunServer) -> None:
    run = server.run("later", phase="Queued")
    thread, out = in_background(lambda: server.http.get(server.path("agentruns", "later", sub="log"),
                                                        params={"follow": "true"}, timeout=30))
    time.sleep(0.5)
    assert "value" not in out, "the request must wait for the run to start"
    ref = server.submit(run, "print('started late')")
    server.set_status(run, phase="Running", runtimeRef=ref, attempt=1)
    thread.join(30)
    r = out["value"]
    assert r.status_code == 200 and r.text == "started late\n"


@pytest.mark.parametrize(("ending", "code", "reason"), [
    ("ended", 400, "BadRequest"),
    ("deleted", 404, "NotFound"),
])
def test_follow_of_a_run_that_never_starts(server: RunServer, ending: str, code: int, reason: str) -> None:
    run = server.run("never", phase="Queued")
    thread, out = in_background(lambda: server.log("never", follow="true"))
    time.sleep(0.3)
    if ending == "ended":
        server.set_status(run, phase="Failed", reason="InvalidSpec", message="no such provider")
    else:
        server.http.delete(server.path("agentruns", "never")).raise_for_status()
    thread.join(30)
    body = out["value"].json()
    assert is_status(body, code, reason)
    if ending == "ended":
        message = 'run "never" ended Failed before it started (InvalidSpec: no such provider); it has no log'
        assert body["message"] == message
        again = server.log("never", follow="true")  # ended already when asked: no waiting
        assert is_status(again.json(), 400, "BadRequest") and again.json()["message"] == message
        assert server.log("never").json()["message"] == message


def test_attempts(server: RunServer) -> None:
    run = server.run("retried")
    first = server.submit(run, "print('attempt one')")
    server.finish(first)
    second = server.submit(run, "print('attempt two')", attempt=2)
    server.finish(second)
    server.set_status(run, phase="Failed", runtimeRef=second, attempt=2)
    assert server.log("retried").text == "attempt two\n"
    assert server.log("retried", attempt="2").text == "attempt two\n"
    assert server.log("retried", attempt="1").text == "attempt one\n"
    assert server.log("retried", attempt="1", follow="true").text == "attempt one\n"
    too_far = server.log("retried", attempt="3")
    assert is_status(too_far.json(), 400, "BadRequest")
    assert too_far.json()["message"] == 'run "retried" has no attempt 3: its latest is attempt 2'
    assert is_status(server.log("retried", attempt="0").json(), 400, "BadRequest")


def test_a_reference_of_another_runtime_is_a_400(server: RunServer) -> None:
    server.run("elsewhere", phase="Running", runtimeRef={"type": "kubernetes", "job": "x"})
    r = server.log("elsewhere")
    assert is_status(r.json(), 400, "BadRequest")
    assert r.json()["message"] == ('run "elsewhere" ran on the kubernetes runtime, and this server reads the '
                                   "local runtime")


def test_a_malformed_reference_is_a_400_not_a_500(server: RunServer) -> None:
    server.run("mangled", phase="Running", runtimeRef={"type": "local", "id": "no-attempt-here"})
    r = server.log("mangled")
    assert is_status(r.json(), 400, "BadRequest") and "malformed" in r.json()["message"]


def test_a_reference_to_another_runs_attempt_serves_none_of_its_files(server: RunServer) -> None:
    victim = server.executed("victim", "print('private output')")
    assert server.log("victim").text == "private output\n"
    # Any API client can write status: another run's reference copied into a run of its own.
    server.run("thief", phase="Succeeded", runtimeRef=victim["status"]["runtimeRef"], attempt=1)
    r = server.log("thief")
    assert is_status(r.json(), 400, "BadRequest") and "private output" not in r.text
    assert 'is not "<its uid>/<attempt>"' in r.json()["message"]


def test_a_server_without_a_runtime_says_so(store: Store, server: RunServer) -> None:
    server.executed("done", "print('hi')")
    with ServerThread(create_app(store, options=FAST)) as bare:
        r = httpx.get(f"{bare.url}{server.path('agentruns', 'done', sub='log')}")
        assert is_status(r.json(), 503, "ServiceUnavailable")
        assert "started without a runtime" in r.json()["message"]
        # the run's phase still says more than the missing runtime
        server.run("queued", phase="Queued")
        r = httpx.get(f"{bare.url}{server.path('agentruns', 'queued', sub='log')}")
        assert is_status(r.json(), 400, "BadRequest")


def test_quiet_followers_do_not_take_the_threads_other_requests_need(server: RunServer, tmp_path: Path) -> None:
    """Each follower blocks in the runtime until the next bytes; more of them than the shared
    threadpool has threads (40) must leave ordinary (synchronous) routes answering."""
    gate = tmp_path / "gate"
    code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)\nprint('bye')\n"
    server.running("quiet", code)
    url = f"{server.url}{server.path('agentruns', 'quiet', sub='log')}?follow=true"
    limits = httpx.Limits(max_connections=60)
    with httpx.Client(timeout=httpx.Timeout(10.0, read=30.0), limits=limits) as many:
        streams = [many.stream("GET", url) for _ in range(45)]
        responses = [s.__enter__() for s in streams]
        try:
            assert all(r.status_code == 200 for r in responses)
            started = time.monotonic()
            got = server.http.get(server.path("agentruns", "quiet"), timeout=5)
            assert got.status_code == 200 and time.monotonic() - started < 5
        finally:
            gate.touch()
            bodies = [r.read() for r in responses]
            for s in streams:
                s.__exit__(None, None, None)
    assert set(bodies) == {b"bye\n"}


def test_a_follower_that_goes_away_does_not_hold_the_server(server: RunServer, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    code = ("import os, time\nprint('one', flush=True)\n"
            f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n")
    ref = server.running("left", code)
    for _ in range(3):
        with server.http.stream("GET", server.path("agentruns", "left", sub="log"), params={"follow": "true"}) as r:
            assert next(r.iter_bytes()) == b"one\n"
    assert server.http.get("/healthz").status_code == 200
    gate.touch()
    server.finish(ref)
    assert server.log("left").text == "one\n"


def _reading_logs() -> int:
    """Threads of this process inside ``LocalRuntime.logs`` now (the server runs in-process)."""
    import joch.runtime.local as local

    count = 0
    for frame in sys._current_frames().values():
        f: Any = frame
        while f is not None:
            if f.f_code.co_name == "logs" and f.f_code.co_filename == local.__file__:
                count += 1
                break
            f = f.f_back
    return count


def test_followers_that_left_a_quiet_agent_leave_no_thread_reading_its_log(server: RunServer, tmp_path: Path) -> None:
    # Each follower reads the runtime in a thread that is abandoned when the client goes away. An
    # iterator blocked until the agent's next output kept those threads polling for as long as the
    # agent stayed quiet: 300 connect-and-leave requests took a server to 200 threads and a full core.
    gate = tmp_path / "gate"
    code = ("import os, time\nprint('one', flush=True)\n"
            f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n")
    ref = server.running("quiet", code)
    try:
        for _ in range(12):
            with server.http.stream("GET", server.path("agentruns", "quiet", sub="log"),
                                    params={"follow": "true"}) as r:
                assert next(r.iter_bytes()) == b"one\n"
        deadline = time.monotonic() + 10
        while (busy := _reading_logs()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert busy == 0, f"{busy} threads still read the log of a run nobody follows"
    finally:
        gate.touch()
        server.finish(ref)


def test_followers_take_watch_slots(store: Store, runtime: LocalRuntime, tmp_path: Path) -> None:
    # A follower holds a socket and a reader thread for as long as the run lasts; with no cap, 100
    # followers of one run were all served by a server started with --max-watches 20.
    options = ServerOptions(bookmark_interval=0.3, sse_heartbeat_interval=0.3, max_watches=2)
    with ServerThread(create_app(store, options=options, runtime=runtime)) as thread, \
            httpx.Client(base_url=thread.url, timeout=httpx.Timeout(60.0)) as http:
        server = RunServer(thread.url, http, store, runtime)
        gate = tmp_path / "gate"
        run = server.run("capped")
        ref = server.submit(run, "import os, time\nprint('one', flush=True)\n"
                                 f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n")
        server.set_status(run, phase="Running", runtimeRef=ref, attempt=1)
        url = server.path("agentruns", "capped", sub="log")
        try:
            for _ in range(3):  # ended before streaming: no slot kept
                assert server.http.get(server.path("agentruns", "absent", sub="log"),
                                       params={"follow": "true"}).status_code == 404
            with server.http.stream("GET", url, params={"follow": "true"}) as first, \
                    server.http.stream("GET", url, params={"follow": "true"}) as second:
                assert first.status_code == second.status_code == 200
                refused = server.http.get(url, params={"follow": "true"})
                assert refused.status_code == 429 and is_status(refused.json(), 429, "TooManyRequests")
                assert refused.headers["retry-after"] == "5"
                watch = server.http.get(server.path("agentruns"), params={"watch": "1"})
                assert watch.status_code == 429, "a follower counts as a watch"
                assert server.log("capped").status_code == 200, "reading without follow takes no slot"
            deadline = time.monotonic() + 5
            while (again := server.http.get(url, params={"follow": "true", "attempt": "5"})).status_code == 429:
                assert time.monotonic() < deadline, "the followers' slots were not given back"
                time.sleep(0.1)
            assert again.status_code == 400  # past the cap again: a slot was free
            with server.http.stream("GET", url, params={"follow": "true"}) as third:
                assert third.status_code == 200
        finally:
            gate.touch()
            server.finish(ref)


def test_openapi_documents_the_run_routes(server: RunServer) -> None:
    paths = server.http.get("/openapi.json").json()["paths"]
    log = "/apis/runtime.joch.dev/v1alpha1/namespaces/{namespace}/agentruns/{name}/log"
    assert "text/plain; charset=utf-8" in paths[log]["get"]["responses"]["200"]["content"]
    assert {p["name"] for p in paths[log]["get"]["parameters"]} >= {"follow", "attempt", "name", "namespace"}
    for path in ("/v1/namespaces/{namespace}/executions/{name}/log",
                 "/apis/runtime.joch.dev/v1alpha1/namespaces/{namespace}/agentruns/{name}/artifacts",
                 "/apis/runtime.joch.dev/v1alpha1/namespaces/{namespace}/agentruns/{name}/artifacts/{artifact}",
                 "/v1/namespaces/{namespace}/agents/{name}/manifest"):
        assert "get" in paths[path], path
    decide = paths["/v1/namespaces/{namespace}/approvals/{name}/decide"]["post"]
    schema = decide["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["decision"]["enum"] == ["approve", "deny"]
