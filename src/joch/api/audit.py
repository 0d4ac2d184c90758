"""An audit record: one decision about one action, in the shape the audit log stores and serves.

``{id, time, actor, groups, verb, kind, namespace, name, decision, reason, requestId, sourceIP}``
(DESIGN.md §4, the Kradle seed's audit event). ``actor``, ``groups``, ``requestId`` and
``sourceIP`` left empty are filled by the store from the current request
(``joch.api.identity.current_request``; outside any request the actor is Joch's ``CONTROLLER``);
``id`` and ``time`` are always the store's. An entry never holds a secret value or a request body:
``reason`` is a sentence written by Joch, clipped to ``REASON_MAX`` characters. ``kind`` is the
Kind's name as the registry spells it (``AgentRun``, what the store writes for an object), so
``?kind=`` finds explicit entries and the automatic rows alike.

How to record a decision (``Store.audit``): inside ``store.transaction()`` the row joins that
transaction, on the same thread even when called on the ``Store`` rather than the transaction's
``Writer``; outside one it commits on its own, from any thread. A denial whose change rolls back
is recorded after the failed transaction, so the rollback does not take its row with it.

``AuditEvent`` is a stored row, ``AuditQuery`` what ``Store.audit_events`` filters by (newest first),
``parse_moment`` the ``since``/``until`` syntax of the API and the CLI (RFC 3339 or ``1h``).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Literal

from joch.api.identity import CONTROLLER, current_request

Decision = Literal["allowed", "denied"]


@dataclass(frozen=True)
class AuditEntry:
    verb: str
    kind: str = ""
    namespace: str | None = None
    name: str | None = None
    decision: Decision = "allowed"
    reason: str = ""
    actor: str = ""
    groups: tuple[str, ...] = ()
    request_id: str = ""
    source_ip: str = ""


REASON_MAX = 1024
"""A reason longer than this many characters is clipped (it is a sentence, not a payload)."""
DEFAULT_LIMIT = 500
MAX_LIMIT = 5000
"""How the store writes ``time`` (``format_time``): RFC 3339 UTC with microseconds, always 27 characters, so the text
order of two times is their order (the time filters compare text in both dialects)."""


def format_time(when: dt.datetime) -> str:
    u = when.astimezone(dt.UTC)
    # Not strftime: its %Y does not pad years before 1000 everywhere, and the width must not vary.
    return (f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}."
            f"{u.microsecond:06d}Z")


def clip(reason: str) -> str:
    return reason if len(reason) <= REASON_MAX else reason[: REASON_MAX - 1] + "…"


def text(value: str) -> str:
    """``value`` without NUL characters, which Postgres text cannot hold: a user name or an object
    name taken from a request must not make the write it records fail."""
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def filled(entry: AuditEntry) -> AuditEntry:
    """``entry`` with an empty actor, groups, request id and source IP taken from the current request;
    outside any request (a controller) the actor is Joch's controller identity. The reason is
    clipped, and NUL characters are replaced (``text``)."""
    ctx = current_request()
    user = ctx.user if ctx is not None else CONTROLLER
    return AuditEntry(
        verb=text(entry.verb), kind=text(entry.kind), namespace=text(entry.namespace or ""),
        name=text(entry.name or ""), decision=entry.decision, reason=text(clip(entry.reason)),
        actor=text(entry.actor or user.name),
        groups=entry.groups or (user.groups if not entry.actor else ()),
        request_id=text(entry.request_id or (ctx.request_id if ctx else "")),
        source_ip=text(entry.source_ip or (ctx.source_ip if ctx else "")),
    )


@dataclass(frozen=True)
class AuditEvent:
    """One stored row of the audit log, as ``GET /v1/audit`` serves it."""

    id: int
    time: str
    actor: str
    groups: tuple[str, ...]
    verb: str
    kind: str
    namespace: str
    name: str
    decision: Decision
    reason: str
    request_id: str
    source_ip: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "time": self.time, "actor": self.actor, "groups": list(self.groups),
                "verb": self.verb, "kind": self.kind, "namespace": self.namespace, "name": self.name,
                "decision": self.decision, "reason": self.reason, "requestId": self.request_id,
                "sourceIP": self.source_ip}


@dataclass(frozen=True)
class AuditQuery:
    """Which rows to read, newest first: every filter given must match exactly; ``since`` is
    inclusive, ``until`` exclusive; ``after_id`` (from a continue token) starts below that id."""

    since: dt.datetime | None = None
    until: dt.datetime | None = None
    actor: str | None = None
    verb: str | None = None
    kind: str | None = None
    namespace: str | None = None
    name: str | None = None
    decision: Decision | None = None
    limit: int = DEFAULT_LIMIT
    before_id: int | None = None


@dataclass(frozen=True)
class AuditPage:
    items: list[AuditEvent]
    more: bool  # rows below the last item match too (the next page starts at its id)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``1h30m`` or ``7d`` (Go's units, and ``d``); ``0`` is 0."""
    value = text.strip()
    if value == "0":
        return 0.0
    parts = _DURATION.findall(value)
    if not parts or "".join(number + unit for number, unit in parts) != value:
        raise ValueError(f"{text!r} is not a duration: use a number and a unit (ms, s, m, h, d), e.g. 1h30m or 7d")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def parse_moment(text: str, *, now: dt.datetime) -> dt.datetime:
    """An RFC 3339 time (``2026-01-02T15:04:05Z``), or a duration before ``now`` (``1h``: an hour ago)."""
    value = text.strip()
    if value[:1].isdigit() and ("T" in value or "-" in value[1:]):
        try:
            when = dt.datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{text!r} is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a duration "
                             "(1h, 30m, 7d)") from None
        if when.tzinfo is None:
            raise ValueError(f"{text!r} has no time zone: add Z or an offset such as +02:00")
        try:
            return when.astimezone(dt.UTC)
        except OverflowError:
            raise ValueError(f"{text!r} is out of range") from None
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise ValueError(f"{text!r} is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a duration "
                         "(1h, 30m, 7d)") from None
    try:
        return now - dt.timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{text!r} reaches back before year 1") from None
