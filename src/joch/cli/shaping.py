"""What ``joch get`` does to its output beyond the server's table: kubectl's ``-o jsonpath=``,
``-o custom-columns=``, ``--sort-by`` and ``--show-labels``.

All of it is done here, on the client, as kubectl does it: the server lists objects (or a Table
whose rows carry the whole object, ``includeObject=Object``, when a table is sorted) and this module
shapes what is printed.

* ``-o jsonpath=TEMPLATE`` renders the template (``joch.cli.jsonpaths``) against the one object
  asked for by name, else against a ``List`` of the objects, as kubectl does.
* ``-o custom-columns=HEADER:PATH,...`` prints a table (laid out as ``printers`` lays out the
  server's) whose cells are the values at each path: several values joined by commas, none as
  ``<none>``.
* ``--sort-by=PATH`` orders objects, or a table's rows by their objects, by the value at PATH:
  numbers by value, everything else as text, objects without the value first; a stable sort, so
  equal values keep the server's order (by name).
* ``--show-labels`` adds a LABELS column (``k=v,...`` sorted by key, ``<none>``) after the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from joch.api import columns, errors
from joch.cli import jsonpaths, printers

Obj = dict[str, Any]
TEMPLATE_OUTPUTS = ("jsonpath", "custom-columns", "jsonpath-file", "custom-columns-file")
SORT_INCLUDE = {"includeObject": "Object"}
"""Table parameters when rows are sorted: each row's whole object, for the sort path to read."""


@dataclass(frozen=True)
class Shape:
    """``-o jsonpath=...`` or ``-o custom-columns=...``, parsed once before anything is fetched."""

    kind: str  # "jsonpath" or "custom-columns"
    spec: str
    template: jsonpaths.Template | None = None
    columns: tuple[tuple[str, jsonpaths.Finder], ...] = ()

    def render(self, objects: Sequence[Obj], *, single: bool) -> str:
        if self.template is not None:
            data: Any = objects[0] if single and objects else printers.as_list(list(objects))
            return self.template.render(data)
        headers = [header for header, _ in self.columns]
        rows = [[cell(finder(obj, obj)) for _, finder in self.columns] for obj in objects]
        return "\n".join(printers.render_table(headers, rows)) + "\n"

    def render_one(self, obj: Obj, *, header: bool) -> str:
        """One watch event: the template against the object, or its custom-columns row."""
        if self.template is not None:
            return self.template.render(obj)
        headers = [h for h, _ in self.columns]
        row = [cell(finder(obj, obj)) for _, finder in self.columns]
        lines = printers.render_table(headers, [row])
        return "\n".join(lines if header else lines[1:]) + "\n"


def shape(output: str | None) -> Shape | None:
    """The shape ``-o`` asks for, or None for the other outputs (wide, yaml, json, name)."""
    if output is None:
        return None
    name, eq, spec = output.partition("=")
    if name not in TEMPLATE_OUTPUTS:
        return None
    if not eq or not spec.strip():
        example = {"jsonpath": "{.items[*].metadata.name}", "custom-columns": "NAME:.metadata.name,PHASE:.status.phase"
                   }.get(name, "FILE")
        raise errors.BadRequest(f"-o {name} needs a template: -o {name}='{example}'")
    if name.endswith("-file"):
        name, spec = name.removesuffix("-file"), _template_file(name, spec)
    if name == "jsonpath":
        return Shape(kind=name, spec=spec, template=jsonpaths.template(spec))
    return Shape(kind=name, spec=spec, columns=tuple(_columns(spec)))


def _template_file(name: str, path: str) -> str:
    """A ``jsonpath-file`` as it is; a ``custom-columns-file`` (a line of headers over a line of
    paths, as kubectl reads it) as a ``custom-columns`` spec."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise errors.BadRequest(f"-o {name}: cannot read {path}: {exc.strerror or exc}") from None
    if name == "jsonpath-file":
        return text
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if len(lines) != 2 or len(lines[0]) != len(lines[1]):
        raise errors.BadRequest(f"-o {name}: {path} must hold two lines, the headers and as many JSONPaths under them")
    return ",".join(f"{header}:{column}" for header, column in zip(lines[0], lines[1], strict=True))


def is_output(output: str) -> bool:
    return output.partition("=")[0] in TEMPLATE_OUTPUTS


def _columns(spec: str) -> list[tuple[str, jsonpaths.Finder]]:
    out = []
    for part in _split(spec):
        header, colon, path = part.partition(":")
        if not colon or not header.strip() or not path.strip():
            raise errors.BadRequest(
                f"unexpected custom-columns spec {part!r}: expected HEADER:JSONPATH, e.g. NAME:.metadata.name"
            )
        out.append((header.strip(), jsonpaths.relaxed(path, what=f"custom column {header.strip()}")))
    return out


def _split(spec: str) -> list[str]:
    """Split on the commas between columns, not those inside brackets (``[?(@.a in ("x","y"))]``)."""
    parts, depth, start = [], 0, 0
    for at, ch in enumerate(spec):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(spec[start:at])
            start = at + 1
    parts.append(spec[start:])
    return [p for p in parts if p.strip()] or [spec]


def cell(found: list[Any]) -> str:
    values = [jsonpaths.show(v) for v in found if v is not None and v != ""]
    return ",".join(values) if values else columns.NONE


# --- sorting ------------------------------------------------------------------------------------

def sorter(path: str | None) -> jsonpaths.Finder | None:
    return jsonpaths.relaxed(path, what="--sort-by") if path else None


def sort_objects(objects: list[Obj], finder: jsonpaths.Finder | None) -> list[Obj]:
    if finder is None:
        return objects
    return sorted(objects, key=lambda obj: _key(jsonpaths.first(finder, obj)))


def sort_rows(rows: list[printers.Row], finder: jsonpaths.Finder | None) -> list[printers.Row]:
    if finder is None:
        return rows

    def key(row: printers.Row) -> tuple[int, float, str]:
        obj = row.get("object")
        return _key(jsonpaths.first(finder, obj) if isinstance(obj, dict) else None)

    return sorted(rows, key=key)


def _key(value: Any) -> tuple[int, float, str]:
    """Missing values first, then numbers by value, then text (RFC 3339 times sort as times)."""
    if value is None:
        return (0, 0.0, "")
    if isinstance(value, bool):
        return (2, 0.0, str(value).lower())
    if isinstance(value, int | float):
        try:
            return (1, float(value), "")
        except OverflowError:  # an integer beyond a float's range (JSON allows 1e400 written out)
            return (1, float("inf") if value > 0 else float("-inf"), "")
    return (2, 0.0, jsonpaths.show(value))


# --- labels -------------------------------------------------------------------------------------

def labels_of(obj: Any) -> str:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    if not isinstance(labels, dict) or not labels:
        return columns.NONE
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@dataclass(frozen=True)
class LabeledLayout(printers.Layout):
    """A ``printers.Layout`` with kubectl's ``--show-labels`` LABELS column last."""

    @property
    def headers(self) -> list[str]:
        return [*super().headers, "LABELS"]

    def cells(self, row: printers.Row) -> list[str]:
        return [*super().cells(row), labels_of(row.get("object"))]


def with_labels(layout: printers.Layout) -> printers.Layout:
    return LabeledLayout(layout.definitions, layout.shown, layout.namespace)
