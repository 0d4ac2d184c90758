"""Object metadata, conditions and the helpers every layer uses to read objects.

Objects travel as plain JSON dicts (what the store holds and the wire carries); the pydantic models
here and in ``kinds`` validate them at admission. Strict scalar types are deliberate: YAML 1.1 turns
``on``/``no``/``yes`` into booleans and ``1.10`` into a float, and a control plane must reject those
in string fields rather than coerce them silently.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Str = StrictStr
Bool = StrictBool
Int = StrictInt
Number = StrictFloat | StrictInt
PositiveInt = Annotated[StrictInt, Field(ge=1)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DEFAULT_NAMESPACE = "default"


class Model(BaseModel):
    """Base for every spec/status model: unknown fields are errors, never dropped."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LocalObjectReference(Model):
    name: Str = Field(min_length=1)


class OwnerReference(Model):
    apiVersion: Str
    kind: Str
    name: Str
    uid: Str
    controller: Bool | None = None
    blockOwnerDeletion: Bool | None = None


class ObjectMeta(Model):
    name: Str | None = None
    generateName: Str | None = None
    namespace: Str | None = None
    uid: Str | None = None
    resourceVersion: Str | None = None
    generation: Int | None = None
    creationTimestamp: Str | None = None
    deletionTimestamp: Str | None = None
    deletionGracePeriodSeconds: Int | None = None
    labels: dict[Str, Str] | None = None
    annotations: dict[Str, Str] | None = None
    finalizers: list[Str] | None = None
    ownerReferences: list[OwnerReference] | None = None
    managedFields: list[dict[str, Any]] | None = None


class Condition(Model):
    type: Str
    status: Literal["True", "False", "Unknown"]
    reason: Str | None = None
    message: Str | None = None
    lastTransitionTime: Str | None = None
    observedGeneration: Int | None = None


class ConditionedStatus(Model):
    conditions: list[Condition] = Field(default_factory=list)
    observedGeneration: Int | None = None


def now() -> str:
    """RFC 3339 UTC timestamp with seconds precision, as Kubernetes writes them."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def epoch(value: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 time as the store holds it; None when absent or not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value).timestamp()
    except ValueError:
        return None


def meta(obj: dict[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = {}
        obj["metadata"] = m
    return m


def dig(obj: Any, path: str) -> Any:
    """The value at a dotted path, or None when any step is missing."""
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def set_condition(conditions: list[dict[str, Any]], condition: dict[str, Any]) -> list[dict[str, Any]]:
    """Upsert a condition by type; ``lastTransitionTime`` moves only when ``status`` changes."""
    out = []
    found = False
    for c in conditions:
        if c.get("type") == condition["type"]:
            found = True
            merged = {**c, **condition}
            if c.get("status") != condition.get("status") or "lastTransitionTime" not in c:
                merged["lastTransitionTime"] = condition.get("lastTransitionTime") or now()
            else:
                merged["lastTransitionTime"] = c["lastTransitionTime"]
            out.append(merged)
        else:
            out.append(c)
    if not found:
        out.append({"lastTransitionTime": now(), **condition})
    return out


def has_huge_float(value: Any) -> bool:
    """Whether ``value`` holds a float of magnitude 2**63 or more: what orjson makes of an integer
    beyond 64 bits (every integer it reads exactly is smaller). A float written that large is read
    the same way by ``json``. Quicker than searching the text for long runs of digits."""
    kind = type(value)
    if kind is dict:
        for child in value.values():
            if type(child) in _CONTAINERS_OR_FLOAT and has_huge_float(child):
                return True
        return False
    if kind is list:
        for child in value:
            if type(child) in _CONTAINERS_OR_FLOAT and has_huge_float(child):
                return True
        return False
    return kind is float and not abs(value) < _HUGE


_CONTAINERS_OR_FLOAT = frozenset({dict, list, float})
_HUGE = 2.0 ** 63
