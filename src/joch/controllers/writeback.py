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

  It copies where the writes landed into the run's ``status.writeBack``. The intents are sent by
  ``joch.controllers.writeintents.WriteIntentController`` (phases, approvals, policy, backoff, audit).

What bit us, and holds now:

* Runs are looked at again when their Agent, synced spec or rule changes, since those may reach
  their caches after the run.
* A change that cannot be proposed (a run from Linear without ``pullRequest.sourceRef``, a title
  template that does not render) is said in the comment, not retried.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from joch.api import errors, kinds
from joch.api.integrations import (
    EXECUTION_ANNOTATION,
    IMPLEMENTATION_SOURCE,
    RULE_LABEL,
    SOURCE_LABEL,
    TRIGGER_EXECUTION,
    TRIGGER_RULE,
    WRITE_INTENT,
    WRITE_RUN,
)
from joch.api.registry import KindInfo
from joch.api.writeback import WriteBack
from joch.compiler import render
from joch.controllers import approvals, triggers
from joch.controllers.base import Context, Controller, Key, Mapper, Result
from joch.controllers.invocations import git_source
from joch.controllers.writeintents import PATCH_LIMIT, marker, owned, read_artifact, read_obj
from joch.runtime import base as rt
from joch.store.base import Obj

logger = logging.getLogger("joch.controllers.writeback")

SUMMARY_BYTES = 4000
ENDED = frozenset({"Succeeded", "Failed", "Cancelled"})


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


def triggered_by(run: Obj, executions: Any) -> Obj | None:
    """The TriggerExecution that dispatched ``run``, when a TriggerRule really made it; else None.

    The ``RULE_LABEL`` label and the ``SOURCE_ITEM``/``EXECUTION_ANNOTATION`` annotations are written
    by the trigger, but anyone who may create or edit AgentRuns can write them too — and they decide
    which issue Joch writes to with the source's credentials. So they are trusted only when admission
    recorded the rule's own user as the run's creator and the execution they name is ``Dispatched``
    for this run by this rule; the item is then the execution's (a record written once), never the
    annotation's. ``executions``: ``get(namespace, name)`` of TriggerExecutions."""
    m = run.get("metadata") or {}
    namespace = m.get("namespace") or ""
    rule_name = (m.get("labels") or {}).get(RULE_LABEL)
    name = (m.get("annotations") or {}).get(EXECUTION_ANNOTATION)
    if not rule_name or not name or executions is None:
        return None
    if approvals.creator_of(run) != triggers.trigger_user(namespace, rule_name).name:
        return None
    execution: Obj | None = executions.get(namespace, name)
    spec = (execution or {}).get("spec") or {}
    if (spec.get("decision") != "Dispatched" or (spec.get("ruleRef") or {}).get("name") != rule_name
            or (spec.get("runRef") or {}).get("name") != m.get("name")):
        return None
    return execution


def origin_of(run: Obj, rules: Any, specs: Any, executions: Any = None) -> Origin | None:
    """``rules``/``specs``/``executions``: caches (``get(namespace, name)``) of TriggerRules,
    ImplementationSpecs and TriggerExecutions. A run's trigger labels and annotations count only when
    ``triggered_by`` vouches for them."""
    m = run.get("metadata") or {}
    namespace = m.get("namespace") or ""
    execution = triggered_by(run, executions)
    rule_name = (m.get("labels") or {}).get(RULE_LABEL) if execution is not None else None
    spec_name = ((run.get("spec") or {}).get("implementationRef") or {}).get("name")
    synced = specs.get(namespace, spec_name) if spec_name else None
    source: str | None = None
    item: str | None = (((execution or {}).get("spec") or {}).get("event") or {}).get("item")
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


class _Stored:
    """``get(namespace, name)`` of ``kind`` straight from the store."""

    def __init__(self, store: Any, kind: KindInfo) -> None:
        self.store, self.kind = store, kind

    def get(self, namespace: str, name: str) -> Obj | None:
        return read_obj(self.store, self.kind, namespace, name)


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


def _intent_name(run_name: str, suffix: str) -> str:
    name = f"{run_name}-{suffix}"
    if len(name) <= 253:
        return name
    return f"{run_name[:220]}-{hashlib.sha256(run_name.encode()).hexdigest()[:10]}-{suffix}"


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
        # The execution is read from the store: it is created with the run, and a cache a moment
        # behind would leave the run without its write-back.
        origin = origin_of(run, self.ctx.cache(TRIGGER_RULE), self.ctx.cache(kinds.IMPLEMENTATION_SPEC),
                           _Stored(self.ctx.store, TRIGGER_EXECUTION))
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
            if found is not None and owned(found, run):
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
        patch = read_artifact(self.runtime, run, "changes.patch", PATCH_LIMIT)
        if not patch or not patch.strip():
            return None
        namespace = run["metadata"].get("namespace") or ""
        source_name = pr.sourceRef or origin.source
        source = read_obj(self.ctx.store, IMPLEMENTATION_SOURCE, namespace, source_name)
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
        # The marker is how a send finds this run's comment again (``find_comment``): text from the
        # issue, the run's message or the agent's summary must never carry one (another run's would
        # make that run adopt, and overwrite, this comment). ``&#58;`` still reads as ":".
        text = text.replace("joch:run:", "joch:run&#58;")
        return f"{text.rstrip()}\n\n{marker(run['metadata']['uid'])}"

    def _context(self, run: Obj, origin: Origin, intents: Mapping[str, Obj]) -> dict[str, Any]:
        status = run.get("status") or {}
        cost = status.get("costUsd")
        summary = None
        if status.get("phase") in ENDED:
            raw = read_artifact(self.runtime, run, "summary", SUMMARY_BYTES)
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
