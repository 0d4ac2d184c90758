"""TriggerRules: an event becomes (at most) one AgentRun, and every evaluation leaves a
TriggerExecution saying what was decided and why.

``evaluate`` is the one place a rule is evaluated, whatever the event came by: a webhook delivery
(``joch.controllers.deliveries``), a poll of the source (``sources.SourceController``), the
schedule (``TriggerController``) or ``joch trigger fire`` (the fire route).

* **Dedupe keys.** Every event has one: ``issue:<item>:<action>[:<label>]`` (a rule on a label:
  ``issue:<item>:labeled:<label>`` whatever the action),
  ``comment:<item>:<comment id>``, ``schedule:<RFC 3339 time>``, ``webhook:<delivery id or the
  rule's dedupeKey template>``, ``manual:<uuid or --key>``. A dispatched execution is named
  ``<rule>-<sha256(key)[:10]>`` and created in ONE admission batch with its AgentRun, of the same
  name: the store's uniqueness of names is the dedupe, across restarts and replicas. A second
  evaluation of the key finds the name taken and records a ``Deduplicated`` execution
  (``generateName: <rule>-``) naming the first.
* **Rejections** are recorded too, with a reason: ``ActorNotAllowed``, ``InvalidCommand`` and
  ``AgentNotAllowed`` (a comment command; the record takes the key's name, so a replay of the
  comment is only Deduplicated), ``ConcurrencyForbidden``, ``NoImplementation`` and ``Invalid``
  (admission refused the run: a dispatch policy, a missing Agent; a new name each time, so the same
  event may be dispatched once the cause is fixed).
* **concurrencyPolicy** is per source item: the runs of the rule labelled with the item's hash
  (``joch.dev/source-item-hash``) that have not ended. ``Forbid`` rejects, ``Replace`` sets
  ``spec.cancel`` on them and dispatches, ``Allow`` dispatches.
* **Who runs it.** The run is created as ``system:joch:trigger:<namespace>:<rule>`` (group
  ``joch:triggers``): admission records that creator, dispatch policies and budgets see it, and the
  audit log shows it (with the request id of the webhook or fire request that caused it).
* **The run.** ``spec.run``'s agent, parameters (a command's ``key=value`` over the rule's, and
  ``joch trigger fire -p`` over those), budget, timeout, labels and annotations; the issue's synced
  ImplementationSpec (or ``implementation.inline`` rendered as a Jinja2 template over ``event``; an
  issue the source does not sync — a command on an issue its label filter leaves out — inline);
  ``execution`` from the rule or else the issue's repository at its default branch.

``TriggerController`` fires scheduled rules on ``ctx.clock``: the latest cron time due since the
last one (never more than one per look, like a CronJob that missed several), skipped when later
than ``startingDeadlineSeconds``; it asks to look again at the next time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from joch.admission.apply import create_documents
from joch.admission.documents import Document
from joch.api import errors, kinds
from joch.api.identity import RequestContext, UserInfo, acting_as, current_request
from joch.api.integrations import (
    EXECUTION_ANNOTATION,
    RULE_LABEL,
    SOURCE_ITEM,
    SOURCE_ITEM_HASH,
    TRIGGER_EXECUTION,
    TRIGGER_RULE,
    TriggerRuleSpec,
)
from joch.api.meta import parse_time, set_condition
from joch.controllers import events
from joch.controllers.base import Context, Controller, Key, Result
from joch.controllers.issues import item_hash, spec_name, spec_of
from joch.integrations import commands, schedule
from joch.integrations.base import Issue
from joch.store.base import ListOptions, Obj

log = logging.getLogger("joch.controllers.triggers")

EventKind = Literal["issue", "comment", "schedule", "webhook", "manual"]
Decision = Literal["Dispatched", "Deduplicated", "Rejected"]
TRIGGER_GROUP = "joch:triggers"
COMPONENT = "joch-trigger-controller"
ENDED = frozenset({"Succeeded", "Failed", "Cancelled"})
FINAL_REJECTIONS = frozenset({"ActorNotAllowed", "InvalidCommand", "AgentNotAllowed"})
STATUS_ATTEMPTS = 5
MAX_LABEL_VALUE = 63
TEMPLATES = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)


@dataclass(frozen=True)
class TriggerEvent:
    """What happened, as a rule sees it (webhooks, polls, the schedule and the fire route all make
    one). ``payload``/``headers``: a generic webhook's body and headers."""

    kind: EventKind
    provider: str | None = None
    action: str | None = None
    issue: Issue | None = None
    label: str | None = None
    comment_id: str | None = None
    comment_body: str | None = None
    association: str | None = None
    actor: str | None = None
    delivery: str | None = None
    scheduled_time: str | None = None
    text: str | None = None
    payload: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def item(self) -> str | None:
        return self.issue.item if self.issue is not None else None

    def context(self) -> dict[str, Any]:
        """``event`` in templates."""
        issue = self.issue
        return {
            "kind": self.kind, "provider": self.provider, "action": self.action, "item": self.item,
            "label": self.label, "actor": self.actor, "delivery": self.delivery, "scheduledTime": self.scheduled_time,
            "text": self.text, "payload": self.payload or {}, "headers": dict(self.headers),
            "comment": {"id": self.comment_id, "body": self.comment_body, "association": self.association}
            if self.comment_id else None,
            "issue": None if issue is None else {
                "id": issue.id, "key": issue.key, "number": issue.number, "title": issue.title, "body": issue.body,
                "url": issue.url, "state": issue.state, "labels": list(issue.labels), "author": issue.author,
                "repository": None if issue.repository is None else {
                    "owner": issue.repository.owner, "name": issue.repository.name,
                    "cloneUrl": issue.repository.clone_url, "defaultBranch": issue.repository.default_branch}},
        }


@dataclass(frozen=True)
class _Outcome:
    decision: Decision
    reason: str | None = None
    message: str | None = None


def trigger_user(namespace: str, rule: str) -> UserInfo:
    return UserInfo(f"system:joch:trigger:{namespace}:{rule}", (TRIGGER_GROUP,))


def execution_name(rule: str, key: str) -> str:
    return f"{rule}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def stamp(moment: float | dt.datetime) -> str:
    at = moment if isinstance(moment, dt.datetime) else dt.datetime.fromtimestamp(moment, dt.UTC)
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- which rules an event concerns -------------------------------------------------------------------

def rule_spec(rule: Obj) -> TriggerRuleSpec:
    return TriggerRuleSpec.model_validate(rule.get("spec") or {})


def name_problem(rule: Obj) -> str | None:
    """Why the rule cannot dispatch under its name: it is the value of the label ``joch.dev/trigger-rule``
    on its executions and runs, and a label value has at most 63 characters (a name may have 253)."""
    name = str(rule["metadata"]["name"])
    if len(name) <= MAX_LABEL_VALUE:
        return None
    return (f'TriggerRule "{name[:70]}..." has a {len(name)}-character metadata.name, but its name is the value of '
            f"the label {RULE_LABEL} on its executions and runs, which is at most {MAX_LABEL_VALUE} characters: "
            "recreate the rule with a shorter name")


def rules_for_source(rules: Iterable[Obj], source: str) -> list[Obj]:
    """The enabled rules of ``rules`` whose ``sourceRef`` names ``source``, by name (a rule whose name
    cannot be a label value is left out: its Ready condition says why)."""
    found = [r for r in rules if ((r.get("spec") or {}).get("sourceRef") or {}).get("name") == source
             and (r.get("spec") or {}).get("enabled", True) is not False and name_problem(r) is None]
    return sorted(found, key=lambda r: str(r["metadata"]["name"]))


def issue_actions(spec: TriggerRuleSpec) -> list[str]:
    trigger = spec.issue
    if trigger is None:
        return []
    return list(trigger.actions) or (["labeled"] if trigger.label else ["opened"])


def issue_matches(spec: TriggerRuleSpec, action: str, label: str | None, issue: Issue) -> bool:
    trigger = spec.issue
    if trigger is None or action not in issue_actions(spec):
        return False
    if trigger.label is None:
        return True
    if action == "labeled":
        return label == trigger.label
    return trigger.label in issue.labels


def issue_key(item: str, action: str, label: str | None, rule_label: str | None = None) -> str:
    """A rule on a label (``rule_label``) fires once per issue carrying it, however the label came: an
    issue opened with it (GitHub sends ``opened`` and then ``labeled``), labelled later, or reopened."""
    if rule_label:
        return f"issue:{item}:labeled:{rule_label}"
    return f"issue:{item}:{action}" + (f":{label}" if action == "labeled" and label else "")


def issue_changed(
    store: Any, rules: Sequence[Obj], issue: Issue, opened: bool, added_labels: Iterable[str], now: float, *,
    action: str | None = None, label: str | None = None, actor: str | None = None, delivery: str | None = None,
) -> list[Obj]:
    """Evaluate every rule of ``rules`` (a source's) that an issue change fires: ``opened`` (new to
    Joch), each of ``added_labels``, and the webhook's own ``action``/``label``; each (action, label)
    once. Closed issues fire nothing. Returns the TriggerExecutions."""
    if issue.state == "closed" or issue.deleted:
        return []
    changes: list[tuple[str, str | None]] = [("opened", None)] if opened else []
    changes += [("labeled", name) for name in added_labels]
    if action in ("opened", "labeled", "reopened"):
        own = (action, label if action == "labeled" else None)
        if own not in changes:
            changes.append(own)
    out = []
    for rule in rules:
        try:
            spec = rule_spec(rule)
        except ValueError:
            continue
        for change, name in changes:
            if issue_matches(spec, change, name, issue):
                event = TriggerEvent(kind="issue", provider=issue.provider, action=change, issue=issue, label=name,
                                     actor=actor, delivery=delivery)
                key = issue_key(issue.item, change, name, spec.issue.label if spec.issue else None)
                out.append(evaluate(store, rule, event, kind="issue", now=now, actor=actor, dedupe_key=key))
    return out


def comment_fires(spec: TriggerRuleSpec, event: TriggerEvent) -> bool:
    """Whether ``event`` is a new comment carrying the rule's command (allowed or not: evaluate decides)."""
    if spec.comment is None or event.kind != "comment" or event.issue is None or not event.comment_body:
        return False
    if event.action not in (None, "created", "create"):
        return False
    return any(line.strip().startswith(spec.comment.command) for line in event.comment_body.splitlines())


# --- evaluating one rule -----------------------------------------------------------------------------

def evaluate(
    store: Any, rule: Obj, event: TriggerEvent | None, *, kind: EventKind, now: float, actor: str | None = None,
    parameters: Mapping[str, str] | None = None, dedupe_key: str | None = None,
) -> Obj:
    """Evaluate ``rule`` for ``event``; returns the TriggerExecution it recorded (see the module docstring)."""
    m = rule["metadata"]
    namespace, name = m.get("namespace") or "", m["name"]
    problem = name_problem(rule)
    if problem is not None:  # not even a Rejected execution can be recorded under this name
        raise errors.Invalid(problem, kind=TRIGGER_RULE.plural, name=name[:253],
                             causes=[errors.Cause("metadata.name", problem, "FieldValueInvalid")])
    event = event or TriggerEvent(kind=kind, actor=actor)
    if actor and not event.actor:
        event = replace(event, actor=actor)
    key = dedupe_key or default_key(kind, event)
    target = execution_name(name, key)
    record = _record(kind, event)
    with acting_as(_context(namespace, name)):
        first = _existing(store, namespace, target)
        if first is not None:
            return _duplicate(store, rule, record, key, first, now)
        try:
            spec = rule_spec(rule)
        except ValueError as exc:
            return _rejected(store, rule, record, key, now, "InvalidRule", f"TriggerRule {name}: {exc}")
        merged = dict(spec.run.parameters)
        agent = spec.run.agentRef.name
        if kind == "comment":
            outcome, agent, extra = _command(spec, name, event)
            if outcome is not None:
                return _rejected(store, rule, record, key, now, outcome.reason or "Rejected", outcome.message or "",
                                 final=True)
            merged.update(extra)
        merged.update(parameters or {})
        blocked = _concurrency(store, spec, namespace, name, event)
        if blocked is not None:
            return _rejected(store, rule, record, key, now, "ConcurrencyForbidden", blocked)
        synced = event.issue is not None and _synced(store, namespace, event.issue)
        try:
            run = _run(spec, namespace, name, target, event, agent, merged, synced=synced)
        except _Refused as exc:
            return _rejected(store, rule, record, key, now, exc.reason, exc.message)
        execution = _execution(namespace, target, name, record, key, now, "Dispatched", run_name=target,
                               message=f"started AgentRun {target} of Agent {agent}")
        try:
            items = create_documents(store, [Document(index=0, source=f"TriggerRule/{name}", obj=execution),
                                             Document(index=1, source=f"TriggerRule/{name}", obj=run)])
        except errors.AlreadyExists:
            found = _existing(store, namespace, target)
            if found is not None:
                return _duplicate(store, rule, record, key, found, now)
            return _rejected(store, rule, record, key, now, "RunExists",
                             f"an AgentRun named {target} exists already (not one of this rule's executions); "
                             "delete it to let the rule dispatch this event")
        except errors.Invalid as exc:
            return _rejected(store, rule, record, key, now, "Invalid", _said(exc))
    _note(store, rule, now, dispatched=True)
    created: Obj = items.items[0].object
    _event(store, rule, "Dispatched", f"started AgentRun {target}" + (f" for {event.item}" if event.item else "")
           + f" ({key})", "Normal")
    return created


class _Refused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def default_key(kind: EventKind, event: TriggerEvent) -> str:
    if kind == "issue" and event.item:
        return issue_key(event.item, event.action or "opened", event.label)
    if kind == "comment" and event.item:
        return f"comment:{event.item}:{event.comment_id}"
    if kind == "schedule" and event.scheduled_time:
        return f"schedule:{event.scheduled_time}"
    if kind == "webhook" and event.delivery:
        return f"webhook:{event.delivery}"
    return f"manual:{uuid.uuid4()}"


def _context(namespace: str, rule: str) -> RequestContext:
    outer = current_request()
    return RequestContext(user=trigger_user(namespace, rule), request_id=outer.request_id if outer else "",
                          source_ip=outer.source_ip if outer else "", verb="create")


def _existing(store: Any, namespace: str, name: str) -> Obj | None:
    try:
        found: Obj = store.get(TRIGGER_EXECUTION, namespace, name)
        return found
    except errors.NotFound:
        return None


def _record(kind: EventKind, event: TriggerEvent) -> dict[str, Any]:
    summary = None
    if event.issue is not None:
        summary = event.issue.title
    elif event.text:
        summary = event.text.splitlines()[0][:200] if event.text.strip() else None
    record = {"kind": kind, "provider": event.provider, "action": event.action, "item": event.item,
              "url": event.issue.url if event.issue is not None else None, "actor": event.actor,
              "deliveryRef": event.delivery, "scheduledTime": event.scheduled_time, "summary": summary}
    return {k: v for k, v in record.items() if v not in (None, "")}


def _execution(namespace: str, name: str | None, rule: str, record: dict[str, Any], key: str, now: float,
               decision: Decision, *, run_name: str | None = None, reason: str | None = None,
               message: str | None = None) -> Obj:
    metadata: dict[str, Any] = {"namespace": namespace, "labels": {RULE_LABEL: rule}}
    if name is not None:
        metadata["name"] = name
    else:
        metadata["generateName"] = f"{rule}-"
    if record.get("item"):
        metadata["labels"][SOURCE_ITEM_HASH] = item_hash(record["item"])
    spec: dict[str, Any] = {"ruleRef": {"name": rule}, "event": record, "dedupeKey": key, "decision": decision,
                            "evaluatedAt": stamp(now)}
    if run_name:
        spec["runRef"] = {"name": run_name}
    if reason:
        spec["reason"] = reason
    if message:
        spec["message"] = message
    return {"apiVersion": TRIGGER_EXECUTION.api_version, "kind": TRIGGER_EXECUTION.kind, "metadata": metadata,
            "spec": spec}


def _store_record(store: Any, execution: Obj) -> Obj:
    result = create_documents(store, [Document(index=0, source="trigger", obj=execution)])
    created: Obj = result.items[0].object
    return created


def _duplicate(store: Any, rule: Obj, record: dict[str, Any], key: str, first: Obj, now: float) -> Obj:
    m = rule["metadata"]
    spec = first.get("spec") or {}
    run = (spec.get("runRef") or {}).get("name")
    said = f"the same event ({key}) was evaluated already by TriggerExecution {first['metadata']['name']} " \
           f"({spec.get('decision')}" + (f", AgentRun {run}" if run else "") + "): nothing new was started"
    out = _store_record(store, _execution(m.get("namespace") or "", None, m["name"], record, key, now,
                                          "Deduplicated", reason="Duplicate", message=said))
    _note(store, rule, now, dispatched=False)
    return out


def _rejected(store: Any, rule: Obj, record: dict[str, Any], key: str, now: float, reason: str, message: str, *,
              final: bool = False) -> Obj:
    m = rule["metadata"]
    namespace = m.get("namespace") or ""
    name = execution_name(m["name"], key) if final else None
    try:
        out = _store_record(store, _execution(namespace, name, m["name"], record, key, now, "Rejected",
                                              reason=reason, message=message))
    except errors.AlreadyExists:
        first = _existing(store, namespace, name or "")
        if first is None:
            raise
        return _duplicate(store, rule, record, key, first, now)
    _note(store, rule, now, dispatched=False)
    _event(store, rule, reason, message, "Warning")
    return out


def _event(store: Any, rule: Obj, reason: str, message: str, type_: Literal["Normal", "Warning"]) -> None:
    """An Event on the rule (``joch describe trigger`` shows them); never fails the evaluation."""
    try:
        events.record(store, rule, reason=reason, message=message, type=type_, component=COMPONENT)
    except errors.JochError as exc:
        log.warning("TriggerRule %s: the %s Event was not recorded: %s", rule["metadata"]["name"], reason, exc)


def _said(exc: errors.JochError) -> str:
    causes = "; ".join(f"{c.field}: {c.message}" if c.field else c.message for c in exc.causes)
    return f"{exc.message}" + (f" ({causes})" if causes and causes not in exc.message else "")


def _command(spec: TriggerRuleSpec, rule: str, event: TriggerEvent) -> tuple[_Outcome | None, str, dict[str, str]]:
    """A comment's command checked against the rule: (a rejection or None, the agent, its parameters)."""

    trigger = spec.comment
    agent = spec.run.agentRef.name
    if trigger is None:
        return _Outcome("Rejected", "InvalidRule", f"TriggerRule {rule} has no spec.comment"), agent, {}
    who = event.actor or "someone"
    association = event.association or "NONE"
    allowed = (event.actor is not None and event.actor in trigger.allowedActors) or \
        (event.association is not None and event.association in trigger.allowedAssociations)
    if not allowed:
        return _Outcome("Rejected", "ActorNotAllowed", (
            f'{who} (author association {association}) may not start runs with "{trigger.command}" on '
            f"{event.item}: TriggerRule {rule} allows the actors [{', '.join(trigger.allowedActors)}] and the "
            f"associations [{', '.join(trigger.allowedAssociations)}]; add them to spec.comment.allowedActors or "
            "spec.comment.allowedAssociations")), agent, {}
    try:
        command = commands.parse_command(event.comment_body or "", command=trigger.command)
    except commands.CommandError as exc:
        return _Outcome("Rejected", "InvalidCommand", f"{who}'s comment on {event.item}: {exc}"), agent, {}
    if command is None:
        return _Outcome("Rejected", "InvalidCommand",
                        f'{who}\'s comment on {event.item} has no line starting with "{trigger.command}"'), agent, {}
    if command.agent and command.agent != agent:
        if command.agent not in trigger.allowedAgents:
            allowed_agents = ", ".join([agent, *trigger.allowedAgents])
            return _Outcome("Rejected", "AgentNotAllowed", (
                f'{who} asked for agent={command.agent} on {event.item}, but TriggerRule {rule} starts only '
                f"[{allowed_agents}]: add it to spec.comment.allowedAgents")), agent, {}
        agent = command.agent
    return None, agent, dict(command.parameters)


def _concurrency(store: Any, spec: TriggerRuleSpec, namespace: str, rule: str, event: TriggerEvent) -> str | None:
    """Why ``concurrencyPolicy`` forbids a new run for the event's item (None: it may start; under
    Replace the active runs were told to cancel)."""
    item = event.item
    if item is None or spec.concurrencyPolicy == "Allow":
        return None
    selector = f"{RULE_LABEL}={rule},{SOURCE_ITEM_HASH}={item_hash(item)}"
    active = [r for r in store.list(kinds.AGENT_RUN, ListOptions(namespace=namespace, label_selector=selector)).items
              if (r.get("status") or {}).get("phase") not in ENDED and not r["metadata"].get("deletionTimestamp")]
    if not active:
        return None
    if spec.concurrencyPolicy == "Forbid":
        names = ", ".join(f"{r['metadata']['name']} ({(r.get('status') or {}).get('phase') or 'Pending'})"
                          for r in active)
        return (f"concurrencyPolicy is Forbid and {item} has a run of TriggerRule {rule} that has not ended: {names}; "
                "it starts again once that run ends (or set spec.concurrencyPolicy: Replace)")
    for run in active:
        if not run["spec"].get("cancel"):
            for _ in range(STATUS_ATTEMPTS):
                try:
                    store.update(kinds.AGENT_RUN, {**run, "spec": {**run["spec"], "cancel": True}})
                    break
                except errors.Conflict:
                    run = store.get(kinds.AGENT_RUN, namespace, run["metadata"]["name"])
    return None


def _render(template: str, event: TriggerEvent, where: str) -> str:
    try:
        return TEMPLATES.from_string(template).render(event=event.context())
    except jinja2.TemplateError as exc:
        raise _Refused("InvalidTemplate", f"{where}: {exc}") from None


def _synced(store: Any, namespace: str, issue: Issue) -> bool:
    """Whether the spec named for ``issue`` is this issue's: two repositories can normalise to one name
    (``acme-x/web`` and ``acme/x-web``), and a run must never implement another issue's spec."""
    try:
        found = store.get(kinds.IMPLEMENTATION_SPEC, namespace, spec_name(issue))
    except errors.NotFound:
        return False
    source = (found.get("spec") or {}).get("source") or {}
    return bool(source.get("provider") == issue.provider and source.get("externalId") == issue.key)


def _run(spec: TriggerRuleSpec, namespace: str, rule: str, name: str, event: TriggerEvent, agent: str,
         parameters: dict[str, str], *, synced: bool = True) -> Obj:
    template = spec.run
    run_spec: dict[str, Any] = {"agentRef": {"name": agent}}
    given = template.implementation or {}
    inline = given.get("inline") if isinstance(given, dict) else None
    ref = given.get("ref") or given.get("implementationRef") if isinstance(given, dict) else None
    if isinstance(inline, dict):
        rendered = dict(inline)
        if isinstance(inline.get("text"), str):
            rendered["text"] = _render(inline["text"], event, f"TriggerRule {rule} spec.run.implementation.inline.text")
        run_spec["implementation"] = {"inline": rendered}
    elif isinstance(ref, dict) and ref.get("name"):
        run_spec["implementationRef"] = {"name": str(ref["name"])}
    elif event.issue is not None and synced:
        run_spec["implementationRef"] = {"name": spec_name(event.issue)}
    elif event.issue is not None:  # an issue the source's filters leave out (a command on it): the issue itself
        run_spec["implementation"] = {"inline": spec_of(event.issue)}
    elif event.text:
        run_spec["implementation"] = {"inline": {"text": event.text}}
    else:
        raise _Refused("NoImplementation", (
            f"TriggerRule {rule}: a {event.kind} event has no issue to implement; set "
            "spec.run.implementation.inline.text (a template over event), or give joch trigger fire --text"))
    if template.execution:
        run_spec["execution"] = json.loads(json.dumps(template.execution))
    elif event.issue is not None and event.issue.repository is not None and event.issue.repository.clone_url:
        repository = event.issue.repository
        run_spec["execution"] = {"coordinates": {"git": {"url": repository.clone_url,
                                                         "ref": repository.default_branch or "HEAD"}}}
    if parameters:
        run_spec["parameters"] = dict(parameters)
    if template.budgetUsd is not None:
        run_spec["budgetUsd"] = template.budgetUsd
    if template.timeoutSeconds is not None:
        run_spec["timeoutSeconds"] = template.timeoutSeconds
    labels = {**template.labels, RULE_LABEL: rule}
    annotations = {**template.annotations, EXECUTION_ANNOTATION: name}
    if event.item:
        labels[SOURCE_ITEM_HASH] = item_hash(event.item)
        annotations[SOURCE_ITEM] = event.item
    return {"apiVersion": kinds.AGENT_RUN.api_version, "kind": kinds.AGENT_RUN.kind,
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
            "spec": run_spec}


def _note(store: Any, rule: Obj, now: float, *, dispatched: bool, scheduled: dict[str, Any] | None = None) -> None:
    """Count the evaluation in the rule's status (and when it last fired)."""
    m = rule["metadata"]
    for _ in range(STATUS_ATTEMPTS):
        try:
            current = store.get(TRIGGER_RULE, m.get("namespace"), m["name"])
        except errors.NotFound:
            return
        status: dict[str, Any] = dict(current.get("status") or {})
        status["executions"] = int(status.get("executions") or 0) + 1
        if dispatched:
            status["lastFiredAt"] = stamp(now)
        status.update(scheduled or {})
        try:
            store.update_status(TRIGGER_RULE, {**current, "status": status})
            return
        except errors.Conflict:
            continue
    log.warning("TriggerRule %s/%s: its status kept changing; the evaluation was not counted", m.get("namespace"),
                m["name"])


# --- schedules ---------------------------------------------------------------------------------------

class TriggerController(Controller):
    """Fires scheduled TriggerRules on ``ctx.clock`` and keeps every rule's ``Ready`` condition."""

    name = "triggers"
    kind = TRIGGER_RULE

    def __init__(self) -> None:
        self._ctx: Context | None = None

    @property
    def ctx(self) -> Context:
        if self._ctx is None:
            raise RuntimeError("TriggerController used before setup()")
        return self._ctx

    def setup(self, ctx: Context) -> None:
        self._ctx = ctx

    def reconcile(self, key: Key) -> Result | None:

        if self.ctx.cache(TRIGGER_RULE).get(key.namespace, key.name) is None:
            return None
        try:  # the cache may not show this controller's last lastScheduleTime yet: never fire a time twice
            rule = self.ctx.store.get(TRIGGER_RULE, key.namespace, key.name)
        except errors.NotFound:
            return None
        if rule["metadata"].get("deletionTimestamp"):
            return None
        problem = name_problem(rule)
        if problem is not None:
            self._ready(rule, "False", "NameTooLong", problem)
            return None
        try:
            spec = rule_spec(rule)
        except ValueError as exc:
            self._ready(rule, "False", "InvalidSpec", str(exc))
            return None
        if spec.schedule is None:
            self._ready(rule, "True", "Ready", "waiting for events" if spec.enabled else "disabled (spec.enabled)")
            return None
        problem = schedule.validate(spec.schedule.cron, spec.schedule.timeZone)
        if problem is not None:
            self._ready(rule, "False", "InvalidSchedule", f"spec.schedule: {problem}")
            return None
        now = self.ctx.clock.time()
        at = dt.datetime.fromtimestamp(now, dt.UTC)
        status = rule.get("status") or {}
        since_text = status.get("lastScheduleTime") or rule["metadata"].get("creationTimestamp")
        since = parse_time(since_text) if since_text else at
        upcoming = schedule.next_after(spec.schedule.cron, spec.schedule.timeZone, at)
        due = schedule.latest_due(spec.schedule.cron, spec.schedule.timeZone, since, at) if spec.enabled else None
        if due is not None:
            late = (at - due).total_seconds()
            deadline = spec.schedule.startingDeadlineSeconds
            marks = {"lastScheduleTime": stamp(due), "nextScheduleTime": stamp(upcoming)}
            if deadline is not None and late > deadline:
                log.info("TriggerRule %s: the run due at %s is %ds late (startingDeadlineSeconds %d): skipped", key,
                         stamp(due), late, deadline)
                self._status(rule, marks)
            else:
                event = TriggerEvent(kind="schedule", scheduled_time=stamp(due), actor="schedule")
                evaluate(self.ctx.store, rule, event, kind="schedule", now=now, dedupe_key=f"schedule:{stamp(due)}")
                self._status(rule, marks)
        elif status.get("nextScheduleTime") != stamp(upcoming):
            self._status(rule, {"nextScheduleTime": stamp(upcoming)})
        self._ready(rule, "True", "Scheduled", f"next run at {stamp(upcoming)}" if spec.enabled
                    else "disabled (spec.enabled)")
        return Result(requeue_after=max(0.5, (upcoming - at).total_seconds()))

    def _status(self, rule: Obj, changes: dict[str, Any]) -> None:
        m = rule["metadata"]
        for _ in range(STATUS_ATTEMPTS):
            current = self.ctx.store.get(TRIGGER_RULE, m.get("namespace"), m["name"])
            status = {**(current.get("status") or {}), **changes}
            if status == current.get("status"):
                return
            try:
                self.ctx.store.update_status(TRIGGER_RULE, {**current, "status": status})
                return
            except errors.Conflict:
                continue

    def _ready(self, rule: Obj, value: str, reason: str, message: str) -> None:
        m = rule["metadata"]
        for _ in range(STATUS_ATTEMPTS):
            current = self.ctx.store.get(TRIGGER_RULE, m.get("namespace"), m["name"])
            status = dict(current.get("status") or {})
            conditions = set_condition(list(status.get("conditions") or []), {
                "type": "Ready", "status": value, "reason": reason, "message": message})
            if conditions == status.get("conditions"):
                return
            try:
                self.ctx.store.update_status(TRIGGER_RULE, {**current, "status": {**status, "conditions": conditions}})
                return
            except errors.Conflict:
                continue


def fire(store: Any, rule: Obj, *, actor: str, now: float, key: str | None = None,
         parameters: Mapping[str, str] | None = None, text: str | None = None) -> Obj:
    """``joch trigger fire``: evaluate ``rule`` as a manual event (key ``manual:<key or a uuid>``)."""
    event = TriggerEvent(kind="manual", actor=actor, text=text)
    return evaluate(store, rule, event, kind="manual", now=now, actor=actor, parameters=parameters,
                    dedupe_key=f"manual:{key or uuid.uuid4()}")
