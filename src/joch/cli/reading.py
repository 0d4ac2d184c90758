"""The read-only commands: ``get`` (list, one object, watch), ``describe`` and ``api-resources``.

Lists go to the server with the selector. A table (no ``-o``, or ``-o wide``) is the server's
Kubernetes ``Table``, its columns and cells decided there from the kind registry (see
``printers``); ``-o yaml|json|name`` read the plain objects. Widths are computed from the whole
response so the columns line up. ``get -w`` prints that table, then follows the watch from the
list's ``resourceVersion`` (so no change between the list and the watch is lost, and none is
printed twice), asking for Table events too, and prints each event's row under the columns of the
first table, padded to its widths. A watch row whose cell is wider than the first table simply
pushes the rest of the line right: kubectl does the same, and the alternative (buffering) would
delay rows a user is waiting for.

"No resources found" goes to stderr, as in kubectl, so ``joch get ... | wc -l`` counts objects.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from joch.api import errors
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
    elif request.output in printers.TABLE_OUTPUTS:
        _get_table(client, types[0], request)
    else:
        _get_objects(client, types[0], request)


def _get_table(client: Client, rt: ResourceType, request: GetRequest) -> None:
    namespace = request.scope.for_path(rt)
    if request.names:
        tables = [_table(client, rt.path(namespace=namespace, name=n)) for n in request.names]
        resource_version = None
    else:
        tables = [_table(client, rt.path(namespace=namespace), _list_params(request))]
        resource_version = (tables[0].get("metadata") or {}).get("resourceVersion")
    layout = _layout(rt, tables[0], request)
    rows = [layout.cells(row) for table in tables for row in table.get("rows") or []]
    column_widths = None
    if rows:
        column_widths = printers.widths(layout.headers, rows)
        for line in (layout.headers, *rows):
            typer.echo(printers.render_row(line, column_widths))
    elif not request.watch:
        typer.echo(_nothing_found(rt, request.scope), err=True)
    if request.watch:
        _follow(client, rt, request, resource_version, _row_printer(layout, column_widths))


def _get_objects(client: Client, rt: ResourceType, request: GetRequest) -> None:
    """``-o yaml|json|name``: the objects themselves, from the plain JSON routes."""
    namespace = request.scope.for_path(rt)
    if request.names:
        objects = [client.get_json(rt.path(namespace=namespace, name=n)) for n in request.names]
        resource_version = None
    else:
        listing = client.get_json(rt.path(namespace=namespace), _list_params(request))
        objects = list(listing.get("items") or [])
        resource_version = (listing.get("metadata") or {}).get("resourceVersion")
    if request.output == "name":
        for obj in objects:
            typer.echo(printers.object_name(rt, obj))
    elif request.output:
        shown = objects[0] if len(request.names) == 1 else printers.as_list(objects)
        typer.echo(printers.dump(shown, request.output), nl=False)
    if request.watch:
        _follow(client, rt, request, resource_version, _object_printer(rt, request))


def _get_many(client: Client, types: list[ResourceType], request: GetRequest) -> None:
    """``get agents,ap`` and ``get all``: one table per type that has objects, as kubectl prints
    them, with names qualified by type (``agent.joch.dev/demo``)."""
    if request.names or request.watch:
        what = "names" if request.names else "--watch"
        raise errors.BadRequest(f"{what} can be used with one resource type only, not {request.kind!r}")
    if request.output not in printers.TABLE_OUTPUTS:
        listed = [(rt, client.get_json(rt.path(namespace=request.scope.for_path(rt)), _list_params(request)))
                  for rt in types]
        if request.output == "name":
            for rt, listing in listed:
                for obj in listing.get("items") or []:
                    typer.echo(printers.object_name(rt, obj))
            return
        everything = [obj for _, listing in listed for obj in listing.get("items") or []]
        typer.echo(printers.dump(printers.as_list(everything), request.output or "yaml"), nl=False)
        return
    printed = 0
    for rt in types:
        table = _table(client, rt.path(namespace=request.scope.for_path(rt)), _list_params(request))
        if not table.get("rows"):
            continue
        layout = _layout(rt, table, request)
        rows = [layout.cells(row) for row in table["rows"]]
        for row in rows:
            row[layout.name_at] = f"{rt.qualified_kind}/{row[layout.name_at]}"
        if printed:
            typer.echo("")
        printed += 1
        for line in printers.render_table(layout.headers, rows):
            typer.echo(line)
    if not printed:
        typer.echo(_nothing_found(types[0], request.scope), err=True)


def _table(client: Client, path: str, params: dict[str, str] | None = None) -> printers.Table:
    return printers.as_table(client.get_json(path, params, accept=printers.TABLE_ACCEPT), utcnow())


def _layout(rt: ResourceType, table: printers.Table, request: GetRequest) -> printers.Layout:
    return printers.layout(table.get("columnDefinitions") or [], wide=request.output == "wide",
                           namespace=request.scope.all_namespaces and rt.namespaced)


def _list_params(request: GetRequest) -> dict[str, str]:
    return {"labelSelector": request.selector} if request.selector else {}


def _nothing_found(rt: ResourceType, scope: Scope) -> str:
    if scope.all_namespaces or not rt.namespaced:
        return "No resources found"
    return f"No resources found in {scope.namespace} namespace."


def _follow(
    client: Client, rt: ResourceType, request: GetRequest, resource_version: str | None,
    emit: Callable[[Obj], None],
) -> None:
    params = {"watch": "1", **_list_params(request)}
    if resource_version:
        params["resourceVersion"] = resource_version
    if len(request.names) == 1:
        params["fieldSelector"] = f"metadata.name={request.names[0]}"
    accept = printers.TABLE_ACCEPT if request.output in printers.TABLE_OUTPUTS else None
    for event in client.stream(rt.path(namespace=request.scope.for_path(rt)), params, accept=accept):
        kind = event.get("type")
        if kind == "ERROR":
            raise errors.from_status(event.get("object") or {})
        if kind != "BOOKMARK":
            emit(event.get("object") or {})


def _row_printer(layout: printers.Layout, column_widths: list[int] | None) -> Callable[[Obj], None]:
    """Prints the rows of each watch event's Table under the columns of the first table (the
    server sends the definitions with its first event only, as the apiserver does)."""
    state: dict[str, list[int]] = {"widths": column_widths} if column_widths else {}

    def emit(obj: Obj) -> None:
        for row in printers.as_table(obj, utcnow()).get("rows") or []:
            cells = layout.cells(row)
            if "widths" not in state:  # nothing was listed: the header comes with the first event
                state["widths"] = printers.widths(layout.headers, [cells])
                typer.echo(printers.render_row(layout.headers, state["widths"]))
            typer.echo(printers.render_row(cells, state["widths"]))

    return emit


def _object_printer(rt: ResourceType, request: GetRequest) -> Callable[[Obj], None]:
    def emit(obj: Obj) -> None:
        if request.output == "name":
            typer.echo(printers.object_name(rt, obj))
            return
        typer.echo(printers.dump(obj, request.output or "yaml"), nl=False)
        if request.output == "yaml":
            typer.echo("---")

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
