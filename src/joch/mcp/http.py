"""``/mcp`` on ``joch server``: MCP over streamable HTTP, each request acting as its bearer token's user.

``install(app)`` adds the route. The SDK's session manager runs in the app's lifespan (uvicorn
runs it; without a lifespan the route answers 503), started by the first MCP request: the SDK takes
about a second of CPU to import, which a server nobody asks over MCP never spends, and which no
server's start waits for. The route sits behind the app's own middleware
like every other: ``guard.Guard`` refuses web pages of other origins and foreign ``Host`` names (so
the SDK's own DNS-rebinding check, which knows nothing of ``--allowed-host``, is off), and the auth
middleware answers 401 to a request without a valid token when authentication is configured
(``joch.server.auth.requests`` lets every authenticated user reach ``/mcp``: what they may do is
decided per tool call).

A tool call is a request to the same app in-process (``in_process_client``, Host ``127.0.0.1``)
carrying the MCP request's ``Authorization`` header and coming from its client's address, so it is
authenticated, authorised, admitted and audited as that user, exactly as if they had called the API.
The transport is stateless with JSON answers: no session outlives its request, so no session can be
borrowed by another token.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from joch.api import errors
from joch.mcp.api import Api

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

logger = logging.getLogger(__name__)
_peer: ContextVar[tuple[str, int] | None] = ContextVar("joch_mcp_peer", default=None)
"""The address of the MCP request's client, for the in-process requests its tools make (the audit
log's source IP): set by the endpoint, it reaches them through the tasks the SDK and
``_InProcess`` start, which copy the context they are started from."""

PATH = "/mcp"
IN_PROCESS = "http://127.0.0.1"
TIMEOUT_SECONDS = 60.0
MAX_BODY_BYTES = 4 * 1024 * 1024
"""The largest MCP message taken, the SDK's own limit (``DEFAULT_MAX_REQUEST_BODY_SIZE``), checked here
first so that a larger one is a ``Status`` 413 like every other route's, not the SDK's plain text."""


def bearer(headers: Mapping[str, str] | None) -> str | None:
    scheme, _, token = ((headers or {}).get("authorization") or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def install(app: Starlette) -> None:
    """Serve MCP at ``PATH`` on ``app``, calling ``app`` itself as each request's user. The MCP server
    is built once the first MCP request of a running app asks for it, by a task of the app's lifespan
    (in its context, not the request's), so building or starting an app costs nothing more (tests
    build hundreds) and the SDK is imported only by a server asked over MCP."""
    endpoint = _Endpoint()
    app.router.routes.append(Route(PATH, endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    outer = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(instance: Any) -> AsyncIterator[Any]:
        sessions = _Sessions(app)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sessions.serve_when_asked, tasks)
            endpoint.sessions = sessions
            try:
                async with outer(instance) as state:
                    yield state
            finally:
                endpoint.sessions = None
                sessions.stop()
                tasks.cancel_scope.cancel()  # the sessions, if a request started them

    app.router.lifespan_context = lifespan


class _Sessions:
    """The SDK's session manager of one run of the app's lifespan, started when first asked for."""

    def __init__(self, app: ASGIApp) -> None:
        self.server = app
        self.asked = anyio.Event()
        self.settled = anyio.Event()  # started, failed to start, or stopping
        self.app: ASGIApp | None = None
        self.problem = "the server is stopping"

    async def get(self) -> ASGIApp | None:
        self.asked.set()
        await self.settled.wait()
        return self.app

    def stop(self) -> None:
        self.app = None
        self.settled.set()

    async def serve_when_asked(self, tasks: TaskGroup) -> None:
        await self.asked.wait()
        http = in_process_client(self.server, tasks)
        async with http:
            try:
                # The SDK's import and the tools' models take a second of CPU: in a thread, the loop
                # goes on serving meanwhile.
                app, manager = await anyio.to_thread.run_sync(_session_manager, http)
            except Exception as exc:  # /mcp says so (503), and the server serves on
                logger.exception("the MCP sessions could not start")
                self.problem = f"the MCP sessions could not start ({type(exc).__name__}: {exc}; see the server log)"
                self.settled.set()
                return
            async with manager.run():
                self.app = app
                self.settled.set()
                await anyio.sleep_forever()


def in_process_client(app: ASGIApp, tasks: TaskGroup) -> httpx.AsyncClient:
    """An HTTP client calling ``app`` in this process, each answer a stream (the app runs in ``tasks``)."""
    return httpx.AsyncClient(transport=_InProcess(app, tasks), base_url=IN_PROCESS, timeout=TIMEOUT_SECONDS)


class _InProcess(httpx.AsyncBaseTransport):
    """Requests to an ASGI app in this process, its answer read as it is sent.

    ``httpx.ASGITransport`` runs the app to its end and gathers the whole body first, so reading
    the first megabyte of a 1 GiB ``changes.patch`` (``Api.excerpt``) would hold the gigabyte,
    once per concurrent call. Here the body passes through a small buffer as the reader takes it,
    and a reader that closes the answer early is a client that hung up: the app's ``receive``
    says ``http.disconnect`` and a streaming response stops (as Starlette's does)."""

    def __init__(self, app: ASGIApp, tasks: TaskGroup) -> None:
        self.app = app
        self.tasks = tasks

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        started, gone = anyio.Event(), anyio.Event()
        head: dict[str, Any] = {}
        chunks_in, chunks_out = anyio.create_memory_object_stream[bytes](4)
        unread = [body]

        async def receive() -> Message:
            if unread:
                return {"type": "http.request", "body": unread.pop(), "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                head.update(status=message["status"], headers=message.get("headers", []))
                started.set()
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                        await chunks_in.send(bytes(message["body"]))
                if not message.get("more_body", False):
                    chunks_in.close()

        async def serve() -> None:
            try:
                await self.app(_scope(request), receive, send)
            except Exception:  # the app's own error handling failed; not a reason to end every other request
                logger.exception("%s %s in process failed", request.method, request.url.path)
            finally:
                chunks_in.close()
                started.set()

        self.tasks.start_soon(serve)
        try:
            await started.wait()
        except BaseException:  # the caller gave up (cancelled) before the answer began: nobody will read it
            await _Body(chunks_out, gone).aclose()
            raise
        if "status" not in head:
            chunks_out.close()
            raise httpx.RemoteProtocolError(f"{request.method} {request.url.path} ended without an answer")
        return httpx.Response(head["status"], headers=head["headers"], stream=_Body(chunks_out, gone))


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: MemoryObjectReceiveStream[bytes], gone: anyio.Event) -> None:
        self.chunks = chunks
        self.gone = gone

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        self.gone.set()
        self.chunks.close()


def _scope(request: httpx.Request) -> Scope:
    """The ASGI scope of ``request``, as ``httpx.ASGITransport`` builds it, from the MCP client's address."""
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
        "headers": [(k.lower(), v) for (k, v) in request.headers.raw], "scheme": request.url.scheme,
        "path": request.url.path, "raw_path": request.url.raw_path.split(b"?")[0],
        "query_string": request.url.query, "server": (request.url.host, request.url.port),
        "client": _peer.get() or ("127.0.0.1", 0), "root_path": "",
    }


def _session_manager(http: httpx.AsyncClient) -> tuple[ASGIApp, StreamableHTTPSessionManager]:
    """The SDK's ASGI app and its session manager, serving ``joch.mcp.server`` over ``http``."""
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
    from mcp.server.transport_security import TransportSecuritySettings

    from joch.mcp.server import create

    server = create(lambda headers: Api(http, bearer(headers)))
    server.streamable_http_app(
        streamable_http_path=PATH, stateless_http=True, json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return StreamableHTTPASGIApp(server.session_manager), server.session_manager


class _Endpoint:
    """The SDK's ASGI app for a POST, or a ``Status`` instead: 405 for GET and DELETE, and while
    the app's lifespan is not running (an app served without it, an embedder's choice) 503.

    Stateless, the server has no stream to offer a GET and no session for a DELETE to end: the
    SDK would answer a GET with an event stream that never carries an event and stays open as
    long as the client likes (a connection and a task each, however many a caller opens). The
    spec's answer for a server without that stream is 405, which clients take in their stride."""

    def __init__(self) -> None:
        self.sessions: _Sessions | None = None
        """The running lifespan's sessions; None while the lifespan does not run."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        _peer.set(scope.get("client"))
        if scope["method"] != "POST":
            error: errors.JochError = errors.MethodNotAllowed(
                f"{PATH} takes POST only: each MCP message is a request of its own (stateless), so there is "
                "no stream to GET and no session to DELETE")
            await JSONResponse(error.to_status(), status_code=error.code, headers={"Allow": "POST"})(
                scope, receive, send)
            return
        sessions = self.sessions
        app = None if sessions is None else await sessions.get()
        if app is None:
            problem = ("the server was started without its lifespan (uvicorn --lifespan off), which runs the "
                       "MCP sessions") if sessions is None else sessions.problem
            error = errors.ServiceUnavailable(f"{PATH} is not available: {problem}")
            await JSONResponse(error.to_status(), status_code=error.code)(scope, receive, send)
            return
        try:
            body = await _read_body(scope, receive)
        except errors.RequestEntityTooLarge as exc:
            await JSONResponse(exc.to_status(), status_code=exc.code, headers={"Connection": "close"})(
                scope, receive, send)
            return
        await _until_disconnected(app, scope, _replaying(body, receive), send)


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    """The request's body, at most ``MAX_BODY_BYTES`` (a larger declared or sent one: 413)."""
    too_large = errors.RequestEntityTooLarge(
        f"the MCP message is larger than the limit of {MAX_BODY_BYTES} bytes: send a smaller one (a manifest "
        "this large belongs in a file applied with joch apply -f)")
    for name, value in scope.get("headers") or ():
        if name == b"content-length" and value.isdigit() and int(value) > MAX_BODY_BYTES:
            raise too_large
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise errors.BadRequest("the client went away before sending the whole message")
        chunk = message.get("body") or b""
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the body already read handed out first, as one message."""
    unread = [body]

    async def replay() -> Message:
        if unread:
            return {"type": "http.request", "body": unread.pop(), "more_body": False}
        return await receive()

    return replay


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
