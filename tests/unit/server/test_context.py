"""Every request runs with a RequestContext: its Audit-Id, peer address and verb."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from joch.api.identity import ANONYMOUS, current_request
from joch.server.context import RequestContextMiddleware
from joch.server.testing import ServerThread


def _app() -> FastAPI:
    app = FastAPI()

    def seen() -> dict[str, object]:  # sync: runs in the threadpool, as the resource routes do
        ctx = current_request()
        assert ctx is not None
        return {"user": ctx.user.name, "id": ctx.request_id, "ip": ctx.source_ip, "verb": ctx.verb}

    app.add_api_route("/seen", seen, methods=["GET", "POST"])
    app.add_middleware(RequestContextMiddleware)
    return app


def test_handler_sees_the_request_context_and_the_client_its_audit_id() -> None:
    with ServerThread(_app()) as server:
        r = httpx.post(f"{server.url}/seen", headers={"X-Request-Id": "req-42"})
    assert r.json() == {"user": ANONYMOUS.name, "id": "req-42", "ip": "127.0.0.1", "verb": "create"}
    assert r.headers["audit-id"] == "req-42"


def test_an_unprintable_or_long_request_id_is_replaced() -> None:
    with ServerThread(_app()) as server:
        replies = [httpx.get(f"{server.url}/seen", headers={"X-Request-Id": given}) for given in ("x" * 200, "a b")]
    for given, r in zip(("x" * 200, "a b"), replies, strict=True):
        assert r.json()["id"] != given and len(r.json()["id"]) == 36
        assert r.headers["audit-id"] == r.json()["id"]
    assert current_request() is None  # nothing leaks out of the request
