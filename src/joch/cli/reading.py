"""The read-only commands: ``get`` (list, one object, watch), ``describe`` and ``api-resources``.

Lists go to the server with the selector. ``get approvals`` prints Pending ones first, then the
newest (``PENDING_FIRST``); every other list keeps the server's order. A table (no ``-o``, or
``-o wide``) is the server's Kubernetes ``Table``, its columns and cells decided there from the kind registry (see
``printers``); ``-o yaml|json|name`` read the plain objects. Widths are computed from the whole
response so the columns line up. ``get -w`` prints that table, then follows the watch from the
list's ``resourceVersion`` (so no change between the list and the watch is lost, and none is
printed twice), asking for Table events too, and prints each event's row under the columns of the
first table, padded to its widths. A watch row whose cell is wider than the first table simply
pushes the rest of the line right: kubectl does the same, and the alternative (buffering) would
delay rows a user is waiting for.

Objects are named as kubectl accepts them: ``TYPE[,TYPE...] [NAME...]`` or ``TYPE/NAME
[TYPE/NAME...]`` (``targets``). With names, every object found is printed (one table per type,
names qualified by type when there are several), then an error line for each one that was not,
and the command fails with the first error's exit code, as kubectl does; ``describe`` likewise.

"No resources found" goes to stderr, as in kubectl, so ``joch get ... | wc -l`` counts objects.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from joch.api import columns, errors
from joch.cli import describe as describing
from joch.cli import jsonpaths, namespaces, printers, shaping
from joch.cli.client import Client
from joch.cli.namespaces import Namespace
from joch.cli.resolve import ResourceType

Obj = dict[str, Any]
Target = tuple[str, list[str]]
INVOLVED_UID = "events.joch.dev/involved-uid"  # the label joch.controllers.events writes
Reporter = Callable[[errors.JochError], None]


@dataclass(frozen=True)
class Scope:
    """Which namespace(s) a command reads: ``namespace`` is ignored when ``all_namespaces``."""

    namespace: Namespace
    all_namespaces: bool = False

    def for_path(self, rt: ResourceType) -> str | None:
        return None if self.all_namespaces or not rt.namespaced else self.namespace.name


@dataclass(frozen=True)
class GetRequest:
    targets: list[Target]
    scope: Scope
    output: str | None
    selector: str | None
    watch: bool
    field_selector: str | None = None
    sort_by: str | None = None
    show_labels: bool = False
    show_managed_fields: bool = False

    @functools.cached_property
    def shape(self) -> shaping.Shape | None:
        return shaping.shape(self.output)

    @functools.cached_property
    def sorter(self) -> jsonpaths.Finder | None:
        return shaping.sorter(self.sort_by)

    @property
    def named(self) -> bool:
        return any(names for _, names in self.targets)

    @property
    def spelled(self) -> str:
        return " ".join(word if not names else f"{word} {' '.join(names)}" for word, names in self.targets)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def targets(args: list[str], *, verb: str) -> list[Target]:
    """kubectl's two spellings: ``TYPE[,TYPE...] [NAME...]`` and ``TYPE/NAME [TYPE/NAME...]``."""
    first, rest = args[0], args[1:]
    if "/" not in first:
        slashed = next((a for a in rest if "/" in a), None)
        if slashed is not None:
            raise errors.BadRequest(
                "there is no need to give the resource type as a separate argument when passing arguments in "
                f'TYPE/NAME form: `joch {verb} {slashed}`, not `joch {verb} {first} {slashed}`'
            )
        return [(first, list(rest))]
    out: dict[str, list[str]] = {}
    for arg in args:
        kind, _, name = arg.partition("/")
        if not kind or not name or "/" in name:
            raise errors.BadRequest(
                f'"{arg}" is not TYPE/NAME: once one argument is TYPE/NAME, every argument must be one'
            )
        out.setdefault(kind, []).append(name)
    return list(out.items())


def resolve(client: Client, wanted: list[Target]) -> list[tuple[ResourceType, list[str]]]:
    """Each type once, in the order first named, with every name asked of it."""
    out: dict[ResourceType, list[str]] = {}
    for word, names in wanted:
        for rt in client.discovery.resolve_many(word):
            out.setdefault(rt, []).extend(names)
    return list(out.items())


def get(client: Client, request: GetRequest, *, report: Reporter) -> errors.JochError | None:
    selected = resolve(client, request.targets)
    several = len(selected) > 1 or any("," in word for word, _ in request.targets)
    if request.watch and several:
        raise errors.BadRequest(f"--watch can be used with one resource type only, not {request.spelled!r}")
    if request.named:
        return _get_named(client, selected, request, report=report)
    if several:
        _get_many(client, [rt for rt, _ in selected], request)
    elif request.output in printers.TABLE_OUTPUTS:
        _list_table(client, selected[0][0], request)
    else:
        _list_objects(client, selected[0][0], request)
    return None


def _list_table(client: Client, rt: ResourceType, request: GetRequest) -> None:
    params = {**_list_params(request), **(shaping.SORT_INCLUDE if request.sort_by else {})}
    table = _table(client, rt.path(namespace=request.scope.for_path(rt)), params)
    layout = _layout(rt, table, request)
    rows = [layout.cells(row) for row in shaping.sort_rows(_ordered(rt, table), request.sorter)]
    column_widths = None
    if rows:
        column_widths = printers.widths(layout.headers, rows)
        for line in (layout.headers, *rows):
            typer.echo(printers.render_row(line, column_widths))
    elif not request.watch:
        typer.echo(_nothing_found(rt, request.scope), err=True)
        _hint_other_namespaces(client, [rt], request)
    if request.watch:
        resource_version = (table.get("metadata") or {}).get("resourceVersion")
        _follow(client, rt, request, resource_version, _row_printer(layout, column_widths))


def _list_objects(client: Client, rt: ResourceType, request: GetRequest) -> None:
    """``-o yaml|json|name``: the objects themselves, from the plain JSON routes."""
    listing = client.get_object(rt.path(namespace=request.scope.for_path(rt)), _list_params(request))
    objects = shaping.sort_objects([o for o in listing.get("items") or [] if isinstance(o, dict)], request.sorter)
    shape = request.shape
    if shape is not None:
        if objects or shape.template is not None:
            typer.echo(shape.render(objects, single=False), nl=False)
        elif not request.watch:
            typer.echo(_nothing_found(rt, request.scope), err=True)
    elif request.output == "name":
        for obj in objects:
            typer.echo(printers.object_name(rt, obj))
    elif request.output:
        typer.echo(printers.dump(printers.as_list(objects), request.output), nl=False)
    if request.watch:
        resource_version = (listing.get("metadata") or {}).get("resourceVersion")
        _follow(client, rt, request, resource_version, _object_printer(rt, request, headed=bool(objects)))


def _get_named(
    client: Client, selected: list[tuple[ResourceType, list[str]]], request: GetRequest, *, report: Reporter
) -> errors.JochError | None:
    """The objects found, then one error line per object that was not; the first error's code."""
    failures: list[errors.JochError] = []

    def fetch(rt: ResourceType, name: str, accept: str | None) -> Obj | None:
        try:
            return client.get_object(rt.path(namespace=request.scope.for_path(rt), name=name), accept=accept)
        except errors.ServiceUnavailable:
            raise
        except errors.JochError as exc:
            failures.append(namespaces.noted(exc, request.scope.namespace))
            return None

    follow: Callable[[Obj], None] | None = None
    if request.output in printers.TABLE_OUTPUTS:
        printed = 0
        for rt, names in selected:
            found = [t for t in (fetch(rt, n, printers.TABLE_ACCEPT) for n in names) if t is not None]
            if not found:
                continue
            tables = [printers.as_table(t, utcnow()) for t in found]
            layout = _layout(rt, tables[0], request)
            rows = [layout.cells(row) for table in tables for row in table.get("rows") or []]
            if len(selected) > 1:
                for row in rows:
                    row[layout.name_at] = f"{rt.qualified_kind}/{row[layout.name_at]}"
            column_widths = printers.widths(layout.headers, rows)
            if printed:
                typer.echo("")
            printed += 1
            for line in (layout.headers, *rows):
                typer.echo(printers.render_row(line, column_widths))
            follow = _row_printer(layout, column_widths)
    else:
        objects = [(rt, obj) for rt, names in selected for obj in (fetch(rt, n, None) for n in names) if obj]
        shape = request.shape
        if shape is not None and objects:
            asked = sum(len(names) for _, names in selected)
            typer.echo(shape.render([obj for _, obj in objects], single=asked == 1), nl=False)
        elif request.output == "name":
            for rt, obj in objects:
                typer.echo(printers.object_name(rt, obj))
        elif objects:
            asked = sum(len(names) for _, names in selected)
            shown = objects[0][1] if asked == 1 else printers.as_list([obj for _, obj in objects])
            typer.echo(printers.dump(shown, request.output or "yaml", show_managed_fields=request.show_managed_fields),
                       nl=False)
        if selected:
            follow = _object_printer(selected[0][0], request, headed=bool(objects))
    for failure in failures:
        report(failure)
    if failures:
        return failures[0]
    if request.watch and follow is not None:
        _follow(client, selected[0][0], request, None, follow, names=selected[0][1])
    return None


def _get_many(client: Client, types: list[ResourceType], request: GetRequest) -> None:
    """``get agents,ap`` and ``get all``: one table per type that has objects, as kubectl prints
    them, with names qualified by type (``agent.joch.dev/demo``)."""
    if request.output not in printers.TABLE_OUTPUTS:
        listed = [(rt, client.get_object(rt.path(namespace=request.scope.for_path(rt)), _list_params(request)))
                  for rt in types]
        if request.output == "name":
            for rt, listing in listed:
                for obj in listing.get("items") or []:
                    typer.echo(printers.object_name(rt, obj))
            return
        everything = shaping.sort_objects([obj for _, listing in listed for obj in listing.get("items") or []],
                                          request.sorter)
        shape = request.shape
        if shape is not None:
            typer.echo(shape.render(everything, single=False), nl=False)
            return
        typer.echo(printers.dump(printers.as_list(everything), request.output or "yaml",
                                  show_managed_fields=request.show_managed_fields), nl=False)
        return
    printed = 0
    for rt in types:
        params = {**_list_params(request), **(shaping.SORT_INCLUDE if request.sort_by else {})}
        table = _table(client, rt.path(namespace=request.scope.for_path(rt)), params)
        if not table.get("rows"):
            continue
        layout = _layout(rt, table, request)
        rows = [layout.cells(row) for row in shaping.sort_rows(list(table["rows"]), request.sorter)]
        for row in rows:
            row[layout.name_at] = f"{rt.qualified_kind}/{row[layout.name_at]}"
        if printed:
            typer.echo("")
        printed += 1
        for line in printers.render_table(layout.headers, rows):
            typer.echo(line)
    if not printed:
        typer.echo(_nothing_found(types[0], request.scope), err=True)
        _hint_other_namespaces(client, types, request)


PENDING_FIRST = frozenset({("runtime.joch.dev", "Approval")})
"""Kinds whose lists show what waits for someone first: Pending ones, then the newest."""


def _ordered(rt: ResourceType, table: printers.Table) -> list[printers.Row]:
    """The table's rows in the order to print them: as the server listed them (by name), except
    for ``PENDING_FIRST`` kinds (``joch get approvals``: what needs a decision on top)."""
    rows: list[printers.Row] = list(table.get("rows") or [])
    if (rt.group, rt.kind) not in PENDING_FIRST:
        return rows
    names = [str(d.get("name", "")).upper() for d in table.get("columnDefinitions") or []]
    at = names.index("PHASE") if "PHASE" in names else None

    def waiting(row: printers.Row) -> bool:
        cells = row.get("cells") or []
        return at is None or at >= len(cells) or cells[at] in (None, "", columns.NONE, "Pending")

    def created(row: printers.Row) -> str:
        obj = row.get("object")
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        stamp = metadata.get("creationTimestamp") if isinstance(metadata, dict) else None
        return stamp if isinstance(stamp, str) else ""

    rows.sort(key=created, reverse=True)  # newest first (RFC 3339 UTC strings sort as times) ...
    rows.sort(key=lambda row: not waiting(row))  # ... and, stably, Pending before the rest
    return rows


def _table(client: Client, path: str, params: dict[str, str] | None = None) -> printers.Table:
    return printers.as_table(client.get_object(path, params, accept=printers.TABLE_ACCEPT), utcnow())


def _layout(rt: ResourceType, table: printers.Table, request: GetRequest) -> printers.Layout:
    layout = printers.layout(table.get("columnDefinitions") or [], wide=request.output == "wide",
                             namespace=request.scope.all_namespaces and rt.namespaced)
    return shaping.with_labels(layout) if request.show_labels else layout


def _list_params(request: GetRequest) -> dict[str, str]:
    params = {"labelSelector": request.selector} if request.selector else {}
    return {**params, "fieldSelector": request.field_selector} if request.field_selector else params


def _nothing_found(rt: ResourceType, scope: Scope) -> str:
    if scope.all_namespaces or not rt.namespaced:
        return "No resources found"
    return f"No resources found in {scope.namespace.name} namespace{scope.namespace.origin}."


def _hint_other_namespaces(client: Client, types: list[ResourceType], request: GetRequest) -> None:
    """After "No resources found in NS namespace", say which other namespaces have some: the
    controllers' Lease lives in joch-system, and a new user looking for it in default should
    not conclude there is none. kubectl stops at the first line; one more request, made only
    when the answer was empty, is cheap."""
    namespaced = [rt for rt in types if rt.namespaced]
    if request.scope.all_namespaces or not namespaced:
        return
    found: set[str] = set()
    for rt in namespaced:
        listing = client.get_object(rt.path(namespace=None), {**_list_params(request), "limit": "500"})
        found.update(str((o.get("metadata") or {}).get("namespace")) for o in listing.get("items") or []
                     if isinstance(o, dict))
    found.discard(request.scope.namespace.name)
    if not found:
        return
    names = sorted(found)
    where = f"namespace {names[0]}" if len(names) == 1 else f"namespaces {', '.join(names)}"
    flag = f"-n {names[0]}" if len(names) == 1 else "-n NAMESPACE"
    typer.echo(f"Some exist in {where}: add {flag}, or -A for all namespaces.", err=True)


def _follow(
    client: Client, rt: ResourceType, request: GetRequest, resource_version: str | None,
    emit: Callable[[Obj], None], *, names: list[str] | None = None,
) -> None:
    params = {"watch": "1", **_list_params(request)}
    if resource_version:
        params["resourceVersion"] = resource_version
    if names and len(names) == 1:
        params["fieldSelector"] = f"metadata.name={names[0]}"
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


def _object_printer(rt: ResourceType, request: GetRequest, *, headed: bool = False) -> Callable[[Obj], None]:
    shape = request.shape
    printed = [True] if headed else []

    def emit(obj: Obj) -> None:
        if shape is not None:
            typer.echo(shape.render_one(obj, header=not printed), nl=False)
            printed.append(True)
            return
        if request.output == "name":
            typer.echo(printers.object_name(rt, obj))
            return
        typer.echo(printers.dump(obj, request.output or "yaml", show_managed_fields=request.show_managed_fields),
                   nl=False)
        if request.output == "yaml":
            typer.echo("---")

    return emit


def describe(client: Client, wanted: list[Target], *, scope: Scope, report: Reporter) -> errors.JochError | None:
    """Each object's page; then an error line per object not found, as for ``get``."""
    failures: list[errors.JochError] = []
    printed = 0
    for rt, names in resolve(client, wanted):
        namespace = scope.for_path(rt)
        for name in names:
            try:
                obj = client.get_object(rt.path(namespace=namespace, name=name))
            except errors.ServiceUnavailable:
                raise
            except errors.JochError as exc:
                failures.append(namespaces.noted(exc, scope.namespace))
                continue
            if printed:
                typer.echo("")
            printed += 1
            events = _events_for(client, obj, namespace)
            typer.echo(describing.describe(obj, rt, events=events, now=utcnow()), nl=False)
    for failure in failures:
        report(failure)
    return failures[0] if failures else None


def _events_for(client: Client, obj: Obj, namespace: str | None) -> list[Obj]:
    """Events about ``obj``. Joch's controllers label each Event with its object's uid
    (``joch.controllers.events.INVOLVED_UID``), so one label-selected list finds them; an object
    with none of those falls back to matching every Event's ``spec.involvedObject`` here (Events
    written by hand or by other tools; servers field-select on metadata only)."""
    try:
        events_rt = client.discovery.resolve("events.ops.joch.dev")
    except errors.NotFound:
        return []
    meta = obj.get("metadata") or {}
    path = events_rt.path(namespace=meta.get("namespace") or namespace)
    related: list[Obj] = []
    if meta.get("uid"):
        labelled = client.get_object(path, {"labelSelector": f"{INVOLVED_UID}={meta['uid']}"})
        related = [e for e in labelled.get("items") or [] if describing.involves(e, obj)]
    if not related:
        listing = client.get_object(path)
        related = [e for e in listing.get("items") or [] if describing.involves(e, obj)]
    return sorted(related, key=describing.event_order)


def api_resources(client: Client) -> None:
    headers = ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    rows = [
        [rt.plural, ",".join(rt.short_names), rt.api_version, str(rt.namespaced).lower(), rt.kind]
        for rt in sorted(client.discovery, key=lambda r: (r.group, r.plural))
    ]
    for line in printers.render_table(headers, rows):
        typer.echo(line)
