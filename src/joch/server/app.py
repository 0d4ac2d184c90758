"""The FastAPI application: assembled from one module per concern, every route from the registry.

``create_app`` is side-effect free apart from building routes: it neither opens nor closes the
store (``serve`` owns the store's lifetime) nor the runtime it may be given (which serves run logs
and artifacts), so tests and embedders can build several apps over one store. Routes use
``errors.StatusRoute`` so nothing but a Kubernetes ``Status`` leaves on failure. Every app has
``guard.Guard`` in front of its routes (Host, Origin and Content-Type checks): there is no way to
build one that a web page can drive. Behind the guard, ``joch.server.auth`` authenticates the
caller and authorizes the request (or, with no authenticator configured, lets everything through).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from joch import __version__
from joch.api import REGISTRY
from joch.api.registry import Registry
from joch.mcp import http as mcp_http
from joch.runtime.base import Runtime
from joch.server import (
    audit,
    context,
    corev1,
    discovery,
    errors,
    events_view,
    guard,
    health,
    limits,
    metering,
    metrics,
    openapi,
    resources,
    runreports,
    runs,
    schemas,
    v1,
    webhooks,
)
from joch.server.auth import setup as auth
from joch.server.options import ServerOptions
from joch.store.base import Store
from joch.telemetry import tracing
from joch.web import install as install_console

NATIVE_TELEMETRY_OFF: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
DESCRIPTION = (
    "Kubernetes-compatible REST and watch API for Joch resources, plus the Joch /v1 routes. "
    "Errors are Kubernetes Status objects."
)


def create_app(
    store: Store, *, options: ServerOptions | None = None, registry: Registry = REGISTRY,
    runtime: Runtime | None = None,
) -> FastAPI:
    options = options or ServerOptions()
    # FastAPI's native OpenTelemetry is off: Joch makes its own server spans (``telemetry.tracing``),
    # with its own provider, and FastAPI's would look up three global providers on every request.
    app = FastAPI(title="Joch", version=__version__, description=DESCRIPTION, redoc_url=None,
                  telemetry=NATIVE_TELEMETRY_OFF)
    app.router.route_class = errors.StatusRoute
    app.state.store = store
    app.state.options = options
    app.state.runtime = runtime  # where run logs and artifacts are read (``runs``); None: not served
    slots = limits.WatchSlots(options.max_watches or limits.default_max_watches())
    app.state.watch_slots = slots
    errors.install(app)
    health.install(app, store)
    discovery.install(app, registry, options)
    openapi.install(app, registry)
    kind_schemas = schemas.for_registry(registry)
    corev1.install(app, store, registry, options, kind_schemas)  # before the generic routes it overrides
    for kind in registry:
        resources.install(app, kind, store, options, kind_schemas, slots)
    corev1.drop_shadowed(app)
    v1.install(app, store, options, registry, kind_schemas, slots)
    events_view.install(app, store, options, slots)
    runs.install(app, store, options, kind_schemas)
    webhooks.install(app, store, options, kind_schemas)
    audit.install(app, store, registry, kind_schemas)
    metering.install(app, store, options, kind_schemas)
    runreports.install(app, store)
    schemas.install(app, kind_schemas)
    install_console(app, oidc=_console_oidc(options))
    mcp_http.install(app)  # /mcp: MCP over streamable HTTP, each call made as its bearer token's user
    app.add_middleware(resources.FastCreates, routes=app, max_body_bytes=options.max_body_bytes)  # innermost
    app.add_middleware(context.RequestContextMiddleware)
    auth.install(app, store, options)  # routes, and the middleware between the context and the guard
    metrics.install(app, options)  # /metrics, and the middleware counting requests (outside authentication)
    app.add_middleware(guard.Guard, options=options)
    if tracing.enabled():  # outermost, so refused requests are traced too; nothing at all when off
        app.add_middleware(tracing.RequestSpans)
    return app


def _console_oidc(options: ServerOptions) -> dict[str, str] | None:
    """What the console's sign-in page needs to run the OIDC flow: the issuer and the client id."""
    oidc = options.auth.oidc
    return {"issuer": oidc.issuer_url, "clientId": oidc.client_id} if oidc is not None else None
