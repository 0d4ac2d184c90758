"""WebhookDeliveries: what a verified delivery causes.

The webhook routes (``joch.server.webhooks``) only verify, record and answer: GitHub and Linear want
an answer within seconds and retry otherwise. ``DeliveryController`` does the work, once per
delivery: a ``Received`` delivery's issue is applied to its source's spec (``sources.apply_issue``),
and every enabled TriggerRule following the source whose trigger the event fires is evaluated
(``triggers``), with the dedupe keys a poll of the same change would get; a generic delivery
evaluates its rule. The delivery then says ``Processed`` and lists what it caused
(``ImplementationSpec/gh-acme-web-12 created``, ``TriggerExecution/fix-3b1c… Dispatched (AgentRun
fix-3b1c…)``). Work that fails is retried (the manager's backoff); an event that cannot be read, or
whose source or rule is gone, ends ``Failed`` with the reason.
"""

from __future__ import annotations

import logging
from typing import Any

from joch.api import errors
from joch.api.integrations import IMPLEMENTATION_SOURCE, TRIGGER_RULE, WEBHOOK_DELIVERY
from joch.api.meta import set_condition
from joch.controllers import sources, triggers
from joch.controllers.base import Context, Controller, Key, Result
from joch.integrations import events
from joch.store.base import ListOptions, Obj

log = logging.getLogger("joch.controllers.deliveries")


class DeliveryController(Controller):
    name = "deliveries"
    kind = WEBHOOK_DELIVERY

    def __init__(self) -> None:
        self._ctx: Context | None = None

    @property
    def ctx(self) -> Context:
        if self._ctx is None:
            raise RuntimeError("DeliveryController used before setup()")
        return self._ctx

    def setup(self, ctx: Context) -> None:
        self._ctx = ctx

    def reconcile(self, key: Key) -> Result | None:
        cached = self.ctx.cache(WEBHOOK_DELIVERY).get(key.namespace, key.name)
        if cached is None or (cached.get("status") or {}).get("phase") not in (None, "Received"):
            return None
        try:  # the cache may not have seen this controller's own Processed yet: never process twice
            delivery = self.ctx.store.get(WEBHOOK_DELIVERY, key.namespace, key.name)
        except errors.NotFound:
            return None
        if (delivery.get("status") or {}).get("phase") not in (None, "Received"):
            return None
        try:
            caused = process(self.ctx.store, delivery, self.ctx.clock.time())
        except _Unusable as exc:
            self._finish(delivery, "Failed", [], str(exc))
            return None
        self._finish(delivery, "Processed", caused, None)
        return None

    def _finish(self, delivery: Obj, phase: str, caused: list[str], message: str | None) -> None:
        m = delivery["metadata"]
        current = self.ctx.store.get(WEBHOOK_DELIVERY, m.get("namespace"), m["name"])
        status: dict[str, Any] = {**(current.get("status") or {}), "phase": phase,
                                  "processedAt": triggers.stamp(self.ctx.clock.time()), "caused": caused}
        if message:
            status["message"] = message
        status["conditions"] = set_condition(list(status.get("conditions") or []), {
            "type": "Processed", "status": "True" if phase == "Processed" else "False", "reason": phase,
            "message": message or (f"caused {len(caused)} change(s)" if caused else "caused nothing")})
        self.ctx.store.update_status(WEBHOOK_DELIVERY, {**current, "status": status})


class _Unusable(Exception):
    """A delivery that no retry can process (its source or rule is gone, its event unreadable)."""


def process(store: Any, delivery: Obj, now: float) -> list[str]:
    """Apply ``delivery`` (see the module docstring); what it caused, as lines."""

    m = delivery["metadata"]
    namespace = m.get("namespace") or ""
    spec = delivery.get("spec") or {}
    if spec.get("provider") == "generic":
        return _generic(store, namespace, delivery, now)
    try:
        event = events.TrackerEvent.from_payload(spec.get("payload") or {})
    except (KeyError, TypeError, ValueError) as exc:
        raise _Unusable(f"the recorded event cannot be read: {exc}") from None
    source_name = (spec.get("sourceRef") or {}).get("name")
    try:
        source = store.get(IMPLEMENTATION_SOURCE, namespace, source_name)
    except errors.NotFound:
        raise _Unusable(f'ImplementationSource "{source_name}" no longer exists') from None
    if event.issue is None or event.kind not in ("issue", "comment"):
        return []
    if event.pull_request is not None:  # a comment on a pull request: not an issue Joch syncs
        return []
    caused: list[str] = []
    change = sources.apply_issue(store, source, event.issue, now)
    if change.change != "unchanged":
        caused.append(f"ImplementationSpec/{change.name} {change.change}")
    rules = triggers.rules_for_source(store.list(TRIGGER_RULE, ListOptions(namespace=namespace)).items, m_name(source))
    actor = getattr(event, "actor", None)
    if event.kind == "issue":
        added = tuple(dict.fromkeys([*change.added_labels, *event.added_labels]))
        executions = triggers.issue_changed(store, rules, event.issue, change.opened, added, now,
                                            action=event.action, label=event.label, actor=actor, delivery=m["name"])
    else:
        executions = []
        comment = event.comment
        trigger_event = triggers.TriggerEvent(
            kind="comment", provider=event.provider, action=event.action, issue=event.issue,
            comment_id=str(comment.id) if comment else None, comment_body=comment.body if comment else None,
            association=comment.association if comment else None,
            actor=(comment.author if comment else None) or actor, delivery=m["name"])
        for rule in rules:
            try:
                spec_ = triggers.rule_spec(rule)
            except ValueError:
                continue
            if triggers.comment_fires(spec_, trigger_event):
                executions.append(triggers.evaluate(store, rule, trigger_event, kind="comment", now=now,
                                                    actor=trigger_event.actor))
    caused += [describe(x) for x in executions]
    return caused


def describe(execution: Obj) -> str:
    spec = execution.get("spec") or {}
    run = (spec.get("runRef") or {}).get("name")
    said = f"TriggerExecution/{execution['metadata']['name']} {spec.get('decision')}"
    if run:
        return f"{said} (AgentRun {run})"
    return f"{said} ({spec.get('reason')})" if spec.get("reason") else said


def _generic(store: Any, namespace: str, delivery: Obj, now: float) -> list[str]:
    spec = delivery.get("spec") or {}
    rule_name = (spec.get("ruleRef") or {}).get("name")
    try:
        rule = store.get(TRIGGER_RULE, namespace, rule_name)
    except errors.NotFound:
        raise _Unusable(f'TriggerRule "{rule_name}" no longer exists') from None
    if (rule.get("spec") or {}).get("enabled", True) is False:
        return [f"TriggerRule/{rule_name} is disabled: nothing evaluated"]
    problem = triggers.name_problem(rule)
    if problem is not None:
        raise _Unusable(problem)
    payload = spec.get("payload") or {}
    body = payload.get("payload")
    body = body if isinstance(body, dict) else payload
    headers = payload.get("headers")
    headers = headers if isinstance(headers, dict) else {}
    event = triggers.TriggerEvent(kind="webhook", provider="generic", action=spec.get("action"),
                                  delivery=delivery["metadata"]["name"], payload=body,
                                  headers={str(k): str(v) for k, v in headers.items()})
    execution = triggers.evaluate(store, rule, event, kind="webhook", now=now,
                                  dedupe_key=f"webhook:{spec.get('deliveryId')}")
    return [describe(execution)]


def m_name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])
