"""``/mcp`` on ``joch server``: MCP over streamable HTTP, each request acting as its bearer token's user.

``install(app)`` adds the route and runs the SDK's session manager in the app's lifespan (uvicorn
runs it; without a lifespan the route answers 503). The route sits behind the app's own middleware
like every other: ``guard.Guard`` refuses web pages of other origins and foreign ``Host`` names (so
the SDK's own DNS-rebinding check, which knows nothing of ``--allowed-host``, is off), and the auth
middleware answers 401 to a request without a valid token when authentication is configured
(``joch.server.auth.requests`` lets every authenticated user reach ``/mcp``: what they may do is
decided per tool call).

A tool call is a request to the same app in-process (``httpx.ASGITransport``, Host ``127.0.0.1``)
carrying the MCP request's ``Authorization`` header, so it is authenticated, authorised, admitted
and audited as that user, exactly as if they had called the API. The transport is stateless with
JSON answers: no session outlives its request, so no session can be borrowed by another token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from joch.api import errors
from joch.mcp.api import Api

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

PATH = "/mcp"
IN_PROCESS = "http://127.0.0.1"
TIMEOUT_SECONDS = 60.0


def bearer(headers: Mapping[str, str] | None) -> str | None:
    scheme, _, token = ((headers or {}).get("authorization") or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def install(app: Starlette) -> None:
    """Serve MCP at ``PATH`` on ``app``, calling ``app`` itself as each request's user. The MCP server
    is built when the app starts (its lifespan), so building an app costs nothing more (tests build
    hundreds) and the SDK is imported only by a server that serves."""
    endpoint = _Endpoint()
    app.router.routes.append(Route(PATH, endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    outer = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(instance: Any) -> AsyncIterator[Any]:
        from mcp.server.streamable_http_manager import StreamableHTTPASGIApp

        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=IN_PROCESS,
                                 timeout=TIMEOUT_SECONDS)
        manager = _session_manager(http)
        async with manager.run(), http, outer(instance) as state:
            endpoint.app = StreamableHTTPASGIApp(manager)
            try:
                yield state
            finally:
                endpoint.app = None

    app.router.lifespan_context = lifespan


def _session_manager(http: httpx.AsyncClient) -> StreamableHTTPSessionManager:
    from mcp.server.transport_security import TransportSecuritySettings

    from joch.mcp.server import create

    server = create(lambda headers: Api(http, bearer(headers)))
    server.streamable_http_app(
        streamable_http_path=PATH, stateless_http=True, json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return server.session_manager


class _Endpoint:
    """The SDK's ASGI app for a POST, or a ``Status`` instead: 405 for GET and DELETE, and while
    the sessions are not running (an app served without its lifespan, an embedder's choice) 503.

    Stateless, the server has no stream to offer a GET and no session for a DELETE to end: the
    SDK would answer a GET with an event stream that never carries an event and stays open as
    long as the client likes (a connection and a task each, however many a caller opens). The
    spec's answer for a server without that stream is 405, which clients take in their stride."""

    def __init__(self) -> None:
        self.app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            error: errors.JochError = errors.MethodNotAllowed(
                f"{PATH} takes POST only: each MCP message is a request of its own (stateless), so there is "
                "no stream to GET and no session to DELETE")
            await JSONResponse(error.to_status(), status_code=error.code, headers={"Allow": "POST"})(
                scope, receive, send)
            return
        if self.app is not None:
            await _until_disconnected(self.app, scope, receive, send)
            return
        error = errors.ServiceUnavailable(f"{PATH} is not available: the server was started without its lifespan "
                                          "(uvicorn --lifespan off), which runs the MCP sessions")
        await JSONResponse(error.to_status(), status_code=error.code)(scope, receive, send)


async def _until_disconnected(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """``app`` answering the request, cancelled when the client goes away.

    Stateless with JSON answers, the SDK reads the body and then never looks at the connection
    again: a ``joch_wait_run`` whose client hung up would poll the run for up to half an hour, and
    a caller opening and dropping many would make the server poll itself many times a second. Once
    the body is read, this waits on the connection for ``http.disconnect`` and cancels ``app``
    (which ends the tool: the SDK terminates the request's transport even when cancelled); a
    ``receive`` of ``app`` after its body gets the same disconnect, without reading the socket twice."""
    body_read, gone = anyio.Event(), anyio.Event()

    async def app_receive() -> Message:
        if body_read.is_set():
            await gone.wait()
            return {"type": "http.disconnect"}
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
        elif not message.get("more_body", False):
            body_read.set()
        return message

    async with anyio.create_task_group() as group:
        async def watch() -> None:
            await body_read.wait()
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            group.cancel_scope.cancel()

        group.start_soon(watch)
        await app(scope, app_receive, send)
        group.cancel_scope.cancel()
