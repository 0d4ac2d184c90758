"""Joch's HTTP API as one caller sees it: every MCP tool goes through here, with the caller's token.

The MCP server holds no store and makes no decisions of its own: a tool is one or a few requests to
the API, so authentication, RBAC, admission and the audit log are exactly the API's. Over stdio the
requests go to the server of the CLI's current context; on ``joch server``'s ``/mcp`` they go to the
same app in-process (``joch.mcp.http``), carrying the bearer token of the MCP request.

Failures leave as ``joch.api.errors.JochError``, rebuilt from the server's ``Status`` as the CLI
rebuilds it, so a tool's error text is the CLI's (``errors.report_lines``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from joch.api import errors

Params = Mapping[str, str]
UNAUTHORIZED_HINT = ("the server needs a valid bearer token; give `joch mcp` one with JOCH_TOKEN or a context "
                     "(joch config set-context NAME --token TOKEN)")


@dataclass(frozen=True)
class Excerpt:
    """Part of a text: ``truncated`` when there was more than ``text``."""

    text: str
    truncated: bool


@dataclass(frozen=True)
class Api:
    """``http`` is shared (its base URL is the server); ``token`` is the caller's, or None."""

    http: httpx.AsyncClient
    token: str | None

    async def json(
        self, method: str, path: str, *, params: Params | None = None, body: Any = None,
        content: str | None = None, content_type: str | None = None,
    ) -> Any:
        response = await self._send(method, path, params=params, body=body, content=content, content_type=content_type)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise self._not_joch(response) from None

    async def object(self, path: str, params: Params | None = None) -> dict[str, Any]:
        """A GET answering a JSON object."""
        found = await self.json("GET", path, params=params)
        if not isinstance(found, dict):
            raise errors.ServiceUnavailable(f"GET {path} answered JSON that is not an object")
        return found

    async def text(self, path: str, params: Params | None = None) -> str:
        response = await self._send("GET", path, params=params)
        return response.text

    async def excerpt(self, path: str, limit: int, *, last: bool = False) -> Excerpt:
        """At most ``limit`` bytes of the text at ``path``: its first, or with ``last`` its last. Read
        as a stream and cut as it comes, so a log of 64 MiB or a patch of a gigabyte is never held
        whole here (over stdio as on ``/mcp``, whose in-process client streams too)."""
        kept = bytearray()
        seen = 0
        async with self._stream(path) as response:
            async for chunk in response.aiter_bytes():
                seen += len(chunk)
                kept += chunk
                if not last and len(kept) > limit:
                    break
                if last and len(kept) > 2 * limit:
                    del kept[:-limit]
        body = bytes(kept[-limit:] if last else kept[:limit])
        return Excerpt(body.decode("utf-8", "replace"), truncated=seen > limit)

    @asynccontextmanager
    async def _stream(self, path: str) -> AsyncIterator[httpx.Response]:
        try:
            async with self.http.stream("GET", path, headers=self._headers(None)) as response:
                if response.status_code >= 300:
                    await response.aread()
                    raise self._error(response)
                yield response
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    async def _send(
        self, method: str, path: str, *, params: Params | None = None, body: Any = None,
        content: str | None = None, content_type: str | None = None,
    ) -> httpx.Response:
        try:
            response = await self.http.request(method, path, params=params, json=body, content=content,
                                               headers=self._headers(content_type))
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code >= 300:
            raise self._error(response)
        return response

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _unreachable(self, exc: httpx.HTTPError) -> errors.JochError:
        return errors.ServiceUnavailable(f"cannot reach the Joch server at {self.http.base_url} "
                                         f"({exc or type(exc).__name__}); is `joch server` running?")

    def _error(self, response: httpx.Response) -> errors.JochError:
        try:
            body = response.json()
        except ValueError:
            body = None
        return errors.from_body(body, unauthorized_hint=UNAUTHORIZED_HINT) or self._not_joch(response)

    def _not_joch(self, response: httpx.Response) -> errors.JochError:
        request = response.request
        kind = response.headers.get("content-type", "").split(";")[0].strip() or "no Content-Type"
        return errors.ServiceUnavailable(f"{self.http.base_url} is not a Joch API server ({request.method} "
                                         f"{request.url.path} answered {response.status_code} {kind})")


def segment(value: str, what: str) -> str:
    """One path segment, escaped; ``.``, ``..`` and ``/`` would address another URL."""
    if not value or value in (".", "..") or "/" in value:
        raise errors.BadRequest(f'invalid {what} "{value}": a {what} may not be empty, "." or ".." or contain "/"')
    return urllib.parse.quote(value, safe="")

