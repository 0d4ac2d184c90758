"""At most one of a kind per key, checked at admission: one AgentRun per ``spec.idempotencyKey``
and one Approval per (run, action) in a namespace.

The key is free text (up to 253 characters), so it cannot be a label value itself; admission labels
the run with a digest of it (``runtime.joch.dev/idempotency-key``, 40 hex characters of its
sha256) and looks for another run carrying that label. Admission runs inside the write transaction,
which holds the store's write lock, so two creates with one key cannot both pass the check. The key
is immutable once set: changing it would let one run answer for two requests.

Approvals work the same way: admission labels each with a digest of its run and action
(``runtime.joch.dev/approval-key``; the run controller labels the Approvals it writes itself) and
refuses a second Approval for the same pair, naming the one that exists. An Approval's spec is
immutable (``provenance``), so the pair cannot change later. ``batch_key`` is the same rule for
the documents of one batch, which the store cannot see until they are written.
"""

from __future__ import annotations

import hashlib
from typing import Any

from joch.api import kinds
from joch.api.errors import Cause
from joch.api.meta import dig
from joch.api.registry import KindInfo
from joch.store.base import ListOptions, Writer

LABEL = "runtime.joch.dev/idempotency-key"
APPROVAL_LABEL = "runtime.joch.dev/approval-key"


def key_label(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def check_idempotency(
    reader: Writer, kind: KindInfo, obj: dict[str, Any], metadata: dict[str, Any], old: dict[str, Any] | None,
) -> list[Cause]:
    """Causes for a reused or changed key; labels ``metadata`` with the key's digest otherwise."""
    if kind is not kinds.AGENT_RUN:
        return []
    key = dig(obj, "spec.idempotencyKey")
    before = dig(old, "spec.idempotencyKey") if old is not None else None
    if old is not None and key != before:
        return [Cause("spec.idempotencyKey", f"field is immutable (it is {_show(before)}); create a new "
                      "run for a new key", "FieldValueInvalid")]
    if not isinstance(key, str) or not key:
        return []
    labels = dict(metadata.get("labels") or {})
    labels[LABEL] = key_label(key)
    metadata["labels"] = labels
    if old is not None:
        return []
    namespace = metadata.get("namespace") or ""
    found = reader.list(kinds.AGENT_RUN, ListOptions(namespace=namespace, label_selector=f"{LABEL}={labels[LABEL]}"))
    for other in found.items:
        if dig(other, "spec.idempotencyKey") == key:
            name = other["metadata"]["name"]
            return [Cause("spec.idempotencyKey", f'idempotency key "{key}" is already used by AgentRun "{name}" '
                          f'in namespace "{namespace}"; that run answers this request (joch get run {name}), '
                          "or use a new key", "FieldValueDuplicate")]
    return []


def approval_key(run: str, action: str) -> str:
    """The ``APPROVAL_LABEL`` value of the Approval of ``action`` on ``run``."""
    return hashlib.sha256(f"{run}\0{action}".encode()).hexdigest()[:40]


def check_one_approval(
    reader: Writer, kind: KindInfo, spec: dict[str, Any], metadata: dict[str, Any], old: dict[str, Any] | None,
) -> list[Cause]:
    """A cause naming the Approval that already covers this (run, action); labels ``metadata``."""
    if kind is not kinds.APPROVAL:
        return []
    run, action = dig(spec, "runRef.name"), spec.get("action") or "dispatch"
    if not isinstance(run, str) or not isinstance(action, str):
        return []
    labels = dict(metadata.get("labels") or {})
    labels[APPROVAL_LABEL] = approval_key(run, action)
    metadata["labels"] = labels
    if old is not None:
        return []
    namespace = metadata.get("namespace") or ""
    found = reader.list(kinds.APPROVAL, ListOptions(namespace=namespace,
                                                    label_selector=f"{APPROVAL_LABEL}={labels[APPROVAL_LABEL]}"))
    for other in found.items:
        if dig(other, "spec.runRef.name") == run and (dig(other, "spec.action") or "dispatch") == action:
            return [Cause("spec.action", duplicate_approval(other["metadata"]["name"], run, action, namespace),
                          "FieldValueDuplicate")]
    return []


def duplicate_approval(existing: str, run: str, action: str, namespace: str) -> str:
    return (f'Approval "{existing}" in namespace "{namespace}" already asks for "{action}" on run "{run}": one '
            f"Approval per run and action; decide that one (joch approve approval {existing}) or delete it first")


def batch_key(obj: dict[str, Any], namespace: str) -> tuple[str, str, str] | None:
    """What must be unique among the documents of one batch: (namespace, field, key), or None."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return None
    if obj.get("kind") == "AgentRun":
        key = spec.get("idempotencyKey")
        return (namespace, "spec.idempotencyKey", key) if isinstance(key, str) and key else None
    if obj.get("kind") == "Approval":
        run = (spec.get("runRef") or {}).get("name") if isinstance(spec.get("runRef"), dict) else None
        action = spec.get("action") or "dispatch"
        if isinstance(run, str) and isinstance(action, str):
            return namespace, "spec.action", f"{run}\0{action}"
    return None


def _show(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else "unset"

