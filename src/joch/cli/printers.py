"""What ``joch get`` prints: the server's tables, YAML, JSON and ``kind.group/name`` lines.

Tables are the server's: ``get`` asks for a Kubernetes ``Table`` (``TABLE_ACCEPT``) and prints its
``columnDefinitions`` and cells the way kubectl does — headers upper-cased, columns of priority
above 0 only with ``-o wide``, a NAMESPACE column in front with ``-A`` taken from each row's object
metadata, a cell up to its first line break (then ``...``). The CLI therefore knows no kind's
columns: a kind added on a newer server prints its own columns here. A server that sends plain JSON
instead (one older than Tables) gets NAME and AGE, computed from the objects with the evaluator the
server uses (``joch.api.columns``), as kubectl prints objects it has no Table for. A missing value
prints as ``<none>`` (the server already writes it so; a null cell is printed the same way).

Tables are plain text laid out like kubectl's tabwriter (columns padded to the widest cell plus
three spaces), not rich tables: the output must not depend on the terminal width, must not wrap
when piped, and must stay greppable and ``awk``-able.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from joch.api import columns
from joch.cli.resolve import ResourceType

PADDING = 3
TABLE_OUTPUTS = (None, "wide")
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
_LOCAL_COLUMNS = (columns.NAME, columns.AGE)
_LINE_BREAK = re.compile(r"[\f\n\r]")

Table = dict[str, Any]
Row = Mapping[str, Any]


@dataclass(frozen=True)
class Layout:
    """Which of a Table's columns are printed, and under which headers."""

    definitions: Sequence[Mapping[str, Any]]
    shown: Sequence[int]
    namespace: bool

    @property
    def headers(self) -> list[str]:
        names = [str(self.definitions[i].get("name", "")).upper() for i in self.shown]
        return ["NAMESPACE", *names] if self.namespace else names

    @property
    def name_at(self) -> int:
        """Where the object's name is among the printed cells (the ``format: name`` column)."""
        named = [n for n, i in enumerate(self.shown) if self.definitions[i].get("format") == "name"]
        return (named[0] if named else 0) + (1 if self.namespace else 0)

    def cells(self, row: Row) -> list[str]:
        given = row.get("cells") or []
        out = [text(given[i] if i < len(given) else None) for i in self.shown]
        return [text(row_namespace(row)), *out] if self.namespace else out


def layout(definitions: Sequence[Mapping[str, Any]], *, wide: bool, namespace: bool) -> Layout:
    shown = [i for i, d in enumerate(definitions) if wide or not d.get("priority")]
    return Layout(definitions, shown, namespace)


def text(value: Any) -> str:
    if value is None or value == "":
        return columns.NONE
    shown = columns.scalar(value)
    cut = _LINE_BREAK.search(shown)
    return f"{shown[:cut.start()]}..." if cut else shown


def row_namespace(row: Row) -> Any:
    obj = row.get("object")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    return metadata.get("namespace") if isinstance(metadata, dict) else None


def as_table(body: Any, now: dt.datetime) -> Table:
    """The Table in a response; a plain object or list (an older server) becomes NAME and AGE."""
    if isinstance(body, dict) and body.get("kind") == "Table":
        return body
    listing = isinstance(body, dict) and "items" in body
    objects = [o for o in (body.get("items") or [] if listing else [body]) if isinstance(o, dict)]
    return {
        "kind": "Table",
        "metadata": (body.get("metadata") or {}) if listing else {},
        "columnDefinitions": columns.definitions(_LOCAL_COLUMNS),
        "rows": [{"cells": columns.cells(o, _LOCAL_COLUMNS, now), "object": {"metadata": o.get("metadata")}}
                 for o in objects],
    }


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


@functools.cache
def _dumper() -> type[Any]:
    """Multi-line strings (system prompts, templates) as ``|`` blocks, as a person wrote them.
    Built on first use: yaml is imported only by the commands that print YAML."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, represent_str)
    return Dumper


def to_yaml(obj: Any) -> str:
    import yaml

    return yaml.dump(obj, Dumper=_dumper(), sort_keys=False, default_flow_style=False, allow_unicode=True)


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=4, ensure_ascii=False) + "\n"


def dump(obj: Any, output: str, *, show_managed_fields: bool = False) -> str:
    """``obj`` as YAML or JSON; ``metadata.managedFields`` (server-side apply's bookkeeping) left
    out unless asked for, as kubectl does (``--show-managed-fields``)."""
    if not show_managed_fields:
        obj = without_managed_fields(obj)
    return to_yaml(obj) if output == "yaml" else to_json(obj)


def without_managed_fields(obj: Any) -> Any:
    """``obj`` (an object, or a list with ``items``) without ``metadata.managedFields``."""
    if not isinstance(obj, dict):
        return obj
    if isinstance(obj.get("items"), list):
        obj = {**obj, "items": [without_managed_fields(item) for item in obj["items"]]}
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return obj
