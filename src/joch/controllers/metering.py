"""Metering: the per-run token, usage events into cost, and the stop when spend crosses a cap.

There is one way into metering, ``report``: the ``POST /v1/namespaces/{ns}/agentruns/{name}/callback``
route calls it for the agent (``$JOCH_API_URL``, ``$JOCH_RUN_TOKEN``), and the runner's own
``report_usage`` posts to that route too, so whatever reports usage is checked, priced, deduplicated
and enforced the same way.

* **Run tokens** are ``jrt1_`` + HMAC-SHA256(key, ``<run uid>/<attempt>``), the key being the store's
  shared key ``run-token`` (``Store.shared_key``: random, made on first use, the same for every
  replica and after restarts; no route serves it). Nothing per run is stored, so a controller
  resuming a start after a crash hands the runner the same token. A token is accepted only for its
  run (uid) and attempt (``status.attempt``), and only while the run is ``Running``: once the run
  has ended, or a retry began, it is worthless. Comparison is constant-time; a missing, wrong or
  expired token, and a run that does not exist, all get the same 401, so the route says nothing
  about which runs exist. The token reaches the agent as a secret does (through the runner's
  pipe, redacted from its log) and is never logged, stored or shown.
* **An event** is ``{id, model, inputTokens, outputTokens, cachedTokens, costUsd?}``.
  ``inputTokens`` counts every input token, ``cachedTokens`` those of them served from the
  provider's cache (so ``cachedTokens <= inputTokens``; a provider that reports cache reads
  separately adds them to ``inputTokens``). Without ``costUsd`` the cost is
  ``((input - cached) * inputPerMillionUsd + cached * cachedInputPerMillionUsd + output *
  outputPerMillionUsd) / 1e6`` from the ``Model`` whose name, else whose ``spec.modelId``, is
  ``model`` (the Agent's ``spec.modelRoute`` when the event names none) in the run's namespace,
  else in ``joch-system``. An event no Model prices is a 422 naming it, and nothing of the
  request is recorded; as nobody but the agent sees that answer, the run says so too, where its
  user looks (``joch describe run``): its ``UsageRecorded`` condition turns False (reason
  ``UsageNotPriced``, the 422's message) with a Warning Event, once per message.
* **Exactly once.** Each event is a row keyed by (run uid, event id) in the store's usage table,
  inserted in the transaction that adds it to the run's ``status.costUsd`` and ``status.usage``: a
  retried request (the first one's answer lost) records nothing twice and answers the same totals.
* **Enforced while running.** When new spend takes the run over its own cap (``spec.budgetUsd``,
  else its Agent's ``defaults.budgetUsd``) or any Budget that applies over its ``limitUsd`` for the
  period, the same transaction sets the run's ``BudgetExceeded`` condition with the figures, records
  an Event and an audit entry; the run controller then cancels the run through its runtime and ends
  it ``Failed/BudgetExceeded`` with that message. Later events are still recorded (the money was
  spent) until the run ends.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError

from joch.api import errors, kinds
from joch.api.audit import AuditEntry
from joch.api.errors import Cause
from joch.api.identity import UserInfo
from joch.api.meta import Model, NonNegativeInt, Number, Str, set_condition
from joch.controllers import budgets, events
from joch.runtime.base import RUN_TOKEN_ENV
from joch.store.base import ListOptions, Obj, Store, UsageRecord, Writer
from joch.telemetry import metrics

# Names, not secrets: the store's key name and the token's prefix.
TOKEN_KEY = "run-token"  # noqa: S105
TOKEN_PREFIX = "jrt1_"  # noqa: S105
TOKEN_ENV = RUN_TOKEN_ENV
EXCEEDED = "BudgetExceeded"
MAX_EVENTS = 1000
# One usage event's cost: finite and at most this (a million dollars), so a report of 1e308 or
# Infinity cannot turn a run's, a Budget's or ``joch cost``'s sum into inf (not JSON, never below a limit).
MAX_EVENT_COST_USD = 1_000_000
# One usage event's token counts: at most a billion each (no model call comes near), so the sums
# the store keeps (SQLite integers are 64-bit) cannot overflow: 2**62 tokens a few times made
# ``GET /v1/cost`` a 500 for everyone.
MAX_EVENT_TOKENS = 1_000_000_000
COMPONENT = "joch-metering"
RECORDED = "UsageRecorded"
"""The run's condition that turns False when usage it reported could not be priced (``UsageNotPriced``)."""
UNPRICED = "UsageNotPriced"
_EVENT_INDEX = re.compile(r"^events\[\d+\]\.")  # the index says nothing once the message is on the run

_keys: weakref.WeakKeyDictionary[Store, bytes] = weakref.WeakKeyDictionary()


class UsageEvent(Model):
    id: Str = Field(min_length=1, max_length=256)
    model: Str | None = Field(default=None, min_length=1, max_length=253)
    inputTokens: NonNegativeInt = Field(default=0, le=MAX_EVENT_TOKENS)
    outputTokens: NonNegativeInt = Field(default=0, le=MAX_EVENT_TOKENS)
    cachedTokens: NonNegativeInt = Field(default=0, le=MAX_EVENT_TOKENS)
    costUsd: Number | None = Field(default=None, ge=0, le=MAX_EVENT_COST_USD, allow_inf_nan=False)


@dataclass(frozen=True)
class Report:
    """What a callback recorded: new events, retried ones, and the run's totals after it."""

    accepted: int
    duplicates: int
    cost_usd: float
    usage: dict[str, int]
    exceeded: str | None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accepted": self.accepted, "duplicates": self.duplicates, "costUsd": self.cost_usd,
                               "usage": self.usage}
        if self.exceeded:
            out["budgetExceeded"] = self.exceeded
        return out


# --- tokens ----------------------------------------------------------------------------------------

def run_token(store: Store, uid: str, attempt: int) -> str:
    """The token of a run's attempt (see the module docstring)."""
    key = _keys.get(store)
    if key is None:
        key = _keys[store] = store.shared_key(TOKEN_KEY)
    return TOKEN_PREFIX + hmac.new(key, f"{uid}/{attempt}".encode(), hashlib.sha256).hexdigest()


def token_matches(store: Store, run: Obj, token: str | None) -> bool:
    status = run.get("status") or {}
    attempt = status.get("attempt")
    if not token or status.get("phase") != "Running" or not isinstance(attempt, int) or isinstance(attempt, bool):
        return False
    expected = run_token(store, str(run["metadata"].get("uid") or ""), attempt)
    return hmac.compare_digest(expected.encode(), token.encode(errors="replace"))


def unauthorized() -> errors.Unauthorized:
    return errors.Unauthorized("a valid run token is required: send the run's $JOCH_RUN_TOKEN as "
                               "Authorization: Bearer <token> while the run is Running")


# --- events ----------------------------------------------------------------------------------------

def parse_events(body: Any) -> list[UsageEvent]:
    """``{"events": [...]}`` or a single event object; a 422 with a cause per bad field otherwise."""
    if isinstance(body, dict) and "events" in body and set(body) <= {"events", "apiVersion", "kind"}:
        items, where = body["events"], "events"
    else:
        items, where = [body], ""
    if not isinstance(items, list) or not items:
        raise errors.Invalid("usage report: events must be a non-empty list of usage events",
                             causes=[Cause("events", "Required value: a list of {id, model, inputTokens, "
                                                     "outputTokens, cachedTokens, costUsd?}", "FieldValueRequired")])
    if len(items) > MAX_EVENTS:
        raise errors.Invalid(f"usage report: at most {MAX_EVENTS} events per request, got {len(items)}",
                             causes=[Cause("events", f"Too many: {len(items)}", "FieldValueTooMany")])
    parsed: list[UsageEvent] = []
    causes: list[Cause] = []
    for i, item in enumerate(items):
        prefix = f"{where}[{i}]" if where else ""
        try:
            event = UsageEvent.model_validate(item)
        except ValidationError as exc:
            for problem in exc.errors():
                path = ".".join(str(p) for p in problem["loc"])
                causes.append(Cause(".".join(p for p in (prefix, path) if p), problem["msg"], "FieldValueInvalid"))
            continue
        if event.cachedTokens > event.inputTokens:
            causes.append(Cause(".".join(p for p in (prefix, "cachedTokens") if p),
                                f"cachedTokens ({event.cachedTokens}) counts input tokens served from cache, so it "
                                f"cannot exceed inputTokens ({event.inputTokens})", "FieldValueInvalid"))
        parsed.append(event)
    if causes:
        listing = ", ".join(f"{c.field}: {c.message}" for c in causes)
        raise errors.Invalid(f"invalid usage report: [{listing}]", causes=causes)
    return parsed


def find_model(reader: Writer, namespace: str, name: str) -> Obj | None:
    """The Model named ``name``, else the one whose ``spec.modelId`` is ``name``: in ``namespace``,
    then in ``joch-system``."""
    for where in dict.fromkeys((namespace, budgets.SYSTEM_NAMESPACE)):
        try:
            return reader.get(kinds.MODEL, where, name)
        except errors.NotFound:
            pass
        for model in reader.list(kinds.MODEL, ListOptions(namespace=where)).items:
            if (model.get("spec") or {}).get("modelId") == name:
                return model
    return None


def price(event: UsageEvent, model: Obj) -> float:
    pricing = (model.get("spec") or {}).get("pricing") or {}
    input_price = float(pricing.get("inputPerMillionUsd") or 0)
    cached_price = pricing.get("cachedInputPerMillionUsd")
    cached_price = input_price if cached_price is None else float(cached_price)
    output_price = float(pricing.get("outputPerMillionUsd") or 0)
    uncached = event.inputTokens - event.cachedTokens
    return (uncached * input_price + event.cachedTokens * cached_price + event.outputTokens * output_price) / 1e6


# --- the one way in --------------------------------------------------------------------------------

def report(store: Store, namespace: str, name: str, token: str | None, body: Any, *,
           clock: Callable[[], float] = time.time) -> Report:
    """Record a run's usage events (see the module docstring); ``Unauthorized`` for a bad token,
    ``Invalid`` for a bad event."""
    authenticate(store, namespace, name, token)
    parsed = parse_events(body)
    stop: str | None = None
    with store.transaction() as w:
        current = w.get(kinds.AGENT_RUN, namespace, name)
        if not token_matches(store, current, token):
            raise unauthorized()  # it ended since it was authenticated: the token expired
        agent = _agent(w, current)
        scope = budgets.RunScope.of(current, agent)
        route = ((agent or {}).get("spec") or {}).get("modelRoute")
        try:
            priced = [_priced(w, namespace, event, route, i) for i, event in enumerate(parsed)]
        except errors.Invalid as exc:
            unpriced: errors.Invalid | None = exc
            priced = []
        else:
            unpriced = None
        now = clock()
        accepted: list[UsageRecord] = []
        status = dict(current.get("status") or {})
        usage = dict(status.get("usage") or {})
        cost = budgets.cost_of(current)
        for event, model_name, amount in priced:
            record = UsageRecord(
                run_uid=current["metadata"]["uid"], event_id=event.id, namespace=namespace, run_name=name,
                agent=scope.agent, team=scope.team, model=model_name, input_tokens=event.inputTokens,
                output_tokens=event.outputTokens, cached_tokens=event.cachedTokens, cost_usd=amount,
                recorded_at=now)
            if not w.record_usage(record):
                continue
            accepted.append(record)
            cost += amount
            for field in ("inputTokens", "outputTokens", "cachedTokens"):
                usage[field] = int(usage.get(field) or 0) + int(getattr(event, field))
        totals = {f: int(usage.get(f) or 0) for f in ("inputTokens", "outputTokens", "cachedTokens")}
        already = exceeded(current)
        if accepted:
            status.update(costUsd=round(cost, 6), usage=totals)
            if already is None:
                stop = crossed(w, current, agent, scope, cost, now)
                if stop is not None:
                    status["conditions"] = set_condition(list(status.get("conditions") or []), {
                        "type": EXCEEDED, "status": "True", "reason": EXCEEDED, "message": stop})
            out = w.update_status(kinds.AGENT_RUN, {**current, "status": status})
            if stop is not None:
                events.record(w, out, reason=EXCEEDED, message=f"stopping the run: {stop}", type="Warning",
                              component=COMPONENT)
                who = run_user(namespace, name)
                w.audit(AuditEntry(verb="run", kind="AgentRun", namespace=namespace, name=name, decision="denied",
                                   reason=f"{EXCEEDED}: {stop}", actor=who.name, groups=who.groups))
    observe_spend(accepted)
    if unpriced is not None:
        _say_unpriced(store, namespace, name, unpriced.message)
        raise unpriced
    return Report(accepted=len(accepted), duplicates=len(priced) - len(accepted), cost_usd=round(cost, 6), usage=totals,
                  exceeded=stop or already)


def observe_spend(records: list[UsageRecord]) -> None:
    """Count committed usage in ``joch_spend_usd_total`` and ``joch_usage_tokens_total``."""
    for r in records:
        metrics.SPEND.labels(r.namespace, r.agent).inc(r.cost_usd)
        for kind, tokens in (("input", r.input_tokens), ("output", r.output_tokens), ("cached", r.cached_tokens)):
            metrics.TOKENS.labels(r.namespace, r.agent, kind).inc(tokens)


def run_user(namespace: str, name: str) -> UserInfo:
    """Who a run's callback acts as once its run token checked out (the actor of the audit rows of
    what its usage report writes): ``system:run:NAMESPACE:NAME``, in no group."""
    return UserInfo(f"system:run:{namespace}:{name}")


def authenticate(store: Store, namespace: str, name: str, token: str | None) -> Obj:
    """The run, when ``token`` is its current attempt's and it is Running; else the same 401 for
    every case (and an audit entry)."""
    try:
        run: Obj | None = store.get(kinds.AGENT_RUN, namespace, name)
    except errors.NotFound:
        run = None
    if run is None or not token_matches(store, run, token):
        _denied(store, namespace, name)
        raise unauthorized()
    return run


def crossed(reader: Writer, run: Obj, agent: Obj | None, scope: budgets.RunScope, cost: float,
            now: float) -> str | None:
    """Why the run must stop now that it has spent ``cost`` (its cap, or a Budget's limit), or None."""
    cap = budgets.reservation(run, agent)
    if cap is not None and cost > cap + budgets.EPSILON:
        source = "spec.budgetUsd" if run["spec"].get("budgetUsd") is not None else "its Agent's defaults.budgetUsd"
        return f"the run has spent {budgets.usd(cost)}, over its own budget of {budgets.usd(cap)} ({source})"
    for budget in budgets.applicable(budgets.budgets_for(reader, scope.namespace), scope):
        spec = budget.get("spec") or {}
        limit = float(spec.get("limitUsd") or 0)
        period = str(spec.get("period") or "total")
        start, _ = budgets.period_bounds(period, now)
        spend = reader.usage_totals(budgets.usage_filter(budget, start))[0].cost_usd
        if spend > limit + budgets.EPSILON:
            since = f" since {budgets.stamp(start)}" if start is not None else ""
            return (f"{budgets.name_of(budget)} has spent {budgets.usd(spend)}{since}, over its limit of "
                    f"{budgets.usd(limit)} {budgets.per(period)} (this run: {budgets.usd(cost)})")
    return None


def exceeded(run: Obj) -> str | None:
    """The message of the run's ``BudgetExceeded`` condition while it is True, else None."""
    for condition in (run.get("status") or {}).get("conditions") or []:
        if condition.get("type") == EXCEEDED and condition.get("status") == "True":
            return str(condition.get("message") or EXCEEDED)
    return None


def _agent(reader: Writer, run: Obj) -> Obj | None:
    try:
        return reader.get(kinds.AGENT, run["metadata"].get("namespace"), run["spec"]["agentRef"]["name"])
    except errors.NotFound:
        return None


def _priced(reader: Writer, namespace: str, event: UsageEvent, route: Any, index: int
            ) -> tuple[UsageEvent, str, float]:
    name = event.model or (route if isinstance(route, str) and route else "")
    if event.costUsd is not None:
        return event, name, float(event.costUsd)
    field = f"events[{index}].model"
    if not name:
        raise errors.Invalid(f"{field}: required when costUsd is not given (the run's Agent names no "
                             "spec.modelRoute to price it with)",
                             causes=[Cause(field, "Required value: a Model's name or modelId, or give costUsd",
                                           "FieldValueRequired")])
    model = find_model(reader, namespace, name)
    if model is None:
        message = (f'no Model "{name}" (by name or spec.modelId) in namespace "{namespace}" or '
                   f'"{budgets.SYSTEM_NAMESPACE}" to price it: create one with its pricing, or give costUsd')
        raise errors.Invalid(f"{field}: {message}", causes=[Cause(field, message, "FieldValueNotFound")])
    return event, str(model["metadata"]["name"]), price(event, model)


def _say_unpriced(store: Store, namespace: str, name: str, message: str) -> None:
    """Set the run's ``UsageRecorded`` condition False with ``message`` and record a Warning Event,
    unless it already says exactly that (an agent reports again and again)."""
    text = f"usage the agent reported was not recorded: an event's {_EVENT_INDEX.sub('', message)}"
    with store.transaction() as w:
        try:
            current = w.get(kinds.AGENT_RUN, namespace, name)
        except errors.NotFound:
            return
        status = dict(current.get("status") or {})
        conditions = list(status.get("conditions") or [])
        if any(c.get("type") == RECORDED and c.get("status") == "False" and c.get("message") == text
               for c in conditions):
            return
        status["conditions"] = set_condition(conditions, {"type": RECORDED, "status": "False", "reason": UNPRICED,
                                                          "message": text})
        out = w.update_status(kinds.AGENT_RUN, {**current, "status": status})
        events.record(w, out, reason=UNPRICED, message=text, type="Warning", component=COMPONENT)


def _denied(store: Store, namespace: str, name: str) -> None:
    """Audit a refused callback, in a transaction of its own (the refusal writes nothing else)."""
    try:
        store.audit(AuditEntry(verb="callback", kind="AgentRun", namespace=namespace, name=name, decision="denied",
                               reason="run callback without a valid run token"))
    except errors.JochError:
        pass
