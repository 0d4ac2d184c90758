"""Approvals: the human gates of a run (``spec.action``: dispatch, tool-use, secret-access,
write-back, release, escalation), their expiry, and the dispatch Approval the run controller asks for.

The run controller creates one per run of an Agent with ``requiresApproval`` (``<run>-dispatch``),
owned by the run's uid, and acts on its decision; only an Approval owned by the run counts, so a new
run with an old run's name never inherits that run's decision. That Approval says who asked
(``requestedBy``: the run's creator, from its ``joch.dev/created-by`` annotation), when it expires
(``expiresAt``: now plus the Agent's ``approvalTimeoutSeconds``; without one it never does) and
whether the run's creator is barred from deciding it (``separationOfDuties``: the Agent's
``approvalSeparationOfDuties``). A Policy rule that requires approval creates its Approval through
``for_run`` too, with its ``policyRef`` and its own settings.

``ApprovalController`` gives a new Approval the ``Pending`` phase and expires it: a Pending
Approval past ``expiresAt`` becomes ``Expired`` (condition ``Expired`` with the time; an Event and
an audit record with verb ``expire``), and the controller asks to look again at the expiry time, so
nothing polls. The run controller fails the run ``ApprovalExpired``.

Write-back Approvals (action ``write-back``) are named after their WriteIntent and owned by it
(``joch.controllers.writeintents``); their ``runRef`` names the run, but the run controller only ever
reads the run's ``<run>-dispatch`` Approval, so deciding one never starts or fails a run. Deciding is the
``/v1/.../approvals/{name}/decide`` route's job (``joch.server.runs``), which refuses a decision
past ``expiresAt`` even before this controller has marked it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable
from typing import Any

from joch.admission import uniqueness
from joch.api import kinds
from joch.api.audit import AuditEntry
from joch.api.identity import CONTROLLER
from joch.api.meta import parse_time, set_condition
from joch.controllers import events
from joch.controllers.base import Context, Controller, Key, Result
from joch.store.base import Obj

COMPONENT = "joch-approval-controller"


class ApprovalController(Controller):
    """Gives a new Approval the ``Pending`` phase and expires a Pending one past ``expiresAt``;
    deciding one is the ``/v1/.../approvals/{name}/decide`` route's job, and acting on the decision
    the run controller's."""

    name = "approvals"
    kind = kinds.APPROVAL
    ctx: Context

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx

    def reconcile(self, key: Key) -> Result | None:
        approval = self.ctx.cache(kinds.APPROVAL).get(key.namespace, key.name)
        if approval is None or approval["metadata"].get("deletionTimestamp"):
            return None
        phase = (approval.get("status") or {}).get("phase")
        if phase not in (None, "Pending"):
            return None
        expires = expires_at(approval)
        left = None if expires is None else expires.timestamp() - self.ctx.clock.time()
        if left is not None and left <= 0:
            self._expire(approval)
            return None
        if phase is None:
            self.ctx.store.update_status(kinds.APPROVAL, {**approval, "status": {
                **(approval.get("status") or {}), "phase": "Pending"}})
        return Result(requeue_after=left) if left is not None else None

    def _expire(self, approval: Obj) -> None:
        m = approval["metadata"]
        when = str(approval["spec"]["expiresAt"])
        message = f"expired at {when} without a decision"
        status: dict[str, Any] = {**(approval.get("status") or {}), "phase": "Expired"}
        status["conditions"] = set_condition(list(status.get("conditions") or []), {
            "type": "Expired", "status": "True", "reason": "Expired", "message": message})
        with self.ctx.store.transaction() as w:
            out = w.update_status(kinds.APPROVAL, {**approval, "status": status})
            events.record(w, out, reason="Expired", message=f"approval {m['name']} {message}", type="Warning",
                          component=COMPONENT)
            w.audit(AuditEntry(verb="expire", kind="Approval", namespace=m.get("namespace"), name=m["name"],
                               decision="allowed", reason=message, actor=CONTROLLER.name,
                               groups=CONTROLLER.groups))


def expires_at(approval: Obj) -> dt.datetime | None:
    """``spec.expiresAt`` as a time, or None (none set, or not a time: admission checks it)."""
    value = (approval.get("spec") or {}).get("expiresAt")
    if not isinstance(value, str):
        return None
    try:
        parsed = parse_time(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def creator_of(run: Obj) -> str | None:
    """Who created the run (``joch.dev/created-by``, written by admission); None when unknown."""
    value = ((run.get("metadata") or {}).get("annotations") or {}).get(kinds.CREATED_BY)
    return value if isinstance(value, str) and value else None


def name_for(run: Obj) -> str:
    name: str = run["metadata"]["name"]
    if len(name) <= 240:
        return f"{name}-dispatch"
    # Cutting a long name could give two runs one Approval; a digest of the whole name cannot.
    return f"{name[:220]}-{hashlib.sha256(name.encode()).hexdigest()[:10]}-dispatch"


def owned_by(approval: Obj, run: Obj) -> bool:
    """Whether ``approval`` is ``run``'s own: its *controller* reference names the run. A plain owner
    reference is not enough: any editor may write one (admission refuses only ``controller: true``
    from users), and an Approval a user made must never stand in for the one the Agent's rules made."""
    uid = run["metadata"]["uid"]
    return any(isinstance(ref, dict) and ref.get("uid") == uid and ref.get("controller") is True
               for ref in approval["metadata"].get("ownerReferences") or [])


def for_run(
    run: Obj, name: str, agent: str, *, requested_by: str | None = None, action: str = "dispatch",
    reason: str | None = None, expires_at: dt.datetime | None = None, separation_of_duties: bool = False,
    policy_ref: dict[str, str] | None = None,
) -> Obj:
    """The Approval of ``action`` on ``run``, owned by the run. ``requested_by`` defaults to the
    run's creator (Joch's controller identity when the run has none recorded)."""
    m = run["metadata"]
    spec: dict[str, Any] = {
        "runRef": {"name": m["name"]}, "action": action,
        "requestedBy": requested_by or creator_of(run) or CONTROLLER.name,
        "reason": reason or f'Agent "{agent}" requires approval before its runs start',
        "separationOfDuties": separation_of_duties,
    }
    if expires_at is not None:
        spec["expiresAt"] = expires_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if policy_ref:
        spec["policyRef"] = dict(policy_ref)
    return {
        "apiVersion": kinds.APPROVAL.api_version, "kind": "Approval",
        "metadata": {"name": name, "namespace": m.get("namespace"),
                     "labels": {uniqueness.APPROVAL_LABEL: uniqueness.approval_key(m["name"], action)},
                     "ownerReferences": [{"apiVersion": run["apiVersion"], "kind": "AgentRun", "name": m["name"],
                                          "uid": m["uid"], "controller": True}]},
        "spec": spec,
    }


def others_for(approvals: Iterable[Obj], run: Obj, action: str) -> list[Obj]:
    """The Approvals of ``action`` on ``run``'s name that ``run`` does not own (left over from an
    earlier run of that name)."""
    name = run["metadata"]["name"]
    return [a for a in approvals if ((a.get("spec") or {}).get("runRef") or {}).get("name") == name
            and ((a.get("spec") or {}).get("action") or "dispatch") == action and not owned_by(a, run)]


def run_of(approval: Obj) -> Iterable[Key]:
    ref = (approval.get("spec") or {}).get("runRef") or {}
    if ref.get("name"):
        yield Key(approval["metadata"].get("namespace") or "", ref["name"])

