"""Who is asking: the authenticated user of a request, and the request's context for audit.

``UserInfo`` has the shape of Kubernetes' ``authentication.k8s.io/v1`` UserInfo (username, uid,
groups). The server's authentication middleware (``joch.server.auth``) builds it from a bearer token
or an OIDC JWT and makes the request's ``RequestContext`` current for the code that handles the
request (``current_request``), so admission, the store's audit rows and approval decisions take the
actor from there — never from the request body.

Fixed identities:

* ``ANONYMOUS``: the caller of a server running with ``--auth none`` (loopback only); that mode
  authorizes everything, as kube-apiserver's ``AlwaysAllow``.
* ``CONTROLLER``: Joch's own controllers and runtime; the only non-admin identity allowed to write
  the status of controller-owned kinds.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
CONTROLLERS_GROUP = "system:joch:controllers"


@dataclass(frozen=True)
class UserInfo:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, object]:
        """The UserInfo as the Kubernetes API spells it (``username``, ``uid``, ``groups``)."""
        out: dict[str, object] = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


ANONYMOUS = UserInfo("system:anonymous", (UNAUTHENTICATED,))
CONTROLLER = UserInfo("system:joch:controller", (CONTROLLERS_GROUP, AUTHENTICATED))


@dataclass(frozen=True)
class RequestContext:
    """What the audit log records about the request being served (``requestId``, ``sourceIP``)."""

    user: UserInfo
    request_id: str = ""
    source_ip: str = ""
    verb: str = ""


_CURRENT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("joch_request", default=None)


def current_request() -> RequestContext | None:
    """The request being served in this context, or None (a controller, a CLI in-process write)."""
    return _CURRENT.get()


def current_user() -> UserInfo | None:
    ctx = _CURRENT.get()
    return ctx.user if ctx else None


@contextmanager
def acting_as(ctx: RequestContext) -> Iterator[RequestContext]:
    """Make ``ctx`` current for the block (the server does this per request; tests may too)."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
