"""The HTTP client the commands share, and the one place transport failures become Joch errors.

Every failure leaves this module as a ``joch.api.errors.JochError`` so the command layer has a
single thing to report: a refused connection is ``ServiceUnavailable`` (exit code 7) with one line
telling the user to start ``joch server``; a ``Status`` body is rebuilt with ``errors.from_status``
so the server's reason decides the exit code; a body that is not a ``Status`` (a proxy's HTML page)
is mapped from the HTTP code alone. ``Warning: 299 - "..."`` headers are handed to ``on_warning``
as they arrive (the CLI prints them to stderr), once each per invocation, as kubectl does.

Discovery is cached on the client, so one invocation asks the server for it at most once.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from joch.api import errors
from joch.cli import resolve

DEFAULT_SERVER = "http://127.0.0.1:8080"
_WARNING = re.compile(r'\d{3}\s+\S+\s+"((?:[^"\\]|\\.)*)"')
_UNESCAPE = re.compile(r"\\(.)")
# For bodies that are not a Status: the first declared error class wins a shared code (409).
_REASON_BY_CODE = {cls.code: cls.reason for cls in reversed(errors.JochError.__subclasses__())}

Params = Mapping[str, str]


def server_url(explicit: str | None) -> str:
    url = (explicit or os.environ.get("JOCH_SERVER") or DEFAULT_SERVER).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise errors.BadRequest(f'the server URL "{url}" must start with http:// or https://')
    return url


class Client:
    def __init__(
        self, *, base_url: str, on_warning: Callable[[str], None], timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self._on_warning = on_warning
        self._seen_warnings: set[str] = set()
        self._http = httpx.Client(base_url=base_url, timeout=timeout, transport=transport)
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

    def request(
        self, method: str, path: str, *, params: Params | None = None, json_body: Any = None,
        content: str | None = None, content_type: str | None = None, warnings: bool = True,
        accept: str | None = None,
    ) -> Any:
        """One request; ``warnings=False`` when the caller reports the body's own warnings."""
        headers = _headers(content_type=content_type, accept=accept)
        try:
            response = self._http.request(
                method, path, params=params, json=json_body, content=content, headers=headers
            )
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        return self._decode(response, warnings=warnings)

    def stream(self, path: str, params: Params, *, accept: str | None = None) -> Iterator[dict[str, Any]]:
        """Newline-delimited JSON (a watch); each decoded line is yielded as it arrives."""
        try:
            with self._http.stream("GET", path, params=params, headers=_headers(accept=accept),
                                   timeout=httpx.Timeout(30.0, read=None)) as r:
                if r.status_code >= 400:
                    r.read()
                    self._decode(r)
                self._warn(r)
                for line in r.iter_lines():
                    if line.strip():
                        yield _parse_json(line)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None

    def _decode(self, response: httpx.Response, *, warnings: bool = True) -> Any:
        if warnings:
            self._warn(response)
        if response.status_code >= 400:
            raise _error_from_response(response)
        if not response.content:
            return None
        return _parse_json(response.text)

    def _warn(self, response: httpx.Response) -> None:
        for header in response.headers.get_list("warning"):
            for match in _WARNING.finditer(header):
                text = _UNESCAPE.sub(r"\1", match.group(1))
                if text not in self._seen_warnings:
                    self._seen_warnings.add(text)
                    self._on_warning(text)

    def _unreachable(self, exc: httpx.TransportError) -> errors.JochError:
        if isinstance(exc, httpx.TimeoutException):
            return errors.ServiceUnavailable(f"the Joch server at {self.base_url} did not answer in time")
        return errors.ServiceUnavailable(
            f"cannot reach the Joch server at {self.base_url} (is `joch server` running?)"
        )


def _headers(*, content_type: str | None = None, accept: str | None = None) -> dict[str, str] | None:
    headers = {name: value for name, value in (("Content-Type", content_type), ("Accept", accept)) if value}
    return headers or None


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise errors.Internal(f"the server sent a response that is not JSON: {text[:200]!r}") from None


def _error_from_response(response: httpx.Response) -> errors.JochError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        return errors.from_status(body)
    reason = _REASON_BY_CODE.get(response.status_code, "InternalError")
    detail = body.get("detail") if isinstance(body, dict) else None
    message = str(detail or response.text.strip()[:200] or response.reason_phrase)
    return errors.from_status({"reason": reason, "code": response.status_code, "message": message})
