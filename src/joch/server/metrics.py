"""``GET /metrics`` in Prometheus' text format, and the middleware counting HTTP requests.

Who may scrape: as on kube-apiserver, ``/metrics`` is a non-resource URL. With authentication
configured it takes a token allowed to ``get`` it: an admin of every namespace, or a member of the
group ``system:monitoring`` (``joch.server.auth.rbac``), which is what a scraper's token-file line
or OIDC group should carry. ``joch server --metrics-public`` makes it readable without a token,
for a scraper on a trusted network; the guard (Host and Origin checks) still applies.

``HTTPMetrics`` is one pure ASGI middleware, between the guard and authentication, so 401s and
403s are counted too. It labels a request with its route's template (``scope["route"]``, which the
router sets), never its path: creating objects under fifty names is one series. A request the
router never saw (refused by authentication, or matching no route) is matched against the routes
here, which costs a scan, but only on those. Time is measured until the response starts, so a watch
or a followed log counts its set-up, not how long it stayed open.

The public scrape is answered by the middleware itself, before authentication; the route serves
the same body behind it otherwise.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from prometheus_client.exposition import choose_encoder
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from joch.server.options import ServerOptions
from joch.telemetry import metrics

PATH = "/metrics"
UNMATCHED = "unmatched"  # the route label of a request no route matches (a 404)


async def scrape(request: Request) -> Response:
    """The exposition (OpenMetrics when the scraper's Accept asks for it, else Prometheus' text
    format), rendered in a worker thread: collectors read the store and the caches (with several
    worker processes, also every worker's files: ``metrics.registry``)."""
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    body = await run_in_threadpool(encode, metrics.registry())
    return Response(body, headers={"Content-Type": content_type})


class HTTPMetrics:
    def __init__(self, app: ASGIApp, *, routes: list[BaseRoute], public: bool = False) -> None:
        self.app = app
        self.routes = routes
        self.public = public
        self.http = metrics.HTTP()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method: str = scope["method"]

        async def measured(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.http.observe(method, self.template(scope), message["status"], time.perf_counter() - started)
            await send(message)

        if self.public and scope["path"] == PATH and method in ("GET", "HEAD"):
            response = await scrape(Request(scope, receive))
            await response(scope, receive, measured)
            return
        await self.app(scope, receive, measured)

    def template(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is None:
            route = self._match(scope)
        if route is None:
            return UNMATCHED
        return str(getattr(route, "path_format", None) or getattr(route, "path", UNMATCHED))

    def _match(self, scope: Scope) -> BaseRoute | None:
        partial = None
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return route
            if match is Match.PARTIAL and partial is None:
                partial = route  # the path matches, the method does not: a 405 for this route
        return partial


def install(app: FastAPI, options: ServerOptions) -> None:
    """The route, and the middleware (call after authentication's ``install``, before the guard's:
    the last ``add_middleware`` is the outermost)."""
    app.add_api_route(PATH, scrape, methods=["GET"], include_in_schema=False)
    app.add_middleware(HTTPMetrics, routes=app.router.routes, public=options.metrics_public)
