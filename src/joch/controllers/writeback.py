"""Write-back: what a run tells the tracker its work came from, one ``WriteIntent`` per outward write.

Two controllers split the work so that deciding *what* to write never waits on the network, and
*writing* it is one small state machine per write:

* ``WriteBackController`` (primary AgentRun) decides what a run writes. A run writes back when it
  came from a tracker issue — a TriggerRule made it (``RULE_LABEL`` and the ``SOURCE_ITEM``
  annotation), or its ``implementationRef`` names a synced ImplementationSpec (``SOURCE_LABEL``) — and
  ``writeBack`` is declared on the rule or the run's Agent. The rule's wins: its ``comment`` and
  ``pullRequest`` sections replace the Agent's when it has them, ``maxAttempts`` is the rule's, and
  ``requireApproval`` holds when either asks. With ``writeBack`` declared the comment is on unless
  ``comment.enabled`` is false; a pull request needs a ``pullRequest`` section. The intents, each owned
  by the run and labelled ``WRITE_RUN``:

  - ``<run>-comment``: the run's one comment on the issue, created as soon as the run exists and
    rewritten (``spec.body``) whenever what it shows changes: phase, cost, pull request, summary,
    failure reason, and any write that was refused. Its body always ends with the marker
    ``<!-- joch:run:<run uid> -->``, which is how the comment is found again after a crash.
  - ``<run>-pr``: once the run Succeeded with a non-empty ``changes.patch`` (read through the runtime):
    the commit to push (base commit, branch ``<branchPrefix>/<run>``, a fixed author date so a retried
    push makes the same commit) and the pull request's title and body (``Closes #N`` added for a
    GitHub issue). Fixed once created.
  - ``<run>-link``: for a Linear issue, the pull request's URL attached to it once the PR is open.

  It copies where the writes landed into the run's ``status.writeBack``.

* ``WriteIntentController`` (primary WriteIntent, secondary Approval) sends one intent::

      (new) ──► PendingApproval ──► ReadyToSend ──► Sending ──► Succeeded
        │             └──► Rejected (denied, expired)   │  ▲ └──► Retrying ──► Sending …
        └──► Rejected (a Policy denies)                 │  └── a comment whose body changed
                                                        └──► Failed (not retryable, or maxAttempts)

  A new intent asks the Policies (phase ``writeBack``: ``joch.policy.decisions.write_back``): ``deny``
  rejects it; ``requireApproval`` — or ``spec.requiresApproval`` — creates the Approval named after
  the intent (action ``write-back``, ``runRef`` the run, owned by the intent: the run controller only
  ever looks at the run's own ``<run>-dispatch`` Approval, so it never mistakes this one for a
  dispatch decision). ``joch approve``/``joch deny`` decide it like any other.

  **Nothing is written twice.** The controller records ``Sending`` (and the attempt) before it
  touches the tracker, and every send starts by looking for what an earlier, interrupted send may
  have left: a comment is looked up by its marker before one is created (or edited by its recorded
  id), a pull request by its branch before one is opened, and the branch push is a forced push of
  a commit that is the same on every retry. A server killed mid-send finds the intent ``Sending``
  and adopts what is there. A retryable failure (rate limit, 5xx, network) waits ``5 s · 2^n``
  (at most 10 minutes, with jitter, and never before the tracker's ``retry_at``) until
  ``maxAttempts``; others fail at once. Every send is audited (verb ``write``, kind WriteIntent,
  ``comment on github:acme/web#12``). Credentials are read from the Secret at the last moment
  and never reach status, audit or errors (``TrackerError`` messages name the Secret, not its value).

What bit us, and holds now:

* The caches lag the store. A send is decided from the *stored* intent (a cache still showing
  ``Sending`` after this controller wrote ``Retrying`` sent again, ahead of the backoff), and the
  ImplementationSource is read from the store when it is used (a source a moment behind in its
  cache failed a write for good). Runs are looked at again when their Agent, synced spec or rule
  changes, since those may reach their caches after the run.
* A change that cannot be proposed (a run from Linear without ``pullRequest.sourceRef``, a title
  template that does not render) is said in the comment, not retried.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import logging
import random
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from joch.api import errors, kinds
from joch.api.audit import AuditEntry
from joch.api.identity import CONTROLLER
from joch.api.integrations import (
    IMPLEMENTATION_SOURCE,
    RULE_LABEL,
    SOURCE_ITEM,
    SOURCE_LABEL,
    TRIGGER_RULE,
    WRITE_INTENT,
    WRITE_RUN,
    WriteTarget,
)
from joch.api.meta import now, parse_time, set_condition
from joch.api.registry import KindInfo
from joch.api.writeback import WriteBack
from joch.compiler import render
from joch.controllers import approvals, events
from joch.controllers.base import Context, Controller, Key, Mapper, Result
from joch.controllers.invocations import git_source
from joch.integrations import gitpush, trackers
from joch.integrations.base import SecretLookup, Tracker, TrackerError
from joch.policy import decisions
from joch.runtime import base as rt
from joch.store.base import Obj

logger = logging.getLogger("joch.controllers.writeback")

COMPONENT = "joch-writeback-controller"
ACTION = "write-back"
BACKOFF_BASE = 5.0
BACKOFF_CAP = 600.0
JITTER = 0.2
SUMMARY_BYTES = 4000
PATCH_LIMIT = 64 * 1024 * 1024
COMMIT_AUTHOR = ("Joch", "joch@users.noreply.joch.dev")
ACTIVE = frozenset({"Pending", "AwaitingApproval", "Queued", "Running"})
ENDED = frozenset({"Succeeded", "Failed", "Cancelled"})
NORMAL: Literal["Normal", "Warning"] = "Normal"
WARNING: Literal["Normal", "Warning"] = "Warning"

DEFAULT_COMMENT = """\
**Joch** run `{{ run.name }}` (agent `{{ run.agent }}`): **{{ run.phase }}**\
{% if run.phase in ["Failed", "Cancelled"] and run.reason %} ({{ run.reason }}){% endif %}
{% if run.phase in ["Failed", "Cancelled"] and run.message %}
> {{ run.message }}
{% endif %}{% if run.cost %}
Cost: {{ run.cost }}
{% endif %}{% if pullRequest %}
Pull request: {{ pullRequest.url }}
{% endif %}{% for line in writeBack.pending %}
Waiting for approval: {{ line }}
{% endfor %}{% for line in writeBack.rejected %}
Not written: {{ line }}
{% endfor %}{% for line in writeBack.failed %}
Write failed: {{ line }}
{% endfor %}{% if summary %}
<details><summary>Summary</summary>

{{ summary }}

</details>
{% endif %}"""

DEFAULT_TITLE = "{{ issue.title or ('Joch run ' ~ run.name) }}"
DEFAULT_BODY = """\
Changes made by Joch run `{{ run.name }}` (agent `{{ run.agent }}`){% if issue.url %} for {{ issue.url }}{% endif %}.
{% if summary %}
{{ summary }}
{% endif %}"""


def _cost_text(cost: Any, phase: str | None) -> str | None:
    """The cost a comment shows: what the run reported; an ended run that reported no usage cost
    nothing Joch metered ($0, said so), so the comment of every finished run shows a cost."""
    if isinstance(cost, (int, float)):
        return f"${cost:.4f}"
    return "$0.0000 (the agent reported no usage)" if phase in ENDED else None


def marker(run_uid: str) -> str:
    return f"<!-- joch:run:{run_uid} -->"


def content_hash(spec: Mapping[str, Any]) -> str:
    """What a send wrote, hashed: a comment whose body changed is sent again."""
    kind = spec.get("type")
    if kind == "comment":
        text = str(spec.get("body") or "")
    elif kind == "link":
        text = f'{spec.get("url")}\0{spec.get("title") or ""}'
    else:
        pr = spec.get("pullRequest") or {}
        text = "\0".join(str(pr.get(k) or "") for k in ("branch", "baseCommit", "base", "title", "body"))
    return hashlib.sha256(text.encode()).hexdigest()


# --- where a run's work came from ----------------------------------------------------------------

_GITHUB_ITEM = re.compile(r"^github:(?P<owner>[^/\s]+)/(?P<repo>[^#\s]+)#(?P<number>\d+)$")
_LINEAR_ITEM = re.compile(r"^linear:(?P<identifier>\S+)$")


@dataclass(frozen=True)
class Origin:
    """The tracker issue a run works on: its source (an ImplementationSource's name), the write
    target, the item (``github:acme/web#12``) and what the synced spec says of it."""

    source: str
    provider: str
    target: dict[str, Any]
    item: str
    url: str | None = None
    title: str | None = None
    rule: str | None = None


def origin_of(run: Obj, rules: Any, specs: Any) -> Origin | None:
    """``rules``/``specs``: caches (``get(namespace, name)``) of TriggerRules and ImplementationSpecs."""
    m = run.get("metadata") or {}
    namespace = m.get("namespace") or ""
    labels = m.get("labels") or {}
    annotations = m.get("annotations") or {}
    rule_name = labels.get(RULE_LABEL)
    spec_name = ((run.get("spec") or {}).get("implementationRef") or {}).get("name")
    synced = specs.get(namespace, spec_name) if spec_name else None
    source: str | None = None
    item: str | None = annotations.get(SOURCE_ITEM)
    url = title = None
    if synced is not None:
        source = ((synced.get("metadata") or {}).get("labels") or {}).get(SOURCE_LABEL)
        s = synced.get("spec") or {}
        ref = s.get("source") or {}
        if source and ref.get("externalId") and ref.get("provider") in ("github", "linear"):
            item = item or f'{ref["provider"]}:{ref["externalId"]}'
        url, title = ref.get("url"), s.get("summary")
    if rule_name:
        rule = rules.get(namespace, rule_name)
        ref_name = (((rule or {}).get("spec") or {}).get("sourceRef") or {}).get("name")
        source = ref_name or source
    if not source or not item:
        return None
    if found := _GITHUB_ITEM.match(item):
        target = {"provider": "github", "sourceRef": {"name": source}, "owner": found["owner"],
                  "repo": found["repo"], "number": int(found["number"])}
        url = url or f'https://github.com/{found["owner"]}/{found["repo"]}/issues/{found["number"]}'
        return Origin(source, "github", target, item, url, title, rule_name)
    if found := _LINEAR_ITEM.match(item):
        # The synced spec keeps the issue's identifier; Linear takes it wherever an issue id goes.
        target = {"provider": "linear", "sourceRef": {"name": source}, "issueId": found["identifier"],
                  "identifier": found["identifier"]}
        return Origin(source, "linear", target, item, url, title, rule_name)
    return None


def merged_write_back(rule: Mapping[str, Any] | None, agent: Mapping[str, Any] | None) -> WriteBack | None:
    """The rule's ``writeBack`` over the Agent's: sections the rule has replace the Agent's,
    ``maxAttempts`` is the rule's, ``requireApproval`` holds when either asks."""
    if rule is None and agent is None:
        return None
    out: dict[str, Any] = dict(agent or {})
    for section in ("comment", "pullRequest"):
        if (rule or {}).get(section) is not None:
            out[section] = rule[section] if rule is not None else None
    if rule is not None and "maxAttempts" in rule:
        out["maxAttempts"] = rule["maxAttempts"]
    out["requireApproval"] = bool((rule or {}).get("requireApproval")) or bool((agent or {}).get("requireApproval"))
    return WriteBack.model_validate(out)


def secret_lookup(store: Any, namespace: str) -> SecretLookup:
    """Secret values of ``namespace``, read (decrypted) when a client asks for them."""

    def lookup(name: str, key: str) -> str:
        try:
            secret = store.reveal(kinds.SECRET, namespace, name)
        except errors.NotFound:
            raise TrackerError("MissingSecret", f'Secret "{name}" not found in namespace "{namespace}": create it '
                                                f'with the key "{key}"') from None
        data = (secret.get("spec") or {}).get("data") or {}
        if key not in data:
            raise TrackerError("MissingSecret", f'Secret "{name}" in namespace "{namespace}" has no key "{key}": '
                                                "add it, or point the source at the right key")
        return base64.b64decode(str(data[key]).replace("\n", "")).decode("utf-8")

    return lookup


def _intent_name(run_name: str, suffix: str) -> str:
    name = f"{run_name}-{suffix}"
    if len(name) <= 253:
        return name
    return f"{run_name[:220]}-{hashlib.sha256(run_name.encode()).hexdigest()[:10]}-{suffix}"


def _owned(obj: Obj, owner: Obj) -> bool:
    uid = owner["metadata"].get("uid")
    return any(isinstance(r, dict) and r.get("uid") == uid and r.get("controller") is True
               for r in (obj.get("metadata") or {}).get("ownerReferences") or [])


def _read_artifact(runtime: rt.Runtime, run: Obj, name: str, limit: int) -> bytes | None:
    """The run's artifact ``name`` (at most ``limit`` bytes), or None when it has none."""
    status = run.get("status") or {}
    ref = rt.own_ref(status.get("runtimeRef"), str(run["metadata"].get("uid") or ""), status.get("attempt"))
    if ref is None or ref.get("pending"):
        return None
    try:
        _, stream = runtime.open_artifact(ref, name)
    except KeyError:
        return None
    except (ValueError, OSError) as exc:
        logger.warning("run %s: cannot read artifact %s: %s", run["metadata"]["name"], name, exc)
        return None
    with stream:
        return stream.read(limit)


# --- WriteBackController ---------------------------------------------------------------------------

class WriteBackController(Controller):
    """Decides the WriteIntents of each run that came from a tracker issue; see the module docstring."""

    name = "writeback"
    kind = kinds.AGENT_RUN

    def __init__(self, runtime: rt.Runtime) -> None:
        self.runtime = runtime
        self._ctx: Context | None = None

    @property
    def ctx(self) -> Context:
        if self._ctx is None:
            raise RuntimeError("WriteBackController used before setup()")
        return self._ctx

    def secondary(self) -> Sequence[tuple[KindInfo, Mapper]]:
        # What decides a run's writes may arrive after the run (an Agent's writeBack applied with
        # it, a spec synced a moment later): each change looks at the runs it concerns again.
        return ((WRITE_INTENT, _run_of_intent), (kinds.AGENT, self._runs_of_agent),
                (kinds.IMPLEMENTATION_SPEC, self._runs_of_spec), (TRIGGER_RULE, self._runs_of_rule))

    def setup(self, ctx: Context) -> None:
        self._ctx = ctx
        for kind in (WRITE_INTENT, TRIGGER_RULE, kinds.IMPLEMENTATION_SPEC, kinds.AGENT):
            ctx.cache(kind)

    def _runs(self, obj: Obj, wanted: Any) -> Iterable[Key]:
        for run in self.ctx.cache(kinds.AGENT_RUN).list(obj["metadata"].get("namespace") or ""):
            if wanted(run):
                yield Key.of(run)

    def _runs_of_agent(self, agent: Obj) -> Iterable[Key]:
        name = agent["metadata"]["name"]
        return self._runs(agent, lambda r: ((r.get("spec") or {}).get("agentRef") or {}).get("name") == name)

    def _runs_of_spec(self, spec: Obj) -> Iterable[Key]:
        name = spec["metadata"]["name"]
        return self._runs(spec, lambda r: ((r.get("spec") or {}).get("implementationRef") or {}).get("name") == name)

    def _runs_of_rule(self, rule: Obj) -> Iterable[Key]:
        name = rule["metadata"]["name"]
        return self._runs(rule, lambda r: ((r.get("metadata") or {}).get("labels") or {}).get(RULE_LABEL) == name)

    def reconcile(self, key: Key) -> Result | None:
        run = self.ctx.cache(kinds.AGENT_RUN).get(key.namespace, key.name)
        if run is None or run["metadata"].get("deletionTimestamp"):
            return None
        status = run.get("status") or {}
        phase = status.get("phase")
        if phase is None:
            return None
        origin = origin_of(run, self.ctx.cache(TRIGGER_RULE), self.ctx.cache(kinds.IMPLEMENTATION_SPEC))
        if origin is None:
            return None
        wb = self._write_back(run, origin)
        if wb is None:
            return None
        intents = self._intents(run)
        pr_wb = wb.pullRequest if wb.pullRequest is not None and wb.pullRequest.enabled else None
        problems: list[str] = []
        if pr_wb is not None and phase == "Succeeded" and "pr" not in intents:
            intent = self._pull_request_intent(run, origin, wb)
            if isinstance(intent, str):
                problems.append(f"the pull request: {intent}")
            elif intent is not None:
                intents["pr"] = self._create(intent)
        pr = intents.get("pr")
        pr_status = (pr or {}).get("status") or {}
        if (origin.provider == "linear" and pr is not None and pr_status.get("phase") == "Succeeded"
                and pr_status.get("url") and "link" not in intents):
            title = ((pr.get("spec") or {}).get("pullRequest") or {}).get("title")
            intents["link"] = self._create(self._intent(run, "link", origin.target, wb, url=pr_status["url"],
                                                        title=title, requires=wb.requireApproval))
        if wb.comment is None or wb.comment.enabled:
            body = self._comment_body(run, origin, wb, intents, problems)
            comment = intents.get("comment")
            if comment is None:
                intents["comment"] = self._create(self._intent(run, "comment", origin.target, wb, body=body,
                                                               requires=wb.requireApproval))
            elif (comment.get("spec") or {}).get("body") != body:
                self.ctx.store.update(WRITE_INTENT, {**comment, "spec": {**comment["spec"], "body": body}})
        self._note(run, intents)
        return None

    # --- what to write ---------------------------------------------------------------------------

    def _rule_write_back(self, run: Obj, origin: Origin) -> dict[str, Any] | None:
        namespace = run["metadata"].get("namespace") or ""
        rule = self.ctx.cache(TRIGGER_RULE).get(namespace, origin.rule) if origin.rule else None
        found = ((rule or {}).get("spec") or {}).get("writeBack")
        return found if isinstance(found, dict) else None

    def _write_back(self, run: Obj, origin: Origin) -> WriteBack | None:
        namespace = run["metadata"].get("namespace") or ""
        agent_name = ((run.get("spec") or {}).get("agentRef") or {}).get("name")
        agent = self.ctx.cache(kinds.AGENT).get(namespace, agent_name) if agent_name else None
        return merged_write_back(self._rule_write_back(run, origin), ((agent or {}).get("spec") or {}).get("writeBack"))

    def _intents(self, run: Obj) -> dict[str, Obj]:
        namespace = run["metadata"].get("namespace") or ""
        out: dict[str, Obj] = {}
        for suffix in ("comment", "pr", "link"):
            found = self.ctx.cache(WRITE_INTENT).get(namespace, _intent_name(run["metadata"]["name"], suffix))
            if found is not None and _owned(found, run):
                out[suffix] = found
        return out

    def _intent(self, run: Obj, suffix: str, target: Mapping[str, Any], wb: WriteBack, *, requires: bool,
                body: str | None = None, url: str | None = None, title: str | None = None,
                pull_request: Mapping[str, Any] | None = None) -> Obj:
        m = run["metadata"]
        spec: dict[str, Any] = {"runRef": {"name": m["name"]}, "runUid": m["uid"],
                                "type": {"pr": "pullRequest"}.get(suffix, suffix), "target": dict(target),
                                "requiresApproval": requires, "maxAttempts": wb.maxAttempts}
        if body is not None:
            spec["body"] = body
        if url is not None:
            spec["url"] = url
        if title is not None:
            spec["title"] = title
        if pull_request is not None:
            spec["pullRequest"] = dict(pull_request)
        return {"apiVersion": WRITE_INTENT.api_version, "kind": WRITE_INTENT.kind,
                "metadata": {"name": _intent_name(m["name"], suffix), "namespace": m.get("namespace"),
                             "labels": {WRITE_RUN: m["name"]},
                             "ownerReferences": [{"apiVersion": run.get("apiVersion") or kinds.AGENT_RUN.api_version,
                                                  "kind": "AgentRun", "name": m["name"], "uid": m["uid"],
                                                  "controller": True}]},
                "spec": spec}

    def _create(self, intent: Obj) -> Obj:
        try:
            return self.ctx.store.create(WRITE_INTENT, intent)
        except errors.AlreadyExists:
            # Left by an earlier run of the same name, or written by the cache's lag: ours when it
            # is owned by this run; another's is replaced on the next look.
            existing = self.ctx.store.get(WRITE_INTENT, intent["metadata"]["namespace"], intent["metadata"]["name"])
            if existing["spec"].get("runUid") != intent["spec"]["runUid"]:
                self.ctx.store.delete(WRITE_INTENT, existing["metadata"]["namespace"], existing["metadata"]["name"],
                                      uid=existing["metadata"]["uid"])
                raise errors.Conflict(f'WriteIntent "{intent["metadata"]["name"]}" belonged to an earlier run of '
                                      "that name; it was removed") from None
            return existing

    def _pull_request_intent(self, run: Obj, origin: Origin, wb: WriteBack) -> Obj | str | None:
        """The pull request intent; None when there is nothing to propose; a problem (text for the
        comment) when there is a change but no way to propose it."""
        pr = wb.pullRequest
        status = run.get("status") or {}
        git = git_source(run)
        if pr is None or git is None or not status.get("baseCommit"):
            return None
        patch = _read_artifact(self.runtime, run, "changes.patch", PATCH_LIMIT)
        if not patch or not patch.strip():
            return None
        namespace = run["metadata"].get("namespace") or ""
        source_name = pr.sourceRef or origin.source
        source = _read(self.ctx.store, IMPLEMENTATION_SOURCE, namespace, source_name)
        github = ((source or {}).get("spec") or {}).get("github") or {}
        if not github:
            if source is None:
                return (f'ImplementationSource "{source_name}" not found in namespace "{namespace}": create it, or '
                        "set writeBack.pullRequest.sourceRef to a GitHub source")
            return (f'ImplementationSource "{source_name}" is not a GitHub source: set writeBack.pullRequest.sourceRef '
                    "to the GitHub ImplementationSource whose repository gets the pull request")
        target = {"provider": "github", "sourceRef": {"name": source_name}, "owner": github.get("owner"),
                  "repo": github.get("repo")}
        closes = None
        if origin.provider == "github":
            target["number"] = origin.target.get("number")
            same = (origin.target.get("owner"), origin.target.get("repo")) == (github.get("owner"), github.get("repo"))
            closes = f'#{origin.target["number"]}' if same else f'{origin.target["owner"]}/{origin.target["repo"]}' \
                                                                  f'#{origin.target["number"]}'
        context = self._context(run, origin, {})
        name = run["metadata"]["name"]
        try:
            title = render.render_text(f"writeBack.pullRequest.titleTemplate (run {name})",
                                       pr.titleTemplate or DEFAULT_TITLE, context, limit=256).strip()
            body = render.render_text(f"writeBack.pullRequest.bodyTemplate (run {name})",
                                      pr.bodyTemplate or DEFAULT_BODY, context, limit=60_000).rstrip()
        except render.TemplateError as exc:
            return f"{exc}; fix the template on the TriggerRule or Agent"
        if closes and f"closes {closes}".lower() not in body.lower():
            body = f"{body}\n\nCloses {closes}"
        base = pr.base or (git.ref if git.ref not in ("", "HEAD") else "")
        when = status.get("finishedAt") or status.get("startedAt") or run["metadata"].get("creationTimestamp")
        content = {"gitUrl": git.url, "branch": f"{pr.branchPrefix.rstrip('/')}/{name}", "base": base,
                   "baseCommit": status["baseCommit"], "title": title or f"Joch run {name}", "body": body,
                   "draft": pr.draft, "authorDate": str(when)}
        return self._intent(run, "pr", target, wb, requires=wb.requireApproval or pr.requireApproval,
                            pull_request=content)

    def _comment_body(self, run: Obj, origin: Origin, wb: WriteBack, intents: Mapping[str, Obj],
                      problems: Sequence[str] = ()) -> str:
        context = self._context(run, origin, intents)
        context["writeBack"]["failed"].extend(problems)
        template = (wb.comment.template if wb.comment is not None else None) or DEFAULT_COMMENT
        try:
            text = render.render_text(f'writeBack.comment.template (run {run["metadata"]["name"]})', template,
                                      context, limit=60_000)
        except render.TemplateError as exc:
            where = "TriggerRule " + origin.rule if origin.rule and (
                self._rule_write_back(run, origin) or {}).get("comment") else "Agent"
            text = f"**Joch** run `{run['metadata']['name']}`: {context['run']['phase']}\n\n" \
                   f"(the comment template could not be rendered: {exc.message}; fix writeBack.comment.template " \
                   f"on the {where})"
        return f"{text.rstrip()}\n\n{marker(run['metadata']['uid'])}"

    def _context(self, run: Obj, origin: Origin, intents: Mapping[str, Obj]) -> dict[str, Any]:
        status = run.get("status") or {}
        cost = status.get("costUsd")
        summary = None
        if status.get("phase") in ENDED:
            raw = _read_artifact(self.runtime, run, "summary", SUMMARY_BYTES)
            summary = raw.decode("utf-8", errors="replace").strip() if raw else None
        pr_status = ((intents.get("pr") or {}).get("status") or {})
        pull_request = ({"url": pr_status["url"], "number": pr_status.get("externalId"),
                         "branch": ((intents["pr"].get("spec") or {}).get("pullRequest") or {}).get("branch")}
                        if pr_status.get("url") else None)
        pending: list[str] = []
        rejected: list[str] = []
        failed: list[str] = []
        for suffix, intent in intents.items():
            if suffix == "comment":
                continue
            s = intent.get("status") or {}
            what = {"pr": "the pull request", "link": "the link to the pull request"}.get(suffix, suffix)
            if s.get("phase") == "PendingApproval":
                pending.append(f"{what} (joch approve approval {s.get('approvalRef') or intent['metadata']['name']})")
            elif s.get("phase") == "Rejected":
                rejected.append(f"{what}: {s.get('lastError') or 'rejected'}")
            elif s.get("phase") == "Failed":
                failed.append(f"{what}: {s.get('lastError') or 'failed'}")
        return {
            "run": {"name": run["metadata"]["name"], "namespace": run["metadata"].get("namespace"),
                    "uid": run["metadata"].get("uid"), "phase": status.get("phase") or "Pending",
                    "reason": status.get("reason"), "message": status.get("message"),
                    "costUsd": cost, "cost": _cost_text(cost, status.get("phase")),
                    "attempt": status.get("attempt"), "startedAt": status.get("startedAt"),
                    "finishedAt": status.get("finishedAt"),
                    "agent": ((run.get("spec") or {}).get("agentRef") or {}).get("name")},
            "issue": {"item": origin.item, "url": origin.url, "title": origin.title,
                      "number": origin.target.get("number"), "identifier": origin.target.get("identifier")},
            "pullRequest": pull_request, "summary": summary,
            "writeBack": {"pending": pending, "rejected": rejected, "failed": failed},
        }

    def _note(self, run: Obj, intents: Mapping[str, Obj]) -> None:
        """The run's ``status.writeBack``: where its writes landed, and what waits for approval."""
        comment = (intents.get("comment") or {}).get("status") or {}
        pr = intents.get("pr")
        pr_status = (pr or {}).get("status") or {}
        status = run.get("status") or {}
        # What landed stays recorded while an intent is being sent again (its url unset meanwhile).
        wanted: dict[str, Any] = {k: v for k, v in (status.get("writeBack") or {}).items() if k != "pending"}
        if comment.get("url"):
            wanted["commentUrl"] = comment["url"]
        if pr is not None and pr_status.get("url"):
            number = pr_status.get("externalId")
            ref: dict[str, Any] = {"url": pr_status["url"],
                                   "branch": ((pr.get("spec") or {}).get("pullRequest") or {}).get("branch")}
            if isinstance(number, str) and number.isdigit():
                ref["number"] = int(number)
            if pr_status.get("commit"):
                ref["commit"] = pr_status["commit"]
            wanted["pullRequest"] = ref
        pending = sorted(i["metadata"]["name"] for i in intents.values()
                         if (i.get("status") or {}).get("phase") == "PendingApproval")
        if pending:
            wanted["pending"] = pending
        if (status.get("writeBack") or {}) == wanted or (not wanted and status.get("writeBack") is None):
            return
        self.ctx.store.update_status(kinds.AGENT_RUN, {**run, "status": {**status, "writeBack": wanted}})


def _run_of_intent(intent: Obj) -> Iterable[Key]:
    ref = (intent.get("spec") or {}).get("runRef") or {}
    if ref.get("name"):
        yield Key(intent["metadata"].get("namespace") or "", ref["name"])


# --- WriteIntentController -------------------------------------------------------------------------

class WriteIntentController(Controller):
    """Sends each WriteIntent once, through its approval gate; see the module docstring."""

    name = "writeintents"
    kind = WRITE_INTENT

    def __init__(self, runtime: rt.Runtime, *, rng: random.Random | None = None, workdir: Path | None = None) -> None:
        self.runtime = runtime
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self.workdir = workdir
        self._ctx: Context | None = None

    @property
    def ctx(self) -> Context:
        if self._ctx is None:
            raise RuntimeError("WriteIntentController used before setup()")
        return self._ctx

    def secondary(self) -> Sequence[tuple[KindInfo, Mapper]]:
        return ((kinds.APPROVAL, _intent_of_approval),)

    def setup(self, ctx: Context) -> None:
        self._ctx = ctx
        ctx.cache(kinds.APPROVAL)

    def reconcile(self, key: Key) -> Result | None:
        intent = self.ctx.cache(WRITE_INTENT).get(key.namespace, key.name)
        if intent is None or intent["metadata"].get("deletionTimestamp"):
            return None
        status = intent.get("status") or {}
        phase = status.get("phase")
        if phase is None:
            return self._gate(intent)
        if phase == "PendingApproval":
            return self._pending(intent)
        if phase == "Retrying":
            due = _epoch(status.get("nextAttemptAt"))
            left = (due or 0.0) - self.ctx.clock.time()
            if left > 0:
                return Result(requeue_after=left)
        if phase in ("ReadyToSend", "Retrying"):
            return self._begin(intent)
        if phase == "Sending":
            return self._send(intent)
        if phase == "Succeeded" and intent["spec"].get("type") == "comment" \
                and status.get("sentHash") != content_hash(intent["spec"]):
            return self._begin(intent, again=True)
        return None

    # --- the gate ----------------------------------------------------------------------------------

    def _run(self, intent: Obj) -> Obj | None:
        try:
            run = self.ctx.store.get(kinds.AGENT_RUN, intent["metadata"].get("namespace"),
                                     intent["spec"]["runRef"]["name"])
        except errors.NotFound:
            return None
        return run if run["metadata"].get("uid") == intent["spec"].get("runUid") else None

    def _gate(self, intent: Obj) -> Result | None:
        run = self._run(intent)
        if run is None:
            return None  # its run is gone: there is nothing to write for
        outcomes = decisions.write_back(decisions.StoreSource(self.ctx.store), intent, run)
        status = dict(intent.get("status") or {})
        what = describe(intent)
        denied = next((o for o in outcomes if o.action == "deny"), None)
        if denied is not None:
            status.update(phase="Rejected", lastError=denied.reason)
            status["conditions"] = set_condition(list(status.get("conditions") or []), {
                "type": "Rejected", "status": "True", "reason": "PolicyDenied", "message": denied.reason})
            with self.ctx.store.transaction() as w:
                out = w.update_status(WRITE_INTENT, {**intent, "status": status})
                events.record(w, out, reason="PolicyDenied", message=f"{what}: {denied.reason}", type="Warning",
                              component=COMPONENT)
                w.audit(self._audit(intent, "denied", f"{what}: {denied.reason}"))
            return None
        with self.ctx.store.transaction() as w:
            for warning in (o for o in outcomes if o.action == "warn"):
                events.record(w, intent, reason="PolicyWarning", message=warning.reason, type="Warning",
                              component=COMPONENT)
            asked = next((o for o in outcomes if o.action == "requireApproval"), None)
            if intent["spec"].get("requiresApproval") or asked is not None:
                name = intent["metadata"]["name"]
                status.update(phase="PendingApproval", approvalRef=name)
                status["conditions"] = set_condition(list(status.get("conditions") or []), {
                    "type": "AwaitingApproval", "status": "True", "reason": "ApprovalRequested",
                    "message": f"waiting for Approval {name}: joch approve approval {name}"})
                out = w.update_status(WRITE_INTENT, {**intent, "status": status})
                namespace = intent["metadata"].get("namespace") or ""
                existing = self.ctx.cache(kinds.APPROVAL).get(namespace, name)
                if existing is not None and not _owned(existing, intent):
                    # an earlier intent's of this name (an earlier run's): its decision is not this write's
                    w.delete(kinds.APPROVAL, namespace, name, uid=existing["metadata"]["uid"])
                    existing = None
                if existing is None:
                    approval = w.create(kinds.APPROVAL, self._approval(intent, run, asked))
                    w.update_status(kinds.APPROVAL, {**approval, "status": {"phase": "Pending"}})
                events.record(w, out, reason="AwaitingApproval", message=f"{what}: approval {name} requested",
                              component=COMPONENT)
            else:
                status.update(phase="ReadyToSend")
                w.update_status(WRITE_INTENT, {**intent, "status": status})
        return None

    def _approval(self, intent: Obj, run: Obj, asked: Any) -> Obj:
        name = intent["metadata"]["name"]
        reason = (f'Policy {asked.policy.ref} rule "{asked.rule.name}" requires approval: {asked.message}'
                  if asked is not None else "the write-back settings require approval")
        agent = ((run.get("spec") or {}).get("agentRef") or {}).get("name") or ""
        body = approvals.for_run(run, name, agent, action=ACTION, reason=f"{describe(intent)}: {reason}",
                                 separation_of_duties=bool(asked is not None and asked.policy.separation_of_duties),
                                 policy_ref=({"namespace": asked.policy.namespace, "name": asked.policy.name,
                                              "rule": asked.rule.name} if asked is not None else None))
        m = intent["metadata"]
        body["metadata"]["ownerReferences"] = [{"apiVersion": WRITE_INTENT.api_version, "kind": WRITE_INTENT.kind,
                                                "name": m["name"], "uid": m["uid"], "controller": True}]
        return body

    def _pending(self, intent: Obj) -> Result | None:
        status = dict(intent.get("status") or {})
        namespace = intent["metadata"].get("namespace") or ""
        name = status.get("approvalRef") or intent["metadata"]["name"]
        approval = self.ctx.cache(kinds.APPROVAL).get(namespace, name)
        if approval is not None and not _owned(approval, intent):
            # Left by an earlier intent of this name (an earlier run's): its decision is not this
            # write's. It goes, and the next look asks again.
            self.ctx.store.delete(kinds.APPROVAL, namespace, name, uid=approval["metadata"]["uid"])
            return None
        if approval is None:
            run = self._run(intent)
            if run is not None:
                try:
                    self.ctx.store.create(kinds.APPROVAL, self._approval(intent, run, None))
                except errors.AlreadyExists:
                    pass
            return None
        decision = (approval.get("status") or {}).get("phase")
        who = (approval.get("status") or {}).get("decidedBy") or "someone"
        why = (approval.get("status") or {}).get("reason")
        what = describe(intent)
        if decision == "Approved":
            status.update(phase="ReadyToSend")
            status["conditions"] = set_condition(list(status.get("conditions") or []), {
                "type": "AwaitingApproval", "status": "False", "reason": "Approved", "message": f"approved by {who}"})
            message, kind = f"{what}: approval {name} approved by {who}", NORMAL
        elif decision in ("Denied", "Expired"):
            if decision == "Denied":
                said = f"write-back Approval {name} denied by {who}" + (f": {why}" if why else "")
            else:
                said = f"write-back Approval {name} expired at {approval['spec'].get('expiresAt')} without a decision"
            status.update(phase="Rejected", lastError=said)
            status["conditions"] = set_condition(list(status.get("conditions") or []), {
                "type": "AwaitingApproval", "status": "False", "reason": decision, "message": said})
            message, kind = f"{what}: {said}", WARNING
        else:
            return None
        with self.ctx.store.transaction() as w:
            out = w.update_status(WRITE_INTENT, {**intent, "status": status})
            events.record(w, out, reason=f"Approval{decision}", message=message, type=kind, component=COMPONENT)
        return None

    # --- sending -----------------------------------------------------------------------------------

    def _begin(self, intent: Obj, *, again: bool = False) -> Result | None:
        """Records ``Sending`` (and the attempt) before anything leaves: a crash from here on is
        recovered by adopting what the tracker has."""
        status = dict(intent.get("status") or {})
        status.update(phase="Sending", attempts=(0 if again else int(status.get("attempts") or 0)) + 1)
        status.pop("nextAttemptAt", None)
        self.ctx.store.update_status(WRITE_INTENT, {**intent, "status": status})
        return None

    def _send(self, cached: Obj) -> Result | None:
        if not self.ctx.leading():
            return None
        # The cache may not have seen this controller's last write yet (a Retrying written a moment
        # ago): what is sent is decided from the stored intent, never from a stale Sending.
        try:
            intent = self.ctx.store.get(WRITE_INTENT, cached["metadata"].get("namespace"), cached["metadata"]["name"])
        except errors.NotFound:
            return None
        if (intent.get("status") or {}).get("phase") != "Sending" or intent["metadata"].get("deletionTimestamp"):
            return None
        what = describe(intent)
        spec = intent["spec"]
        try:
            source = self._source(intent)
            tracker = trackers.open_tracker(source, secret_lookup(self.ctx.store, intent["metadata"].get("namespace")
                                                                   or ""), self.ctx.clock.time)
            sent = self._deliver(tracker, intent)
        except TrackerError as exc:
            return self._failed(intent, exc)
        fresh = self.ctx.store.get(WRITE_INTENT, intent["metadata"].get("namespace"), intent["metadata"]["name"])
        status = dict(fresh.get("status") or {})
        status.update(phase="Succeeded", sentAt=now(), sentHash=content_hash(spec), **sent)
        status.pop("lastError", None)
        status.pop("nextAttemptAt", None)
        status["conditions"] = set_condition(list(status.get("conditions") or []), {
            "type": "Sent", "status": "True", "reason": "Sent", "message": f"{what}: {status.get('url') or 'sent'}"})
        with self.ctx.store.transaction() as w:
            out = w.update_status(WRITE_INTENT, {**fresh, "status": status})
            events.record(w, out, reason="Sent", message=f"{what}: {status.get('url') or 'sent'}", component=COMPONENT)
            w.audit(self._audit(intent, "allowed", what))
        return None

    def _source(self, intent: Obj) -> Obj:
        namespace = intent["metadata"].get("namespace") or ""
        name = intent["spec"]["target"]["sourceRef"]["name"]
        # From the store: a source applied a moment ago may not be in the cache yet.
        source = _read(self.ctx.store, IMPLEMENTATION_SOURCE, namespace, name)
        if source is None:
            raise TrackerError("NotFound", f'ImplementationSource "{name}" not found in namespace "{namespace}": '
                                           f'WriteIntent {intent["metadata"]["name"]} writes with its credentials')
        return source

    def _deliver(self, tracker: Tracker, intent: Obj) -> dict[str, Any]:
        """Sends the intent, adopting what an interrupted send left; the status fields to record."""
        spec = intent["spec"]
        status = intent.get("status") or {}
        target = _target(spec["target"])
        kind = spec["type"]
        if kind == "comment":
            body = str(spec.get("body") or "")
            existing_id = status.get("externalId")
            if existing_id:
                comment = tracker.update_comment(target, str(existing_id), body)
            else:
                found = tracker.find_comment(target, marker(spec["runUid"]))
                if found is None:
                    comment = tracker.create_comment(target, body)
                elif found.body != body:
                    comment = tracker.update_comment(target, found.id, body)
                else:
                    comment = found
            return {"externalId": comment.id, "url": comment.url}
        if kind == "link":
            attach = getattr(tracker, "attach_link", None)
            if attach is None:
                raise TrackerError("Invalid", f"{tracker.provider} issues take no links; the WriteIntent "
                                              f'{intent["metadata"]["name"]} cannot be sent')
            external = attach(target, str(spec.get("url")), str(spec.get("title") or spec.get("url")))
            return {"externalId": str(external), "url": spec.get("url")}
        return self._pull_request(tracker, intent)

    def _pull_request(self, tracker: Any, intent: Obj) -> dict[str, Any]:
        spec = intent["spec"]
        pr = spec.get("pullRequest") or {}
        name = intent["metadata"]["name"]
        if not pr:
            raise TrackerError("Invalid", f"WriteIntent {name}: spec.pullRequest is not set")
        found = tracker.find_pull_request(pr["branch"])
        commit = (intent.get("status") or {}).get("commit")
        if found is None:
            run = self._run(intent)
            patch = _read_artifact(self.runtime, run, "changes.patch", PATCH_LIMIT) if run is not None else None
            if not patch:
                raise TrackerError("NotFound", f'WriteIntent {name}: the changes.patch of run '
                                               f'"{spec["runRef"]["name"]}" is gone (its files were removed?); '
                                               "nothing to push")
            base = pr.get("base") or tracker.repository().default_branch
            git_url = str(pr["gitUrl"])
            token = tracker.token() if git_url.startswith("https://") else None
            with tempfile.TemporaryDirectory(prefix="joch-push-", dir=self.workdir) as tmp:
                commit = gitpush.push_patch(
                    git_url=git_url, base_commit=pr["baseCommit"], fetch_ref=base, patch=patch, branch=pr["branch"],
                    message=f'{pr["title"]}\n\nJoch run {spec["runRef"]["name"]}', author_name=COMMIT_AUTHOR[0],
                    author_email=COMMIT_AUTHOR[1], date=pr["authorDate"], token=token, workdir=Path(tmp))
            # Found again: a PR opened for the branch between the first look and the push is adopted.
            found = tracker.find_pull_request(pr["branch"]) or tracker.create_pull_request(
                head=pr["branch"], base=base, title=pr["title"], body=pr["body"], draft=bool(pr.get("draft")))
        out: dict[str, Any] = {"externalId": str(found.number), "url": found.url}
        if commit:
            out["commit"] = commit
        return out

    def _failed(self, intent: Obj, exc: TrackerError) -> Result | None:
        fresh = self.ctx.store.get(WRITE_INTENT, intent["metadata"].get("namespace"), intent["metadata"]["name"])
        status = dict(fresh.get("status") or {})
        attempts = int(status.get("attempts") or 1)
        limit = int(intent["spec"].get("maxAttempts") or 8)
        what = describe(intent)
        message = f"{exc.reason}: {exc.message}"
        status["lastError"] = message
        requeue: float | None = None
        if exc.retryable and attempts < limit:
            clock = self.ctx.clock.time()
            delay = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempts - 1))
            delay = min(BACKOFF_CAP, delay * self.rng.uniform(1 - JITTER, 1 + JITTER))
            if exc.retry_at is not None:
                delay = max(delay, exc.retry_at - clock)
            status.update(phase="Retrying", nextAttemptAt=_rfc3339(clock + delay))
            reason, said, requeue = "Retrying", f"{what}: attempt {attempts} of {limit} failed ({message}); " \
                                                f"retrying at {status['nextAttemptAt']}", delay
        else:
            status.update(phase="Failed")
            status.pop("nextAttemptAt", None)
            why = f"after {attempts} attempts" if exc.retryable else "not retryable"
            reason, said = "Failed", f"{what}: failed {why}: {message}"
        status["conditions"] = set_condition(list(status.get("conditions") or []), {
            "type": "Sent", "status": "False", "reason": exc.reason, "message": message})
        with self.ctx.store.transaction() as w:
            out = w.update_status(WRITE_INTENT, {**fresh, "status": status})
            events.record(w, out, reason=reason, message=said, type="Warning", component=COMPONENT)
            w.audit(self._audit(intent, "allowed", f"{what} failed: {message}"))
        return Result(requeue_after=requeue) if requeue is not None else None

    def _audit(self, intent: Obj, decision: Any, reason: str) -> AuditEntry:
        m = intent["metadata"]
        return AuditEntry(verb="write", kind=WRITE_INTENT.kind, namespace=m.get("namespace"), name=m["name"],
                          decision=decision, reason=reason, actor=CONTROLLER.name, groups=CONTROLLER.groups)


def describe(intent: Obj) -> str:
    """``comment on github:acme/web#12``, ``pull request on github:acme/web``, ``link on linear:ENG-12``."""
    spec = intent.get("spec") or {}
    t = spec.get("target") or {}
    if t.get("provider") == "github":
        where = f'github:{t.get("owner")}/{t.get("repo")}' + (f'#{t["number"]}' if t.get("number") else "")
        if spec.get("type") == "pullRequest":
            where = f'github:{t.get("owner")}/{t.get("repo")}'
    else:
        where = f'linear:{t.get("identifier") or t.get("issueId")}'
    what = {"comment": "comment", "pullRequest": "pull request", "link": "link"}.get(str(spec.get("type")), "write")
    return f"{what} on {where}"


def _target(raw: Mapping[str, Any]) -> WriteTarget:
    return WriteTarget.model_validate(raw)


def _intent_of_approval(approval: Obj) -> Iterable[Key]:
    for ref in (approval.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("kind") == WRITE_INTENT.kind and ref.get("controller") is True \
                and ref.get("name"):
            yield Key(approval["metadata"].get("namespace") or "", str(ref["name"]))


def _read(store: Any, kind: KindInfo, namespace: str, name: str) -> Obj | None:
    try:
        found: Obj = store.get(kind, namespace, name)
    except errors.NotFound:
        return None
    return found


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_time(value).timestamp()
    except ValueError:
        return None


def _rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
