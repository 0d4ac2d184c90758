"""Failures become Kubernetes Status bodies: unknown routes, bad parameters, oversized bodies,
unexpected exceptions (500, nothing leaked) and a store that does not answer (503)."""

from __future__ import annotations

from typing import Any

from joch.server import ServerOptions
from joch.server.testing import LiveServer, is_status, live_server
from joch.store import Store


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
