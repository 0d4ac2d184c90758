"""``joch explain KIND[.field.path]``: a kind's fields from the server's OpenAPI v3 document.

As kubectl explain does, the kind is resolved through the server's discovery and its schema read
from ``/openapi/v3/apis/GROUP/VERSION`` (the component tagged with the kind's
``x-kubernetes-group-version-kind``), so the answer is what that server serves, whatever the
version of this CLI. The output follows kubectl's: GROUP, KIND, VERSION, then the field (its type
and description) and its fields, or with ``--recursive`` the whole tree of field names and types.
Rendering (``render``) is a pure function of the schema.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

from joch.api import errors
from joch.api.openapi import field, type_name
from joch.cli.client import Client
from joch.cli.resolve import ResourceType

GVK = "x-kubernetes-group-version-kind"
WIDTH = 80


def explain(client: Client, target: str, *, recursive: bool = False) -> str:
    name, *path = target.split(".")
    rt = client.discovery.resolve(name)
    schema = kind_schema(client, rt)
    return render(rt, schema, path, recursive=recursive)


def kind_schema(client: Client, rt: ResourceType) -> dict[str, Any]:
    where = f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"
    document = client.get_object(f"/openapi/v3/{where}")
    wanted = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    for schema in document.get("components", {}).get("schemas", {}).values():
        if isinstance(schema, dict) and wanted in schema.get(GVK, []):
            return schema
    raise errors.NotFound(f"the server's OpenAPI document /openapi/v3/{where} has no schema for {rt.kind}",
                          kind=rt.kind)


def render(rt: ResourceType, schema: dict[str, Any], path: list[str], *, recursive: bool = False) -> str:
    lines = [f"GROUP:      {rt.group}", f"KIND:       {rt.kind}", f"VERSION:    {rt.version}", ""]
    node = field(schema, path) if path else schema
    if node is None:
        raise errors.NotFound(_no_such_field(schema, path), kind=rt.kind)
    if path:
        lines += [f"FIELD: {path[-1]} <{type_name(node)}>", ""]
    lines += ["DESCRIPTION:", *_wrapped(node.get("description") or "<empty>", 4)]
    if "enum" in node:
        lines += [f"    ENUM: {', '.join(str(v) for v in node['enum'])}"]
    fields = _fields(node)
    if fields:
        lines += ["", "FIELDS:"]
        lines += list(_tree(fields, 1) if recursive else _described(fields))
    return "\n".join(lines) + "\n"


def _fields(node: dict[str, Any]) -> dict[str, Any]:
    """A node's fields (a list's items' fields), each with whether it is required."""
    while node.get("type") == "array":
        node = node.get("items", {})
    required = set(node.get("required", []))
    return {name: (sub, name in required) for name, sub in node.get("properties", {}).items()}


def _described(fields: dict[str, Any]) -> Iterator[str]:
    for name in sorted(fields):
        sub, required = fields[name]
        yield f"  {name}\t<{type_name(sub)}>" + (" -required-" if required else "")
        yield from _wrapped(sub.get("description") or "<no description>", 4)
        if "enum" in sub:
            yield f"    enum: {', '.join(str(v) for v in sub['enum'])}"
        yield ""


def _tree(fields: dict[str, Any], depth: int) -> Iterator[str]:
    for name in sorted(fields):
        sub, required = fields[name]
        yield f"{'  ' * depth}{name}\t<{type_name(sub)}>" + (" -required-" if required else "")
        yield from _tree(_fields(sub), depth + 1)


def _wrapped(text: str, indent: int) -> list[str]:
    out: list[str] = []
    for paragraph in text.split("\n\n"):
        out += textwrap.wrap(" ".join(paragraph.split()), WIDTH - indent, initial_indent=" " * indent,
                             subsequent_indent=" " * indent) or [""]
    return out


def _no_such_field(schema: dict[str, Any], path: list[str]) -> str:
    for i in range(len(path)):
        node = field(schema, path[:i]) if i else schema
        known = sorted(_fields(node or {}))
        if path[i] not in known:
            where = ".".join(path[:i]) or "the object"
            return (f'field "{path[i]}" does not exist in {where} (its fields: {", ".join(known) or "none"})')
    return f'field "{".".join(path)}" does not exist'
