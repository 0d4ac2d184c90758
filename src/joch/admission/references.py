"""Cross-object references: each kind declares them (``KindInfo.references``); admission checks them.

Design decisions:

* A reference names an object of the target kind in the same namespace (cluster-scoped targets
  have none). ``missing="reject"`` makes a dangling reference an error at the field's path;
  ``missing="warn"`` accepts the object with a warning, because an Agent may well be declared
  before its provider.
* For kinds with ``warn`` references admission owns one condition, ``ReferencesResolved``: False
  with reason ``<Kind>NotFound`` while a target is missing, True with reason ``Resolved`` once all
  resolve. It is the only status admission writes; everything else in status belongs to
  controllers and the status subresource.
* Rejection ratchets: on update, a ``reject`` reference whose value did not change is not checked
  again. Deleting an Agent must not make every unchanged manifest that once named it unappliable.
* ``pending`` holds the objects being written in the same batch, so a multi-document apply is
  order-independent: an AgentRun may come before the Agent it names.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

from joch.api import errors
from joch.api.errors import Cause
from joch.api.meta import dig
from joch.api.registry import REGISTRY, KindInfo
from joch.store.base import Writer

Pending = Set[tuple[str, str | None, str]]
CONDITION = "ReferencesResolved"


@dataclass
class Resolution:
    causes: list[Cause] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    condition: dict[str, Any] | None = None


def check_references(
    reader: Writer, kind: KindInfo, obj: dict[str, Any], *, namespace: str | None,
    old: dict[str, Any] | None, pending: Pending,
) -> Resolution:
    result = Resolution()
    missing: list[tuple[KindInfo, str]] = []
    for ref in kind.references:
        value = dig(obj, ref.path)
        if not isinstance(value, str) or not value:
            continue  # absent, or a type error the schema already reports
        if ref.missing == "reject" and old is not None and dig(old, ref.path) == value:
            continue
        target = REGISTRY.resolve(ref.kind)
        target_ns = namespace if target.namespaced else None
        if _exists(reader, target, target_ns, value, pending):
            continue
        message = _not_found(target, target_ns, value)
        if ref.missing == "reject":
            result.causes.append(Cause(ref.path, f"{message}; create it first or fix {ref.path}",
                                       "FieldValueNotFound"))
        else:
            result.warnings.append(f"{ref.path}: {message}; {kind.kind} is accepted but cannot "
                                   f"be used until the {target.singular} exists")
            missing.append((target, message))
    if any(ref.missing == "warn" for ref in kind.references):
        result.condition = _condition(missing)
    return result


def _exists(reader: Writer, kind: KindInfo, namespace: str | None, name: str, pending: Pending) -> bool:
    if (kind.kind, namespace, name) in pending:
        return True
    try:
        reader.get(kind, namespace, name)
    except errors.NotFound:
        return False
    return True


def _not_found(kind: KindInfo, namespace: str | None, name: str) -> str:
    where = f' in namespace "{namespace}"' if namespace else ""
    return f'{kind.singular} "{name}" not found{where}'


def _condition(missing: list[tuple[KindInfo, str]]) -> dict[str, Any]:
    if not missing:
        return {"type": CONDITION, "status": "True", "reason": "Resolved",
                "message": "all references resolve"}
    return {"type": CONDITION, "status": "False", "reason": f"{missing[0][0].kind}NotFound",
            "message": "; ".join(message for _, message in missing)}
