"""The writing commands: ``apply``, ``create`` and ``delete``.

``apply`` sends every document of every ``-f`` in one ``POST /v1/resources/apply`` so the server
applies them atomically: all are written or none is. When the server rejects the batch, its
``Status`` names documents by their index in the joined stream (``documents[7]``, possibly with
the server's own label after it); ``_locate`` rewrites every such reference, in the message and in
each cause, to the document's label in its own file (see ``manifests``), e.g.
``documents[3] (Agent/broken in bad.yaml:20): spec.providerRef.name: required field is missing``.

``create`` uses the ordinary ``POST`` to each document's collection (so ``metadata.generateName``
works as in Kubernetes) and is therefore *not* atomic: it stops at the first error, and the
objects created before it stay. ``delete -f`` and ``delete KIND NAME...`` go on after a failure, as
kubectl does, and fail at the end with the first failure's exit code.

An explicit ``-n`` (or ``JOCH_NAMESPACE``) is sent as the apply endpoint's ``namespace``
parameter: the server gives it to documents that set no namespace, and rejects a document naming
a different one, as kubectl does, rather than silently moving it. The files go to the server as
written. ``create`` and ``delete -f`` make that check here (``check_namespaces``).

Warnings are printed from the result's items, prefixed with the object they are about (the
``Warning`` headers carry the same text unprefixed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import typer

from joch.api import errors
from joch.cli import manifests, printers
from joch.cli.client import Client
from joch.cli.manifests import Bundle, Document
from joch.cli.resolve import ResourceType

Obj = dict[str, Any]
APPLY_PATH = "/v1/resources/apply"
# A server reference to document i of the stream, with the server's own label if it added one.
_REFERENCE = re.compile(r"documents\[(\d+)\](?:\.items\[(\d+)\])?(?: \([^()]*\))?")


def check_namespaces(docs: list[Document], namespace: str | None) -> None:
    if namespace is None:
        return
    for doc in docs:
        meta = doc.obj.get("metadata") if isinstance(doc.obj, dict) else None
        current = meta.get("namespace") if isinstance(meta, dict) else None
        if current and current != namespace:
            raise errors.BadRequest(
                f'{doc.label}: the namespace from the provided object "{current}" does not match the '
                f'namespace "{namespace}"; pass --namespace={current} or remove metadata.namespace'
            )


def apply(
    client: Client, sources: list[manifests.Source], *, namespace: str | None, dry_run: bool, output: str | None,
    warn: Callable[[str], None],
) -> None:
    bundle = Bundle(sources)
    if bundle.count == 0:
        raise errors.BadRequest("no objects passed to apply")
    params = {"dryRun": "All"} if dry_run else {}
    if namespace is not None:
        params["namespace"] = namespace
    try:
        result = client.request(
            "POST", APPLY_PATH, params=params, content=bundle.text, content_type="application/yaml",
            warnings=False,
        ) or {}
    except errors.JochError as exc:
        raise _locate(exc, bundle) from None
    for item in result.get("items") or []:
        for text in item.get("warnings") or []:
            warn(f"{_qualified_kind(item)}/{item.get('name', '')}: {text}")
    _print_apply_result(client, result, output=output, dry_run=dry_run)


def _print_apply_result(client: Client, result: Obj, *, output: str | None, dry_run: bool) -> None:
    items: list[Obj] = list(result.get("items") or [])
    if output == "name":
        for item in items:
            typer.echo(f"{_qualified_kind(item)}/{item.get('name', '')}")
    elif output in ("yaml", "json"):
        objects = [item["object"] if "object" in item else _fetch(client, item, dry_run) for item in items]
        shown = objects[0] if len(objects) == 1 else printers.as_list(objects)
        typer.echo(printers.dump(shown, output), nl=False)
    else:
        for line in result.get("lines") or [_line(item, dry_run) for item in items]:
            typer.echo(line)


def _fetch(client: Client, item: Obj, dry_run: bool) -> Obj:
    if dry_run:
        return item  # nothing was stored; the result entry is all there is to show
    rt = client.discovery.for_object(str(item.get("apiVersion")), str(item.get("kind")))
    return dict(client.get_json(rt.path(namespace=item.get("namespace"), name=str(item.get("name")))))


def _qualified_kind(item: Obj) -> str:
    group, _, _ = str(item.get("apiVersion", "")).rpartition("/")
    kind = str(item.get("kind", "")).lower()
    return f"{kind}.{group}" if group else kind


def _line(item: Obj, dry_run: bool) -> str:
    suffix = " (server dry run)" if dry_run else ""
    return f"{_qualified_kind(item)}/{item.get('name', '')} {item.get('action', 'configured')}{suffix}"


def _locate(exc: errors.JochError, bundle: Bundle) -> errors.JochError:
    causes = [
        errors.Cause(field=_relabel(c.field, bundle), message=_relabel(c.message, bundle), reason=c.reason)
        for c in exc.causes
    ]
    return type(exc)(_relabel(exc.message, bundle), kind=exc.kind, name=exc.name, causes=causes, extra=exc.extra)


def _relabel(text: str, bundle: Bundle) -> str:
    def replace(match: re.Match[str]) -> str:
        item = int(match.group(2)) if match.group(2) is not None else None
        doc = bundle.document(int(match.group(1)), item)
        return doc.label if doc is not None else match.group(0)

    return _REFERENCE.sub(replace, text)


def create(client: Client, docs: list[Document], *, default_namespace: str) -> None:
    if not docs:
        raise errors.BadRequest("no objects passed to create")
    for doc in docs:
        try:
            rt, namespace = _target(client, doc, default_namespace)
            created = client.request("POST", rt.path(namespace=namespace), json_body=doc.obj)
        except errors.JochError as exc:
            raise _prefixed(exc, doc.label) from None
        typer.echo(f"{printers.object_name(rt, created)} created")


Reporter = Callable[[errors.JochError], None]


def delete_documents(
    client: Client, docs: list[Document], *, default_namespace: str, ignore_not_found: bool, report: Reporter
) -> errors.JochError | None:
    first: errors.JochError | None = None
    for doc in docs:
        try:
            rt, namespace = _target(client, doc, default_namespace)
            _delete_one(client, rt, namespace, doc.name, ignore_not_found=ignore_not_found)
        except errors.JochError as exc:
            failure = _prefixed(exc, doc.label)
            report(failure)
            first = first or failure
    return first


def delete_names(
    client: Client, rt: ResourceType, names: list[str], *, namespace: str | None, ignore_not_found: bool,
    report: Reporter,
) -> errors.JochError | None:
    first: errors.JochError | None = None
    for name in names:
        try:
            _delete_one(client, rt, namespace, name, ignore_not_found=ignore_not_found)
        except errors.JochError as exc:
            report(exc)
            first = first or exc
    return first


def _delete_one(
    client: Client, rt: ResourceType, namespace: str | None, name: str, *, ignore_not_found: bool
) -> None:
    try:
        client.request("DELETE", rt.path(namespace=namespace, name=name))
    except errors.NotFound:
        if ignore_not_found:
            return
        raise
    typer.echo(f'{rt.qualified_kind} "{name}" deleted')


def _target(client: Client, doc: Document, default_namespace: str) -> tuple[ResourceType, str | None]:
    rt = client.discovery.for_object(str(doc.obj.get("apiVersion", "")), doc.kind)
    if not rt.namespaced:
        return rt, None
    meta = doc.obj.setdefault("metadata", {})
    namespace = str(meta.get("namespace") or default_namespace)
    meta["namespace"] = namespace
    return rt, namespace


def _prefixed(exc: errors.JochError, label: str) -> errors.JochError:
    """The error, naming the document it is about (not when the server could not be reached)."""
    if isinstance(exc, errors.ServiceUnavailable):
        return exc
    message = f"{label}: {exc.message}"
    return type(exc)(message, kind=exc.kind, name=exc.name, causes=exc.causes, extra=exc.extra)
