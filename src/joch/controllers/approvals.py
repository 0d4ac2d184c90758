"""Approvals of run dispatch: the Approval a run of an Agent with ``requiresApproval`` waits on.

The run controller creates one per run (``<run>-dispatch``), owned by the run's uid, and acts on its
decision; only an Approval owned by the run counts, so a new run with an old run's name never
inherits that run's decision. ``ApprovalController`` gives an Approval created by hand (or by a
tool) the ``Pending`` phase; deciding one is the ``/v1/.../approvals/{name}/decide`` route's job.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from joch.api import kinds
from joch.controllers.base import Context, Controller, Key, Result
from joch.store.base import Obj


class ApprovalController(Controller):
    """Gives an Approval created by hand (or by a tool) the ``Pending`` phase; deciding one is the
    ``/v1/.../approvals/{name}/decide`` route's job, and acting on the decision the run controller's."""

    name = "approvals"
    kind = kinds.APPROVAL
    ctx: Context

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx

    def reconcile(self, key: Key) -> Result | None:
        approval = self.ctx.cache(kinds.APPROVAL).get(key.namespace, key.name)
        if approval is None or (approval.get("status") or {}).get("phase"):
            return None
        self.ctx.store.update_status(kinds.APPROVAL, {**approval, "status": {**(approval.get("status") or {}),
                                                                              "phase": "Pending"}})
        return None


def name_for(run: Obj) -> str:
    name: str = run["metadata"]["name"]
    if len(name) <= 240:
        return f"{name}-dispatch"
    # Cutting a long name could give two runs one Approval; a digest of the whole name cannot.
    return f"{name[:220]}-{hashlib.sha256(name.encode()).hexdigest()[:10]}-dispatch"


def owned_by(approval: Obj, run: Obj) -> bool:
    uid = run["metadata"]["uid"]
    return any(ref.get("uid") == uid for ref in approval["metadata"].get("ownerReferences") or [])


def for_run(run: Obj, name: str, agent: str, *, requested_by: str) -> Obj:
    m = run["metadata"]
    return {
        "apiVersion": kinds.APPROVAL.api_version, "kind": "Approval",
        "metadata": {"name": name, "namespace": m.get("namespace"),
                     "ownerReferences": [{"apiVersion": run["apiVersion"], "kind": "AgentRun", "name": m["name"],
                                          "uid": m["uid"], "controller": True}]},
        "spec": {"runRef": {"name": m["name"]}, "action": "dispatch", "requestedBy": requested_by,
                 "reason": f'Agent "{agent}" requires approval before its runs start'},
    }


def run_of(approval: Obj) -> Iterable[Key]:
    ref = (approval.get("spec") or {}).get("runRef") or {}
    if ref.get("name"):
        yield Key(approval["metadata"].get("namespace") or "", ref["name"])
