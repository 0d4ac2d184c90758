"""A real server whose callers say who they are in a header: a stand-in for authentication.

Authentication (bearer tokens, OIDC) puts the caller's ``UserInfo`` in ``scope["joch.user"]``,
and the server's request-context middleware makes it the current user of the request. ``AsUser``
does just that from ``X-Test-User: NAME`` (groups from ``X-Test-Groups``, comma-separated), in
front of the real app, so tests of what the server does with an identity — who decided, who
created — run over a real socket and store. It only sets the identity; everything after it is the
production code path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from joch.api.identity import AUTHENTICATED, UserInfo
from joch.server.app import create_app
from joch.server.context import USER_KEY
from joch.server.options import ServerOptions
from joch.server.testing import LiveServer, ServerThread
from joch.store.base import Store

USER_HEADER = "X-Test-User"


def as_user(name: str, *groups: str) -> dict[str, str]:
    """The headers of a request made by ``name``."""
    headers = {USER_HEADER: name}
    if groups:
        headers["X-Test-Groups"] = ",".join(groups)
    return headers


class AsUser:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or ())
            name = headers.get(USER_HEADER.lower().encode())
            if name:
                groups = [g for g in headers.get(b"x-test-groups", b"").decode().split(",") if g]
                scope = {**scope, USER_KEY: UserInfo(name.decode(), (*groups, AUTHENTICATED))}
        await self.app(scope, receive, send)


@contextmanager
def users_server(store: Store, options: ServerOptions | None = None) -> Iterator[LiveServer]:
    with ServerThread(AsUser(create_app(store, options=options))) as thread, httpx.Client(
        base_url=thread.url, timeout=httpx.Timeout(10.0)
    ) as http:
        yield LiveServer(thread.url, http, store)
