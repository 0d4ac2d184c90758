"""Cross-object references: each kind declares them (``KindInfo.references``); admission checks them.

Design decisions:

* A reference names an object of the target kind in the same namespace (cluster-scoped targets
  have none). ``missing="reject"`` makes a dangling reference an error at the field's path;
  ``missing="warn"`` accepts the object with a warning, because an Agent may well be declared
  before its provider.
* Admission writes no status. Whether an Agent's references resolve *now* is the Agent
  controller's ``ReferencesResolved`` condition, kept current as providers and Secrets come and go;
  a condition admission wrote at apply time would go stale the moment the provider was created,
  and two writers of one condition would fight over its message and its transition time.
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


@dataclass
class Resolution:
    causes: list[Cause] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_references(
    reader: Writer, kind: KindInfo, obj: dict[str, Any], *, namespace: str | None,
    old: dict[str, Any] | None, pending: Pending,
) -> Resolution:
    result = Resolution()
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
            lacks = ref.until or "cannot be used"
            result.warnings.append(f"{ref.path}: {message}; {kind.kind} is accepted but {lacks} until the "
                                   f"{target.singular} exists")
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

