"""Failures become Kubernetes Status bodies: unknown routes, bad parameters, oversized bodies,
unexpected exceptions (500, nothing leaked) and a store that does not answer (503)."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from joch.server import ServerOptions
from joch.server.testing import LiveServer, is_status, live_server
from joch.store import Store, open_store


class Faulty:
    """A store whose named methods raise an unexpected error carrying a secret; the rest delegate."""

    SECRET = "password=hunter2"

    def __init__(self, store: Store, *failing: str) -> None:
        self._store = store
        self._failing = set(failing)

    def __getattr__(self, name: str) -> Any:
        if name in self._failing:
            def fail(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(f"database exploded ({self.SECRET})")
            return fail
        return getattr(self._store, name)


def test_readyz_is_503_when_the_store_does_not_answer(store: Store) -> None:
    with live_server(Faulty(store, "current_revision"), ServerOptions()) as broken:  # type: ignore[arg-type]
        r = broken.http.get("/readyz")
    assert r.status_code == 503 and is_status(r.json(), 503, "ServiceUnavailable")
    assert Faulty.SECRET not in r.text and "Traceback" not in r.text


def test_unexpected_errors_are_500_status_without_details(store: Store) -> None:
    with live_server(Faulty(store, "get"), ServerOptions()) as broken:  # type: ignore[arg-type]
        r = broken.http.get(broken.path("ap", "x"))
    assert r.status_code == 500 and is_status(r.json(), 500, "InternalError")
    assert Faulty.SECRET not in r.text and "Traceback" not in r.text and "RuntimeError" not in r.text


def test_unknown_routes_methods_and_bad_parameters_are_status(server: LiveServer) -> None:
    r = server.http.get("/apis/joch.dev/v1alpha1/namespaces/default/nothings")
    assert r.status_code == 404 and is_status(r.json(), 404, "NotFound")
    r = server.http.post(server.path("ap", "x"), json={})
    assert r.status_code == 405 and is_status(r.json(), 405, "MethodNotAllowed")
    r = server.http.get(server.path("ap"), params={"limit": "lots"})
    assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest")
    assert r.json()["details"]["causes"][0]["field"] == "limit"


def test_oversized_bodies_are_413(store: Store) -> None:
    with live_server(store, ServerOptions(max_body_bytes=100)) as small:
        r = small.http.post(small.path("ap"), content=b"{" + b" " * 200 + b"}",
                            headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and is_status(r.json(), 413, "RequestEntityTooLarge")


def test_limits_beyond_what_the_databases_hold_are_400_naming_limit(server: LiveServer) -> None:
    for limit in ("99999999999999999999999", "2147483648", "-1"):
        r = server.http.get(server.path("ap"), params={"limit": limit})
        assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest"), limit
        assert r.json()["details"]["causes"][0]["field"] == "limit"
        assert "from 1 to 2147483647" in r.json()["message"]
    assert server.http.get(server.path("ap"), params={"limit": "2147483647"}).status_code == 200


def test_deeply_nested_json_is_400_not_500(server: LiveServer) -> None:
    body = b'{"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "spec":\n' + b"[" * 100_000
    for path in (server.path("ap"), "/v1/resources/apply", "/v1/resources/create"):
        r = server.http.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest"), path
        assert r.json()["message"].startswith("request body: documents[0] (line 2): mappings and lists nest more "
                                              "than 64 levels deep")


def test_lone_surrogates_are_400_naming_the_field(server: LiveServer) -> None:
    body = b'{"apiVersion":"joch.dev/v1alpha1","kind":"ImplementationSpec","metadata":{"name":"s"},' \
           b'"spec":{"text":"x\\ud800y"}}'
    r = server.http.post(server.path("impl"), content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest")
    assert r.json()["details"]["causes"][0]["field"] == "spec.text"
    r = server.http.post("/v1/resources/apply", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest")
    assert r.json()["details"]["causes"][0]["field"] == "documents[0].spec.text"
    assert server.http.get(server.path("impl", "s")).status_code == 404


@pytest.mark.postgres
def test_pooled_connections_killed_under_the_server_cost_no_request(postgres_url: str) -> None:
    """What a PostgreSQL restart does to the pool, without restarting the server others test on:
    terminate this store's own backends (found by a unique application_name), then read and write."""
    app = f"joch-test-{uuid.uuid4().hex[:12]}"
    store = open_store(f"{postgres_url}&application_name={app}")

    def kill_backends() -> None:
        with ThreadPoolExecutor(4) as pool:  # several pooled connections, all to go stale
            assert set(pool.map(lambda _: server.http.get(server.path("agents")).status_code, range(20))) == {200}
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()) AS t", (app,)).fetchone()
        assert killed is not None and killed[0] >= 2

    try:
        with live_server(store, ServerOptions()) as server:
            kill_backends()
            started = time.monotonic()
            created = server.http.post(server.path("ap"), json={
                "apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
                "spec": {"binary": "x"}})
            assert created.status_code == 201, created.text
            assert time.monotonic() - started < 3  # no backoff sleeps between dead connections
            kill_backends()
            codes = [server.http.get(server.path("ap", "p")).status_code for _ in range(40)]
            assert codes == [200] * 40
    finally:
        store.close()
