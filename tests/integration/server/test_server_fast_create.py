"""The hot create path (``resources.FastCreates``): a POST of one object without a query string is
answered without FastAPI's routing, and must answer exactly as the route does. Each case is sent
twice, once plain (the fast path) and once with ``?dryRun=`` (an empty dryRun is no dry run, so the
route serves it), and the two answers compared."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from joch.server import resources
from joch.server.app import create_app
from joch.server.testing import LiveServer, is_status
from joch.store import Store
from support import provider

ROUTE = {"dryRun": ""}


def agent(name: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
            "spec": {"providerRef": {"name": "codex"}}, **extra}


def comparable(response: httpx.Response) -> tuple[int, Any, list[str], bool]:
    body = response.json()
    if response.status_code == 201:
        m = body["metadata"]
        for key in ("name", "uid", "resourceVersion", "creationTimestamp"):
            m.pop(key)
        for entry in m.get("managedFields", []):
            entry.pop("time")
    return response.status_code, body, response.headers.get_list("warning"), "audit-id" in response.headers


def both(server: LiveServer, path: str, fast: dict[str, Any] | bytes, routed: dict[str, Any] | bytes,
         headers: dict[str, str] | None = None) -> tuple[httpx.Response, httpx.Response]:
    def send(body: dict[str, Any] | bytes, params: dict[str, str] | None) -> httpx.Response:
        if isinstance(body, bytes):
            return server.http.post(path, content=body, params=params, headers=headers)
        return server.http.post(path, json=body, params=params, headers=headers)
    return send(fast, None), send(routed, ROUTE)


def test_a_create_answers_as_the_route_does(server: LiveServer) -> None:
    server.create(provider("codex"))
    path = server.path("agents")
    fast, routed = both(server, path, agent("fast"), agent("routed"), {"User-Agent": "kubectl/v1.31"})
    assert fast.status_code == 201 and comparable(fast) == comparable(routed)
    assert fast.json()["metadata"]["managedFields"][0]["manager"] == "kubectl"  # from the User-Agent
    stored = server.http.get(server.path("agents", "fast")).json()
    assert stored == fast.json()


def test_warnings_errors_and_limits_answer_as_the_route_does(server: LiveServer) -> None:
    path = server.path("agents")
    # No provider yet: created with a warning about the reference.
    fast, routed = both(server, path, agent("w1"), agent("w2"))
    assert fast.status_code == 201 and fast.headers.get_list("warning") and comparable(fast) == comparable(routed)
    fast, routed = both(server, path, agent("w1"), agent("w2"))
    assert fast.status_code == 409 and is_status(fast.json(), 409, "AlreadyExists")
    assert fast.json()["reason"] == routed.json()["reason"]
    for body in (b"{not json", b"[]", b'{"apiVersion": 1}', b"x" * (3 * 1024 * 1024 + 1)):
        fast, routed = both(server, path, body, body, {"Content-Type": "application/json"})
        assert fast.status_code >= 400 and comparable(fast) == comparable(routed), body[:20]
    invalid = agent("bad", spec={"providerRef": {"name": 5}})
    fast, routed = both(server, path, invalid, invalid)
    assert fast.status_code == 422 and comparable(fast) == comparable(routed)
    bad_namespace = server.path("agents", namespace="Not_A_Label")
    fast, routed = both(server, bad_namespace, agent("n"), agent("n"))
    assert fast.status_code == 400 and comparable(fast) == comparable(routed)


def test_the_fast_path_serves_the_kinds_whose_create_route_it_is(store: Store) -> None:
    app = create_app(store)
    targets = resources._fast_targets(app)
    assert "/apis/joch.dev/v1alpha1/namespaces/*/agents" in targets
    assert "/api/v1/namespaces" not in targets  # Namespaces are created by corev1's own route
    found = resources._target(targets, "/apis/joch.dev/v1alpha1/namespaces/team-a/agents")
    assert found is not None and found[0].handlers.kind.kind == "Agent" and found[1] == "team-a"
    assert found[0].route.path == "/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents"
    assert resources._target(targets, "/apis/joch.dev/v1alpha1/namespaces/team-a/agents/x") is None
    assert resources._target(targets, "/apis/joch.dev/v1alpha1/namespaces//agents") is None


def test_other_paths_go_to_the_routes(server: LiveServer) -> None:
    slash = server.http.post("/apis/joch.dev/v1alpha1/namespaces/default/agents/", json=agent("x"))
    assert slash.status_code == 307  # the routes' redirect to the path without the slash
    assert slash.headers["location"].endswith("/apis/joch.dev/v1alpha1/namespaces/default/agents")
    nul = server.http.post("/apis/joch.dev/v1alpha1/namespaces/def%00ault/agents", json=agent("x"))
    assert nul.status_code == 404 and is_status(nul.json(), 404, "NotFound")  # StatusRoute's NUL rule


def test_the_fast_path_leaves_the_route_in_the_scope_as_the_router_does(namespaces: Store) -> None:
    """Middleware outside (metrics by route template, spans) reads ``scope["route"]`` after the call."""
    seen: list[tuple[str | None, dict[str, str]]] = []

    class Recorder:
        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await self.app(scope, receive, send)
            if scope["type"] != "http":
                return
            route = scope.get("route")
            seen.append((getattr(route, "path", None), scope.get("path_params", {})))

    app = create_app(namespaces)
    app.add_middleware(Recorder)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        path = "/apis/joch.dev/v1alpha1/namespaces/default/agents"
        assert client.post(path, json=agent("a")).status_code == 201
        assert client.post(path, params=ROUTE, json=agent("b")).status_code == 201
    template = "/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents"
    assert seen == [(template, {"namespace": "default"})] * 2
