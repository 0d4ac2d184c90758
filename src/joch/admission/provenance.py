"""Who asked for an object: the creator of an AgentRun and the requester of an Approval.

Both are read from the authenticated user of the request being served
(``joch.api.identity.current_user``), never from the body, because approval decisions rest on
them: an Approval with ``separationOfDuties`` may not be decided by the run's creator, and a
creator who could write their own name (or someone else's) would decide it anyway.

* **AgentRun**: on create through the API, ``metadata.annotations["joch.dev/created-by"]``
  (``kinds.CREATED_BY``) is set to the user's name, replacing whatever the body says. On every
  update the stored value is kept, whatever the body says (also removing it is impossible); a run
  stored without one stays without one.
* **Approval**: on create through the API, ``spec.requestedBy`` is the user's name. On update the
  spec cannot change at all (like a Kubernetes CertificateSigningRequest): what was asked for,
  by whom, until when and under which rules is what gets decided. A body that repeats the stored
  spec, with or without ``requestedBy``, is fine (``joch apply`` of the same file).
  An Approval created or updated through the API may not claim a run as its controller
  (``ownerReferences[].controller``; an update keeps the controller references it had): the run
  controller acts only on the Approval its run controls (``controllers.approvals.owned_by``), and
  one a user wrote there would stand in for it without the Agent's rules.
* **Outside a request** (controllers, ``joch server --apply`` at start) no user is current, and
  what the object says is kept: the run controller writes the dispatch Approval's ``requestedBy``
  as the run's creator itself. Joch's own controllers calling the API (group
  ``system:joch:controllers``) are trusted the same way: a creator or requester they name is
  kept, and only when they name none is their own name written.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from joch.api import kinds
from joch.api.errors import Cause
from joch.api.identity import CONTROLLERS_GROUP, UserInfo, current_user
from joch.api.registry import KindInfo


def stamp(kind: KindInfo, metadata: dict[str, Any], spec: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Write the creator/requester into ``metadata``/``spec`` (in place); causes for a changed
    Approval spec or a forged controller reference."""
    if kind is kinds.AGENT_RUN:
        _creator(metadata, old)
        return []
    if kind is kinds.APPROVAL:
        return [*_requester(spec, old), *_owner(metadata, old)]
    return []


def _controller(user: UserInfo) -> bool:
    return CONTROLLERS_GROUP in user.groups


def _creator(metadata: dict[str, Any], old: dict[str, Any] | None) -> None:
    annotations = dict(metadata.get("annotations") or {})
    if old is None:
        user = current_user()
        if user is not None and not (_controller(user) and annotations.get(kinds.CREATED_BY)):
            annotations[kinds.CREATED_BY] = user.name
    else:
        stored = ((old.get("metadata") or {}).get("annotations") or {}).get(kinds.CREATED_BY)
        if isinstance(stored, str):
            annotations[kinds.CREATED_BY] = stored
        else:
            annotations.pop(kinds.CREATED_BY, None)
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)


def _requester(spec: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    if old is None:
        user = current_user()
        if user is not None and not (_controller(user) and spec.get("requestedBy")):
            spec["requestedBy"] = user.name
        return []
    stored = _normalized(old.get("spec") or {})
    if "requestedBy" in stored:
        spec["requestedBy"] = stored["requestedBy"]
    else:
        spec.pop("requestedBy", None)
    changed = sorted(k for k in set(spec) | set(stored) if spec.get(k) != stored.get(k))
    if not changed:
        return []
    return [Cause(f"spec.{name}", "field is immutable: an Approval's spec cannot change once it is created "
                  "(it is what gets decided); delete the Approval and create a new one", "FieldValueForbidden")
            for name in changed]


def _owner(metadata: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    user = current_user()
    if user is None or _controller(user):
        return []
    # On update, the controller references the Approval already has are kept; a new one is not
    # (an Approval a user created must not become a run's dispatch Approval by a later edit).
    kept = [ref for ref in ((old or {}).get("metadata") or {}).get("ownerReferences") or []
            if isinstance(ref, dict) and ref.get("controller")]
    refs = metadata.get("ownerReferences") or []
    message = ("Forbidden: only Joch's run controller makes an Approval controlled by a run (its dispatch "
               "Approval); remove controller: true")
    return [Cause(f"metadata.ownerReferences[{i}].controller", message, "FieldValueForbidden")
            for i, ref in enumerate(refs) if isinstance(ref, dict) and ref.get("controller") and ref not in kept]


def _normalized(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored spec with the defaults of today's schema (one stored before a field existed
    compares equal to the same spec applied again)."""
    try:
        model = kinds.ApprovalSpec.model_validate(spec)
    except ValidationError:
        return spec
    out: dict[str, Any] = model.model_dump(mode="json", exclude_none=True)
    return out
