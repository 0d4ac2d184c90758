"""The read-only commands: ``get`` (list, one object, watch), ``describe`` and ``api-resources``.

Lists go to the server with the selector; the table is computed from the whole response so the
columns line up. ``get -w`` prints that table, then follows the watch from the list's
``resourceVersion`` (so no change between the list and the watch is lost, and none is printed
twice) and prints one row per event, padded to the widths of the first table. A watch row whose
cell is wider than the first table simply pushes the rest of the line right: kubectl does the
same, and the alternative (buffering) would delay rows a user is waiting for.

"No resources found" goes to stderr, as in kubectl, so ``joch get ... | wc -l`` counts objects.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from joch.api import errors
from joch.api.registry import Column
from joch.cli import describe as describing
from joch.cli import printers
from joch.cli.client import Client
from joch.cli.resolve import ResourceType

Obj = dict[str, Any]


@dataclass(frozen=True)
class Scope:
    """Which namespace(s) a command reads: ``namespace`` is ignored when ``all_namespaces``."""

    namespace: str
    all_namespaces: bool = False

    def for_path(self, rt: ResourceType) -> str | None:
        return None if self.all_namespaces or not rt.namespaced else self.namespace


@dataclass(frozen=True)
class GetRequest:
    kind: str
    names: list[str]
    scope: Scope
    output: str | None
    selector: str | None
    watch: bool


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def split_kind(kind: str, names: list[str]) -> tuple[str, list[str]]:
    """``agent/coder`` is accepted wherever ``agent coder`` is."""
    if "/" in kind and not names:
        kind, _, name = kind.partition("/")
        return kind, [name]
    return kind, names


def get(client: Client, request: GetRequest) -> None:
    types = client.discovery.resolve_many(request.kind)
    if len(types) > 1 or "," in request.kind:
        _get_many(client, types, request)
        return
    rt = types[0]
    namespace = request.scope.for_path(rt)
    if request.names:
        objects = [client.get_json(rt.path(namespace=namespace, name=n)) for n in request.names]
        resource_version = None
    else:
        listing = client.get_json(rt.path(namespace=namespace), _list_params(request))
        objects = list(listing.get("items") or [])
        resource_version = (listing.get("metadata") or {}).get("resourceVersion")
    column_widths = _print(rt, objects, request, single=len(request.names) == 1)
    if request.watch:
        _follow(client, rt, request, resource_version, column_widths)


def _get_many(client: Client, types: list[ResourceType], request: GetRequest) -> None:
    """``get agents,ap`` and ``get all``: one table per type that has objects, as kubectl prints
    them, with names qualified by type (``agent.joch.dev/demo``)."""
    if request.names or request.watch:
        what = "names" if request.names else "--watch"
        raise errors.BadRequest(f"{what} can be used with one resource type only, not {request.kind!r}")
    listed: list[tuple[ResourceType, list[Obj]]] = []
    for rt in types:
        listing = client.get_json(rt.path(namespace=request.scope.for_path(rt)), _list_params(request))
        listed.append((rt, list(listing.get("items") or [])))
    if request.output in ("yaml", "json"):
        everything = [obj for _, objects in listed for obj in objects]
        typer.echo(printers.dump(printers.as_list(everything), request.output), nl=False)
        return
    tables = [(rt, objects) for rt, objects in listed if objects]
    if not tables and request.output != "name":
        typer.echo(_nothing_found(types[0], request.scope), err=True)
    for i, (rt, objects) in enumerate(tables):
        if request.output == "name":
            for obj in objects:
                typer.echo(printers.object_name(rt, obj))
            continue
        if i:
            typer.echo("")
        columns = _columns(rt, request)
        rows = [printers.row(obj, columns, utcnow()) for obj in objects]
        name_at = next(n for n, c in enumerate(columns) if c.name == "NAME")
        for row, obj in zip(rows, objects, strict=True):
            row[name_at] = printers.object_name(rt, obj)
        column_widths = printers.widths([c.name for c in columns], rows)
        for line in ([c.name for c in columns], *rows):
            typer.echo(printers.render_row(line, column_widths))


def _list_params(request: GetRequest) -> dict[str, str]:
    return {"labelSelector": request.selector} if request.selector else {}


def _print(rt: ResourceType, objects: list[Obj], request: GetRequest, *, single: bool) -> list[int] | None:
    """Print objects in the requested format; returns the table's column widths (or None)."""
    if request.output in ("yaml", "json"):
        shown = objects[0] if single else printers.as_list(objects)
        typer.echo(printers.dump(shown, request.output), nl=False)
        return None
    if request.output == "name":
        for obj in objects:
            typer.echo(printers.object_name(rt, obj))
        return None
    if not objects:
        if not request.watch:
            typer.echo(_nothing_found(rt, request.scope), err=True)
        return None
    return _print_table(rt, objects, request)


def _print_table(rt: ResourceType, objects: list[Obj], request: GetRequest) -> list[int]:
    columns = _columns(rt, request)
    rows = [printers.row(obj, columns, utcnow()) for obj in objects]
    headers = [c.name for c in columns]
    column_widths = printers.widths(headers, rows)
    for line in (headers, *rows):
        typer.echo(printers.render_row(line, column_widths))
    return column_widths


def _columns(rt: ResourceType, request: GetRequest) -> list[Column]:
    wide = request.output == "wide"
    return printers.columns_for(rt, wide=wide, all_namespaces=request.scope.all_namespaces)


def _nothing_found(rt: ResourceType, scope: Scope) -> str:
    if scope.all_namespaces or not rt.namespaced:
        return "No resources found"
    return f"No resources found in {scope.namespace} namespace."


def _follow(
    client: Client, rt: ResourceType, request: GetRequest, resource_version: str | None,
    column_widths: list[int] | None,
) -> None:
    params = {"watch": "1", **_list_params(request)}
    if resource_version:
        params["resourceVersion"] = resource_version
    if len(request.names) == 1:
        params["fieldSelector"] = f"metadata.name={request.names[0]}"
    columns = _columns(rt, request)
    emit = _event_printer(rt, request, columns, column_widths)
    for event in client.stream(rt.path(namespace=request.scope.for_path(rt)), params):
        kind = event.get("type")
        if kind == "ERROR":
            raise errors.from_status(event.get("object") or {})
        if kind != "BOOKMARK":
            emit(event.get("object") or {})


def _event_printer(
    rt: ResourceType, request: GetRequest, columns: list[Column], column_widths: list[int] | None
) -> Callable[[Obj], None]:
    headers = [c.name for c in columns]
    state: dict[str, list[int]] = {"widths": column_widths} if column_widths else {}

    def emit(obj: Obj) -> None:
        if request.output in ("yaml", "json"):
            typer.echo(printers.dump(obj, request.output), nl=False)
            if request.output == "yaml":
                typer.echo("---")
            return
        if request.output == "name":
            typer.echo(printers.object_name(rt, obj))
            return
        cells = printers.row(obj, columns, utcnow())
        if "widths" not in state:  # nothing was listed: the header comes with the first event
            state["widths"] = printers.widths(headers, [cells])
            typer.echo(printers.render_row(headers, state["widths"]))
        typer.echo(printers.render_row(cells, state["widths"]))

    return emit


def describe(client: Client, *, kind: str, names: list[str], scope: Scope) -> None:
    rt = client.discovery.resolve(kind)
    namespace = scope.for_path(rt)
    for index, name in enumerate(names):
        obj = client.get_json(rt.path(namespace=namespace, name=name))
        if index:
            typer.echo("")
        events = _events_for(client, obj, namespace)
        typer.echo(describing.describe(obj, rt, events=events, now=utcnow()), nl=False)


def _events_for(client: Client, obj: Obj, namespace: str | None) -> list[Obj]:
    """Events about ``obj``; filtered here because servers only field-select on metadata."""
    try:
        events_rt = client.discovery.resolve("events.ops.joch.dev")
    except errors.NotFound:
        return []
    ns = (obj.get("metadata") or {}).get("namespace") or namespace
    listing = client.get_json(events_rt.path(namespace=ns))
    related = [e for e in listing.get("items") or [] if describing.involves(e, obj)]
    return sorted(related, key=describing.event_timestamp)


def api_resources(client: Client) -> None:
    headers = ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    rows = [
        [rt.plural, ",".join(rt.short_names), rt.api_version, str(rt.namespaced).lower(), rt.kind]
        for rt in sorted(client.discovery, key=lambda r: (r.group, r.plural))
    ]
    for line in printers.render_table(headers, rows):
        typer.echo(line)
