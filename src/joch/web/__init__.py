"""The web console: static ES modules served at ``/console/``, talking to the server's own API.

``install(app, oidc=...)`` mounts three things:

* ``/console/`` — ``index.html`` and the modules under ``static/`` (no build step: the files in the
  wheel are the files the browser runs). They are public: a browser must load the sign-in page
  before it has a token, and they hold nothing but code. Every API call the console makes sends
  ``Authorization: Bearer`` from the tab's ``sessionStorage``; there are no cookies, so there is
  nothing for a cross-site request to ride on (no CSRF surface), and the server's guard refuses
  cross-origin API calls anyway.
* ``/console/config.json`` — public too: the server's version and, when the server verifies OIDC ID
  tokens, the issuer and client id the sign-in page runs the authorization-code flow (with PKCE)
  against. Nothing secret: a public client has no secret, and both values are in every ID token.
* ``GET /`` — a browser (``Accept: text/html``) is redirected to ``/console/``; anything else gets
  the 404 ``Status`` it got before the console existed.

Every console response carries a strict Content-Security-Policy: scripts, styles and connections
from the server's own origin only (plus the OIDC issuer's, for the token exchange), no inline script
or style, no framing. Pages build their DOM with ``textContent``, never ``innerHTML`` with data, so
whatever an agent wrote into a log or a patch stays text. This package imports nothing of the server
(layers): the server passes in what it needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from joch import __version__
from joch.api import errors

STATIC = Path(__file__).parent / "static"
PREFIX = "/console"
CONFIG_PATH = f"{PREFIX}/config.json"
NOT_FOUND = errors.NotFound('the server could not find the requested resource (get "/"): the API is under '
                           "/apis, /api and /v1; the web console is at /console/")


def content_security_policy(oidc: dict[str, Any] | None) -> str:
    """Same origin for everything; connections also to the issuer (discovery and token endpoint)."""
    connect = "'self'"
    if oidc and oidc.get("issuer"):
        parts = urlsplit(str(oidc["issuer"]))
        connect += f" {parts.scheme}://{parts.netloc}"
    return ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            f"connect-src {connect}; object-src 'none'; base-uri 'none'; form-action 'self'; "
            "frame-ancestors 'none'")


class _Console:
    """The static files, with the CSP. Browsers revalidate each file on every load (``no-cache``; the
    ETag makes that a 304): the files are not versioned by name, so an upgraded package is seen at once
    instead of a mix of old and new modules."""

    def __init__(self, csp: str) -> None:
        self.files = StaticFiles(directory=STATIC, html=True)
        self.headers = [(b"content-security-policy", csp.encode()), (b"referrer-policy", b"no-referrer")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.headers,
                                      (b"cache-control", b"no-cache")]
            await send(message)

        await self.files(scope, receive, send_with_headers)


def install(app: Starlette, *, oidc: dict[str, Any] | None) -> None:
    """Mount the console on ``app`` (the server's FastAPI app). ``oidc``: ``{"issuer", "clientId"}`` when the
    server verifies OIDC ID tokens, else None (token sign-in only)."""
    config = {"version": __version__, "oidc": dict(oidc) if oidc else None}
    csp = content_security_policy(oidc)
    body = json.dumps(config).encode()

    async def console_config(request: Request) -> Response:
        return Response(body, media_type="application/json",
                        headers={"Cache-Control": "no-cache", "Content-Security-Policy": csp})

    async def root(request: Request) -> Response:
        if "text/html" in request.headers.get("accept", ""):
            return RedirectResponse(f"{PREFIX}/", status_code=302)
        return JSONResponse(NOT_FOUND.to_status(), status_code=NOT_FOUND.code)

    async def bare(request: Request) -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=301)

    app.add_route(CONFIG_PATH, console_config, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_route("/", root, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_route(PREFIX, bare, methods=["GET", "HEAD"], include_in_schema=False)
    console: ASGIApp = _Console(csp)
    app.mount(PREFIX, console, name="console")


def is_console_path(method: str, path: str) -> bool:
    """A request the auth middleware lets through without a token: reading the console's files."""
    return method in ("GET", "HEAD") and (path == "/" or path == PREFIX or path.startswith(f"{PREFIX}/"))
