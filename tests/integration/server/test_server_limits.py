"""Resource limits over HTTP: a cap on open watch streams (429 with ``Retry-After``) and a bounded
buffer per watcher (a stuck client is cut off with a 410 ERROR event, its buffer freed)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx

from joch.server import ServerOptions
from joch.server.testing import LiveServer, is_status
from joch.store.sql import SqlStore


def provider(name: str, size: int = 0) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"binary": "x", "argsTemplate": ["a" * size] if size else []}}


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_watches_past_the_cap_are_429_with_retry_after_until_one_ends(
    server_with: Callable[[ServerOptions], LiveServer],
) -> None:
    server = server_with(ServerOptions(max_watches=2, sse_heartbeat_interval=0.3))
    path = server.path("ap")
    with httpx.Client(base_url=server.url, timeout=10) as http:
        with http.stream("GET", path, params={"watch": "1"}) as first, \
                http.stream("GET", "/v1/resources/watch") as second:
            assert first.status_code == 200 and second.status_code == 200
            refused = http.get(path, params={"watch": "1"})
            assert refused.status_code == 429
            assert refused.headers["Retry-After"] == "5"
            body = refused.json()
            assert is_status(body, 429, "TooManyRequests")
            assert "at most 2" in body["message"] and "--max-watches" in body["message"]
            assert body["details"]["retryAfterSeconds"] == 5
            sse = http.get("/v1/resources/watch")
            assert sse.status_code == 429
            assert http.get(path).status_code == 200  # lists are not watches
        # Both streams ended: their slots are free again.
        wait_for(lambda: http.get(path, params={"watch": "1", "timeoutSeconds": "1"}).status_code == 200)
        assert http.get(path, params={"watch": "1", "timeoutSeconds": "1"}).status_code == 200


def test_a_stuck_watch_client_is_cut_off_with_410_and_frees_its_buffer(
    server_with: Callable[[ServerOptions], LiveServer],
) -> None:
    server = server_with(ServerOptions(watch_buffer_events=20))
    store = server.store
    assert isinstance(store, SqlStore)
    host, port = server.url.removeprefix("http://").split(":")
    start = store.current_revision()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing
        sock.connect((host, int(port)))
        sock.sendall(f"GET {server.path('ap')}?watch=1&resourceVersion={start} HTTP/1.1\r\n"
                     f"Host: {host}\r\n\r\n".encode())
        wait_for(lambda: store.feed.subscribers_count() == 1)
        for i in range(100):  # 10 MB: more than the socket buffers and the transport hold
            store.create(_kind(), provider(f"p{i}", 100_000))
        # The watch overflowed while its client read nothing: it left the feed at once.
        wait_for(lambda: store.feed.subscribers_count() == 0)
        sock.settimeout(10)
        received = b""
        while not received.endswith(b"0\r\n\r\n"):  # the end of the chunked body: the stream ended
            chunk = sock.recv(1 << 20)
            assert chunk, "the server closed the connection without ending the stream"
            received += chunk
    lines = [json.loads(line) for line in _dechunk(received).splitlines() if line.strip()]
    *added, last = lines
    assert all(e["type"] == "ADDED" for e in added) and len(added) < 100
    assert last["type"] == "ERROR" and is_status(last["object"], 410, "Expired")
    assert "fell behind" in last["object"]["message"]


def test_a_stuck_event_stream_client_is_cut_off_with_an_error_event(
    server_with: Callable[[ServerOptions], LiveServer],
) -> None:
    server = server_with(ServerOptions(watch_buffer_events=20, sse_heartbeat_interval=60))
    store = server.store
    assert isinstance(store, SqlStore)
    host, port = server.url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(f"GET /v1/resources/watch?kind=agentproviders HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        wait_for(lambda: store.feed.subscribers_count() == 1)
        for i in range(100):
            store.create(_kind(), provider(f"p{i}", 100_000))
        wait_for(lambda: store.feed.subscribers_count() == 0)
        sock.settimeout(10)
        received = b""
        while not received.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(1 << 20)
            assert chunk, "the server closed the connection without ending the stream"
            received += chunk
    frames = [f for f in _dechunk(received).split("\n\n") if f.strip()]
    last = dict(line.split(": ", 1) for line in frames[-1].splitlines())
    assert last["event"] == "ERROR" and "id" not in last  # a reconnecting EventSource resumes after the last id
    status = json.loads(last["data"])
    assert is_status(status, 410, "Expired") and "fell behind" in status["message"]


def _kind() -> Any:
    from joch.api.kinds import AGENT_PROVIDER

    return AGENT_PROVIDER


def _dechunk(raw: bytes) -> str:
    _, _, body = raw.partition(b"\r\n\r\n")
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out, body = out + rest[:size], rest[size + 2:]
    return out.decode()


def _manifests(count: int) -> str:
    return "\n---\n".join(
        f"apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {{name: p{i}, namespace: default}}\n"
        "spec: {binary: x}" for i in range(count))


def test_an_apply_past_the_document_or_byte_cap_is_413_naming_the_flag_and_writes_nothing(
    server_with: Callable[[ServerOptions], LiveServer],
) -> None:
    server = server_with(ServerOptions(max_apply_documents=5, max_apply_bytes=4096))
    yaml = {"Content-Type": "application/yaml"}
    for route in ("/v1/resources/apply", "/v1/resources/create"):
        many = server.http.post(route, content=_manifests(6), headers=yaml)
        assert many.status_code == 413 and is_status(many.json(), 413, "RequestEntityTooLarge")
        assert many.json()["message"] == (
            f"the request holds 6 objects; one {route.rsplit('/', 1)[1]} takes at most 5 "
            "(joch server --max-apply-documents): split the manifests into several requests")
        large = server.http.post(route, content=_manifests(5) + "\n# " + "x" * 5000, headers=yaml)
        assert large.status_code == 413
        assert large.json()["message"] == (
            "the request body is larger than the limit of 4096 bytes (joch server --max-apply-bytes)")
    assert server.http.get(server.path("ap")).json()["items"] == []
    assert server.http.post("/v1/resources/apply", content=_manifests(5), headers=yaml).status_code == 200


def test_a_megabyte_label_value_is_not_echoed_back_at_length(server: LiveServer) -> None:
    value = "a" * 1_000_000
    obj = {**provider("p"), "metadata": {"name": "p", "namespace": "default", "labels": {"app": value}}}
    single = server.http.post(server.path("ap"), json=obj)
    batch = server.http.post("/v1/resources/apply", json=obj)
    for answer in (single, batch):
        assert answer.status_code == 422 and len(answer.content) < 10_000
    cause = single.json()["details"]["causes"][0]
    assert cause["field"] == "metadata.labels.app"
    assert cause["message"].startswith(f'"{"a" * 100}… (999900 more characters)" is not a valid label value')
