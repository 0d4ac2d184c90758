"""Cost over HTTP: the run callback agents report usage to, and spend summed for ``joch cost``.

Routes::

    POST /v1/namespaces/{ns}/agentruns/{name}/callback   Authorization: Bearer <run token>
         {"events": [{id, model, inputTokens, outputTokens, cachedTokens, costUsd?}]} (or one event)
         → {"kind": "UsageReport", accepted, duplicates, costUsd, usage, budgetExceeded?}
    GET  /v1/cost?by=agent|namespace|team|model&since=7d|24h|RFC3339        every namespace
    GET  /v1/namespaces/{ns}/cost?by=...&since=...                           one namespace
         → {"kind": "CostReport", by, since, items: [{namespace?, agent?, team?, model?, costUsd,
            inputTokens, outputTokens, cachedTokens, runs, events}], total: {...}}

* **The callback authenticates itself.** It is the one route user authentication leaves alone
  (agents hold no user credentials); ``joch.controllers.metering`` checks the per-run token, and
  every refusal is the same 401 ``Status`` — before the body is even read, so a request without a
  valid token learns nothing, not even whether its body would have parsed. What an event means,
  how it is priced and counted once, and how a crossed budget stops the run: ``metering``.
* **Cost sums the usage table**, not the runs: it answers for runs since deleted, per period
  (``since`` is inclusive; without it, everything metered), and costs one query whatever the
  number of runs. ``since`` takes a duration back from now (``30m``, ``24h``, ``7d``, ``2w``) or an
  RFC 3339 time; anything else is a 400 saying so.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from contextlib import nullcontext
from dataclasses import replace
from enum import Enum
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query
from starlette.requests import Request
from starlette.responses import Response

from joch.api import errors
from joch.api.identity import acting_as, current_request
from joch.api.meta import parse_time
from joch.controllers import metering
from joch.server import resources, wire
from joch.server.options import ServerOptions
from joch.server.resources import ContentType
from joch.server.schemas import KindSchemas, error_responses
from joch.store.base import Store, UsageFilter, UsageGroup, UsageTotal

TAGS: list[str | Enum] = ["cost"]
GROUPS: dict[str, tuple[str, ...]] = {"agent": ("namespace", "agent"), "namespace": ("namespace",),
                                      "team": ("team",), "model": ("model",)}
_DURATION = re.compile(r"(\d+)([smhdw])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

By = Annotated[str, Query(alias="by", description="group by agent, namespace, team or model")]
Since = Annotated[str | None, Query(alias="since", description="30m, 24h, 7d, 2w back from now, or an RFC 3339 time")]


def since_time(text: str | None, now: float) -> float | None:
    if not text:
        return None
    match = _DURATION.fullmatch(text.strip())
    if match:
        return now - int(match.group(1)) * _SECONDS[match.group(2)]
    try:
        moment = parse_time(text.strip())
    except ValueError:
        raise errors.BadRequest(f'since: "{text}" is neither a duration (30m, 24h, 7d, 2w) nor an RFC 3339 time '
                                "(2026-01-31T00:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def bearer(header: str | None) -> str | None:
    scheme, _, token = (header or "").strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _item(by: str, total: UsageTotal) -> dict[str, Any]:
    out: dict[str, Any] = dict(zip(GROUPS.get(by, ()), total.group, strict=False))
    out.update(costUsd=round(total.cost_usd, 6), inputTokens=total.input_tokens, outputTokens=total.output_tokens,
               cachedTokens=total.cached_tokens, runs=total.runs, events=total.events)
    return out


class CostRoutes:
    def __init__(self, store: Store) -> None:
        self.store = store

    def callback(self, request: Request, namespace: str, name: str, body: bytes, content_type: str | None) -> Response:
        token = bearer(request.headers.get("authorization"))
        metering.authenticate(self.store, namespace, name, token)
        kind = wire.media_type(content_type)
        if not wire.is_json(kind):
            raise wire.unsupported(kind, wire.JSON)
        try:
            payload = json.loads(wire.decode_text(body))
        except ValueError as exc:
            raise errors.BadRequest(f"the request body is not JSON: {exc}") from None
        # The route is exempt from user authentication, so the request's user is anonymous; what the
        # report writes (the run's status, an Event) is the run's doing: audit it as the run.
        ctx = current_request()
        acting = replace(ctx, user=metering.run_user(namespace, name), verb="callback") if ctx else None
        with acting_as(acting) if acting else nullcontext():
            report = metering.report(self.store, namespace, name, token, payload)
        return wire.json_response({"kind": "UsageReport", "apiVersion": "v1", **report.to_dict()})

    def cost(self, namespace: str | None, by: str, since: str | None) -> Response:
        if by not in GROUPS:
            raise errors.BadRequest(f'by: "{by}" is not one of {", ".join(GROUPS)}')
        start = since_time(since, time.time())
        group: UsageGroup = by  # type: ignore[assignment]  # checked against GROUPS above
        items = self.store.usage_totals(UsageFilter(since=start, namespace=namespace), group)
        total = self.store.usage_totals(UsageFilter(since=start, namespace=namespace))[0]
        stamp = dt.datetime.fromtimestamp(start, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if start else None
        return wire.json_response({
            "kind": "CostReport", "apiVersion": "v1", "by": by, "since": stamp, "namespace": namespace,
            "items": [_item(by, t) for t in items], "total": _item("", total),
        })


def install(app: FastAPI, store: Store, options: ServerOptions, schemas: KindSchemas) -> None:
    h = CostRoutes(store)
    read_body = wire.body_reader(options.max_body_bytes)
    scope = resources.namespace_scope

    def callback(request: Request, name: str, namespace: str | None = Depends(scope),
                 body: bytes = Depends(read_body), content_type: ContentType = None) -> Response:
        return h.callback(request, namespace or "", name, body, content_type)

    def cost_all(by: By = "agent", since: Since = None) -> Response:
        return h.cost(None, by, since)

    def cost_namespace(by: By = "agent", since: Since = None, namespace: str | None = Depends(scope)) -> Response:
        return h.cost(namespace, by, since)

    event = {"type": "object", "required": ["id"], "properties": {
        "id": {"type": "string"}, "model": {"type": "string"},
        **{field: {"type": "integer", "minimum": 0, "maximum": metering.MAX_EVENT_TOKENS}
           for field in ("inputTokens", "outputTokens", "cachedTokens")},
        "costUsd": {"type": "number", "minimum": 0, "maximum": metering.MAX_EVENT_COST_USD}}}
    body_doc = resources.request_body({"oneOf": [{"type": "object", "required": ["events"], "properties": {
        "events": {"type": "array", "items": event}}}, event]}, wire.JSON)
    callback_doc = schemas.responses(200, None, "a UsageReport", body=True)
    callback_doc.update(error_responses((401, "No valid run token for this run (missing, wrong or expired)")))
    app.add_api_route("/v1/namespaces/{namespace}/agentruns/{name}/callback", callback, methods=["POST"], tags=TAGS,
                      summary="Report a run's token usage (authenticated by the run's own token)",
                      openapi_extra=body_doc, responses=callback_doc)
    app.add_api_route("/v1/cost", cost_all, methods=["GET"], tags=TAGS,
                      summary="Metered spend in every namespace, grouped",
                      responses=schemas.responses(200, None, "a CostReport"))
    app.add_api_route("/v1/namespaces/{namespace}/cost", cost_namespace, methods=["GET"], tags=TAGS,
                      summary="Metered spend in one namespace, grouped",
                      responses=schemas.responses(200, None, "a CostReport"))
