"""The error hierarchy every layer raises and every interface maps exactly once.

Each error knows the Kubernetes ``Status`` it becomes (``reason`` and HTTP ``code``) and the exit
code the CLI uses, so the server and the CLI never guess. ``Invalid`` carries one ``Cause`` per
problem so a user sees every error in a document at once, each with its field path.

A ``Status`` never carries more than ``MAX_STATUS_TEXT`` characters in any one string: messages
and paths echo what the user sent (a name, a key, a kind), and a megabyte-long value must not come
back as a multi-megabyte error. Admission clips the values it quotes to far less; this is the
backstop for every other echo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

MAX_STATUS_TEXT = 4096


@dataclass(frozen=True)
class Cause:
    """One problem with one field: ``field`` is a dotted path such as ``spec.agentRef.name``."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


class JochError(Exception):
    """Base of every error Joch reports to a user."""

    reason: ClassVar[str] = "InternalError"
    code: ClassVar[int] = 500
    exit_code: ClassVar[int] = 1

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        name: str | None = None,
        causes: list[Cause] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.name = name
        self.causes = list(causes or [])
        self.extra = dict(extra or {})

    def to_status(self) -> dict[str, Any]:
        """The Kubernetes ``Status`` body for this error."""
        details: dict[str, Any] = {}
        if self.name is not None:
            details["name"] = self.name
        if self.kind is not None:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = [c.to_dict() for c in self.causes]
        details.update(self.extra)
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            status["details"] = details
        clipped: dict[str, Any] = _clipped(status)
        return clipped


class BadRequest(JochError):
    reason = "BadRequest"
    code = 400
    exit_code = 2


class Invalid(JochError):
    reason = "Invalid"
    code = 422
    exit_code = 2


class Unauthorized(JochError):
    reason = "Unauthorized"
    code = 401
    exit_code = 4


class Forbidden(JochError):
    reason = "Forbidden"
    code = 403
    exit_code = 4


class NotFound(JochError):
    reason = "NotFound"
    code = 404
    exit_code = 3


class MethodNotAllowed(JochError):
    reason = "MethodNotAllowed"
    code = 405
    exit_code = 2


class AlreadyExists(JochError):
    reason = "AlreadyExists"
    code = 409
    exit_code = 5


class Conflict(JochError):
    reason = "Conflict"
    code = 409
    exit_code = 5


class Gone(JochError):
    """A watch or continue token refers to a revision that compaction already removed."""

    reason = "Expired"
    code = 410
    exit_code = 6


class RequestEntityTooLarge(JochError):
    reason = "RequestEntityTooLarge"
    code = 413
    exit_code = 2


class UnsupportedMediaType(JochError):
    reason = "UnsupportedMediaType"
    code = 415
    exit_code = 2


class TooManyRequests(JochError):
    """Come back later: ``details.retryAfterSeconds`` (and the ``Retry-After`` header) says when."""

    reason = "TooManyRequests"
    code = 429
    exit_code = 7


class ServiceUnavailable(JochError):
    reason = "ServiceUnavailable"
    code = 503
    exit_code = 7


class InsufficientStorage(JochError):
    """A write failed because a disk is full (the store's, or the runtime's). The message says
    which disk and how to recover: writes succeed again once space is freed, without a restart."""

    reason = "InsufficientStorage"
    code = 507
    exit_code = 7


def retry_after(error: JochError, seconds: int) -> JochError:
    """``error`` telling the client when to try again, as the apiserver's ``retryAfterSeconds``."""
    error.extra["retryAfterSeconds"] = seconds
    return error


class Internal(JochError):
    reason = "InternalError"
    code = 500
    exit_code = 1


def _clipped(value: Any) -> Any:
    if isinstance(value, str):
        if len(value) <= MAX_STATUS_TEXT:
            return value
        return f"{value[:MAX_STATUS_TEXT]}… ({len(value) - MAX_STATUS_TEXT} more characters)"
    if isinstance(value, dict):
        return {key: _clipped(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clipped(item) for item in value]
    return value


_BY_REASON: dict[tuple[str, int], type[JochError]] = {
    (cls.reason, cls.code): cls
    for cls in (
        BadRequest, Invalid, Unauthorized, Forbidden, NotFound, MethodNotAllowed, AlreadyExists,
        Conflict, Gone, RequestEntityTooLarge, UnsupportedMediaType, TooManyRequests, ServiceUnavailable,
        InsufficientStorage,
        Internal,
    )
}


def from_status(status: dict[str, Any]) -> JochError:
    """Rebuild an error from a ``Status`` body (the CLI uses this on every 4xx/5xx)."""
    reason = str(status.get("reason") or "InternalError")
    code = int(status.get("code") or 500)
    cls = _BY_REASON.get((reason, code))
    if cls is None:
        cls = next((c for (r, _), c in _BY_REASON.items() if r == reason), Internal)
    details = status.get("details") or {}
    causes = [
        Cause(field=str(c.get("field", "")), message=str(c.get("message", "")),
              reason=str(c.get("reason", "FieldValueInvalid")))
        for c in details.get("causes") or []
    ]
    extra = {k: v for k, v in details.items() if k not in {"name", "kind", "causes"}}
    return cls(str(status.get("message") or reason), kind=details.get("kind"),
               name=details.get("name"), causes=causes, extra=extra)



def from_body(body: Any, *, unauthorized_hint: str) -> JochError | None:
    """The error a failed response's JSON body means, or None when it is not a ``Status`` (so the
    peer is not a Joch server). A 401's message gets ``unauthorized_hint``: how to give a token."""
    if not isinstance(body, dict) or body.get("kind") != "Status":
        return None
    error = from_status(body)
    if isinstance(error, Unauthorized):
        return Unauthorized(f"{error.message}: {unauthorized_hint}")
    return error

_LABELLED_FIELD = re.compile(r"^(documents\[\d+\](?:\.items\[\d+\])? \([^()]*\))\.")


def readable_field(field: str) -> str:
    """``documents[3] (Agent/x in a.yaml:4).spec.y`` → ``documents[3] (Agent/x in a.yaml:4): spec.y``."""
    return _LABELLED_FIELD.sub(r"\1: ", field)


def headline(exc: JochError) -> str:
    """The message, or with causes its first line without the causes it lists (they follow)."""
    if not exc.causes:
        return exc.message
    line = exc.message.strip().splitlines()[0] if exc.message.strip() else exc.reason
    shown = [f"{c.field}: {c.message}" if c.field else c.message for c in exc.causes]
    for listing in ("[" + ", ".join(shown) + "]", shown[0] if len(shown) == 1 else None):
        if listing and line.endswith(f": {listing}"):
            return line[: -len(listing) - 2]
    head, bracket, rest = line.partition(": [")  # the listing, after documents were relabelled
    if bracket and rest.endswith("]") and all(c.message in rest for c in exc.causes):
        return head
    return line


def report_lines(exc: JochError) -> list[str]:
    """What a user is shown for ``exc`` (the CLI on stderr, the MCP tools as their error text):
    ``error: <headline>``, then ``  - <field>: <message>`` per cause the headline does not say."""
    line = headline(exc)
    lines = [f"error: {line}"]
    for cause in exc.causes:
        if cause.message and cause.message in line:
            continue  # the headline already says it (e.g. a Conflict that names its document)
        prefix = f"{readable_field(cause.field)}: " if cause.field else ""
        lines.append(f"  - {prefix}{cause.message}")
    return lines
