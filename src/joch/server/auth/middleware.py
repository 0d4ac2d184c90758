"""The authentication and authorization middleware: who is asking, and may they.

Installed by ``create_app`` between ``guard.Guard`` (outside) and
``context.RequestContextMiddleware`` (inside), so a web page is refused before any token is
looked at, and every handler runs with the authenticated user current. For each HTTP request:

1. **Exempt routes pass untouched**: ``/healthz``, ``/livez``, ``/readyz``, ``/version``, everything under
   ``/v1/webhooks/`` (webhooks verify their own signatures) and exactly
   ``POST /v1/namespaces/NS/agentruns/NAME/callback`` (a run's usage callback, which checks the
   run's own token), and the Job runner's reports, ``PUT .../agentruns/NAME/attempts/N/record``,
   ``.../log`` and ``.../artifacts/X`` (``server.runreports``, which check it the same way), and
   reading the web console's files (``joch.web``: ``GET /console/...`` and ``GET /``, which only
   redirects browsers there); every API call the console makes sends its token.
2. **What the request asks** (``requests.resolve``): verb, group, resource, subresource,
   namespace, name. The verb goes to ``scope["joch.verb"]`` (``list``, ``watch``, ``update`` for an
   approval decision), which the request context and the audit log record.
3. **Authentication** (only when an authenticator is configured): the ``Authorization: Bearer``
   token is looked up in the token file, then verified as an OIDC ID token. No token, an unknown
   one, a malformed one or an expired one all get the same 401 ``Status`` (message
   ``Unauthorized``), so the answer never tells whether a token exists; each failure is audited as
   ``system:anonymous``, ``decision: denied``, ``reason: authentication failed``, without any
   token material. The user goes to ``scope["joch.user"]``.
4. **Authorization** (``rbac``): a 403 ``Status`` in kube-apiserver's words naming the user, verb,
   resource and namespace, audited. The batch routes (``/v1/resources/apply|create``) are
   authorized by the route, per document (``rbac.authorize_documents``).

Without an authenticator (auth none, loopback only) every caller is ``system:anonymous`` and
everything is allowed, as before authentication existed.

Failed requests carry ``Audit-Id`` like the others: the request id is computed here and kept in
``scope["joch.request_id"]`` for the request context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from joch.api import errors
from joch.api.audit import AuditEntry
from joch.api.identity import ANONYMOUS, UserInfo
from joch.server import context
from joch.server.auth import rbac, requests
from joch.server.errors import status_response
from joch.store.base import Store
from joch.web import is_console_path

EXEMPT = frozenset({"/healthz", "/livez", "/readyz", "/version"})
WEBHOOKS = "/v1/webhooks/"
AUTHENTICATION_FAILED = "authentication failed"


class TokenAuthenticator(Protocol):
    async def authenticate(self, token: str) -> UserInfo | None: ...


class Authenticators:
    """The configured authenticators, tried in order; the first that knows the token wins."""

    def __init__(self, authenticators: Sequence[TokenAuthenticator]) -> None:
        self.authenticators = tuple(authenticators)

    async def authenticate(self, token: str) -> UserInfo | None:
        for authenticator in self.authenticators:
            user = await authenticator.authenticate(token)
            if user is not None:
                return user
        return None


def is_exempt(method: str, path: str) -> bool:
    if path in EXEMPT or path.startswith(WEBHOOKS) or is_console_path(method, path):
        return True
    if method == "PUT" and "/attempts/" in path:
        return _run_report(path)
    if method != "POST" or not path.endswith("/callback"):
        return False
    parts = path.split("/")  # "", "v1", "namespaces", NS, "agentruns", NAME, "callback"
    return len(parts) == 7 and parts[1:3] == ["v1", "namespaces"] and parts[4] == "agentruns" \
        and all(parts[3:6])


def _run_report(path: str) -> bool:
    """A Job runner's report (``server.runreports``), which checks the attempt's run token itself:
    ``/v1/namespaces/NS/agentruns/NAME/attempts/N/{record,log,artifacts/X}``."""
    parts = path.split("/")
    head = len(parts) >= 9 and parts[1:3] == ["v1", "namespaces"] and parts[4] == "agentruns" \
        and parts[6] == "attempts" and all(parts[3:8])
    return head and (parts[8:] in (["record"], ["log"]) or (len(parts) == 10 and parts[8] == "artifacts"
                                                              and bool(parts[9])))


def bearer_token(scope: Scope) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


class AuthMiddleware:
    def __init__(
        self, app: ASGIApp, *, store: Store, authenticator: TokenAuthenticator | None, authorizer: rbac.Authorizer,
    ) -> None:
        self.app = app
        self.store = store
        self.authenticator = authenticator
        self.authorizer = authorizer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_exempt(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        info = requests.resolve(scope["method"], scope["path"], scope.get("query_string", b"").decode("latin-1"))
        scope[context.VERB_KEY] = info.verb
        if self.authenticator is None:
            scope[context.USER_KEY] = ANONYMOUS
            await self.app(scope, receive, send)
            return
        request_id = context.request_id_of(scope)
        scope[context.REQUEST_ID_KEY] = request_id
        token = bearer_token(scope)
        user = await self.authenticator.authenticate(token) if token else None
        if user is None:
            await self._audit(AuditEntry(
                verb=info.verb, kind=rbac.kind_of(info.resource), namespace=info.namespace or None,
                name=info.name or None, decision="denied", reason=AUTHENTICATION_FAILED, actor=ANONYMOUS.name,
                groups=ANONYMOUS.groups, request_id=request_id, source_ip=_peer(scope)))
            await _refuse(errors.Unauthorized("Unauthorized"), request_id, scope, receive, send)
            return
        scope[context.USER_KEY] = user
        if not info.batch:
            attrs = rbac.Attributes.of(user, info)
            decision = await self._authorize(attrs)
            if not decision.allowed:
                await self._audit(rbac.denial_entry(attrs, decision.reason, request_id=request_id,
                                                    source_ip=_peer(scope)))
                await _refuse(rbac.forbidden(attrs, decision), request_id, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _authorize(self, attrs: rbac.Attributes) -> rbac.Decision:
        authorizer = self.authorizer
        if authorizer.needs_reload():
            await anyio.to_thread.run_sync(authorizer.reload)
        decision = authorizer.authorize(attrs)
        if decision.allowed:
            return decision
        # Denied by the kept bindings: decide again on the store's current ones (a binding just made).
        return await anyio.to_thread.run_sync(lambda: authorizer.authorize(attrs, fresh=True))

    async def _audit(self, entry: AuditEntry) -> None:
        await anyio.to_thread.run_sync(self.store.audit, entry)


def _peer(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


async def _refuse(error: errors.JochError, request_id: str, scope: Scope, receive: Receive, send: Send) -> None:
    audit_id = request_id.encode()

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), (b"audit-id", audit_id)]
        await send(message)

    await status_response(error)(scope, receive, send_with_id)
