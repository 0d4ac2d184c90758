"""The writing commands: ``apply``, ``create`` and ``delete``.

``apply`` and ``create`` send every document of every ``-f`` in one request (``POST
/v1/resources/apply`` or ``/v1/resources/create``) so the server writes them atomically: all or
none. ``create`` differs only in that an existing object is an error and ``metadata.generateName``
is honoured. When the server rejects the batch, its ``Status`` names documents by their index in
the joined stream (``documents[7]``, possibly with the server's own label after it); ``_locate``
rewrites every such reference, in the message and in each cause, to the document's label in its
own file (see ``manifests``), e.g.
``documents[3] (Agent/broken in bad.yaml:20): spec.providerRef.name: required field is missing``.

``delete -f`` and ``delete KIND NAME...`` go on after a failure, as kubectl does, and fail at the
end with the first failure's exit code. An object with finalizers is only marked for deletion;
that is what is printed then, with the finalizers it waits on.

Namespaces (see ``namespaces``): an explicit ``-n`` is checked here against the documents (the
message names ``-n``) and sent as the endpoint's ``namespace`` parameter, which gives it to
documents that set none. ``JOCH_NAMESPACE`` is a default: documents naming a namespace keep it.
It is sent the same way when no document names another namespace (the usual case); otherwise the
parameter would reject those, so it is written into the text of the documents that name none
(``manifests.with_namespace``) and the batch is sent without it.

Warnings are printed from the result's items, prefixed with the object they are about (the
``Warning`` headers carry the same text unprefixed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import typer

from joch.api import errors
from joch.cli import manifests, namespaces, printers
from joch.cli.client import Client
from joch.cli.manifests import Bundle, Document
from joch.cli.namespaces import Namespace
from joch.cli.resolve import ResourceType

Obj = dict[str, Any]
APPLY_PATH = "/v1/resources/apply"
CREATE_PATH = "/v1/resources/create"
# A server reference to document i of the stream, with the server's own label if it added one.
# "request body: " is the server's name for the stream; the label that replaces it names the file.
_REFERENCE = re.compile(r"(?:request body: )?documents\[(\d+)\](?:\.items\[(\d+)\])?(?: \([^()]*\))?")


def check_namespaces(docs: list[Document], namespace: Namespace) -> None:
    """An explicit ``-n`` and a document naming another namespace contradict each other."""
    if not namespace.explicit:
        return
    for doc in docs:
        current = _named_namespace(doc)
        if current and current != namespace.name:
            raise errors.BadRequest(namespaces.mismatch(doc.label, current, namespace))


def _named_namespace(doc: Document) -> str:
    named = _metadata(doc).get("namespace")
    return str(named) if named else ""


def _metadata(doc: Document) -> dict[str, Any]:
    meta = doc.obj.get("metadata") if isinstance(doc.obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def apply(
    client: Client, sources: list[manifests.Source], *, namespace: Namespace, dry_run: bool, output: str | None,
    warn: Callable[[str], None], create: bool = False,
) -> None:
    """``apply``, or with ``create`` the create-only batch; the two share everything else."""
    bundle = Bundle(sources)
    if bundle.count == 0:
        raise errors.BadRequest(f"no objects passed to {'create' if create else 'apply'}")
    bundle, params = _in_namespace(client, bundle, sources, namespace)
    if dry_run:
        params["dryRun"] = "All"
    path = CREATE_PATH if create else APPLY_PATH
    try:
        result = client.request(
            "POST", path, params=params, content=bundle.text, content_type="application/yaml", warnings=False,
        ) or {}
    except errors.JochError as exc:
        raise _locate(exc, bundle) from None
    if not isinstance(result, dict):
        raise client.not_joch(f"POST {path} answered JSON that is not an ApplyResult")
    for item in result.get("items") or []:
        for text in item.get("warnings") or []:
            warn(f"{_qualified_kind(item)}/{item.get('name', '')}: {text}")
    _print_apply_result(client, result, output=output, dry_run=dry_run)


def _in_namespace(
    client: Client, bundle: Bundle, sources: list[manifests.Source], namespace: Namespace
) -> tuple[Bundle, dict[str, str]]:
    """The batch to send, and the request parameters that carry the namespace, if any."""
    if namespace.source == namespaces.DEFAULT:
        return bundle, {}
    docs = bundle.documents()
    check_namespaces(docs, namespace)
    others = [d for d in docs if _named_namespace(d) not in ("", namespace.name)]
    if namespace.explicit or not others:
        return bundle, {"namespace": namespace.name}

    def namespaced(api_version: str, kind: str) -> bool | None:
        try:
            return client.discovery.for_object(api_version, kind).namespaced
        except errors.NotFound:
            return None  # the server names the unknown kind itself

    why = f"from {namespaces.ENV}"
    return Bundle([manifests.with_namespace(s, namespace.name, namespaced, why=why) for s in sources]), {}


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
    return client.get_object(rt.path(namespace=item.get("namespace"), name=str(item.get("name"))))


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


Reporter = Callable[[errors.JochError], None]


def delete_documents(
    client: Client, docs: list[Document], *, namespace: Namespace, ignore_not_found: bool, report: Reporter
) -> errors.JochError | None:
    first: errors.JochError | None = None
    for doc in docs:
        try:
            rt, in_namespace = _target(client, doc, namespace)
            name = _metadata(doc).get("name")
            if not name or not isinstance(name, str):
                raise errors.BadRequest("metadata.name is required to delete an object")
            _delete_one(client, rt, in_namespace, name, ignore_not_found=ignore_not_found)
        except errors.ServiceUnavailable:
            raise
        except errors.JochError as exc:
            failure = _prefixed(exc, doc.label)
            report(failure)
            first = first or failure
    return first


def delete_names(
    client: Client, targets: list[tuple[ResourceType, list[str]]], *, namespace: Namespace,
    ignore_not_found: bool, report: Reporter,
) -> errors.JochError | None:
    first: errors.JochError | None = None
    for rt, names in targets:
        for name in names:
            try:
                _delete_one(client, rt, namespace.name if rt.namespaced else None, name,
                            ignore_not_found=ignore_not_found)
            except errors.ServiceUnavailable:
                raise
            except errors.JochError as exc:
                failure = namespaces.noted(exc, namespace)
                report(failure)
                first = first or failure
    return first


def _delete_one(
    client: Client, rt: ResourceType, namespace: str | None, name: str, *, ignore_not_found: bool
) -> None:
    try:
        answer = client.request("DELETE", rt.path(namespace=namespace, name=name))
    except errors.NotFound:
        if ignore_not_found:
            return
        raise
    typer.echo(f'{rt.qualified_kind} "{name}" {deletion(answer)}')


def deletion(answer: Any) -> str:
    """``deleted``, or ``marked for deletion (...)`` when the server answered an object that still
    waits on finalizers (a deleted object comes back without them, or a ``Status`` comes back)."""
    meta = answer.get("metadata") if isinstance(answer, dict) else None
    finalizers = meta.get("finalizers") if isinstance(meta, dict) else None
    if isinstance(meta, dict) and meta.get("deletionTimestamp") and finalizers:
        return f"marked for deletion (waiting on finalizers: {', '.join(map(str, finalizers))})"
    return "deleted"


def _target(client: Client, doc: Document, namespace: Namespace) -> tuple[ResourceType, str | None]:
    rt = client.discovery.for_object(str(doc.obj.get("apiVersion", "")), doc.kind)
    if not rt.namespaced:
        return rt, None
    return rt, _named_namespace(doc) or namespace.name


def _prefixed(exc: errors.JochError, label: str) -> errors.JochError:
    """The error, naming the document it is about (not when the server could not be reached)."""
    if isinstance(exc, errors.ServiceUnavailable):
        return exc
    message = f"{label}: {exc.message}"
    return type(exc)(message, kind=exc.kind, name=exc.name, causes=exc.causes, extra=exc.extra)
