"""Turning objects into what ``joch get`` prints: tables, YAML, JSON and ``kind.group/name`` lines.

Tables are plain text laid out like kubectl's tabwriter (columns padded to the widest cell plus
three spaces), not rich tables: the output must not depend on the terminal width, must not wrap
when piped, and must stay greppable and ``awk``-able. A missing value prints as ``<none>``.

Columns come from the local kind registry (``KindInfo.columns``), looked up by the group and kind
the server's discovery reported; a kind the local registry does not know (a newer server) still
prints, with NAME and AGE. Column paths are dotted with two bracket forms, enough for the
registry and for kubectl-style ``additionalPrinterColumns``: ``conditions[type=Ready]`` keeps the
list items whose field equals a value, ``rules[*]`` keeps every item (and ``items[0]`` one item).
A column headed AGE holds a timestamp and prints as a short age (``5s``, ``3m``, ``2h``, ``4d``,
``1y``), which is kubectl's rounding for the AGE column.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from joch.api import REGISTRY
from joch.api.meta import parse_time
from joch.api.registry import Column
from joch.cli.resolve import ResourceType

NONE = "<none>"
PADDING = 3
OUTPUTS = ("wide", "yaml", "json", "name")
NAME = Column("NAME", "metadata.name")
NAMESPACE = Column("NAMESPACE", "metadata.namespace")
AGE = Column("AGE", "metadata.creationTimestamp")
_SEGMENT = re.compile(r"([^.\[\]]+)(?:\[([^\]]*)\])?")


def short_duration(seconds: float) -> str:
    if seconds < -1:
        return "<invalid>"
    total = max(int(seconds), 0)
    for unit, size, limit in (("s", 1, 60), ("m", 60, 3600), ("h", 3600, 86400), ("d", 86400, 86400 * 365)):
        if total < limit:
            return f"{total // size}{unit}"
    return f"{total // (86400 * 365)}y"


def format_age(timestamp: str | None, now: dt.datetime) -> str:
    if not timestamp:
        return NONE
    try:
        then = parse_time(timestamp)
    except ValueError:
        return "<invalid>"
    return short_duration((now - then).total_seconds())


def extract(obj: Any, path: str) -> list[Any]:
    """Every value at ``path`` (see the module docstring for the bracket forms)."""
    values = [obj]
    for key, selector in _SEGMENT.findall(path):
        values = [found for value in values for found in _step(value, key, selector)]
    return values


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
    return [item for item in child if isinstance(item, dict) and _scalar(item.get(field)) == wanted]


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def cell(values: Sequence[Any]) -> str:
    present = [v for v in values if v is not None and v != ""]
    return ",".join(_scalar(v) for v in present) if present else NONE


def columns_for(rt: ResourceType, *, wide: bool, all_namespaces: bool) -> list[Column]:
    known = next((i for i in REGISTRY if i.group == rt.group and i.kind == rt.kind), None)
    declared = list(known.columns) if known and known.columns else [AGE]
    columns = [NAME, *(c for c in declared if wide or not c.wide)]
    if all_namespaces and rt.namespaced:
        columns.insert(0, NAMESPACE)
    return columns


def row(obj: dict[str, Any], columns: Sequence[Column], now: dt.datetime) -> list[str]:
    out = []
    for column in columns:
        values = extract(obj, column.path)
        if column.name == "AGE":
            out.append(format_age(values[0] if values else None, now))
        else:
            out.append(cell(values))
    return out


def widths(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[int]:
    out = [len(h) for h in headers]
    for r in rows:
        out = [max(w, len(c)) for w, c in zip(out, r, strict=True)]
    return out


def render_row(cells: Sequence[str], column_widths: Sequence[int]) -> str:
    padded = [c + " " * max(PADDING, w + PADDING - len(c)) for c, w in zip(cells, column_widths, strict=True)]
    return "".join(padded).rstrip()


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    column_widths = widths(headers, rows)
    return [render_row(r, column_widths) for r in (headers, *rows)]


def object_name(rt: ResourceType, obj: dict[str, Any]) -> str:
    return f"{rt.qualified_kind}/{obj.get('metadata', {}).get('name', '')}"


def as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``List`` kubectl prints for several objects in YAML or JSON."""
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (system prompts, templates) as ``|`` blocks, as a person wrote them."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _represent_str)


def to_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=4, ensure_ascii=False) + "\n"


def dump(obj: Any, output: str) -> str:
    return to_yaml(obj) if output == "yaml" else to_json(obj)
