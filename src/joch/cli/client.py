"""The HTTP client the commands share, and the one place transport failures become Joch errors.

Requests carry ``Authorization: Bearer TOKEN`` when the command has a token (``--token``,
``JOCH_TOKEN`` or the current context's; see ``joch.cli.contexts``).

Every failure leaves this module as a ``joch.api.errors.JochError`` so the command layer has a
single thing to report, never an ``httpx`` traceback:

* the server URL is checked before anything is sent (``server_url``): a malformed one is a
  ``BadRequest`` (exit code 2) naming where it came from (``--server`` or ``JOCH_SERVER``);
* a refused connection, a timeout, a broken connection or a peer that does not speak HTTP is
  ``ServiceUnavailable`` (exit code 7) in one line;
* a ``Status`` body is rebuilt with ``errors.from_status`` so the server's reason decides the exit
  code (a 401 or 403 is exit code 4 with the server's message; a 401 also says how to give a token);
* anything else — an HTML page, JSON that is not a ``Status``, a redirect, a success that is not
  JSON — means ``--server`` points at something that is not a Joch API server (another web server,
  a proxy's error page): ``ServiceUnavailable`` naming the request and what answered it, e.g.
  ``http://127.0.0.1:8000 is not a Joch API server (GET /apis answered 404 text/html)``.

``Warning: 299 - "..."`` headers are handed to ``on_warning`` as they arrive (the CLI prints them
to stderr), once each per invocation, as kubectl does. Discovery is cached on the client, so one
invocation asks the server for it at most once.

``httpx`` is imported when the first client is made, not with this module: ``joch --help`` and
every command that fails before it talks to a server start without it. Its package ``__init__``
also imports ``httpx._main``, the ``httpx`` console script (rich, click, pygments: about half of
httpx's import time), which no Joch process uses, so ``_httpx`` keeps that module out; and a
plain-http client does not load a CA bundle it cannot use (``_tls_context``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from joch.api import errors
from joch.cli import resolve

if TYPE_CHECKING:
    import httpx

DEFAULT_SERVER = "http://127.0.0.1:8080"
SERVER_ENV = "JOCH_SERVER"
_WARNING = re.compile(r'\d{3}\s+\S+\s+"((?:[^"\\]|\\.)*)"')
_UNESCAPE = re.compile(r"\\(.)")
_GATEWAY_CODES = (502, 503, 504)

Params = Mapping[str, str]


def _httpx() -> ModuleType:
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "not importable"
    import httpx

    return httpx


def _tls_context(base_url: str) -> Any:
    """``True`` (httpx's default: certifi's CAs) for https; for plain http, which never uses TLS
    (redirects are not followed, no proxy is configured), a bare client context instead, because
    loading certifi's bundle costs ~80 ms of every command. The bare context still verifies
    certificates and hostnames, and with no CAs refuses them all: nothing is weakened."""
    proxied = any(os.environ.get(name) for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"))
    if not base_url.startswith("http://") or proxied:
        return True
    import ssl

    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def server_url(explicit: str | None, *, context_server: str | None = None, context: str = "") -> str:
    """``--server``, else ``JOCH_SERVER``, else the current context's server, else the default; a
    malformed URL names its source."""
    env = os.environ.get(SERVER_ENV)
    source = ("--server" if explicit else SERVER_ENV if env else f'context "{context}" in the config file'
              if context_server else "the default server URL")
    given = explicit or env or context_server or DEFAULT_SERVER
    fix = "give http://HOST[:PORT], e.g. http://127.0.0.1:8080"
    if not given.startswith(("http://", "https://")):
        raise errors.BadRequest(f'the server URL "{given}" ({source}) must start with http:// or https://; {fix}')
    try:
        parts = urllib.parse.urlsplit(given)
        parts.port  # noqa: B018  # parsing the port is the check: it raises for 99999 or "x"
    except ValueError as exc:
        raise errors.BadRequest(f'the server URL "{given}" ({source}) is not a valid URL ({exc}); {fix}') from None
    if not parts.hostname:
        raise errors.BadRequest(f'the server URL "{given}" ({source}) names no host; {fix}')
    if parts.query or parts.fragment:
        raise errors.BadRequest(f'the server URL "{given}" ({source}) must not have a query or fragment; {fix}')
    return given.rstrip("/")


class Client:
    def __init__(
        self, *, base_url: str, on_warning: Callable[[str], None], timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None, token: str | None = None,
    ) -> None:
        httpx = _httpx()
        self.base_url = base_url
        self._on_warning = on_warning
        self._seen_warnings: set[str] = set()
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else None
            self._http = httpx.Client(base_url=base_url, timeout=timeout, transport=transport,
                                      verify=_tls_context(base_url), headers=headers)
        except httpx.InvalidURL as exc:
            raise errors.BadRequest(f'the server URL "{base_url}" is not valid: {exc}') from None
        self._discovery: resolve.Discovery | None = None

    def close(self) -> None:
        self._http.close()

    @property
    def discovery(self) -> resolve.Discovery:
        if self._discovery is None:
            self._discovery = resolve.discover(self)
        return self._discovery

    def get_json(self, path: str, params: Params | None = None, *, accept: str | None = None) -> Any:
        return self.request("GET", path, params=params, accept=accept)

    def get_object(self, path: str, params: Params | None = None, *, accept: str | None = None) -> dict[str, Any]:
        """A JSON object; any other JSON means the server is not a Joch API server."""
        body = self.get_json(path, params, accept=accept)
        if not isinstance(body, dict):
            raise self.not_joch(f"GET {path} answered JSON that is not an object")
        return body

    def request(
        self, method: str, path: str, *, params: Params | None = None, json_body: Any = None,
        content: str | None = None, content_type: str | None = None, warnings: bool = True,
        accept: str | None = None,
    ) -> Any:
        """One request; ``warnings=False`` when the caller reports the body's own warnings."""
        httpx = _httpx()
        headers = _headers(content_type=content_type, accept=accept)
        try:
            response = self._http.request(
                method, path, params=params, json=json_body, content=content, headers=headers
            )
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise self._failed(exc, method, path) from None
        return self._decode(response, warnings=warnings)

    def stream(self, path: str, params: Params, *, accept: str | None = None) -> Iterator[dict[str, Any]]:
        """Newline-delimited JSON (a watch); each decoded line is yielded as it arrives."""
        httpx = _httpx()
        try:
            with self._http.stream("GET", path, params=params, headers=_headers(accept=accept),
                                   timeout=httpx.Timeout(30.0, read=None)) as r:
                if r.status_code >= 300:
                    r.read()
                    self._decode(r)
                self._warn(r)
                for line in r.iter_lines():
                    if line.strip():
                        event = self._parse_json(r, line)
                        if not isinstance(event, dict):
                            raise self.not_joch(f"GET {path} streamed JSON that is not a watch event")
                        yield event
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise self._failed(exc, "GET", path) from None

    def stream_bytes(self, path: str, params: Params | None = None) -> Iterator[bytes]:
        """A body streamed as it arrives (a log, an artifact); errors as for ``request``."""
        httpx = _httpx()
        try:
            with self._http.stream("GET", path, params=params, timeout=httpx.Timeout(30.0, read=None)) as r:
                if r.status_code >= 300:
                    r.read()
                    self._decode(r)
                self._warn(r)
                yield from r.iter_bytes()
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            raise self._failed(exc, "GET", path) from None

    def not_joch(self, what: str) -> errors.JochError:
        return errors.ServiceUnavailable(f"{self.base_url} is not a Joch API server ({what})")

    def _decode(self, response: httpx.Response, *, warnings: bool = True) -> Any:
        if warnings:
            self._warn(response)
        if response.status_code >= 400:
            raise self._error_from_response(response)
        if 300 <= response.status_code < 400:
            raise self._redirected(response)
        if not response.content:
            return None
        return self._parse_json(response, response.text)

    def _warn(self, response: httpx.Response) -> None:
        for header in response.headers.get_list("warning"):
            for match in _WARNING.finditer(header):
                text = _UNESCAPE.sub(r"\1", match.group(1))
                if text not in self._seen_warnings:
                    self._seen_warnings.add(text)
                    self._on_warning(text)

    def _parse_json(self, response: httpx.Response, text: str) -> Any:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise self.not_joch(_answered(response)) from None

    def _error_from_response(self, response: httpx.Response) -> errors.JochError:
        try:
            body = response.json()
        except ValueError:
            body = None
        error = errors.from_body(body, unauthorized_hint=(
            f"the server at {self.base_url} needs a valid bearer token; give it with "
            "--token, JOCH_TOKEN or a context (joch config set-context NAME --token TOKEN)"))
        if error is not None:
            return error
        if response.status_code in _GATEWAY_CODES:  # a proxy or gateway in front of the server
            request = response.request
            return errors.ServiceUnavailable(
                f"cannot reach the Joch server at {self.base_url}: {request.method} {request.url.path} answered "
                f"{response.status_code} {response.reason_phrase}, not from a Joch server (a proxy or gateway?)"
            )
        return self.not_joch(_answered(response))

    def _redirected(self, response: httpx.Response) -> errors.JochError:
        location = response.headers.get("location", "")
        target = urllib.parse.urljoin(str(response.request.url), location)
        request = response.request
        return errors.ServiceUnavailable(
            f"{self.base_url} is not a Joch API server ({request.method} {request.url.path} answered "
            f"{response.status_code}, a redirect to {target or 'nowhere'}); if the server moved, pass its "
            "new URL with --server"
        )

    def _failed(self, exc: Exception, method: str, path: str) -> errors.JochError:
        httpx = _httpx()
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, httpx.InvalidURL | httpx.UnsupportedProtocol):
            return errors.BadRequest(f"cannot send {method} {path} to {self.base_url}: {detail}")
        if isinstance(exc, httpx.TimeoutException):
            return errors.ServiceUnavailable(
                f"the Joch server at {self.base_url} did not answer {method} {path} in time ({detail})"
            )
        if isinstance(exc, httpx.ConnectError):
            return errors.ServiceUnavailable(
                f"cannot reach the Joch server at {self.base_url} (is `joch server` running?)"
            )
        if isinstance(exc, httpx.ProtocolError | httpx.DecodingError | httpx.TooManyRedirects):
            return errors.ServiceUnavailable(
                f"no valid HTTP answer from {self.base_url} to {method} {path} ({detail}); "
                "is it a Joch API server, and is it still running?"
            )
        return errors.ServiceUnavailable(f"{method} {path} to the Joch server at {self.base_url} failed: {detail}")


def _answered(response: httpx.Response) -> str:
    request = response.request
    content_type = response.headers.get("content-type", "").split(";")[0].strip()
    body = content_type or ("an empty body" if not response.content else "a body with no Content-Type")
    return f"{request.method} {request.url.path} answered {response.status_code} {body}"


def _headers(*, content_type: str | None = None, accept: str | None = None) -> dict[str, str] | None:
    headers = {name: value for name, value in (("Content-Type", content_type), ("Accept", accept)) if value}
    return headers or None
