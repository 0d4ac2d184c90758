"""Who may drive the server: the Host, Origin and Content-Type checks in front of every route.

There is no authentication yet, and on loopback that is fine for a laptop: only the user's own
processes can connect. Their web browser is one of them, though, and runs whatever page the user
visits. Without this guard a page on ``http://evil.example`` could POST an AgentProvider and an
AgentRun to ``http://127.0.0.1:8080`` and so run commands as the user. ``Guard`` is one ASGI
middleware, installed by ``create_app`` for every deployment, that closes the three ways in:

* **DNS rebinding** (the page's own name resolving to 127.0.0.1, so the browser considers the
  server same-origin): the ``Host`` header must name this server. Accepted: any IP address literal
  (a rebinding attack always carries the attacker's *name*), ``localhost``, the address or name the
  server is bound to, and the names given with ``--allowed-host`` (``*`` turns the check off), with
  any port. Bound to a wildcard (``0.0.0.0``, ``::``), the machine's host name is accepted too; any
  other name a client uses (a DNS alias, a reverse proxy passing its own ``Host``) must be listed.
  Anything else is a 400 naming the flag: Starlette's ``TrustedHostMiddleware`` and Django answer
  a foreign ``Host`` the same way.
* **Cross-origin requests** (the page calling ``http://127.0.0.1:8080`` directly): a request whose
  ``Origin`` is not the server's own, or whose ``Sec-Fetch-Site`` says ``cross-site`` or
  ``same-site`` (another port on the same host is another origin), is a 403, whatever its method.
  Writes are the danger; reads are refused too because a page has no business holding watches or
  following logs on the user's server, and a browser would not let it read the answers anyway.
  Top-level navigations (``Sec-Fetch-Mode: navigate`` and ``Sec-Fetch-Dest: document`` on a GET
  or HEAD: the user followed a link to ``/docs``) are let through, as the page cannot read what
  they return. A navigation inside a frame (``Sec-Fetch-Dest: iframe``) is not: a page could
  otherwise frame the Swagger UI and trick the user's clicks into its "Execute" buttons
  (clickjacking), or hold watches open in hidden frames. Origins listed with
  ``--allowed-origin`` (exact ``scheme://host[:port]``) are exempt and get CORS headers, preflights
  included (with Chrome's Private Network Access grant when asked); no other response carries
  any. Kubernetes clients (kubectl, client-go, the Python client) and the CLI send neither header
  and are unaffected, as is the same-origin Swagger UI.
* **Form-shaped writes** (what a browser may send cross-origin without a CORS preflight, and what
  an old browser sends without ``Origin``): POST, PUT and PATCH must say their body is JSON
  (``application/json``, ``application/*+json``: merge and JSON patches), YAML, an apply patch, or
  Kubernetes protobuf (kubectl's self-reviews);
  ``text/plain``, form types and a missing ``Content-Type`` are a 415 before any route runs. Every
  type accepted here forces a browser to preflight, which the origin check refuses. The route then
  checks the type it actually takes (a PATCH wants a merge patch) and names it in its own 415.

Every response, refused or not, also says it may not be framed (``X-Frame-Options: DENY``,
``Content-Security-Policy: frame-ancestors 'none'``: for browsers that send no ``Sec-Fetch-*``)
and may not be sniffed into another type (``X-Content-Type-Options: nosniff``: a run's log is
text the agent wrote).

The checks run in that order, so one Status explains the first problem. DELETE and the custom
``WATCH`` method need a preflight in any browser and are covered by the origin check alone.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from joch.api import errors
from joch.server import wire
from joch.server.errors import status_response
from joch.server.options import ServerOptions

ANY_HOST = "*"
LOOPBACK_NAMES = frozenset({"localhost"})
WRITES = frozenset({"POST", "PUT", "PATCH"})
READS = frozenset({"GET", "HEAD"})
CROSS_SITES = frozenset({"cross-site", "same-site"})
APPLY_PATCH = "application/apply-patch+yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"  # kubectl's self-reviews; routes refuse it unless they read it
OCTET_STREAM = "application/octet-stream"  # a Job's runner uploading artifacts (server.runreports); preflighted too
DEFAULT_PORTS = {"http": 80, "https": 443}
CORS_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE"
CORS_MAX_AGE = "600"
ACCEPTED = "application/json, application/merge-patch+json or application/yaml"
TOP_LEVEL = frozenset({"document", None})  # None: a browser from before Sec-Fetch-Dest (Chrome 76-79)
ACCEPTED_HOSTS_KEPT = 64  # bounded: a client sending a new good Host each time only loses the shortcut
SECURITY_HEADERS = (("X-Frame-Options", "DENY"), ("Content-Security-Policy", "frame-ancestors 'none'"),
                    ("X-Content-Type-Options", "nosniff"))


def normalize_host(value: str) -> str:
    """A name for ``--allowed-host``: a host name or IP address without a port, or ``*``."""
    text = value.strip().lower()
    if text == ANY_HOST or _is_ip(text.strip("[]")):
        return text.strip("[]")
    split = split_host(text)
    if split is None or not split[0]:
        raise ValueError(f'"{value}" is not a host name or IP address')
    name, port = split
    if port is not None:
        raise ValueError(f'"{value}" has a port: give the name alone ({name}); every port is accepted')
    return name


def normalize_origin(value: str) -> str:
    """An origin for ``--allowed-origin``: exactly ``scheme://host[:port]``, as browsers send it."""
    text = value.strip()
    example = "give the origin as a browser sends it, e.g. https://app.example.com or http://localhost:3000"
    if text in ("*", "null"):
        raise ValueError(f'"{value}" cannot be allowed (any page could drive the server); {example}')
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ValueError(f'"{value}" is not a valid origin; {example}') from None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f'"{value}" is not an origin (scheme://host[:port], nothing else); {example}')
    return _origin_key(parts.scheme, parts.hostname, port)


def split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header value (lower-cased, IPv6 without brackets, a trailing
    dot dropped), or None when it is not one."""
    text = value.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        name, rest = text[1:end], text[end + 1:]
        if end < 0 or not _is_ip(name, version=6):  # brackets hold an IPv6 address and nothing else
            return None
    else:
        name, colon, port_text = text.partition(":")
        rest = colon + port_text
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= len(":65535")):
        return None
    if not name or any(c.isspace() or c in "/\\@?#," for c in name):
        return None
    return name.removesuffix(".") or name, int(rest[1:]) if rest else None


def is_wildcard(host: str) -> bool:
    """``0.0.0.0``, ``::`` or empty: every address of the machine."""
    name = host.strip().strip("[]")
    return not name or (_is_ip(name) and ipaddress.ip_address(name).is_unspecified)


def is_loopback(host: str) -> bool:
    name = host.strip().lower().strip("[]")
    return name in LOOPBACK_NAMES or (_is_ip(name) and ipaddress.ip_address(name).is_loopback)


def _is_ip(name: str, *, version: int | None = None) -> bool:
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return version is None or address.version == version


def _origin_key(scheme: str, name: str, port: int | None) -> str:
    """``scheme://host[:port]`` with the scheme's default port left out, as browsers write it."""
    host = f"[{name}]" if ":" in name else name
    return f"{scheme}://{host}" if port in (None, DEFAULT_PORTS.get(scheme)) else f"{scheme}://{host}:{port}"


def _host_key(host: tuple[str, int | None], scheme: str) -> tuple[str, int | None]:
    name, port = host
    return name, None if port == DEFAULT_PORTS.get(scheme) else port


@dataclass(frozen=True)
class _Request:
    method: str
    hosts: list[str]
    origin: str | None
    fetch_site: str | None
    fetch_mode: str | None
    fetch_dest: str | None
    content_type: str | None
    preflight: bool
    scheme: str

    @classmethod
    def of(cls, scope: Scope) -> _Request:
        hosts: list[str] = []
        found: dict[bytes, str] = {}
        for key, value in scope["headers"]:
            if key == b"host":
                hosts.append(value.decode("latin-1"))
            elif key in (b"origin", b"sec-fetch-site", b"sec-fetch-mode", b"sec-fetch-dest", b"content-type",
                         b"access-control-request-method"):
                found.setdefault(key, value.decode("latin-1"))
        method = str(scope["method"]).upper()
        return cls(
            method=method, hosts=hosts, origin=found.get(b"origin"),
            fetch_site=(found.get(b"sec-fetch-site") or "").strip().lower() or None,
            fetch_mode=(found.get(b"sec-fetch-mode") or "").strip().lower() or None,
            fetch_dest=(found.get(b"sec-fetch-dest") or "").strip().lower() or None,
            content_type=found.get(b"content-type"),
            preflight=method == "OPTIONS" and b"access-control-request-method" in found and b"origin" in found,
            scheme=str(scope.get("scheme") or "http"),
        )


class Guard:
    def __init__(self, app: ASGIApp, *, options: ServerOptions) -> None:
        self.app = app
        self.any_host = ANY_HOST in options.allowed_hosts
        self.names = self._names(options.bind_host, options.allowed_hosts)
        self.origins = frozenset(normalize_origin(origin) for origin in options.allowed_origins)
        self.accepted_hosts: set[str] = set()  # Host values found good, as sent (parsing one is ~10 µs)

    @staticmethod
    def _names(bind_host: str, allowed: Iterable[str]) -> frozenset[str]:
        names = set(LOOPBACK_NAMES) | {normalize_host(name) for name in allowed if name != ANY_HOST}
        if is_wildcard(bind_host):
            names.add(socket.gethostname().lower())
        elif not _is_ip(bind_host.strip("[]")):  # addresses are accepted anyway
            names.add(normalize_host(bind_host))
        return frozenset(names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = _Request.of(scope)
        send = _with_headers(send, SECURITY_HEADERS)
        try:
            self._check_host(request)
            allowed_origin = self._check_origin(request)
        except errors.JochError as exc:
            await status_response(exc)(scope, receive, send)
            return
        if allowed_origin is not None:
            if request.preflight:
                await _preflight(allowed_origin, scope)(scope, receive, send)
                return
            send = _with_cors(send, allowed_origin)
        try:
            _check_content_type(request)
        except errors.JochError as exc:
            await status_response(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check_host(self, request: _Request) -> None:
        if self.any_host or not request.hosts:  # no Host at all: HTTP/1.0, never a browser
            return
        if len(request.hosts) > 1:
            raise errors.BadRequest("the request has more than one Host header")
        if request.hosts[0] in self.accepted_hosts:  # every request of a client names the same Host
            return
        host = split_host(request.hosts[0])
        if host is None:
            raise errors.BadRequest(f"the Host header {request.hosts[0]!r} is not a host name and port")
        name = host[0]
        if name in self.names or _is_ip(name):
            if len(self.accepted_hosts) < ACCEPTED_HOSTS_KEPT:
                self.accepted_hosts.add(request.hosts[0])
            return
        raise errors.BadRequest(
            f"the Host header names {name!r}, which this server does not answer to (a web page using "
            f"DNS rebinding would look like this); if you reach the server by that name, start it with "
            f"--allowed-host {name}"
        )

    def _check_origin(self, request: _Request) -> str | None:
        """The allowed origin a cross-origin request comes from (it gets CORS headers), or None for
        a same-origin or non-browser request; a 403 for any other cross-origin request."""
        origin = self._origin(request.origin) if request.origin is not None else None
        if origin is not None and origin in self.origins:
            return origin
        if not self._cross_origin(request):
            return None
        if request.method in READS and request.fetch_mode == "navigate" and request.fetch_dest in TOP_LEVEL:
            return None
        source = f"from {request.origin.strip()!r}" if request.origin else f"(Sec-Fetch-Site: {request.fetch_site})"
        raise errors.Forbidden(
            f"cross-origin request {source} refused: web pages from other origins may not use this API; "
            f"to let one, start the server with --allowed-origin {origin or 'ORIGIN'}"
        )

    @staticmethod
    def _origin(origin: str) -> str | None:
        try:
            return normalize_origin(origin)
        except ValueError:
            return None

    @staticmethod
    def _cross_origin(request: _Request) -> bool:
        if request.fetch_site in CROSS_SITES:
            return True
        if request.origin is None:
            return False
        try:
            parts = urlsplit(request.origin.strip())
            origin = (parts.hostname or "", parts.port)
        except ValueError:
            return True
        host = split_host(request.hosts[0]) if len(request.hosts) == 1 else None
        if not parts.hostname or host is None:
            return True
        # Ports compared with each side's default left out: behind a TLS proxy, an https page on
        # joch.example (port 443) reaches the server as Host "joch.example" over plain http.
        return _host_key(origin, parts.scheme) != _host_key(host, request.scheme)


def _preflight(allowed_origin: str, scope: Scope) -> Response:
    headers = {
        "Access-Control-Allow-Origin": allowed_origin,
        "Access-Control-Allow-Methods": CORS_METHODS,
        "Access-Control-Max-Age": CORS_MAX_AGE,
        "Vary": "Origin",
    }
    for key, value in scope["headers"]:
        if key == b"access-control-request-headers":
            headers["Access-Control-Allow-Headers"] = value.decode("latin-1")
        elif key == b"access-control-request-private-network":
            # Chrome's Private Network Access: a public page asking for a loopback server.
            headers["Access-Control-Allow-Private-Network"] = "true"
    return Response(status_code=204, headers=headers)


def _with_cors(send: Send, allowed_origin: str) -> Send:
    async def send_with_cors(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            headers["Access-Control-Allow-Origin"] = allowed_origin
            headers["Access-Control-Expose-Headers"] = "Warning"
            headers.add_vary_header("Origin")
        await send(message)

    return send_with_cors


def _with_headers(send: Send, headers: Iterable[tuple[str, str]]) -> Send:
    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            response_headers = MutableHeaders(scope=message)
            for key, value in headers:
                response_headers.setdefault(key, value)
        await send(message)

    return send_with_headers


def _check_content_type(request: _Request) -> None:
    if request.method not in WRITES:
        return
    kind = wire.media_type(request.content_type)
    if wire.is_json(kind) or kind in wire.YAML_TYPES or kind in (APPLY_PATCH, PROTOBUF, OCTET_STREAM):
        return
    if not kind:
        raise errors.UnsupportedMediaType(
            f"a {request.method} must say what its body is: send {ACCEPTED} and say so in the "
            f"Content-Type header (curl: -H 'Content-Type: application/json')"
        )
    raise wire.unsupported(kind, ACCEPTED)
