"""``joch wait``: block until objects meet a condition, as ``kubectl wait`` does.

``--for`` takes kubectl's forms:

* ``condition=Ready`` (status ``True``) or ``condition=Ready=False``: an entry of
  ``status.conditions`` of that type (any case) with that status;
* ``jsonpath={.status.phase}=Succeeded`` (the value printed as ``-o jsonpath`` prints it) or
  ``jsonpath={.status.phase}`` (the field exists and is not empty);
* ``delete``: the object is gone (one already gone counts);
* ``create``: the object exists.

Each object is read once, then followed with a watch from the ``resourceVersion`` read (so no
change between the read and the watch is missed) until it meets the condition or ``--timeout``
(kubectl's durations: ``30s``, ``5m``, ``1h``; a bare number is seconds; ``0`` checks once) runs
out. The server bounds each watch with ``timeoutSeconds`` at the time left, so a silent server
cannot hold the command past its timeout; a watch that ends early (the server restarted, 410 Gone)
is resumed from a fresh read. Objects are named ``TYPE NAME...`` or ``TYPE/NAME...``, or selected
with ``-l``/``--all``. A timeout prints ``error: timed out waiting for the condition on TYPE/NAME``
and exits 1, as kubectl.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from joch.api import errors
from joch.cli import jsonpaths
from joch.cli.client import Client
from joch.cli.resolve import ResourceType

Obj = dict[str, Any]
TIMEOUT_EXIT_CODE = 1
_DURATION = re.compile(r"(\d+(?:\.\d*)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class Condition:
    """What ``--for`` asks; ``met(obj)`` with None for an object that does not exist."""

    spelled: str
    kind: str  # condition, jsonpath, delete, create
    name: str = ""
    value: str | None = None
    finder: jsonpaths.Finder | None = None

    def met(self, obj: Obj | None) -> bool:
        if self.kind == "delete":
            return obj is None
        if obj is None:
            return False
        if self.kind == "create":
            return True
        if self.kind == "condition":
            conditions = (obj.get("status") or {}).get("conditions") or []
            return any(isinstance(c, dict) and str(c.get("type", "")).lower() == self.name.lower()
                       and str(c.get("status", "")).lower() == (self.value or "True").lower() for c in conditions)
        found = self.finder(obj, obj) if self.finder is not None else []
        if self.value is None:
            return any(v not in (None, "", [], {}) for v in found)
        return any(jsonpaths.show(v) == self.value for v in found)


def parse(spec: str) -> Condition:
    word, _, rest = spec.partition("=")
    kind = word.strip().lower()
    if kind in ("delete", "create") and not rest:
        return Condition(spelled=spec, kind=kind)
    if kind == "condition" and rest:
        name, _, status = rest.partition("=")
        if name:
            return Condition(spelled=spec, kind=kind, name=name, value=status or None)
    if kind == "jsonpath" and rest:
        expression, wanted = _split_jsonpath(rest)
        return Condition(spelled=spec, kind=kind, value=wanted,
                         finder=jsonpaths.relaxed(expression, what="--for=jsonpath"))
    raise errors.BadRequest(
        f'unrecognized --for "{spec}": use condition=NAME[=VALUE], jsonpath={{.path}}[=VALUE], delete or create'
    )


def _split_jsonpath(text: str) -> tuple[str, str | None]:
    """``{.status.phase}=Succeeded`` or ``.status.phase=Succeeded``: the expression and the value."""
    if text.startswith("{"):
        end = text.find("}")
        if end < 0:
            raise errors.BadRequest(f'--for=jsonpath={text}: the expression has no closing "}}"')
        rest = text[end + 1:]
        if rest and not rest.startswith("="):
            raise errors.BadRequest(f'--for=jsonpath={text}: expected "=VALUE" after the expression')
        return text[:end + 1], (rest[1:] if rest else None)
    expression, eq, value = text.partition("=")
    return expression, (value if eq else None)


def duration(text: str) -> float:
    """kubectl's ``--timeout``: ``30s``, ``1m30s``, ``2h``, ``500ms``, a bare number of seconds;
    a negative one means a week, as kubectl."""
    spelled = text.strip()
    negative = spelled.startswith("-")
    body = spelled.lstrip("-")
    try:
        seconds = float(body)
    except ValueError:
        parts = _DURATION.findall(body)
        if not parts or "".join(n + u for n, u in parts) != body:
            raise errors.BadRequest(
                f'invalid --timeout "{text}": give a duration such as 30s, 5m, 1h30m or a number of seconds'
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds):  # nan, inf, 1e400: no deadline to count down to
        raise errors.BadRequest(
            f'invalid --timeout "{text}": give a finite duration such as 30s, 5m, 1h30m or a number of seconds'
        )
    return 7 * 24 * 3600.0 if negative else seconds


def wait(client: Client, rt: ResourceType, namespace: str | None, names: list[str], condition: Condition, *,
         timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
    deadline = clock() + timeout
    for name in names:
        _wait_one(client, rt, namespace, name, condition, deadline, clock)
        done = "deleted" if condition.kind == "delete" else "condition met"
        typer.echo(f"{rt.qualified_kind}/{name} {done}")


def selected(client: Client, rt: ResourceType, namespace: str | None, selector: str | None) -> list[str]:
    params = {"labelSelector": selector} if selector else {}
    listing = client.get_object(rt.path(namespace=namespace), params)
    names = [str((o.get("metadata") or {}).get("name")) for o in listing.get("items") or [] if isinstance(o, dict)]
    if not names:
        where = f" in {namespace} namespace" if namespace and rt.namespaced else ""
        raise errors.NotFound(f"no matching resources found{where}", kind=rt.plural)
    return names


def _wait_one(client: Client, rt: ResourceType, namespace: str | None, name: str, condition: Condition,
              deadline: float, clock: Callable[[], float]) -> None:
    path = rt.path(namespace=namespace, name=name)
    while True:
        obj = _read(client, path, condition)
        if condition.met(obj):
            return
        if obj is None and condition.kind != "create":
            raise errors.NotFound(f'{rt.plural} "{name}" not found', kind=rt.plural, name=name)
        left = deadline - clock()
        if left <= 0:
            raise _timed_out(rt, name)
        version = (obj or {}).get("metadata", {}).get("resourceVersion") if obj else None
        if _watch(client, rt, namespace, name, condition, version, left):
            return


def _read(client: Client, path: str, condition: Condition) -> Obj | None:
    try:
        return client.get_object(path)
    except errors.NotFound:
        return None


def _watch(client: Client, rt: ResourceType, namespace: str | None, name: str, condition: Condition,
           version: str | None, left: float) -> bool:
    """Follow the object until the condition holds (True) or the watch ends (False: read again)."""
    params = {"watch": "1", "fieldSelector": f"metadata.name={name}", "timeoutSeconds": str(max(1, math.ceil(left)))}
    if version:
        params["resourceVersion"] = version
    try:
        for event in client.stream(rt.path(namespace=namespace), params):
            kind = event.get("type")
            if kind == "ERROR":
                return False  # e.g. 410 Gone: read again, watch from there
            if kind == "BOOKMARK":
                continue
            obj = event.get("object") if kind != "DELETED" else None
            if condition.met(obj if isinstance(obj, dict) or obj is None else None):
                return True
            if kind == "DELETED" and condition.kind != "create":
                raise errors.NotFound(f'{rt.plural} "{name}" was deleted while waiting for {condition.spelled}',
                                      kind=rt.plural, name=name)
    except errors.Gone:
        return False
    return False


class TimedOut(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _timed_out(rt: ResourceType, name: str) -> TimedOut:
    return TimedOut(f"timed out waiting for the condition on {rt.plural}/{name}")

