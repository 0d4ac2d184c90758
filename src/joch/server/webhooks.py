"""Webhooks in, and ``joch trigger fire``: the routes that turn outside events into TriggerRule
evaluations.

Routes::

    POST /v1/webhooks/github                            X-Hub-Signature-256 over the body
    POST /v1/webhooks/linear                            Linear-Signature, webhookTimestamp within 60 s
    POST /v1/webhooks/{namespace}/{rule}                X-Joch-Signature-256 (or X-Hub-Signature-256)
    POST /v1/namespaces/{namespace}/triggerrules/{name}/fire   {"key"?, "parameters"?, "text"?}

Decisions:

* **The webhook routes take no bearer token** (``joch.server.auth.middleware`` exempts
  ``/v1/webhooks/``): the signature is the authentication. GitHub's and Linear's secrets are the
  ``spec.webhook.secretRef`` of the ImplementationSources following the delivery's repository
  (team), in any namespace; a generic webhook's is its rule's ``spec.webhook.secretRef``. They are
  read from the store's sealed Secrets (``reveal``) for each delivery and compared in constant time.
* **A delivery no secret verifies is a 401 and nothing is stored** (no delivery, no spec, no run); the
  refusal is audited (verb ``create``, kind ``WebhookDelivery``, decision ``denied``). The body is
  parsed before it is verified only to find whose secrets to try; nothing else reads it first.
* **Recorded, then answered.** A verified delivery becomes one ``WebhookDelivery`` per verifying
  source (in the source's namespace), named ``<provider>-<sha256(delivery id)[:20]>``: a replay
  (GitHub's "redeliver", a retry after a timeout) finds the name taken and gets a 200 with
  ``"duplicate": true`` and causes nothing. The work (specs, rule evaluations, runs) is the delivery
  controller's (``joch.controllers.deliveries``), so the answer comes within GitHub's 10 s.
  Bodies over 1 MiB are a 413 (GitHub caps its payloads at 25 MB, but issues are small).
  Deliveries are written as ``system:joch:webhook:<provider>`` (group ``system:joch:webhooks``), so
  the audit log tells them from people.
* **Fire** is RBAC ``create`` on ``triggerrules/fire`` (editors may). It evaluates the rule at once,
  as a ``manual`` event whose actor is the authenticated user, and answers the TriggerExecution
  (``Dispatched`` with its run, ``Deduplicated`` when ``key`` was fired before, ``Rejected`` with the
  reason). The run is still created as the rule's trigger identity, so dispatch policies treat a
  fired run like a triggered one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, NoReturn

from fastapi import Depends, FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from joch.admission.apply import create_documents
from joch.admission.documents import Document
from joch.api import errors, kinds
from joch.api.audit import AuditEntry
from joch.api.identity import ANONYMOUS, RequestContext, UserInfo, acting_as, current_request, current_user
from joch.api.integrations import TRIGGER_EXECUTION, TRIGGER_RULE, WEBHOOK_DELIVERY, TriggerRuleSpec, WebhookTrigger
from joch.api.meta import now as now_text
from joch.controllers import sources, triggers
from joch.integrations import events, signatures
from joch.integrations.base import TrackerError
from joch.server import resources, wire
from joch.server.options import ServerOptions
from joch.server.schemas import KindSchemas
from joch.store.base import Obj, Store
from joch.telemetry import metrics

MAX_WEBHOOK_BYTES = 1024 * 1024
WEBHOOKS_GROUP = "system:joch:webhooks"
TAGS: list[str | Enum] = ["webhooks"]
KEPT_HEADERS = ("content-type", "user-agent", "x-joch-delivery", "x-joch-event", "x-github-event",
                "x-github-delivery", "linear-event", "linear-delivery")


def webhook_user(provider: str) -> UserInfo:
    return UserInfo(f"system:joch:webhook:{provider}", (WEBHOOKS_GROUP,))


def delivery_name(provider: str, delivery_id: str) -> str:
    return f"{provider}-{hashlib.sha256(delivery_id.encode()).hexdigest()[:20]}"


class WebhookRoutes:
    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    # --- GitHub ------------------------------------------------------------------------------------

    def github(self, body: bytes, headers: Mapping[str, str]) -> Response:

        event_name, delivery = headers.get("x-github-event"), headers.get("x-github-delivery")
        if not event_name or not delivery:
            raise errors.BadRequest("a GitHub webhook delivery carries the X-GitHub-Event and X-GitHub-Delivery "
                                    "headers; this request has " + ("neither" if not (event_name or delivery) else
                                                                    "only one of them"))
        payload = _json(body)
        repository = _mapping(payload.get("repository"))
        owner, name = _mapping(repository.get("owner")).get("login"), repository.get("name")
        candidates = sources.sources_of_repository(self.store, str(owner or ""), str(name or "")) \
            if owner and name else []
        signature = headers.get("x-hub-signature-256")
        verified = [s for s in candidates if (secret := self._source_secret(s)) is not None
                    and signatures.verify_github(secret, body, signature)]
        where = f"{owner}/{name}" if owner and name else "a delivery without a repository"
        if not verified:
            self._refuse("github", f"X-Hub-Signature-256 of GitHub delivery {delivery} ({event_name}) for {where} "
                                   "does not verify with the webhook secret of any ImplementationSource following it")
        try:
            event = events.parse_github(event_name, delivery, payload)
        except TrackerError as exc:  # signed by a source, but not shaped as GitHub sends it
            raise errors.BadRequest(exc.message) from None
        return self._record("github", delivery, event_name, event, verified)

    # --- Linear ------------------------------------------------------------------------------------

    def linear(self, body: bytes, headers: Mapping[str, str]) -> Response:

        payload = _json(body)
        delivery = headers.get("linear-delivery") or str(payload.get("webhookId") or "") + ":" + \
            str(payload.get("webhookTimestamp") or "")
        event_name = headers.get("linear-event") or str(payload.get("type") or "")
        try:
            event: events.TrackerEvent | None = events.parse_linear(delivery, payload)
            problem = None
        except TrackerError as exc:  # unreadable: only a signature may tell the sender it is malformed
            event, problem = None, exc.message
        signature = headers.get("linear-signature")
        candidates = sources.sources_of_team(self.store, event.team_key if event is not None else None)
        verified = [s for s in candidates if (secret := self._source_secret(s)) is not None
                    and signatures.verify_linear(secret, body, signature)]
        if not verified:
            self._refuse("linear", f"Linear-Signature of Linear delivery {delivery} ({event_name}) does not verify "
                                   "with the webhook secret of any ImplementationSource of its team")
        if event is None:
            raise errors.BadRequest(problem or "the Linear delivery cannot be read")
        if not signatures.linear_fresh(payload, self.clock()):
            self._refuse("linear", f"Linear delivery {delivery}: webhookTimestamp {payload.get('webhookTimestamp')} "
                                   "is more than 60 s from the server's clock (a replay, or the clocks differ)")
        return self._record("linear", delivery, event_name, event, verified)

    # --- generic -----------------------------------------------------------------------------------

    def generic(self, namespace: str, rule_name: str, body: bytes, headers: Mapping[str, str]) -> Response:

        refused = (f"the delivery for TriggerRule {namespace}/{rule_name} is not signed with its webhook secret "
                   "(X-Joch-Signature-256: sha256=<HMAC-SHA256 of the body>), or the rule has no spec.webhook")
        try:
            rule = self.store.get(TRIGGER_RULE, namespace, rule_name)
        except errors.NotFound:
            self._refuse("generic", refused)
        webhook = TriggerRuleSpec.model_validate(rule.get("spec") or {}).webhook
        if webhook is None:
            self._refuse("generic", refused)
        secret = _secret(self.store, namespace, webhook.secretRef.name, webhook.secretRef.key)
        if secret is None or not signatures.verify_generic(secret, body, dict(headers)):
            self._refuse("generic", refused)
        payload = _json(body)
        kept = {k: v for k, v in headers.items() if k.lower() in KEPT_HEADERS}
        delivery = self._generic_key(webhook, rule_name, payload, kept, body, headers)
        record = {"payload": payload, "headers": kept}
        obj = self._delivery(namespace, "generic", delivery, headers.get("x-joch-event") or "webhook", None,
                             record, rule_ref=rule_name)
        created = self._create(obj, "generic")
        return _delivered("generic", created is None, [f"{namespace}/{obj['metadata']['name']}"])

    def _generic_key(self, webhook: WebhookTrigger, rule: str, payload: dict[str, Any], kept: dict[str, str],
                     body: bytes, headers: Mapping[str, str]) -> str:
        if webhook.dedupeKey:
            event = triggers.TriggerEvent(kind="webhook", payload=payload, headers=kept)
            # The key is stored (the delivery's deliveryId, the execution's dedupeKey): the template never
            # sees the signature or a credential header, so no rule can copy one into a readable object.
            visible = events.generic(rule, payload, headers).headers
            try:
                rendered = triggers.TEMPLATES.from_string(webhook.dedupeKey).render(
                    payload=payload, headers=visible, event=event.context())
            except Exception as exc:  # noqa: BLE001 - any template failure is the rule's to fix
                raise errors.BadRequest(f"TriggerRule {rule} spec.webhook.dedupeKey cannot be rendered for this "
                                        f"delivery: {exc}") from None
            if rendered.strip():
                return rendered.strip()
        return headers.get("x-joch-delivery") or "sha256:" + hashlib.sha256(body).hexdigest()

    # --- shared ------------------------------------------------------------------------------------

    def _source_secret(self, source: Obj) -> bytes | None:
        ref = ((source.get("spec") or {}).get("webhook") or {}).get("secretRef") or {}
        if not ref.get("name") or not ref.get("key"):
            return None
        return _secret(self.store, source["metadata"].get("namespace") or "", ref["name"], ref["key"])

    def _refuse(self, provider: str, reason: str) -> NoReturn:
        # Anyone may call these routes and every refusal is an audit row: the sender's headers and body
        # (delivery id, event, repository) are clipped, so a request cannot write 64 KiB into the log.
        reason = _clipped(reason)
        outer = current_request()
        user = webhook_user(provider)
        self.store.audit(AuditEntry(verb="create", kind=WEBHOOK_DELIVERY.kind, decision="denied", reason=reason,
                                    actor=user.name, groups=user.groups,
                                    request_id=outer.request_id if outer else "",
                                    source_ip=outer.source_ip if outer else ""))
        raise errors.Unauthorized(f"{reason}: check that the secret configured for the webhook is the one in the "
                                  "Secret spec.webhook.secretRef names")

    def _delivery(self, namespace: str, provider: str, delivery: str, event_name: str, action: str | None,
                  payload: dict[str, Any], *, source_ref: str | None = None, rule_ref: str | None = None) -> Obj:
        spec: dict[str, Any] = {"provider": provider, "deliveryId": delivery, "event": event_name,
                                "receivedAt": now_text(), "verified": True, "payload": payload}
        if action:
            spec["action"] = action
        if source_ref:
            spec["sourceRef"] = {"name": source_ref}
        if rule_ref:
            spec["ruleRef"] = {"name": rule_ref}
        return {"apiVersion": WEBHOOK_DELIVERY.api_version, "kind": WEBHOOK_DELIVERY.kind,
                "metadata": {"name": delivery_name(provider, delivery), "namespace": namespace}, "spec": spec}

    def _record(self, provider: str, delivery: str, event_name: str, event: Any, verified: list[Obj]) -> Response:
        names, duplicate = [], True
        for source in verified:
            namespace = source["metadata"].get("namespace") or ""
            obj = self._delivery(namespace, provider, delivery, event_name, getattr(event, "action", None),
                                 event.to_payload(), source_ref=source["metadata"]["name"])
            if self._create(obj, provider) is not None:
                duplicate = False
            names.append(f"{namespace}/{obj['metadata']['name']}")
        return _delivered(provider, duplicate, names)

    def _create(self, obj: Obj, provider: str) -> Obj | None:
        """Store the delivery (status Received); None when it was recorded before (a replay)."""
        outer = current_request()
        ctx = RequestContext(user=webhook_user(provider), request_id=outer.request_id if outer else "",
                             source_ip=outer.source_ip if outer else "", verb="create")
        with acting_as(ctx):
            try:
                result = create_documents(self.store, [Document(index=0, source="webhook", obj=obj)])
            except errors.AlreadyExists:
                return None
            created = result.items[0].object
            try:
                return self.store.update_status(WEBHOOK_DELIVERY, {**created, "status": {"phase": "Received"}})
            except errors.Conflict:
                # The deliveries controller saw the new object on its watch and wrote its status first:
                # the delivery is further along than Received, which is what this write would have said.
                return created

    # --- fire --------------------------------------------------------------------------------------

    def fire(self, namespace: str, name: str, body: bytes, content_type: str | None) -> Response:
        given = wire.decode_object(body, content_type, allow_yaml=False) if body.strip() else {}
        unknown = sorted(set(given) - {"key", "parameters", "text", "apiVersion", "kind"})
        causes = [errors.Cause(k, "unknown field: the body takes key, parameters and text", "FieldValueNotSupported")
                  for k in unknown]
        key, parameters, text = given.get("key"), given.get("parameters") or {}, given.get("text")
        if key is not None and (not isinstance(key, str) or not key.strip()):
            causes.append(errors.Cause("key", "must be a non-empty string", "FieldValueInvalid"))
        if not isinstance(parameters, dict) or not all(isinstance(v, str) for v in parameters.values()):
            causes.append(errors.Cause("parameters", "must map names to strings", "FieldValueInvalid"))
        if text is not None and not isinstance(text, str):
            causes.append(errors.Cause("text", "must be a string", "FieldValueInvalid"))
        if causes:
            raise errors.Invalid(f'the fire request for TriggerRule "{name}" is invalid', kind=TRIGGER_RULE.plural,
                                 name=name, causes=causes)
        rule = self.store.get(TRIGGER_RULE, namespace, name)
        if (rule.get("spec") or {}).get("enabled", True) is False:
            raise errors.Conflict(f'TriggerRule "{name}" is disabled (spec.enabled: false): enable it to fire it',
                                  kind=TRIGGER_RULE.plural, name=name)
        user = current_user() or ANONYMOUS
        execution = triggers.fire(self.store, rule, actor=user.name, now=self.clock(), key=key,
                                  parameters={str(k): str(v) for k, v in parameters.items()}, text=text)
        dispatched = (execution.get("spec") or {}).get("decision") == "Dispatched"
        return wire.json_response(execution, status_code=201 if dispatched else 200)


def _delivered(provider: str, duplicate: bool, names: list[str]) -> Response:
    metrics.WEBHOOK_DELIVERIES.labels(provider, "duplicate" if duplicate else "accepted").inc()
    return wire.json_response({"kind": WEBHOOK_DELIVERY.kind, "duplicate": duplicate, "deliveries": names})


async def _receive(provider: str, handle: Callable[..., Response], *args: Any) -> Response:
    """``handle`` a delivery in a worker thread, counting one that fails (an accepted or a
    duplicate one is counted by ``_delivered``)."""
    try:
        return await run_in_threadpool(handle, *args)
    except Exception as exc:
        outcome = ("refused" if isinstance(exc, errors.Unauthorized)
                   else "invalid" if isinstance(exc, errors.BadRequest | errors.Invalid) else "error")
        metrics.WEBHOOK_DELIVERIES.labels(provider, outcome).inc()
        raise


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise errors.BadRequest(f"the webhook body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise errors.BadRequest("the webhook body must be a JSON object")
    return value


def _clipped(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _secret(store: Store, namespace: str, name: str, key: str) -> bytes | None:
    try:
        secret = store.reveal(kinds.SECRET, namespace, name)
    except errors.NotFound:
        return None
    value = ((secret.get("spec") or {}).get("data") or {}).get(key)
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def install(app: FastAPI, store: Store, options: ServerOptions, schemas: KindSchemas) -> None:
    del options
    h = WebhookRoutes(store)
    read_webhook = wire.body_reader(MAX_WEBHOOK_BYTES)
    read_body = wire.body_reader(MAX_WEBHOOK_BYTES)

    def headers_of(request: Request) -> dict[str, str]:
        return {k.lower(): v for k, v in request.headers.items()}

    async def github(request: Request, body: bytes = Depends(read_webhook)) -> Response:
        return await _receive("github", h.github, body, headers_of(request))

    async def linear(request: Request, body: bytes = Depends(read_webhook)) -> Response:
        return await _receive("linear", h.linear, body, headers_of(request))

    async def generic(request: Request, rule: str, namespace: str | None = Depends(resources.namespace_scope),
                      body: bytes = Depends(read_webhook)) -> Response:
        return await _receive("generic", h.generic, namespace or "", rule, body, headers_of(request))

    async def fire(request: Request, name: str, namespace: str | None = Depends(resources.namespace_scope),
                   body: bytes = Depends(read_body)) -> Response:
        return await run_in_threadpool(h.fire, namespace or "", name, body, request.headers.get("content-type"))

    delivered = schemas.responses(200, None, '{"kind": "WebhookDelivery", "duplicate": bool, "deliveries": [...]}')
    app.add_api_route("/v1/webhooks/github", github, methods=["POST"], tags=TAGS, responses=delivered,
                      summary="A GitHub webhook delivery (X-Hub-Signature-256 verified against the sources' secrets)")
    app.add_api_route("/v1/webhooks/linear", linear, methods=["POST"], tags=TAGS, responses=delivered,
                      summary="A Linear webhook delivery (Linear-Signature verified against the sources' secrets)")
    app.add_api_route("/v1/webhooks/{namespace}/{rule}", generic, methods=["POST"], tags=TAGS, responses=delivered,
                      summary="A generic webhook for a TriggerRule with spec.webhook (X-Joch-Signature-256)")
    app.add_api_route("/v1/namespaces/{namespace}/triggerrules/{name}/fire", fire, methods=["POST"], tags=TAGS,
                      summary="Evaluate a TriggerRule now, as a manual event (joch trigger fire)",
                      responses=schemas.responses(200, schemas.object(TRIGGER_EXECUTION), "the TriggerExecution",
                                                  body=True))
