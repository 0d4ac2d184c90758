"""``GET /v1/audit``: the audit log, filtered and paged; there is no route that changes it.

The log is **append-only** through the API: rows are written by the store (every object written
during a request, in that write's transaction) and by the controllers and checks that record a
decision (``Store.audit``); only retention (``joch server --audit-retention``) deletes them.

Answers ``{"kind": "AuditEventList", "apiVersion": "v1", "metadata": {"continue": ...}, "items":
[...]}``, **newest first**: the first page is the most recent activity, and each ``continue``
token (opaque; it holds the id below which the next page starts) pages back in time. Rows
written after the first page was read do not shift later pages, since ids only grow. A page
without ``metadata.continue`` is the last.

Query parameters: ``since`` (inclusive) and ``until`` (exclusive), each an RFC 3339 time or a
duration back from now (``1h``, ``30m``, ``7d``); ``actor``, ``verb``, ``kind`` (any name kubectl
accepts for a Joch kind, else matched as written), ``namespace``, ``name``, ``decision``
(``allowed`` or ``denied``) match exactly (``namespace`` must be a DNS-1123 label, as on every
route); ``limit`` is 1 to 5000 (default 500). A bad value is a 400 ``Status`` naming the parameter.
Authorization is the auth section's: verb ``list`` on ``auditevents`` (group ``ops.joch.dev``) in
the namespace of ``?namespace=``.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from enum import Enum
from typing import Annotated, Any

from fastapi import FastAPI, Query
from starlette.responses import Response

from joch.api import audit as audits
from joch.api import errors
from joch.api.registry import Registry
from joch.server import params, wire
from joch.server.schemas import AUDIT_EVENT_LIST_REF, KindSchemas
from joch.store.base import Store

PATH = "/v1/audit"
TAGS: list[str | Enum] = ["v1"]
_MOMENT = "an RFC 3339 time (2026-01-02T15:04:05Z) or a duration back from now (1h, 30m, 7d)"

Since = Annotated[str | None, Query(alias="since", description=f"rows at or after: {_MOMENT}")]
Until = Annotated[str | None, Query(alias="until", description=f"rows before: {_MOMENT}")]
Actor = Annotated[str | None, Query(alias="actor", description="the user who acted (exact)")]
Verb = Annotated[str | None, Query(alias="verb", description="create, apply, update, patch, delete, approve, deny, …")]
Kind = Annotated[str | None, Query(alias="kind", description="a kind, plural or short name")]
Namespace = Annotated[str | None, Query(alias="namespace")]
Name = Annotated[str | None, Query(alias="name")]
DecisionParam = Annotated[str | None, Query(alias="decision", description="`allowed` or `denied`")]
Limit = Annotated[int | None, Query(alias="limit", description=f"rows per page, 1 to {audits.MAX_LIMIT} "
                                    f"(default {audits.DEFAULT_LIMIT})")]
Continue = Annotated[str | None, Query(alias="continue", description="the token of the previous page")]


def bad(parameter: str, message: str) -> errors.BadRequest:
    text = f"invalid {parameter}: {message}"
    return errors.BadRequest(text, causes=[errors.Cause(parameter, text, "FieldValueInvalid")])


def moment(parameter: str, value: str | None, now: dt.datetime) -> dt.datetime | None:
    if value is None or value == "":
        return None
    try:
        return audits.parse_moment(value, now=now)
    except ValueError as exc:
        raise bad(parameter, str(exc)) from None


def encode_continue(before_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"before": before_id}).encode()).decode().rstrip("=")


def decode_continue(token: str) -> int:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        before = data["before"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        before = None
    if not isinstance(before, int) or isinstance(before, bool) or not 0 < before < 2**63:
        raise bad("continue", f"{token!r} is not a token this server returned: pass metadata.continue of "
                  "the previous page")
    return before


def query_of(
    registry: Registry, *, since: str | None, until: str | None, actor: str | None, verb: str | None,
    kind: str | None, namespace: str | None, name: str | None, decision: str | None, limit: int | None,
    token: str | None,
) -> audits.AuditQuery:
    now = dt.datetime.now(dt.UTC)
    if limit is None:
        limit = audits.DEFAULT_LIMIT
    if not 1 <= limit <= audits.MAX_LIMIT:
        raise bad("limit", f"{limit}: a page holds 1 to {audits.MAX_LIMIT} rows")
    wanted: audits.Decision | None = None
    if decision == "allowed":
        wanted = "allowed"
    elif decision == "denied":
        wanted = "denied"
    elif decision:
        raise bad("decision", f"{decision!r}: use allowed or denied")
    return audits.AuditQuery(
        since=moment("since", since, now), until=moment("until", until, now),
        actor=actor or None, verb=verb or None, kind=kind_name(registry, kind),
        namespace=params.check_namespace(namespace),
        name=name or None, decision=wanted,
        limit=limit, before_id=decode_continue(token) if token else None,
    )


def kind_name(registry: Registry, kind: str | None) -> str | None:
    """The stored kind (``Agent``) for any name of a registered kind; other names as written (an
    explicit audit entry may name something that is not a kind)."""
    if not kind:
        return None
    try:
        return registry.resolve(kind).kind
    except errors.NotFound:
        return kind


def page_body(page: audits.AuditPage) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    if page.more and page.items:
        metadata["continue"] = encode_continue(page.items[-1].id)
    return {"kind": "AuditEventList", "apiVersion": "v1", "metadata": metadata,
            "items": [event.to_dict() for event in page.items]}


def install(app: FastAPI, store: Store, registry: Registry, schemas: KindSchemas) -> None:
    def list_audit(
        since: Since = None, until: Until = None, actor: Actor = None, verb: Verb = None, kind: Kind = None,
        namespace: Namespace = None, name: Name = None, decision: DecisionParam = None, limit: Limit = None,
        token: Continue = None,
    ) -> Response:
        query = query_of(registry, since=since, until=until, actor=actor, verb=verb, kind=kind,
                         namespace=namespace, name=name, decision=decision, limit=limit, token=token)
        page = store.audit_events(query)
        return wire.json_response(page_body(page))

    app.add_api_route(
        PATH, list_audit, methods=["GET"], tags=TAGS,
        summary="List audit events, newest first (append-only: no route changes or deletes them)",
        responses=schemas.responses(200, AUDIT_EVENT_LIST_REF, "an AuditEventList, newest first"),
    )
