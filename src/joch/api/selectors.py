"""Kubernetes label and field selectors: parsing and matching (pure functions).

Label selectors support ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)`` and
``k notin (a,b)``, comma-separated (all must hold). Field selectors support ``=``, ``==`` and
``!=`` on ``metadata.name`` and ``metadata.namespace`` — the fields every kind has — and, for a
kind given to ``parse_fields``, on its *selectable fields*: the plain paths of the kind's table
columns (``status.phase`` and ``spec.agentRef.name`` of an AgentRun, ``spec.involvedObject.name``
of an Event, ...), as a CRD declares ``selectableFields`` and the apiserver a Pod's
``status.phase``. What ``joch get`` shows in a column is what a user filters on; a path with a
wildcard or a filter (``spec.rules[*].name``, ``status.conditions[type=Ready].status``) selects
nothing sensible and is left out. A field's value compares as text: a missing field is ``""``,
booleans ``true``/``false``, numbers as JSON writes them (``status.attempt=2``).

Name and namespace never change; the other fields do, so a watch with such a selector sees an
object enter and leave the selection (``joch.store.feed``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from joch.api import errors

if TYPE_CHECKING:
    from joch.api.registry import KindInfo

_SET_RE = re.compile(r"^\s*(!?)([A-Za-z0-9][-A-Za-z0-9_./]*)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*(==|!=|=)\s*([-A-Za-z0-9_.]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*$")
FIELDS = ("metadata.name", "metadata.namespace")
_PLAIN_PATH = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)+$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # "!=" and "notin"


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (p.strip() for p in parts) if p]


def parse_labels(selector: str | None) -> tuple[Requirement, ...]:
    if not selector or not selector.strip():
        return ()
    out = []
    for part in _split_top_level(selector):
        if m := _SET_RE.match(part):
            values = tuple(v.strip() for v in m.group(4).split(",") if v.strip())
            out.append(Requirement(m.group(2), m.group(3), values))
        elif m := _EQ_RE.match(part):
            op = "=" if m.group(2) in ("=", "==") else "!="
            out.append(Requirement(m.group(1), op, (m.group(3),)))
        elif m := _EXISTS_RE.match(part):
            out.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise errors.BadRequest(
                f"unable to parse label selector requirement {part!r}: use key=value, key!=value, "
                "key, !key, 'key in (a,b)' or 'key notin (a,b)'"
            )
    return tuple(out)


def selectable(kind: KindInfo | None) -> tuple[str, ...]:
    """The fields a field selector may name for ``kind``: name, namespace, its columns' plain paths."""
    if kind is None:
        return FIELDS
    extra = [c.path for c in kind.columns if _PLAIN_PATH.match(c.path) and c.path not in FIELDS]
    return FIELDS + tuple(dict.fromkeys(extra))


def parse_fields(selector: str | None, kind: KindInfo | None = None) -> tuple[Requirement, ...]:
    if not selector or not selector.strip():
        return ()
    allowed = selectable(kind)
    out = []
    for part in _split_top_level(selector):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise errors.BadRequest(f"unable to parse field selector requirement {part!r}: use field=value or "
                                    "field!=value, comma-separated")
        if m.group(1) not in allowed:
            whose = f" for {kind.plural}" if kind is not None else ""
            raise errors.BadRequest(
                f"field label not supported{whose}: {m.group(1)} (supported: {', '.join(allowed)})"
            )
        op = "=" if m.group(2) in ("=", "==") else "!="
        out.append(Requirement(m.group(1), op, (m.group(3),)))
    return tuple(out)


def matches(obj: dict[str, Any], labels: tuple[Requirement, ...], fields: tuple[Requirement, ...]) -> bool:
    metadata = obj.get("metadata") or {}
    if labels:
        object_labels = metadata.get("labels") or {}
        if not all(r.matches(object_labels) for r in labels):
            return False
    if fields:
        if not all(r.matches({r.key: field_value(obj, r.key)}) for r in fields):
            return False
    return True


def mutable(fields: tuple[Requirement, ...]) -> bool:
    """Whether a selection can change while the object lives: it names more than name and namespace."""
    return any(r.key not in FIELDS for r in fields)


def field_value(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))
