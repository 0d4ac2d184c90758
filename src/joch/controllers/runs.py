"""The run controller: an AgentRun from Pending to Succeeded, Failed or Cancelled.

Phases (DESIGN.md §2)::

    Pending ──► [AwaitingApproval] ──► Queued ──► Running ──► Succeeded | Failed | Cancelled
       └── InvalidSpec ──► Failed                   ▲    │
                                                    └────┘ retry: a new attempt, Queued again

Each reconcile reads the run from the cache and takes the steps its phase allows, writing status
(and the Event that reports the transition, in the same transaction) after each one. Writes carry
the resourceVersion they were computed from, so a stale cache costs a Conflict and a retry, never a
lost update. What the controller decides and why:

* **Resolution happens once, in Pending.** Agent, compiled manifest, implementation, secrets and a
  trial rendering of the provider's templates are checked before the run is queued; a problem ends
  the run ``Failed`` with ``InvalidSpec`` and a reason naming it (``MissingAgent``,
  ``MissingProvider``, ``MissingImplementation``, ``MissingSecret``, ``SecretNotAllowed``,
  ``TemplateError``, ``InvalidPath``). A run that cannot start should say so at once rather than queue forever.
* **Secret values are read at the last moment.** Pending checks that each Secret exists and is in
  the Agent's ``security.allowedSecrets`` (``SecretNotAllowed`` otherwise) from the caches, which
  hold only the public view (``joch.api.secrets``); the values are read from the store
  (``Store.reveal``, decrypted) when the run is dispatched, go to the runtime's ``submit`` and
  nowhere else, and each Secret resolved is recorded with ``Store.audit`` (verb ``resolve``, the
  Secret and the run, never a value) — once per attempt on this replica.
* **Dispatch policies** run once the run resolves, before it is queued (``joch.policy``): the
  Policies of the run's namespace and ``joch-system`` are read from the store (not the caches, so
  a Policy applied just before the run counts). A ``deny`` ends it ``Failed`` with reason
  ``PolicyDenied`` and a message naming the policy, the rule and its message; ``requireApproval``
  sends it to ``AwaitingApproval`` with the run's one dispatch Approval, whose ``spec.reason``
  names the rule, ``spec.policyRef`` points at it and ``spec.separationOfDuties`` is the Policy's
  (an Agent that requires approval too still gets one Approval per run and action); ``warn`` is a
  Warning Event. Denials and warnings are audited.
* **Scheduling** (``scheduling.Scheduler``) decides which Queued run may start under the global,
  namespace and agent limits; approvals (``approvals``) gate runs of agents that require one
  (denied: ``ApprovalDenied``; expired unanswered: ``ApprovalExpired``, with the time).
* **Nothing starts twice.** The attempt number is fixed when a run is queued; before starting it
  the controller records the intent (Running, reason Starting, a ``pending`` reference) under the
  run's resourceVersion and checks it still holds the leader lease; the runtime's ``submit`` is
  idempotent per (uid, attempt), so whoever resumes a pending start gets the same process back.
* **The runner owns the deadline;** the controller keeps a backstop (cancel when the run is well
  past its deadline plus grace) for a runner that stopped enforcing it.
* **Cancellation and deletion** both go through the runtime's cancel and wait for the runner to
  record the end; a finalizer keeps a deleted run until its process is gone and its files removed.
* Retries (``Agent.spec.defaults.retryLimit``) apply to failures that another attempt might not
  repeat: the agent's non-zero exit, its CLI's own error (``AgentReportedError``) and a lost
  runner. A missed deadline, a bad checkout, a binary that cannot start or a full disk
  (``DiskFull``) fail at once.
* **Resume, or start over.** An attempt retried after its runner was lost (``RunnerLost``: the
  runner, or the whole server, killed) continues the agent CLI's session when the provider is
  ``resumable`` and the runner recorded the session id (``RunState.session``): the decision is made
  when the attempt ends and written into ``status.session`` (``id``, the new ``attempt``,
  ``resumedFromAttempt``), so a dispatch resumed after a crash decides the same. The next attempt's
  ``RunnerSpec.resume`` names the attempt whose worktree holds the session (the lost one, or the
  one it resumed in turn), its templates see ``session.id`` and that worktree's paths, and the
  worktree is kept instead of cleaned up until the run ends. An agent that failed on its own starts
  over: its session is what failed. The ``Retrying`` event says which. An attempt that missed its
  deadline while its user raised ``spec.timeoutSeconds`` (above what the attempt ran) continues the
  same way, retry limit or not — the user asked for more time; each attempt gets the whole timeout.
* **What ran is recorded.** The runner's record (``RunState``: ``invocation``, ``base_commit``,
  ``sandbox``, ``session``, ``omitted``) is copied into the run's status while it runs and when the
  attempt ends (``invocations.note_runtime_facts``); the provider's policies, config files and version
  arguments, the Agent's network and the manifest hash go the other way, into the ``RunnerSpec``
  (``invocations.runner_fields``).
* **Budgets** (``budgets``): before a run is queued, and again before it takes a slot, its
  reservation is checked against every Budget that applies; a run that does not fit ends
  ``Failed/BudgetExceeded`` (``onExceed: deny``) or waits ``Queued`` with reason ``BudgetExceeded``
  (``hold``) until the period rolls over, and each block is audited. An admitted run holds its
  reservation in memory (``_reservations``) until it ends. While it runs, a usage report that
  crosses a cap sets its ``BudgetExceeded`` condition (``metering``); this controller then cancels
  it through the runtime and ends it ``Failed/BudgetExceeded``, whatever the agent did meanwhile.
* **The run token** (``metering.run_token``) reaches the runner with the secrets, as
  ``JOCH_RUN_TOKEN``: the same for a resumed start, worthless once the attempt is over.
* **Traced and logged by uid:** each reconcile is a ``joch.run.reconcile`` span in the run's own
  trace (its id is the uid) and its log lines carry ``run_uid``; the transitions ``_write`` records
  end the spans of the run's life (``runspans``).
* **Limits** (``--max-log-bytes``, ``--max-artifact-bytes``) go to the runner in the spec. An
  output it refused is listed in ``status.refusedArtifacts`` (name, path, size, why) with an
  ``ArtifactsRefused`` condition, never in ``status.artifacts``, which holds what can be downloaded.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

from joch.admission import uniqueness
from joch.api import errors, kinds
from joch.api.audit import AuditEntry
from joch.api.identity import CONTROLLER
from joch.api.meta import now, parse_time, set_condition
from joch.api.registry import KindInfo
from joch.compiler import manifest as compiler
from joch.compiler import render
from joch.controllers import approvals, budgets, events, metering, placements, runspans, scheduling
from joch.controllers.base import Context, Controller, Key, Mapper, Result
from joch.controllers.invocations import git_source, note_runtime_facts, resume_of, runner_fields
from joch.controllers.options import ControllerOptions
from joch.policy import decisions
from joch.policy.rules import Outcome
from joch.runtime import agentoutput, disks
from joch.runtime import base as rt
from joch.store.base import ListOptions, Obj
from joch.telemetry import logs, metrics, tracing

logger = logging.getLogger("joch.controllers.runs")

FINALIZER = "runtime.joch.dev/cleanup"
TERMINAL = frozenset({"Succeeded", "Failed", "Cancelled"})
RETRYABLE = frozenset({"AgentFailed", "AgentReportedError", "RunnerLost"})
WAITING = frozenset({"Unschedulable", "ErrImagePull", "ImagePullBackOff"})  # a runtime's unfinished reasons
BACKSTOP_SLACK = 30.0  # seconds past deadline + grace before the controller cancels on its own
COMPONENT = "joch-run-controller"

Phase = Literal["Pending", "AwaitingApproval", "Queued", "Running", "Succeeded", "Failed", "Cancelled"]

_PROBLEM_REASONS = {
    "ProviderNotFound": "MissingProvider",
    "SecretNotFound": "MissingSecret",
    "SecretNotAllowed": "SecretNotAllowed",
    "TemplateError": "TemplateError",
    "UnknownParameter": "UnknownParameter",
}


class InvalidSpec(Exception):
    """Why a run cannot start; ``audit`` is recorded once the run's Failed status is written (a
    reconcile retried after a conflict must not record the denial twice)."""

    def __init__(self, reason: str, message: str, audit: AuditEntry | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.audit = audit


@dataclass(frozen=True)
class Plan:
    """Everything a run needs to start, resolved from the caches."""

    agent: Obj
    compiled: compiler.Compiled
    implementation: Mapping[str, Any]
    timeout_seconds: int
    retry_limit: int
    requires_approval: bool
    max_concurrent: int | None


class RunController(Controller):
    name = "runs"
    kind = kinds.AGENT_RUN

    def __init__(self, runtime: rt.Runtime, options: ControllerOptions) -> None:
        self.runtime = runtime
        self.options = options
        self.workers = max(1, options.workers)
        self.scheduler = scheduling.Scheduler(options, self._agent_limit)
        self._cancel_sent: set[tuple[Key, str]] = set()
        self._cleaned: set[tuple[Key, str]] = set()
        # Run attempts whose secrets this replica has audited as resolved: a start resumed by the
        # same replica (its intent write came back through the cache first) reads them again, but
        # is the same resolution. Forgotten when the run ends or goes away.
        self._resolved: dict[str, int] = {}
        self._ctx: Context | None = None
        self._budget_lock = threading.Lock()
        self._reservations: dict[Key, budgets.Reserved] = {}

    # --- wiring -----------------------------------------------------------------------------------

    def secondary(self) -> Sequence[tuple[KindInfo, Mapper]]:
        return ((kinds.APPROVAL, approvals.run_of), (kinds.AGENT, self._runs_of_agent),
                (kinds.BUDGET, self._runs_of_budget))

    def setup(self, ctx: Context) -> None:
        self._ctx = ctx
        # Every kind reconcile reads comes from a cache; asking for them now gets them synced with
        # the rest before the first reconcile.
        for kind in (kinds.AGENT_PROVIDER, kinds.IMPLEMENTATION_SPEC, kinds.SECRET, kinds.APPROVAL, kinds.BUDGET):
            ctx.cache(kind)
        self.runtime.subscribe(self._runtime_changed)

    def started(self) -> None:
        running = [r for r in self.ctx.cache(kinds.AGENT_RUN).list() if _phase(r) == "Running"]
        self.scheduler.seed(running)
        for run in running:
            self._hold_reservation(Key.of(run), run)
        runs = self.ctx.cache(kinds.AGENT_RUN)
        metrics.RUNS.track(self, lambda: metrics.count_phases(_phase(run) for run in runs.list()))

    def stopped(self) -> None:
        metrics.RUNS.untrack(self)
        self.scheduler.clear()
        with self._budget_lock:
            self._reservations.clear()
        self._cancel_sent.clear()
        self._cleaned.clear()
        self._resolved.clear()

    @property
    def ctx(self) -> Context:
        if self._ctx is None:
            raise RuntimeError("RunController used before setup()")
        return self._ctx

    def _runtime_changed(self, run: rt.RunId) -> None:
        if self._ctx is not None:
            self._ctx.enqueue(self.name, Key(run.namespace, run.name))

    def _runs_of_agent(self, agent: Obj) -> Iterable[Key]:
        # An Agent change matters to runs not yet started (its limit, its approval flag).
        m = agent["metadata"]
        for run in self.ctx.cache(kinds.AGENT_RUN).list(m.get("namespace") or ""):
            if run["spec"]["agentRef"]["name"] == m["name"] and _phase(run) in (None, "Pending", "Queued"):
                yield Key.of(run)

    def _runs_of_budget(self, budget: Obj) -> Iterable[Key]:
        # A Budget raised, or its period changed: the runs it holds may start now.
        for run in self.ctx.cache(kinds.AGENT_RUN).list(budgets.counted_namespace(budget)):
            if _phase(run) == "Queued":
                yield Key.of(run)

    # --- reconcile --------------------------------------------------------------------------------

    def reconcile(self, key: Key) -> Result | None:
        run = self.ctx.cache(kinds.AGENT_RUN).get(key.namespace, key.name)
        if run is None:
            self._release(key)
            self.scheduler.forget(key)
            return None
        m = run["metadata"]
        uid = str(m.get("uid") or "")
        # Every resync reconciles every ended run: no span for those, or a store of ended runs would
        # flood the collector with spans saying nothing.
        ended = _phase(run) in TERMINAL and not m.get("deletionTimestamp")
        traced = nullcontext() if ended else tracing.run_span("joch.run.reconcile", uid=uid,
                                                              namespace=key.namespace, name=key.name)
        with logs.running(uid), traced:
            return self._reconcile(key, run)

    def _reconcile(self, key: Key, run: Obj) -> Result | None:
        if _phase(run) in TERMINAL:
            self._resolved.pop(str(run["metadata"].get("uid")), None)
        self.scheduler.remember(key)
        if run["metadata"].get("deletionTimestamp"):
            return self._finalize(key, run)
        phase = _phase(run)
        if phase in TERMINAL:
            self._release(key)
            return self._finished(key, run)
        if FINALIZER not in (run["metadata"].get("finalizers") or []):
            m = {**run["metadata"], "finalizers": [*(run["metadata"].get("finalizers") or []), FINALIZER]}
            run = self.ctx.store.update(kinds.AGENT_RUN, {**run, "metadata": m})
        if run["spec"].get("cancel") and phase != "Running":
            self._release(key)
            self._write(run, _ended(run, "Cancelled", "Cancelled", "the run was cancelled before it started"),
                        ("Cancelled", "cancelled before it started", "Normal"))
            return None
        if phase in (None, "Pending"):
            return self._pending(key, run)
        if phase == "AwaitingApproval":
            return self._awaiting_approval(key, run)
        if phase == "Queued":
            return self._queued(key, run)
        return self._running(key, run)

    # --- Pending ----------------------------------------------------------------------------------

    def _pending(self, key: Key, run: Obj) -> Result | None:
        try:
            plan = self._plan(run)
            self._trial_render(run, plan)
        except InvalidSpec as exc:
            status = _ended(run, "Failed", exc.reason, exc.message)
            status["conditions"] = set_condition(status["conditions"], _cond("InvalidSpec", "True", exc.reason,
                                                                             exc.message))
            self._write(run, status, (exc.reason, exc.message, "Warning"))
            if exc.audit is not None:
                self.ctx.store.audit(exc.audit)
            return None
        status = dict(run.get("status") or {})
        conditions = set_condition(list(status.get("conditions") or []),
                                   _cond("Accepted", "True", "Accepted", "the run's references resolve"))
        conditions = set_condition(conditions, _cond("InvalidSpec", "False", "Valid", "the spec is valid"))
        status.update(conditions=conditions, attempt=status.get("attempt") or 1,
                      compiledManifestHash=plan.compiled.hash, observedGeneration=run["metadata"].get("generation"))
        outcomes = decisions.dispatch(decisions.StoreSource(self.ctx.store), run)
        denied = [o for o in outcomes if o.action == "deny"]
        if denied:
            message = "; ".join(f'denied by Policy {o.policy.ref} rule "{o.rule.name}": {o.message}' for o in denied)
            ended = _ended(run, "Failed", "PolicyDenied", message)
            ended["conditions"] = set_condition(ended["conditions"], _cond("Blocked", "True", "PolicyDenied", message))
            self._write(run, ended, ("PolicyDenied", message, "Warning"))
            self._audit(run, denied, "denied")
            return None
        warned = [o for o in outcomes if o.action == "warn"]
        if warned:
            with self.ctx.store.transaction() as w:
                for o in warned:
                    events.record(w, run, reason="PolicyWarning", message=o.reason, type="Warning",
                                  component=COMPONENT)
            self._audit(run, warned, "allowed")
        asked = next((o for o in outcomes if o.action == "requireApproval"), None)
        if plan.requires_approval or asked is not None:
            return self._request_approval(key, run, status, plan, asked)
        return self._enqueue(key, run, status, plan.agent, "Accepted", "waiting for a run slot",
                             ("Queued", f"accepted; agent {plan.agent['metadata']['name']}, attempt "
                                        f"{status['attempt']}", "Normal"))

    def _plan(self, run: Obj) -> Plan:
        namespace = run["metadata"].get("namespace") or ""
        agent_name = run["spec"]["agentRef"]["name"]
        agent = self._read(kinds.AGENT, namespace, agent_name)
        if agent is None:
            raise InvalidSpec("MissingAgent", f'Agent "{agent_name}" not found in namespace "{namespace}": create '
                                              "it or fix spec.agentRef.name")
        compiled = compiler.compile_agent(self._read, agent)
        if compiled.problems or compiled.manifest is None:
            reason, message = compiled.problems[0] if compiled.problems else ("InvalidAgent", "agent does not compile")
            raise InvalidSpec(_PROBLEM_REASONS.get(reason, reason), f'Agent "{agent_name}": {message}')
        spec = compiled.manifest["spec"]
        implementation = self._implementation(run, namespace)
        self._check_secrets(run, spec, namespace)
        defaults = spec.get("defaults") or {}
        timeout = run["spec"].get("timeoutSeconds") or defaults.get("timeoutSeconds") or 3600
        return Plan(agent=agent, compiled=compiled, implementation=implementation, timeout_seconds=int(timeout),
                    retry_limit=int(defaults.get("retryLimit") or 0),
                    requires_approval=bool(spec.get("requiresApproval")),
                    max_concurrent=spec.get("maxConcurrentRuns"))

    def _implementation(self, run: Obj, namespace: str) -> Mapping[str, Any]:
        inline = (run["spec"].get("implementation") or {}).get("inline")
        if inline is not None:
            return dict(inline)
        name = run["spec"]["implementationRef"]["name"]
        impl = self._read(kinds.IMPLEMENTATION_SPEC, namespace, name)
        if impl is None:
            raise InvalidSpec("MissingImplementation", f'ImplementationSpec "{name}" not found in namespace '
                                                       f'"{namespace}": create it or fix spec.implementationRef.name')
        return dict(impl["spec"])

    def _check_secrets(self, run: Obj, spec: Mapping[str, Any], namespace: str) -> None:
        allowed = set((spec.get("security") or {}).get("allowedSecrets") or [])
        agent = run["spec"]["agentRef"]["name"]
        for i, name in enumerate(run["spec"].get("secrets") or []):
            if name not in allowed:
                raise InvalidSpec("SecretNotAllowed", f'spec.secrets[{i}]: Secret "{name}" is not allowed for Agent '
                                                      f'"{agent}"; add it to the agent\'s spec.security.allowedSecrets',
                                  audit=AuditEntry(
                    verb="resolve", kind=kinds.SECRET.kind, namespace=namespace, name=name, decision="denied",
                    actor=CONTROLLER.name, groups=CONTROLLER.groups,
                    reason=f'not allowed for Agent {agent}: AgentRun {namespace}/{run["metadata"]["name"]} fails '
                           "SecretNotAllowed"))
            if self._read(kinds.SECRET, namespace, name) is None:
                raise InvalidSpec("MissingSecret", f'spec.secrets[{i}]: Secret "{name}" not found in namespace '
                                                   f'"{namespace}"')

    def _read(self, kind: KindInfo, namespace: str | None, name: str) -> Obj | None:
        """The cached object, or on a miss the stored one: informers of different kinds lag
        independently, so a run applied together with its Agent may reach the controller first."""
        found = self.ctx.cache(kind).get(namespace or "", name)
        if found is not None:
            return found
        try:
            return self.ctx.store.get(kind, namespace, name)
        except errors.NotFound:
            return None

    def _trial_render(self, run: Obj, plan: Plan) -> None:
        run_id = _run_id(run, 1)
        self._invocation(run, plan, self._workspace(run_id, git_source(run)), run_id)

    def _invocation(self, run: Obj, plan: Plan, workspace: rt.Workspace, run_id: rt.RunId,
                    resume: rt.Resume | None = None) -> render.Invocation:
        return invocation_of(run, plan, workspace, run_id, resume)

    # --- AwaitingApproval -------------------------------------------------------------------------

    def _audit(self, run: Obj, outcomes: Sequence[Outcome], decision: Literal["allowed", "denied"]) -> None:
        m = run["metadata"]
        for o in outcomes:
            self.ctx.store.audit(AuditEntry(verb="dispatch", kind="AgentRun", namespace=m.get("namespace"),
                                            name=m["name"], decision=decision, reason=o.reason))

    def _request_approval(self, key: Key, run: Obj, status: dict[str, Any], plan: Plan,
                          asked: Outcome | None = None) -> Result | None:
        name = approvals.name_for(run)
        agent = plan.agent["metadata"]["name"]
        why = _asked_why(asked) if asked is not None else f'Agent "{agent}" requires approval'
        status.update(phase="AwaitingApproval", reason="AwaitingApproval",
                      message=f"{why}: joch approve approval {name}")
        status["conditions"] = set_condition(status["conditions"], _cond(
            "AwaitingApproval", "True", "ApprovalRequested", f"waiting for Approval {name}"))
        with self.ctx.store.transaction() as w:
            try:
                existing: Obj | None = w.get(kinds.APPROVAL, key.namespace, name)
            except errors.NotFound:
                existing = None
            if existing is not None and not approvals.owned_by(existing, run):
                # Left over from an earlier run of the same name: its decision is not this run's.
                w.delete(kinds.APPROVAL, key.namespace, name, uid=existing["metadata"]["uid"])
                existing = None
            if existing is None:
                # One Approval per (run, action): a dispatch Approval for this run's name that the
                # run does not own was left by an earlier run of that name, and answers nothing here.
                listed = w.list(kinds.APPROVAL, ListOptions(namespace=key.namespace, label_selector=(
                    f"{uniqueness.APPROVAL_LABEL}={uniqueness.approval_key(key.name, 'dispatch')}")))
                for other in approvals.others_for(listed.items, run, "dispatch"):
                    w.delete(kinds.APPROVAL, key.namespace, other["metadata"]["name"], uid=other["metadata"]["uid"])
                approval = w.create(kinds.APPROVAL, self._dispatch_approval(run, name, plan.agent, asked))
                w.update_status(kinds.APPROVAL, {**approval, "status": {"phase": "Pending"}})
            out = w.update_status(kinds.AGENT_RUN, {**run, "status": status})
            events.record(w, out, reason="AwaitingApproval", message=f"approval {name} requested", component=COMPONENT)
        observe_phase(run, out, self.ctx.clock.time())
        return None

    def _dispatch_approval(self, run: Obj, name: str, agent: Obj, asked: Outcome | None = None) -> Obj:
        """The run's dispatch Approval: the Agent's expiry and separation of duties, and when a Policy
        rule asked for it, which (``policyRef``, the reason) and that Policy's separation of duties."""
        spec = agent.get("spec") or {}
        timeout = spec.get("approvalTimeoutSeconds")
        expires = None
        if isinstance(timeout, int) and timeout > 0:
            expires = dt.datetime.fromtimestamp(self.ctx.clock.time() + timeout, dt.UTC)
        separate = bool(spec.get("approvalSeparationOfDuties"))
        separate = separate or (asked is not None and asked.policy.separation_of_duties)
        body = approvals.for_run(run, name, agent["metadata"]["name"], expires_at=expires,
                                 separation_of_duties=separate)
        if asked is not None:
            body["spec"].update(reason=_asked_why(asked), policyRef={
                "namespace": asked.policy.namespace, "name": asked.policy.name, "rule": asked.rule.name})
        return body

    def _awaiting_approval(self, key: Key, run: Obj) -> Result | None:
        name = approvals.name_for(run)
        approval = self.ctx.cache(kinds.APPROVAL).get(key.namespace, name)
        if approval is not None and not approvals.owned_by(approval, run):
            # Left over from an earlier run of the same name: its decision is not this run's.
            self.ctx.store.delete(kinds.APPROVAL, key.namespace, name, uid=approval["metadata"]["uid"])
            return Result(requeue_after=0.2)
        if approval is None:
            try:
                self.ctx.store.get(kinds.APPROVAL, key.namespace, name)
            except errors.NotFound:
                # Gone while the run waited: ask again, for the same reason.
                agent = self._read(kinds.AGENT, key.namespace, run["spec"]["agentRef"]["name"])
                if agent is None:
                    return Result(requeue_after=1.0)
                outcomes = decisions.dispatch(decisions.StoreSource(self.ctx.store), run)
                asked = next((o for o in outcomes if o.action == "requireApproval"), None)
                self.ctx.store.create(kinds.APPROVAL, self._dispatch_approval(run, name, agent, asked))
            return None
        decision = (approval.get("status") or {}).get("phase")
        who = (approval.get("status") or {}).get("decidedBy") or "someone"
        why = (approval.get("status") or {}).get("reason")
        status = dict(run.get("status") or {})
        if decision == "Approved":
            status["conditions"] = set_condition(list(status.get("conditions") or []), _cond(
                "AwaitingApproval", "False", "Approved", f"approved by {who}"))
            agent = self._read(kinds.AGENT, key.namespace, run["spec"]["agentRef"]["name"])
            return self._enqueue(key, run, status, agent, "Approved", "approved; waiting for a run slot",
                                 ("Approved", f"approval {name} approved by {who}", "Normal"))
        if decision == "Denied":
            message = f"approval {name} denied by {who}" + (f": {why}" if why else "")
        elif decision == "Expired":
            when = (approval.get("spec") or {}).get("expiresAt") or "its expiry time"
            message = f"approval {name} expired at {when} without a decision"
        else:
            return None
        ended = _ended(run, "Failed", f"Approval{decision}", message)
        ended["conditions"] = set_condition(ended["conditions"], _cond(
            "AwaitingApproval", "False", decision, message))
        self._write(run, ended, (f"Approval{decision}", message, "Warning"))
        return None

    # --- Queued: the scheduler ----------------------------------------------------------------------

    @staticmethod
    def _to_queued(status: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
        out = {**status, "phase": "Queued", "reason": reason, "message": message}
        out["conditions"] = set_condition(list(status.get("conditions") or []),
                                          _cond("Queued", "True", reason, message))
        return out

    def _enqueue(self, key: Key, run: Obj, status: dict[str, Any], agent: Obj | None, reason: str, message: str,
                 reported: tuple[str, str, Literal["Normal", "Warning"]]) -> Result | None:
        """Queue a validated (and approved) run, unless a Budget it does not fit in says otherwise."""
        block = self._budget_check(key, run, agent, reserve=False)
        if block is None:
            run = self._write(run, self._to_queued(status, reason, message), reported)
            return self._queued(key, run)
        return self._budget_blocked(key, {**run, "status": status}, block, write_from=run)

    def _queued(self, key: Key, run: Obj) -> Result | None:
        agent = self._read(kinds.AGENT, key.namespace, run["spec"]["agentRef"]["name"])
        block = self._budget_check(key, run, agent, reserve=True)
        if block is not None:
            return self._budget_blocked(key, run, block)
        if any(c.get("type") == "Blocked" and c.get("status") == "True"
               for c in (run.get("status") or {}).get("conditions") or []):
            status = dict(run.get("status") or {})
            status["conditions"] = set_condition(list(status.get("conditions") or []), _cond(
                "Blocked", "False", "BudgetAvailable", "the run fits in every Budget that applies"))
            run = self._write(run, status)
        hold = self.scheduler.claim(key, run, self._waiting_runs())
        if hold is not None:
            status = dict(run.get("status") or {})
            if status.get("message") != hold.message:
                status.update(message=hold.message, reason="WaitingForSlot")
                status["conditions"] = set_condition(list(status.get("conditions") or []),
                                                     _cond("Queued", "True", "WaitingForSlot", hold.message))
                self._write(run, status)
            return None
        return self._dispatch(key, run)

    def _waiting_runs(self) -> list[Obj]:
        """Queued and still wanted: a cancelled or deleted run will not take a slot."""
        return [r for r in self.ctx.cache(kinds.AGENT_RUN).list() if _phase(r) == "Queued"
                and not r["metadata"].get("deletionTimestamp") and not r["spec"].get("cancel")]

    def _agent_limit(self, namespace: str, agent: str) -> int | None:
        limit = ((self.ctx.cache(kinds.AGENT).get(namespace, agent) or {}).get("spec") or {}).get("maxConcurrentRuns")
        return limit if isinstance(limit, int) else None

    def _release(self, key: Key) -> None:
        with self._budget_lock:
            self._reservations.pop(key, None)
        for other in self.scheduler.release(key, self._waiting_runs()):
            self.ctx.enqueue(self.name, other)

    # --- budgets ----------------------------------------------------------------------------------

    def _budget_check(self, key: Key, run: Obj, agent: Obj | None, *, reserve: bool) -> budgets.Block | None:
        """The Budget ``run`` does not fit in (``budgets.check``), or None; with ``reserve`` an
        admitted run holds its reservation until it ends (``_release``)."""
        scope = budgets.RunScope.of(run, agent)
        amount = budgets.reservation(run, agent) or 0.0
        cache = self.ctx.cache(kinds.BUDGET)
        candidates = budgets.applicable([*cache.list(scope.namespace), *(
            cache.list(budgets.SYSTEM_NAMESPACE) if scope.namespace != budgets.SYSTEM_NAMESPACE else [])], scope)
        runs = self.ctx.cache(kinds.AGENT_RUN)
        with self._budget_lock:
            block: budgets.Block | None = None
            if candidates:
                now_ = self.ctx.clock.time()
                costs = {k: budgets.cost_of(runs.get(k.namespace, k.name)) for k in self._reservations}
                spent = {b["metadata"]["uid"]: budgets.spend_in_period(self.ctx.store, b, now_) for b in candidates}
                held = {b["metadata"]["uid"]: budgets.outstanding(self._reservations, costs, b, excluding=key)
                        for b in candidates}
                block = budgets.check(candidates, scope, amount, spent, held, now_)
            if block is None and reserve:
                self._reservations[key] = budgets.Reserved(scope, amount)
        return block

    def _hold_reservation(self, key: Key, run: Obj) -> None:
        """Count a run found running (after a restart, say) as holding its reservation."""
        agent = self.ctx.cache(kinds.AGENT).get(key.namespace, run["spec"]["agentRef"]["name"])
        with self._budget_lock:
            self._reservations.setdefault(key, budgets.Reserved(budgets.RunScope.of(run, agent),
                                                                budgets.reservation(run, agent) or 0.0))

    def _budget_blocked(self, key: Key, run: Obj, block: budgets.Block, *, write_from: Obj | None = None
                        ) -> Result | None:
        """Fail the run (deny) or hold it Queued (hold); ``run`` carries the status to start from and
        ``write_from`` the stored object when they differ."""
        self._release(key)
        status = dict(run.get("status") or {})
        stored = write_from or run
        first = status.get("reason") != metering.EXCEEDED or (stored.get("status") or {}).get("phase") != "Queued"
        if not block.hold:
            ended = _ended(run, "Failed", metering.EXCEEDED, block.message)
            ended["conditions"] = set_condition(ended["conditions"], _cond("Blocked", "True", metering.EXCEEDED,
                                                                           block.message))
            self._write(stored, ended, (metering.EXCEEDED, block.message, "Warning"))
            self._audit_block(run, block.message)
            return None
        if first or status.get("message") != block.message:
            held = self._to_queued(status, metering.EXCEEDED, block.message)
            held["conditions"] = set_condition(held["conditions"], _cond("Blocked", "True", metering.EXCEEDED,
                                                                         block.message))
            if first:
                self._write(stored, held, (metering.EXCEEDED, block.message, "Warning"))
                self._audit_block(run, block.message)
            else:
                self._write(stored, held)
        if block.until is None:
            return None  # a total Budget: a change to it requeues the run (_runs_of_budget)
        return Result(requeue_after=max(1.0, block.until.timestamp() - self.ctx.clock.time()))

    def _audit_block(self, run: Obj, message: str) -> None:
        # Its own transaction: the run's write has committed, and a denial is recorded whatever follows.
        m = run["metadata"]
        self.ctx.store.audit(AuditEntry(verb="dispatch", kind="AgentRun", namespace=m.get("namespace"), name=m["name"],
                                        decision="denied", reason=f"{metering.EXCEEDED}: {message}",
                                        actor=CONTROLLER.name, groups=CONTROLLER.groups))

    def _dispatch(self, key: Key, run: Obj, *, resume: bool = False) -> Result | None:
        """Start the run in the slot ``_claim`` took, in three steps:

        1. record the intent — phase Running, reason Starting, a reference that names the attempt —
           with the resourceVersion precondition. A cancel, a delete or another replica's write since
           the cache saw the run makes it a Conflict, and nothing starts;
        2. check that this replica still holds the leader lease (a paused leader resuming after
           another took over must not start anything), then ``submit`` (idempotent per attempt);
        3. record the runtime's reference.

        A crash or a lost leadership between 1 and 3 leaves a Running run whose reference is
        ``pending``: whoever reconciles it next resumes here (``resume``), and ``submit`` returns the
        process that was started, or starts it. Until ``submit`` succeeds any failure gives the slot
        back; after it, the process keeps its slot even if recording it fails."""
        try:
            plan = self._plan(run)
            attempt = int((run.get("status") or {}).get("attempt") or 1)
            run_id = _run_id(run, attempt)
            git = git_source(run)
            resumed = resume_of(run, attempt, plan.compiled.manifest or {})
            placement, runtime = self._placement(run, plan)
            workspace = self._workspace(run_id, git, resumed, runtime)
            invocation = self._invocation(run, plan, workspace, run_id, resumed)
            secrets = self._secret_values(run, invocation, plan.agent["metadata"]["name"])
            secrets[metering.TOKEN_ENV] = metering.run_token(self.ctx.store, run_id.uid, attempt)
        except InvalidSpec as exc:
            if resume:
                # A crashed replica may have started it before the spec went bad: stop what exists.
                self._stop_pending(run)
            self._release(key)
            status = _ended(run, "Failed", exc.reason, exc.message)
            status["conditions"] = set_condition(status["conditions"], _cond("InvalidSpec", "True", exc.reason,
                                                                             exc.message))
            self._write(run, status, (exc.reason, exc.message, "Warning"))
            return None
        except BaseException:
            self._release(key)
            raise
        spec = rt.RunnerSpec(
            run=run_id, argv=invocation.argv, env=dict(invocation.env), secret_env=tuple(sorted(secrets)),
            input_files=tuple(rt.InputFile(path, content) for path, content in invocation.input_files),
            outputs=tuple(rt.Output(name, path, optional) for name, path, optional in invocation.outputs),
            git=git, timeout_seconds=float(plan.timeout_seconds), grace_seconds=self.options.grace_seconds,
            max_log_bytes=self.options.max_log_bytes, max_artifact_bytes=self.options.max_artifact_bytes,
            **runner_fields(invocation, plan.compiled), resume=resumed, placement=placement,
        )
        spec_hash = "sha256:" + hashlib.sha256(spec.to_json().encode()).hexdigest()
        if not resume:
            status = dict(run.get("status") or {})
            status.update(phase="Running", reason="Starting", message=f"starting attempt {attempt}",
                          runtimeRef={"type": runtime.type, "id": f"{run_id.uid}/{attempt}", "pending": True},
                          startedAt=now(), specHash=spec_hash, compiledManifestHash=plan.compiled.hash)
            status.pop("finishedAt", None)
            for stale in ("invocation", "baseCommit", "sandbox", "omitted"):
                status.pop(stale, None)  # the previous attempt's
            if resumed is None:
                status.pop("session", None)
            try:
                run = self._write(run, status)
            except BaseException:
                self._release(key)
                raise
        if not self.ctx.leading():
            # A renewal may only be late: look again (a replica that really lost the lease stops
            # reconciling, and the new leader resumes the pending start).
            logger.info("run %s: not starting attempt %d, this replica does not hold the lease now", key, attempt)
            return Result(requeue_after=self.options.retry_period)
        try:
            ref = runtime.submit(spec, secrets=secrets)
        except (OSError, ValueError, RuntimeError) as exc:
            if resume:
                self._stop_pending(run)
            self._release(key)
            reason, why = "SubmitFailed", str(exc)
            if disks.is_full_error(exc):
                reason, why = disks.REASON, disks.describe(getattr(exc, "filename", None) or self.options.data_dir)
            message = f"the {runtime.type} runtime could not start the run: {why}"
            self._write(run, _ended(run, "Failed", reason, message), (reason, message, "Warning"))
            return None
        status = dict(run.get("status") or {})
        message = f"attempt {attempt} started on the {runtime.type} runtime"
        status.update(phase="Running", reason="Started", message=message, runtimeRef=ref, specHash=spec_hash)
        conditions = set_condition(list(status.get("conditions") or []), _cond("Queued", "False", "Started", message))
        status["conditions"] = set_condition(conditions, _cond("InProgress", "True", "Started", message))
        self._write(run, status, ("Started", message, "Normal"))
        return Result(requeue_after=min(float(plan.timeout_seconds), self.options.resync_period))

    def _stop_pending(self, run: Obj) -> None:
        ref = _runtime_ref(run)
        if isinstance(ref, dict):
            try:
                self.runtime.cancel({k: v for k, v in ref.items() if k != "pending"})
            except (OSError, ValueError) as exc:
                logger.warning("run %s: could not stop a possibly started attempt: %s", Key.of(run), exc)

    def _placement(self, run: Obj, plan: Plan) -> tuple[rt.Placement, rt.Runtime]:
        """Where the attempt runs (``placements``), and the runtime of that type this server has."""
        try:
            placement = placements.placement_of(run, plan.compiled.manifest or {})
        except placements.PlacementProblem as exc:
            raise InvalidSpec(exc.reason, exc.message) from None
        runtime = self.runtime.for_type(placement.type)
        if runtime is None:
            raise InvalidSpec("RuntimeUnavailable", (
                f'runtime.type "{placement.type}": this server has no {placement.type} runtime (it runs '
                f"{self.runtime.type}; joch server --kube-config or in-cluster config enables kubernetes): "
                "set the run's or its Agent's spec.runtime.type to one it has"))
        return placement, runtime

    def _workspace(self, run_id: rt.RunId, git: rt.GitSource | None, resume: rt.Resume | None = None,
                   runtime: rt.Runtime | None = None) -> rt.Workspace:
        try:
            return (runtime or self.runtime).workspace(run_id, git, resume=resume)
        except ValueError as exc:
            raise InvalidSpec("InvalidPath", f"spec.execution.coordinates.git: {exc}") from None

    def _secret_values(self, run: Obj, invocation: render.Invocation, agent: str) -> dict[str, str]:
        """The values of the run's secrets, read from the store (``reveal``) at the last moment —
        the caches hold only their public view — and each Secret resolved recorded in the audit
        log (its name, never a value). Allowed-ness was checked in ``_plan`` just before."""
        namespace = run["metadata"].get("namespace") or ""
        values: dict[str, str] = {}
        revealed: dict[str, Obj | None] = {}

        def reveal(name: str) -> Obj | None:
            if name not in revealed:
                try:
                    revealed[name] = self.ctx.store.reveal(kinds.SECRET, namespace, name)
                except errors.NotFound:
                    revealed[name] = None
            return revealed[name]

        for name in run["spec"].get("secrets") or []:
            secret = reveal(name)
            if secret is None:
                raise InvalidSpec("MissingSecret", f'Secret "{name}" not found in namespace "{namespace}"')
            for k, v in ((secret.get("spec") or {}).get("data") or {}).items():
                # Admission rejects such keys now; a Secret stored before it did must still not
                # reach the runner as a name the operating system cannot carry.
                problem = kinds.env_name_problem(k)
                if problem is not None:
                    raise InvalidSpec("InvalidSecretKey", f'spec.secrets: Secret "{name}" key "{k}" cannot be passed '
                                                          f"to the agent: {problem}; rename the key in the Secret")
                values[k] = _decode(v)
        for env_name, secret_name, secret_key in invocation.secret_env:
            secret = reveal(secret_name)
            data = ((secret or {}).get("spec") or {}).get("data") or {}
            if secret_key not in data:
                where = "" if secret is not None else " (the Secret does not exist)"
                raise InvalidSpec("MissingSecret", f'env {env_name}: key "{secret_key}" not found in Secret '
                                                   f'"{secret_name}" in namespace "{namespace}"{where}')
            values[env_name] = _decode(data[secret_key])
        uid, attempt = str(run["metadata"].get("uid")), int((run.get("status") or {}).get("attempt") or 1)
        if self._resolved.get(uid) == attempt:
            return values
        self._resolved[uid] = attempt
        for name in sorted(n for n, found in revealed.items() if found is not None):
            self.ctx.store.audit(AuditEntry(
                verb="resolve", kind=kinds.SECRET.kind, namespace=namespace, name=name, actor=CONTROLLER.name,
                groups=CONTROLLER.groups,
                reason=f'resolved into AgentRun {namespace}/{run["metadata"]["name"]} for Agent {agent}'))
        return values

    # --- Running ----------------------------------------------------------------------------------

    def _running(self, key: Key, run: Obj) -> Result | None:
        ref = _runtime_ref(run)
        if not isinstance(ref, dict):
            # Running without a reference cannot be followed; say so instead of waiting forever.
            self._release(key)
            message = "the run was marked Running but has no runtime reference"
            self._write(run, _ended(run, "Failed", "RunnerLost", message), ("RunnerLost", message, "Warning"))
            return None
        self.scheduler.occupy(key, run)
        self._hold_reservation(key, run)
        if ref.get("pending"):
            return self._dispatch(key, run, resume=True)
        state = self.runtime.status(ref)
        if not state.finished:
            return self._still_running(key, run, ref, state)
        return self._ended_run(key, run, ref, state)

    def _still_running(self, key: Key, run: Obj, ref: rt.Ref, state: rt.RunState) -> Result:
        over = metering.exceeded(run)
        if over is not None and state.reason != "Unreachable":
            self._cancel_once(key, ref)  # it ends Failed/BudgetExceeded once the runner has stopped it
            return Result(requeue_after=1.0)
        if (run["spec"].get("cancel") or over is not None) and state.reason == "Unreachable":
            message = f"cancelled; {state.message}, so its process could not be stopped from here"
            self._write(run, _ended(run, "Cancelled", "Cancelled", message), ("Cancelled", message, "Warning"))
            self._release(key)
            return Result()
        if run["spec"].get("cancel"):
            self._cancel_once(key, ref)
            return Result(requeue_after=1.0)
        status = run.get("status") or {}
        if state.reason != "Unreachable":
            noted = dict(status)
            note_runtime_facts(noted, state)
            said = _waiting(status, state)
            if said is not None:  # why it does not start yet (a Pod that cannot be scheduled), or that it has
                noted.update(reason=said[0], message=said[1])
            if noted != status:
                # what runs, as the runner recorded it (no Event); a wait a person can act on has one
                events: list[tuple[str, str, Literal["Normal", "Warning"]]] = []
                if said is not None and said[0] in WAITING:
                    events.append((said[0], said[1], "Warning"))
                run = self._write(run, noted, *events)
                status = noted
        timeout = float(run["spec"].get("timeoutSeconds") or self._agent_timeout(run))
        started = parse_time(status["startedAt"]).timestamp() if status.get("startedAt") else self.ctx.clock.time()
        overdue = self.ctx.clock.time() - (started + timeout + self.options.grace_seconds + BACKSTOP_SLACK)
        if overdue > 0 and state.reason == "Unreachable":
            # Started by a replica on another host (or data dir) that is gone: its runner may have
            # finished or may still run, but nobody here can see it. Never start it again; once its
            # deadline has certainly passed, say what is known and end it.
            message = f"{state.message}; its deadline has passed, so it is reported lost"
            self._write(run, _ended(run, "Failed", "RunnerUnreachable", message),
                        ("RunnerUnreachable", message, "Warning"))
            self._release(key)
            return Result()
        if overdue > 0:
            logger.warning("run %s is %.0f s past its deadline and still running: cancelling it", key, overdue)
            self._cancel_once(key, ref)
            return Result(requeue_after=1.0)
        return Result(requeue_after=min(self.options.resync_period, max(1.0, -overdue)))

    def _agent_timeout(self, run: Obj) -> float:
        agent = self.ctx.cache(kinds.AGENT).get(run["metadata"].get("namespace") or "", run["spec"]["agentRef"]["name"])
        return float((((agent or {}).get("spec") or {}).get("defaults") or {}).get("timeoutSeconds") or 3600)

    def _cancel_once(self, key: Key, ref: rt.Ref) -> None:
        token = (key, str(ref.get("id")))
        if token in self._cancel_sent:
            return
        self._cancel_sent.add(token)
        self.runtime.cancel(ref)

    def _ended_run(self, key: Key, run: Obj, ref: rt.Ref, state: rt.RunState) -> Result | None:
        """Record the attempt's end, then free its slot (not before: a stale cache read of an
        earlier attempt fails its write with a Conflict and must not free the current one's slot)."""
        status = dict(run.get("status") or {})
        attempt = int(status.get("attempt") or 1)
        retry_limit = self._retry_limit(run)
        reason = state.reason or ("Completed" if state.phase == "Succeeded" else state.phase)
        message = state.message or reason
        artifacts = [{"name": a.name, "path": a.path, "sha256": a.sha256, "size": a.size} for a in state.artifacts]
        _note_refused(status, state.refused)
        note_runtime_facts(status, state)
        live = not run["spec"].get("cancel") and metering.exceeded(run) is None
        retrying = state.phase in ("Failed", "Lost") and reason in RETRYABLE and attempt <= retry_limit and live
        extended = reason == "DeadlineExceeded" and live and self._deadline_raised(run, state) is not None
        resume = self._resumption(run, state, status) if retrying or extended else None
        retrying = retrying or (extended and resume is not None)
        if resume is None:
            self._cleanup(key, ref, keep_records=True)
            self._cleanup_resumed(key, run, attempt)
        over = metering.exceeded(run)
        if over is not None:
            # Stopped for its spend: that is the outcome, however the agent's process ended.
            ended = _ended(run, "Failed", metering.EXCEEDED, f"stopped: {over} (the agent: {message})",
                           finished_at=state.finished_at)
            ended.update(exitCode=state.exit_code, artifacts=artifacts)
            _note_refused(ended, state.refused)
            note_runtime_facts(ended, state)
            self._write(run, ended, (metering.EXCEEDED, ended["message"], "Warning"))
            self._release(key)
            return None
        if retrying:
            status.update(attempt=attempt + 1, exitCode=state.exit_code, artifacts=artifacts)
            note = f"attempt {attempt} failed ({message}); retrying as attempt {attempt + 1} of {retry_limit + 1}"
            if reason == "DeadlineExceeded":
                note = (f"attempt {attempt} ran out of time ({message}), and spec.timeoutSeconds was raised to "
                        f"{self._deadline_raised(run, state) or 0:g} s meanwhile; continuing as attempt {attempt + 1}")
            if resume is not None:
                # The next attempt continues the agent's session in the worktree it was made in.
                status["session"] = {"id": resume.session_id, "attempt": attempt + 1,
                                     "resumedFromAttempt": resume.attempt}
                note += f", resuming the agent's session {resume.session_id} (attempt {resume.attempt}'s worktree)"
            elif (state.session or rt.Session()).id:
                note += ", starting over (" + ("the provider is not resumable" if reason == "RunnerLost" else
                                                 "only an attempt whose runner was lost is resumed") + ")"
            status["conditions"] = set_condition(list(status.get("conditions") or []),
                                                 _cond("InProgress", "False", reason, message))
            run = self._write(run, self._to_queued(status, "Retrying", note), ("Retrying", note, "Warning"))
            self._release(key)
            return self._queued(key, run)
        phase: Phase = "Succeeded" if state.phase == "Succeeded" else (
            "Cancelled" if state.phase == "Cancelled" else "Failed")
        ended = _ended(run, phase, reason, message, finished_at=state.finished_at)
        ended.update(exitCode=state.exit_code, artifacts=artifacts)
        _note_refused(ended, state.refused)
        note_runtime_facts(ended, state)
        kind: Literal["Normal", "Warning"] = "Normal" if phase == "Succeeded" else "Warning"
        summary = message if phase != "Succeeded" else (
            f"{message}; {len(artifacts)} artifact{'s' if len(artifacts) != 1 else ''}")
        if state.refused:
            summary += f"; refused: {', '.join(f'{r.name} ({r.message})' for r in state.refused)}"
        self._write(run, ended, (phase if phase != "Failed" else reason, summary, kind))
        self._release(key)
        return None

    def _resumption(self, run: Obj, state: rt.RunState, status: Mapping[str, Any]) -> rt.Resume | None:
        """Whether the attempt that just ended is continued rather than started over: only after its
        runner was lost (the agent itself did not fail) or it missed a deadline the user has raised
        since (``_deadline_raised``), for a ``resumable`` provider, and when the runner recorded the
        agent's session id. The next attempt then works in the worktree that
        session was made in: this attempt's, or the one it resumed in turn (``status``: the run's
        status with the attempt's record noted)."""
        attempt = int(status.get("attempt") or 1)
        noted = status.get("session") or {}
        # the runner's final record, else what it recorded while the agent ran (status.session)
        session_id = (state.session.id if state.session is not None else None) or (
            noted.get("id") if noted.get("attempt") == attempt else None)
        if state.reason not in ("RunnerLost", "DeadlineExceeded") or not agentoutput.valid_session_id(session_id):
            return None  # none, or not one to put on a command line (a record the agent could write)
        namespace = run["metadata"].get("namespace") or ""
        agent = self._read(kinds.AGENT, namespace, run["spec"]["agentRef"]["name"])
        provider_name = (((agent or {}).get("spec") or {}).get("providerRef") or {}).get("name")
        provider = self._read(kinds.AGENT_PROVIDER, namespace, provider_name) if provider_name else None
        if not ((provider or {}).get("spec") or {}).get("resumable"):
            return None
        earlier = noted.get("resumedFromAttempt") if noted.get("attempt") == attempt else None
        if not isinstance(earlier, int) or not 1 <= earlier < attempt:
            earlier = attempt
        return rt.Resume(attempt=earlier, session_id=str(session_id))

    def _deadline_raised(self, run: Obj, state: rt.RunState) -> float | None:
        """The run's timeout when it was raised above what the attempt that just missed its deadline
        had (the attempt ran about that long), else None: the user extended the deadline while the
        agent ran, so a resumable session may continue with the new timeout."""
        if state.started_at is None or state.finished_at is None:
            return None
        timeout = float(run["spec"].get("timeoutSeconds") or self._agent_timeout(run))
        ran = state.finished_at - state.started_at
        return timeout if timeout > ran + self.options.grace_seconds + 1.0 else None

    def _cleanup_resumed(self, key: Key, run: Obj, attempt: int) -> None:
        """Remove the worktree of the earlier attempt the ending one resumed (kept for it)."""
        session = (run.get("status") or {}).get("session") or {}
        earlier = session.get("resumedFromAttempt")
        if isinstance(earlier, int) and 1 <= earlier < attempt and session.get("attempt") == attempt:
            kind = (_runtime_ref(run) or {}).get("type") or self.runtime.type
            self._cleanup(key, {"type": kind, "id": f"{run['metadata']['uid']}/{earlier}"},
                          keep_records=True)

    def _retry_limit(self, run: Obj) -> int:
        agent = self.ctx.cache(kinds.AGENT).get(run["metadata"].get("namespace") or "", run["spec"]["agentRef"]["name"])
        return int((((agent or {}).get("spec") or {}).get("defaults") or {}).get("retryLimit") or 0)

    # --- finished and deleted runs ----------------------------------------------------------------

    def _finished(self, key: Key, run: Obj) -> Result | None:
        ref = _runtime_ref(run)
        if isinstance(ref, dict):
            self._cleanup(key, ref, keep_records=True)
            self._cleanup_resumed(key, run, int((run.get("status") or {}).get("attempt") or 1))
        ttl = run["spec"].get("ttlSecondsAfterFinished")
        finished = (run.get("status") or {}).get("finishedAt")
        if ttl is None or not finished:
            return None
        left = parse_time(finished).timestamp() + ttl - self.ctx.clock.time()
        if left > 0:
            return Result(requeue_after=left)
        m = run["metadata"]
        try:
            self.ctx.store.delete(kinds.AGENT_RUN, m.get("namespace"), m["name"], uid=m["uid"])
        except errors.NotFound:
            pass
        return None

    def _finalize(self, key: Key, run: Obj) -> Result | None:
        """A deleted run: stop its process, record how it ended, remove its files and its Approval,
        then let it go (drop the finalizer)."""
        finalizers = run["metadata"].get("finalizers") or []
        if FINALIZER not in finalizers:
            return None
        ref = _runtime_ref(run)
        if _phase(run) not in TERMINAL:
            state: rt.RunState | None = None
            if isinstance(ref, dict) and _phase(run) == "Running":
                state = self.runtime.status(ref)
                if not state.finished and state.reason != "Unreachable":
                    self._cancel_once(key, ref)
                    return Result(requeue_after=0.2)
            if state is not None and state.phase in ("Succeeded", "Failed"):
                # It ended on its own before the cancel reached it: record what really happened.
                phase: Phase = "Succeeded" if state.phase == "Succeeded" else "Failed"
                reason = state.reason or state.phase
                ended = _ended(run, phase, reason, state.message or reason, finished_at=state.finished_at)
                ended.update(exitCode=state.exit_code)
                run = self._write(run, ended, (phase if phase == "Succeeded" else reason, ended["message"],
                                               "Normal" if phase == "Succeeded" else "Warning"))
            else:
                message = "the run was deleted"
                run = self._write(run, _ended(run, "Cancelled", "Deleted", message), ("Cancelled", message, "Normal"))
        self._release(key)
        if isinstance(ref, dict):
            self.runtime.cleanup(ref, keep_records=False)
        self._delete_approval(run)
        m = {**run["metadata"], "finalizers": [f for f in finalizers if f != FINALIZER]}
        try:
            self.ctx.store.update(kinds.AGENT_RUN, {**run, "metadata": m})
        except errors.NotFound:
            pass
        return None

    def _delete_approval(self, run: Obj) -> None:
        m = run["metadata"]
        approval = self._read(kinds.APPROVAL, m.get("namespace"), approvals.name_for(run))
        if approval is None or not approvals.owned_by(approval, run):
            return
        try:
            self.ctx.store.delete(kinds.APPROVAL, m.get("namespace"), approval["metadata"]["name"],
                                  uid=approval["metadata"]["uid"])
        except (errors.NotFound, errors.Conflict):
            pass

    def _cleanup(self, key: Key, ref: rt.Ref, *, keep_records: bool) -> None:
        token = (key, str(ref.get("id")))
        if token in self._cleaned:
            return
        self.runtime.cleanup(ref, keep_records=keep_records)
        self._cleaned.add(token)

    # --- writing ----------------------------------------------------------------------------------

    def _write(self, run: Obj, status: dict[str, Any],
               *reported: tuple[str, str, Literal["Normal", "Warning"]]) -> Obj:
        with self.ctx.store.transaction() as w:
            out = w.update_status(kinds.AGENT_RUN, {**run, "status": status})
            for reason, message, type_ in reported:
                events.record(w, out, reason=reason, message=message, type=type_, component=COMPONENT)
        for reason, message, _ in reported:
            logger.info("run %s: %s: %s", Key.of(out), reason, message)
        runspans.record(run, out)
        observe_phase(run, out, self.ctx.clock.time())
        return out


# --- the invocation and what the runner recorded of it -------------------------------------------

def invocation_of(run: Obj, plan: Plan, workspace: rt.Workspace, run_id: rt.RunId,
                  resume: rt.Resume | None = None) -> render.Invocation:
    """The provider's templates rendered for one attempt of ``run`` (``InvalidSpec`` on a problem);
    ``resume``: the attempt continues that CLI session (template context ``session``)."""
    manifest = plan.compiled.manifest or {}
    session = {"id": resume.session_id, "resumedFrom": resume.attempt} if resume is not None else None
    try:
        context = render.build_context(manifest, run=run, attempt=run_id.attempt, implementation=plan.implementation,
                                       workspace=workspace.context(), session=session)
        return render.render_invocation(manifest, context)
    except render.TemplateError as exc:
        raise InvalidSpec("TemplateError", str(exc)) from None
    except render.ParameterError as exc:
        raise InvalidSpec("UnknownParameter", str(exc)) from None






# --- helpers ---------------------------------------------------------------------------------------

def observe_phase(before: Obj, after: Obj, at: float) -> None:
    """Count a committed phase change in the run metrics: the transition; the dispatch latency when
    the first attempt starts Running (creation to now); the duration (the last attempt's start to
    its end) when the run ends."""
    phase = _phase(after)
    if phase == _phase(before):
        return
    status = after.get("status") or {}
    metrics.RUN_PHASE_TRANSITIONS.labels(metrics.phase_label(phase), metrics.reason_label(status.get("reason"))).inc()
    created = after["metadata"].get("creationTimestamp")
    if phase == "Running" and int(status.get("attempt") or 1) == 1 and created:
        metrics.RUN_DISPATCH.observe(max(0.0, at - parse_time(created).timestamp()))
    elif phase in TERMINAL and status.get("startedAt") and status.get("finishedAt"):
        seconds = parse_time(status["finishedAt"]).timestamp() - parse_time(status["startedAt"]).timestamp()
        metrics.RUN_DURATION.labels(phase).observe(max(0.0, seconds))


def _phase(run: Obj) -> str | None:
    phase = (run.get("status") or {}).get("phase")
    return phase if isinstance(phase, str) else None


def _run_id(run: Obj, attempt: int) -> rt.RunId:
    m = run["metadata"]
    return rt.RunId(namespace=m.get("namespace") or "", name=m["name"], uid=m["uid"], attempt=attempt)




def _asked_why(asked: Outcome) -> str:
    return f'Policy {asked.policy.ref} rule "{asked.rule.name}" requires approval: {asked.message}'


def _cond(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def _ended(run: Obj, phase: Phase, reason: str, message: str, *, finished_at: float | None = None) -> dict[str, Any]:
    status = dict(run.get("status") or {})
    stamp = now()
    if finished_at is not None:
        stamp = dt.datetime.fromtimestamp(finished_at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status.update(phase=phase, reason=reason, message=message, finishedAt=stamp)
    conditions = list(status.get("conditions") or [])
    if any(c.get("type") == "InProgress" for c in conditions):
        conditions = set_condition(conditions, _cond("InProgress", "False", reason, message))
    if any(c.get("type") == "Queued" and c.get("status") == "True" for c in conditions):
        conditions = set_condition(conditions, _cond("Queued", "False", reason, message))
    if phase == "Succeeded":
        conditions = set_condition(conditions, _cond("Succeeded", "True", reason, message))
    elif phase == "Failed":
        conditions = set_condition(conditions, _cond("Failed", "True", reason, message))
    else:
        conditions = set_condition(conditions, _cond("Failed", "False", reason, message))
    status["conditions"] = conditions
    return status


def _note_refused(status: dict[str, Any], refused: Sequence[rt.RefusedArtifact]) -> None:
    """``status.refusedArtifacts`` (kept apart from ``artifacts``, which lists only what can be
    downloaded) and the ``ArtifactsRefused`` condition, for the attempt that just ended."""
    if not refused:
        status.pop("refusedArtifacts", None)
        if any(c.get("type") == "ArtifactsRefused" for c in status.get("conditions") or []):
            status["conditions"] = set_condition(list(status["conditions"]), _cond(
                "ArtifactsRefused", "False", "NoneRefused", "every output artifact was stored"))
        return
    status["refusedArtifacts"] = [{"name": r.name, "path": r.path, "size": r.size, "message": r.message}
                                  for r in refused]
    said = "; ".join(f"{r.name}: {r.message}" for r in refused)
    status["conditions"] = set_condition(list(status.get("conditions") or []),
                                         _cond("ArtifactsRefused", "True", "TooLarge", said))


def _decode(value: str) -> str:
    return base64.b64decode(value.replace("\n", "")).decode("utf-8", errors="replace")


def _waiting(status: Mapping[str, Any], state: rt.RunState) -> tuple[str, str] | None:
    """The run's reason and message while its attempt waits on something a person can act on
    (``WAITING``: the Kubernetes runtime's Pod that cannot be scheduled or pulled), or once it no
    longer does; None: nothing to change."""
    if state.reason in WAITING and state.message and (status.get("reason"), status.get("message")) != (
            state.reason, state.message):
        return state.reason, state.message
    if state.reason not in WAITING and status.get("reason") in WAITING:
        return "Started", "the attempt's runner has started"
    return None


def _runtime_ref(run: Obj) -> rt.Ref | None:
    """The run's ``status.runtimeRef``, never one that names another run's attempt (``rt.own_ref``)."""
    status = run.get("status") or {}
    return rt.own_ref(status.get("runtimeRef"), str(run["metadata"].get("uid") or ""), status.get("attempt"))
