"""The integration kinds: where work comes from (``ImplementationSource``, ``TriggerRule``) and what
Joch did about it (``WebhookDelivery``, ``TriggerExecution``, ``WriteIntent``).

* ``ImplementationSource`` (joch.dev) syncs GitHub issues or Linear issues into ImplementationSpecs,
  by polling and by webhooks (``joch.controllers.sources``). A synced spec is named
  ``gh-<owner>-<repo>-<number>`` or ``lin-<identifier>`` (lower case) and labelled
  ``joch.dev/source: <source>``.
* ``TriggerRule`` (joch.dev) turns an event into an AgentRun: an issue opened or labelled, a
  ``/joch run`` comment, a schedule, a generic webhook, or ``joch trigger fire``
  (``joch.controllers.triggers``).
* ``WebhookDelivery`` (runtime.joch.dev): one per verified delivery, named from its delivery id, so a
  replay is recognised; ``spec.event`` is the delivery normalised (``joch.integrations.events``).
* ``TriggerExecution`` (runtime.joch.dev): one per evaluation of a rule — its decision
  (``Dispatched``, ``Deduplicated``, ``Rejected``), why, and the run it created. A record: written
  once, everything in ``spec``.
* ``WriteIntent`` (runtime.joch.dev): one outward write (a comment, a pull request, a link), with the
  phases ``PendingApproval → ReadyToSend → Sending → Succeeded | Retrying | Failed | Rejected``
  (``joch.controllers.writeback`` decides them, ``joch.controllers.writeintents`` sends them).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import Field, model_validator

from joch.api.kinds import JOCH, RUNTIME, V1ALPHA1, CheckedSpec, Problem
from joch.api.meta import (
    Bool,
    ConditionedStatus,
    Int,
    LocalObjectReference,
    Model,
    NonNegativeInt,
    Number,
    PositiveInt,
    Str,
)
from joch.api.registry import Column, KindInfo, Reference, register
from joch.api.writeback import WriteBack

SOURCE_LABEL = "joch.dev/source"
"""On a synced ImplementationSpec: the ImplementationSource that wrote it."""
SYNCED_HASH = "joch.dev/synced-spec-hash"
"""On a synced ImplementationSpec: the hash of the spec the source last wrote. A spec whose hash
differs was edited by hand since; the source then leaves it alone (``Diverged``) unless the source's
``onManualEdit`` is ``Overwrite``."""
SYNC_REQUESTED = "joch.dev/sync-requested-at"
"""On an ImplementationSource: ``joch sync source`` sets it (a timestamp); the controller syncs and
records it in ``status.observedSyncRequest``."""
RULE_LABEL = "joch.dev/trigger-rule"
"""On a triggered AgentRun: the TriggerRule (label, so runs of a rule can be listed)."""
EXECUTION_ANNOTATION = "joch.dev/trigger-execution"
"""On a triggered AgentRun: the TriggerExecution that created it (annotation)."""
SOURCE_ITEM = "joch.dev/source-item"
"""On a triggered AgentRun: the source item (annotation: ``github:acme/web#12``, ``linear:ENG-12``)."""
SOURCE_ITEM_HASH = "joch.dev/source-item-hash"
"""On a triggered AgentRun: the source item hashed to a label value (concurrencyPolicy lists by it)."""
WRITE_RUN = "joch.dev/run"
"""On a WriteIntent: the run it writes for (label)."""


# --- checks shared with joch.integrations (admission says it before a controller would) -----------

_CRON_EXAMPLE = 'five fields "minute hour day-of-month month day-of-week", e.g. "0 9 * * MON-FRI"'


def time_zone_problem(tz: str) -> str | None:
    """Why ``tz`` is not an IANA time zone this machine knows, or None."""
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file (tzdata)
        return (f'time zone "{tz[:80]}" is unknown: use an IANA name such as "UTC", "Europe/Berlin" or '
                '"America/New_York"')
    return None


def cron_problem(cron: str, tz: str = "UTC") -> str | None:
    """Why ``cron`` is not a five-field cron expression that fires (evaluated in ``tz``, which must be
    valid), or None. ``joch.integrations.schedule`` evaluates what this admits."""
    fields = cron.split()
    if cron.strip().startswith("@"):
        return (f'cron "{cron[:80]}" is a macro (@reboot, @daily...), which schedules do not take: write '
                f'{_CRON_EXAMPLE}, e.g. "0 0 * * *" for daily')
    if len(fields) != 5:
        return f'cron "{cron[:80]}" has {len(fields)} fields: write {_CRON_EXAMPLE}'
    try:
        sim = CronSim(cron, datetime.now(ZoneInfo(tz)))
    except CronSimError as exc:
        return f'cron "{cron[:80]}" is not valid ({exc}): write {_CRON_EXAMPLE}'
    try:
        next(sim)
    except StopIteration:
        return f'cron "{cron[:80]}" never fires (no such date within 50 years): pick a day that exists'
    return None


def api_url_problem(url: str) -> str | None:
    """Why a token may not be sent to ``url``, or None: it must be https, or http to this machine only
    (a local test server or proxy), with no user or password in it. The message starts with the URL
    (or "the URL"); callers put the field's name before it."""
    parts = urlsplit(url)
    try:
        host = (parts.hostname or "").lower()
    except ValueError:
        host = ""
    if parts.scheme not in ("https", "http") or not host:
        return f'"{url[:80]}" is not an http(s) URL: give an https URL such as https://api.github.com'
    if parts.username is not None or parts.password is not None:
        return "the URL holds a user or password: leave credentials to the auth Secret and give the URL without them"
    if parts.scheme == "http" and not _loopback(host):
        return (f'"http://{host}" is plain http to another machine: the token would cross the network '
                "unencrypted; use https (http is allowed to localhost only)")
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# --- joch.dev/ImplementationSource ---------------------------------------------------------------

class SecretKeySelector(Model):
    name: Str = Field(min_length=1)
    key: Str = Field(min_length=1)


class GitHubApp(Model):
    """Authenticate as a GitHub App installation: a JWT signed with the app's private key buys
    short-lived installation tokens (refreshed before they expire)."""

    appId: Str | Int
    installationId: Str | Int
    privateKeySecretRef: SecretKeySelector


class GitHubAuth(Model):
    tokenSecretRef: SecretKeySelector | None = None
    app: GitHubApp | None = None

    @model_validator(mode="after")
    def _one(self) -> GitHubAuth:
        if (self.tokenSecretRef is None) == (self.app is None):
            raise ValueError("set exactly one of tokenSecretRef (a personal or fine-grained token) or app "
                             "(a GitHub App installation)")
        return self


class GitHubSource(Model):
    owner: Str = Field(min_length=1)
    repo: Str = Field(min_length=1)
    apiUrl: Str = "https://api.github.com"
    labels: list[Str] = Field(default_factory=list)  # issues carrying all of them (GitHub's `labels`)
    state: Literal["open", "closed", "all"] = "open"
    auth: GitHubAuth


class LinearAuth(Model):
    apiKeySecretRef: SecretKeySelector


class LinearSource(Model):
    teamKey: Str = Field(min_length=1)
    apiUrl: Str = "https://api.linear.app/graphql"
    labels: list[Str] = Field(default_factory=list)  # issues carrying all of them
    states: list[Str] = Field(default_factory=list)  # workflow state names; empty: every state
    auth: LinearAuth


class SourceWebhook(Model):
    """The secret GitHub or Linear signs this source's deliveries with (``X-Hub-Signature-256``,
    ``Linear-Signature``)."""

    secretRef: SecretKeySelector


class ImplementationSourceSpec(CheckedSpec):
    provider: Literal["github", "linear"]
    github: GitHubSource | None = None
    linear: LinearSource | None = None
    webhook: SourceWebhook | None = None
    # 0: webhooks only (``joch sync source`` still syncs on demand).
    pollIntervalSeconds: NonNegativeInt = 300
    # A synced spec edited by hand: Keep leaves it (condition Diverged on it), Overwrite replaces it.
    onManualEdit: Literal["Keep", "Overwrite"] = "Keep"
    suspend: Bool = False

    def problems(self) -> Iterator[Problem]:
        for provider in ("github", "linear"):
            given = getattr(self, provider) is not None
            if provider == self.provider and not given:
                yield ((provider,), f'provider is "{provider}": set spec.{provider}', "FieldValueRequired")
            if provider != self.provider and given:
                yield ((provider,), f'provider is "{self.provider}": remove spec.{provider}', "FieldValueForbidden")
        for provider, section in (("github", self.github), ("linear", self.linear)):
            if section is not None:
                problem = api_url_problem(section.apiUrl)
                if problem is not None:
                    yield ((provider, "apiUrl"), problem, "FieldValueInvalid")


class SyncCounts(Model):
    issues: NonNegativeInt = 0  # specs this source holds
    created: NonNegativeInt = 0  # in the last sync
    updated: NonNegativeInt = 0
    stale: NonNegativeInt = 0
    diverged: NonNegativeInt = 0


class ImplementationSourceStatus(ConditionedStatus):
    observedGeneration: Int | None = None
    lastSyncedAt: Str | None = None
    cursor: Str | None = None
    etag: Str | None = None
    counts: SyncCounts | None = None
    rateLimitedUntil: Str | None = None
    lastError: Str | None = None
    observedSyncRequest: Str | None = None
    # Linear and GitHub App installations: when the installation token expires (never the token).
    tokenExpiresAt: Str | None = None


# --- joch.dev/TriggerRule ------------------------------------------------------------------------

class IssueTrigger(Model):
    """An issue opened, or labelled ``label``. ``actions`` default to ``[labeled]`` with a label, else
    ``[opened]``; a label names the label that fires (``joch:codex``)."""

    actions: list[Literal["opened", "labeled", "reopened"]] = Field(default_factory=list)
    label: Str | None = None


class CommentTrigger(Model):
    """A comment ``/joch run [agent=NAME] [key=value ...]`` (``command``) on an issue of the source, from
    an allowed actor (``allowedActors``: logins, or Linear user names/emails) or author association
    (``allowedAssociations``, GitHub's ``author_association``)."""

    command: Str = "/joch run"
    allowedActors: list[Str] = Field(default_factory=list)
    allowedAssociations: list[Str] = Field(default_factory=lambda: ["OWNER", "MEMBER", "COLLABORATOR"])
    # Agents a comment may name with agent=NAME (the run template's agent is always allowed).
    allowedAgents: list[Str] = Field(default_factory=list)


class ScheduleTrigger(Model):
    cron: Str = Field(min_length=1)
    timeZone: Str = "UTC"
    # A schedule missed by more than this (the server was down) is skipped, as CronJob does.
    startingDeadlineSeconds: PositiveInt | None = None


class WebhookTrigger(Model):
    """``POST /v1/webhooks/{namespace}/{rule}`` signed with HMAC-SHA256 of the body under this secret
    (``X-Joch-Signature-256: sha256=<hex>``, or ``X-Hub-Signature-256``). ``dedupeKey``: a Jinja2
    template over ``payload`` and ``headers`` (default: the ``X-Joch-Delivery`` header, else the
    body's hash)."""

    secretRef: SecretKeySelector
    dedupeKey: Str | None = None


class RunTemplate(Model):
    """The run a rule creates. ``implementation.inline.text`` (a Jinja2 template over ``event``) or,
    for issue and comment events, the synced ImplementationSpec of the issue (the default).
    ``execution`` defaults to the issue's repository at its default branch (GitHub)."""

    agentRef: LocalObjectReference
    implementation: dict[str, Any] | None = None
    execution: dict[str, Any] | None = None
    parameters: dict[Str, Str] = Field(default_factory=dict)
    budgetUsd: Number | None = Field(default=None, ge=0)
    timeoutSeconds: PositiveInt | None = None
    labels: dict[Str, Str] = Field(default_factory=dict)
    annotations: dict[Str, Str] = Field(default_factory=dict)


class TriggerRuleSpec(CheckedSpec):
    enabled: Bool = True
    sourceRef: LocalObjectReference | None = None  # the ImplementationSource (issue and comment triggers)
    issue: IssueTrigger | None = None
    comment: CommentTrigger | None = None
    schedule: ScheduleTrigger | None = None
    webhook: WebhookTrigger | None = None
    # Manual (``joch trigger fire``) works for every rule; a rule with none of the above is manual only.
    run: RunTemplate
    concurrencyPolicy: Literal["Allow", "Forbid", "Replace"] = "Allow"
    writeBack: WriteBack | None = None

    def problems(self) -> Iterator[Problem]:
        given = [n for n in ("issue", "comment", "schedule", "webhook") if getattr(self, n) is not None]
        if len(given) > 1:
            yield ((given[1],), f"a rule has one trigger: {' and '.join(given)} are set; split it into one "
                   "TriggerRule per trigger", "FieldValueForbidden")
        if (self.issue is not None or self.comment is not None) and self.sourceRef is None:
            yield (("sourceRef",), "issue and comment triggers need the ImplementationSource whose events they "
                   "follow: set spec.sourceRef.name", "FieldValueRequired")
        if self.schedule is not None:
            zone = time_zone_problem(self.schedule.timeZone)
            if zone is not None:
                yield (("schedule", "timeZone"), zone, "FieldValueInvalid")
            else:
                cron = cron_problem(self.schedule.cron, self.schedule.timeZone)
                if cron is not None:
                    yield (("schedule", "cron"), cron, "FieldValueInvalid")


class TriggerRuleStatus(ConditionedStatus):
    lastFiredAt: Str | None = None
    lastScheduleTime: Str | None = None
    nextScheduleTime: Str | None = None
    executions: NonNegativeInt = 0


# --- runtime.joch.dev/WebhookDelivery ------------------------------------------------------------

class WebhookDeliverySpec(Model):
    provider: Literal["github", "linear", "generic"]
    deliveryId: Str
    event: Str  # GitHub's X-GitHub-Event, Linear's type, "webhook"
    action: Str | None = None
    receivedAt: Str
    verified: Bool = True
    sourceRef: LocalObjectReference | None = None  # the ImplementationSource whose secret verified it
    ruleRef: LocalObjectReference | None = None  # generic deliveries: the TriggerRule
    payload: dict[str, Any] = Field(default_factory=dict)  # normalised (joch.integrations.events)


class WebhookDeliveryStatus(ConditionedStatus):
    phase: Literal["Received", "Processed", "Failed"] | None = None
    processedAt: Str | None = None
    caused: list[Str] = Field(default_factory=list)  # "ImplementationSpec/gh-acme-web-12 updated", ...
    message: Str | None = None


# --- runtime.joch.dev/TriggerExecution -----------------------------------------------------------

class TriggerEventRecord(Model):
    kind: Literal["issue", "comment", "schedule", "webhook", "manual"]
    provider: Str | None = None
    action: Str | None = None
    item: Str | None = None  # github:acme/web#12, linear:ENG-12
    url: Str | None = None
    actor: Str | None = None
    deliveryRef: Str | None = None  # the WebhookDelivery
    scheduledTime: Str | None = None
    summary: Str | None = None


class TriggerExecutionSpec(Model):
    ruleRef: LocalObjectReference
    event: TriggerEventRecord
    dedupeKey: Str
    decision: Literal["Dispatched", "Deduplicated", "Rejected"]
    reason: Str | None = None
    message: Str | None = None
    runRef: LocalObjectReference | None = None
    evaluatedAt: Str


class TriggerExecutionStatus(ConditionedStatus):
    pass


# --- runtime.joch.dev/WriteIntent ----------------------------------------------------------------

WritePhase = Literal["PendingApproval", "ReadyToSend", "Sending", "Retrying", "Succeeded", "Failed", "Rejected"]


class WriteTarget(Model):
    """Where the write goes: ``sourceRef`` (the ImplementationSource whose credentials it uses) and the
    item (``github``: ``owner``/``repo`` and the issue ``number``; ``linear``: the issue ``issueId`` and
    ``identifier``)."""

    provider: Literal["github", "linear"]
    sourceRef: LocalObjectReference
    owner: Str | None = None
    repo: Str | None = None
    number: Int | None = None
    issueId: Str | None = None
    identifier: Str | None = None


class PullRequestContent(Model):
    gitUrl: Str  # where the branch is pushed (the run's repository)
    branch: Str
    base: Str
    baseCommit: Str
    title: Str
    body: Str
    draft: Bool = False
    authorDate: Str  # fixes the commit's dates, so a retried push makes the same commit


class WriteIntentSpec(Model):
    runRef: LocalObjectReference
    runUid: Str
    type: Literal["comment", "pullRequest", "link"]
    target: WriteTarget
    body: Str | None = None  # comment: the text (edited in place whenever it changes)
    pullRequest: PullRequestContent | None = None
    url: Str | None = None  # link: the URL to attach (Linear)
    title: Str | None = None
    requiresApproval: Bool = False
    maxAttempts: PositiveInt = 8


class WriteIntentStatus(ConditionedStatus):
    phase: WritePhase | None = None
    attempts: NonNegativeInt = 0
    nextAttemptAt: Str | None = None
    lastError: Str | None = None
    externalId: Str | None = None  # comment id, pull request number, attachment id
    url: Str | None = None
    sentHash: Str | None = None  # hash of the content last sent (a comment whose body changed is sent again)
    sentAt: Str | None = None
    approvalRef: Str | None = None
    commit: Str | None = None


# --- registrations -------------------------------------------------------------------------------

_AGE = Column("AGE", "metadata.creationTimestamp")
_READY = Column("READY", "status.conditions[type=Ready].status")

IMPLEMENTATION_SOURCE = register(KindInfo(
    group=JOCH, version=V1ALPHA1, kind="ImplementationSource", plural="implementationsources",
    short_names=("source", "sources", "isrc"),
    spec_model=ImplementationSourceSpec, status_model=ImplementationSourceStatus,
    columns=(Column("PROVIDER", "spec.provider"), _READY, Column("ISSUES", "status.counts.issues", type="integer"),
             Column("LAST-SYNC", "status.lastSyncedAt"), Column("CURSOR", "status.cursor", wide=True),
             Column("ERROR", "status.lastError", wide=True), _AGE),
))
TRIGGER_RULE = register(KindInfo(
    group=JOCH, version=V1ALPHA1, kind="TriggerRule", plural="triggerrules", short_names=("trigger", "triggers", "tr"),
    spec_model=TriggerRuleSpec, status_model=TriggerRuleStatus,
    references=(Reference("spec.run.agentRef.name", "Agent", missing="warn"),
                Reference("spec.sourceRef.name", "ImplementationSource", missing="warn")),
    columns=(Column("AGENT", "spec.run.agentRef.name"), Column("SOURCE", "spec.sourceRef.name"),
             Column("CONCURRENCY", "spec.concurrencyPolicy"), Column("LAST-FIRED", "status.lastFiredAt"),
             Column("NEXT", "status.nextScheduleTime", wide=True), _AGE),
))
WEBHOOK_DELIVERY = register(KindInfo(
    group=RUNTIME, version=V1ALPHA1, kind="WebhookDelivery", plural="webhookdeliveries",
    short_names=("delivery", "deliveries", "whd"), spec_model=WebhookDeliverySpec,
    status_model=WebhookDeliveryStatus, categories=(),
    columns=(Column("PROVIDER", "spec.provider"), Column("EVENT", "spec.event"), Column("ACTION", "spec.action"),
             Column("PHASE", "status.phase"), Column("DELIVERY", "spec.deliveryId", wide=True),
             Column("CAUSED", "status.caused[*]", wide=True), _AGE),
))
TRIGGER_EXECUTION = register(KindInfo(
    group=RUNTIME, version=V1ALPHA1, kind="TriggerExecution", plural="triggerexecutions",
    short_names=("triggerexecution", "tex"), spec_model=TriggerExecutionSpec,
    status_model=TriggerExecutionStatus, categories=(),
    columns=(Column("RULE", "spec.ruleRef.name"), Column("EVENT", "spec.event.kind"),
             Column("ITEM", "spec.event.item"), Column("DECISION", "spec.decision"),
             Column("RUN", "spec.runRef.name"), Column("REASON", "spec.reason"),
             Column("MESSAGE", "spec.message", wide=True), _AGE),
))
WRITE_INTENT = register(KindInfo(
    group=RUNTIME, version=V1ALPHA1, kind="WriteIntent", plural="writeintents", short_names=("wi", "writeintent"),
    spec_model=WriteIntentSpec, status_model=WriteIntentStatus,
    references=(Reference("spec.runRef.name", "AgentRun", missing="warn"),),
    columns=(Column("RUN", "spec.runRef.name"), Column("TYPE", "spec.type"), Column("PHASE", "status.phase"),
             Column("ATTEMPTS", "status.attempts", type="integer"), Column("URL", "status.url", wide=True),
             Column("ERROR", "status.lastError", wide=True), _AGE),
    initial_phase=None,
))

__all__ = ["EXECUTION_ANNOTATION", "IMPLEMENTATION_SOURCE", "RULE_LABEL", "SOURCE_ITEM", "SOURCE_ITEM_HASH",
           "SOURCE_LABEL", "SYNCED_HASH", "SYNC_REQUESTED", "TRIGGER_EXECUTION", "TRIGGER_RULE", "WEBHOOK_DELIVERY",
           "WRITE_INTENT", "WRITE_RUN", "api_url_problem", "cron_problem", "time_zone_problem"]
