"""The request context: who is asking, which request this is, and from where — for every route.

``RequestContextMiddleware`` runs inside the guard and the authentication middleware, for every
HTTP request. It makes a ``joch.api.identity.RequestContext`` current for the handler (a context
variable, which Starlette carries into the worker thread of a sync route), so admission, the store's
audit rows and approval decisions read the actor from it and never from the request body:

* ``user``: what authentication put in ``scope["joch.user"]``; ``ANONYMOUS`` when nothing did
  (``--auth none``).
* ``request_id``: the client's ``X-Request-Id`` when it is short and printable, else a new UUID;
  returned as ``Audit-Id`` on the response, as kube-apiserver does, so a client can find the
  audit rows of its request.
* ``source_ip``: the peer's address.
* ``verb``: the Kubernetes verb of the method (``create``, ``update``, ``patch``, ``delete``,
  ``get``); authentication may refine it in ``scope["joch.verb"]`` (``list``, ``watch``, ``apply``).
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from joch.api.identity import ANONYMOUS, RequestContext, UserInfo, acting_as

USER_KEY = "joch.user"
VERB_KEY = "joch.verb"
REQUEST_ID_KEY = "joch.request_id"  # set by authentication, which answers 401/403 with it before this runs
METHOD_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete", "WATCH": "watch"}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_of(scope: Scope) -> str:
    given = scope.get(REQUEST_ID_KEY)
    if isinstance(given, str):
        return given
    for key, value in scope.get("headers") or ():
        if key == b"x-request-id":
            text: str = value.decode("latin-1")
            if _REQUEST_ID.match(text):
                return text
            break
    return str(uuid.uuid4())


def context_of(scope: Scope) -> RequestContext:
    user = scope.get(USER_KEY)
    client = scope.get("client")
    return RequestContext(
        user=user if isinstance(user, UserInfo) else ANONYMOUS,
        request_id=request_id_of(scope),
        source_ip=client[0] if client else "",
        verb=str(scope.get(VERB_KEY) or METHOD_VERBS.get(scope.get("method", ""), "")),
    )


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = context_of(scope)
        audit_id = ctx.request_id.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"audit-id", audit_id)]
            await send(message)

        with acting_as(ctx):
            await self.app(scope, receive, send_with_id)
