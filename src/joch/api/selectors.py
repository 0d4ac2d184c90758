"""Kubernetes label and field selectors: parsing and matching (pure functions).

Label selectors support ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)`` and
``k notin (a,b)``, comma-separated (all must hold). Field selectors support ``=``, ``==`` and
``!=`` on ``metadata.name`` and ``metadata.namespace`` — the fields every kind has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from joch.api import errors

_SET_RE = re.compile(r"^\s*(!?)([A-Za-z0-9][-A-Za-z0-9_./]*)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*(==|!=|=)\s*([-A-Za-z0-9_.]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*$")
FIELDS = ("metadata.name", "metadata.namespace")


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


def parse_fields(selector: str | None) -> tuple[Requirement, ...]:
    if not selector or not selector.strip():
        return ()
    out = []
    for part in _split_top_level(selector):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise errors.BadRequest(f"unable to parse field selector requirement {part!r}")
        if m.group(1) not in FIELDS:
            raise errors.BadRequest(
                f"field label not supported: {m.group(1)} (supported: {', '.join(FIELDS)})"
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
        values = {"metadata.name": metadata.get("name") or "",
                  "metadata.namespace": metadata.get("namespace") or ""}
        if not all(r.matches({r.key: values[r.key]}) for r in fields):
            return False
    return True
