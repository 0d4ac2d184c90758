"""A kind's table columns, evaluated: the one implementation behind server-side Tables.

The server turns ``KindInfo.columns`` into a Kubernetes ``Table`` (``joch.server.tables``), which
both ``kubectl get`` and ``joch get`` print; the CLI only evaluates columns itself for a server that
sends no Table (NAME and AGE, as kubectl does). Pure functions, no I/O.

Column paths are dotted with two bracket forms, enough for the registry and for kubectl-style
``additionalPrinterColumns``: ``conditions[type=Ready]`` keeps the list items whose field equals a
value, ``rules[*]`` keeps every item (and ``items[0]`` one item).

Cells are rendered on the server, as the kube-apiserver renders a CRD's printer columns: kubectl
prints a cell as it comes and an empty one as nothing, so

* a ``string`` cell is every value found, joined with commas, or ``<none>`` when there is none;
* a ``date`` cell is the age of the timestamp (``5s``, ``3m``, ``2h``, ``4d``, ``1y``: one unit,
  rounded down, Joch's AGE since before Tables), ``<none>`` when absent, ``<invalid>`` when it is
  not a timestamp;
* an ``integer``, ``number`` or ``boolean`` cell is the JSON value when it is one value of that
  type, and otherwise rendered like a string cell, so a value never silently disappears.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from joch.api.meta import parse_time
from joch.api.registry import Column, ColumnType, KindInfo

NONE = "<none>"
INVALID = "<invalid>"
NAME = Column("NAME", "metadata.name", description="The object's name, unique within its namespace.")
AGE = Column("AGE", "metadata.creationTimestamp", type="date",
             description="Time since the object was created (metadata.creationTimestamp).")
_SEGMENT = re.compile(r"([^.\[\]]+)(?:\[([^\]]*)\])?")


def for_kind(kind: KindInfo) -> list[Column]:
    """NAME, then the kind's declared columns (AGE alone when it declares none)."""
    return [NAME, *(kind.columns or (AGE,))]


def column_type(column: Column) -> ColumnType:
    if column.type is not None:
        return column.type
    return "date" if column.name == "AGE" else "string"


def definition(column: Column) -> dict[str, Any]:
    """The ``TableColumnDefinition`` of a column (``format: name`` marks the NAME column)."""
    return {
        "name": column.name,
        "type": column_type(column),
        "format": "name" if column is NAME else "",
        "description": column.description or column.path,
        "priority": 1 if column.wide else 0,
    }


def definitions(columns: Iterable[Column]) -> list[dict[str, Any]]:
    return [definition(c) for c in columns]


def cells(obj: Any, columns: Sequence[Column], now: dt.datetime) -> list[Any]:
    return [value(obj, c, now) for c in columns]


def value(obj: Any, column: Column, now: dt.datetime) -> Any:
    found = extract(obj, column.path)
    kind = column_type(column)
    if kind == "date":
        return age(found[0] if found else None, now)
    if len(found) == 1 and _is(found[0], kind):
        return found[0]
    return cell(found)


def _is(found: Any, kind: ColumnType) -> bool:
    if isinstance(found, bool):
        return kind == "boolean"
    if isinstance(found, int):
        return kind in ("integer", "number")
    return isinstance(found, float) and kind == "number"


def extract(obj: Any, path: str) -> list[Any]:
    """Every value at ``path`` (see the module docstring for the bracket forms)."""
    values = [obj]
    for key, selector in _segments(path):
        values = [found for value in values for found in _step(value, key, selector)]
    return values


@functools.lru_cache(maxsize=512)
def _segments(path: str) -> tuple[tuple[str, str], ...]:
    return tuple(_SEGMENT.findall(path))


def _step(value: Any, key: str, selector: str) -> list[Any]:
    if not isinstance(value, dict) or value.get(key) is None:
        return []
    child = value[key]
    if not selector:
        return [child]
    if not isinstance(child, list):
        return []
    if selector == "*":
        return list(child)
    if selector.isdigit():
        return [child[int(selector)]] if int(selector) < len(child) else []
    field, _, wanted = selector.partition("=")
    return [item for item in child if isinstance(item, dict) and scalar(item.get(field)) == wanted]


def scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def cell(values: Sequence[Any]) -> str:
    present = [v for v in values if v is not None and v != ""]
    return ",".join(scalar(v) for v in present) if present else NONE


def short_duration(seconds: float) -> str:
    if seconds < -1:
        return INVALID
    total = max(int(seconds), 0)
    for unit, size, limit in (("s", 1, 60), ("m", 60, 3600), ("h", 3600, 86400), ("d", 86400, 86400 * 365)):
        if total < limit:
            return f"{total // size}{unit}"
    return f"{total // (86400 * 365)}y"


def age(timestamp: Any, now: dt.datetime) -> str:
    if not timestamp:
        return NONE
    if not isinstance(timestamp, str):
        return INVALID
    try:
        then = parse_time(timestamp)
    except ValueError:
        return INVALID
    if then.tzinfo is None:  # RFC 3339 requires an offset (and naive minus aware would raise)
        return INVALID
    return short_duration((now - then).total_seconds())
