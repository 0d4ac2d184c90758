"""The Kubernetes REST routes of every registered kind, generated from its ``KindInfo``.

For a namespaced kind ``K`` (``group/version``, plural ``ks``)::

    GET            /apis/group/version/ks                           list or watch, all namespaces
    GET, POST, DELETE  /apis/group/version/namespaces/{namespace}/ks   (DELETE: deletecollection)
    GET, PUT, PATCH, DELETE  .../namespaces/{namespace}/ks/{name}
    GET, PUT, PATCH          .../namespaces/{namespace}/ks/{name}/status

and the same without ``namespaces/{namespace}`` for a cluster-scoped kind. Each route is added
with literal group, version and plural and real path parameters, so ``/openapi.json`` documents
every kind with its own schema, and adding a kind to the registry adds its routes.

Handlers are sync: FastAPI runs them in its threadpool, where blocking on the store is fine. The
body is read beforehand by an async dependency (``wire.body_reader``). Writes go through
admission (validation, defaulting, references, policy); reads and deletes go to the store.

Wire rules, as the apiserver applies them: POST answers 201, everything else 200; admission
warnings become ``Warning: 299`` headers; a namespace in the path that is not a DNS-1123 label is
a 400 naming the rule (before any handler runs); a body whose namespace, name, apiVersion or kind
disagrees with the URL is a 400 (admission checks it, and fills in what the body leaves out or
leaves empty); a ``metadata.uid`` or ``metadata.resourceVersion`` in a PUT body is a precondition
(409 when stale), and a ``resourceVersion`` that is not a decimal revision is a 422;
DELETE answers the object (with ``deletionTimestamp`` when finalizers hold it back); the status
subresource changes only ``status`` and the main resource never does. ``PATCH .../status``
merges the patch into the stored object and writes its status, retrying on a conflict unless the
patch itself named a ``resourceVersion`` precondition. GET (list, watch, read) answers a Kubernetes
``Table`` instead when the ``Accept`` header asks for one (``tables``), which is how ``kubectl get``
prints Joch's columns.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Path
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

from joch.admission import apply as admission
from joch.admission import json_patch, merge
from joch.api import errors
from joch.api.meta import now
from joch.api.namespaces import collection_deletable
from joch.api.registry import KindInfo
from joch.server import apply, limits, params, tables, watch, wire
from joch.server import errors as server_errors
from joch.server.options import ServerOptions
from joch.server.schemas import KindSchemas
from joch.store.base import ListResult, Obj, Store

ContentType = Annotated[str | None, Header(alias="content-type", include_in_schema=False)]
Scope = Callable[..., Awaitable[str | None]]
FIELDS = Depends(apply.field_management)  # fieldManager, force, User-Agent (joch.server.apply)
STATUS_PATCH_ATTEMPTS = 5
JSON_PATCH = "application/json-patch+json"


def json_patch_pins(patched: Obj, current: Obj) -> bool:
    """Whether a patch changed ``metadata.resourceVersion``: it then names a precondition."""
    wanted = (patched.get("metadata") or {}).get("resourceVersion")
    return bool(wanted) and wanted != current["metadata"].get("resourceVersion")


def require_patch_type(content_type: str | None) -> None:
    kind = wire.media_type(content_type)
    if kind != wire.MERGE_PATCH:
        raise errors.UnsupportedMediaType(
            f"the patch type {kind or '(none)'!r} is not supported: send a JSON merge patch "
            f"(Content-Type: {wire.MERGE_PATCH}), a JSON patch (Content-Type: {JSON_PATCH}) or a "
            f"server-side apply patch (Content-Type: application/apply-patch+yaml)"
        )


def list_body(kind: KindInfo, result: ListResult) -> dict[str, Any]:
    return {"kind": f"{kind.kind}List", "apiVersion": kind.api_version, "metadata": tables.list_metadata(result),
            "items": result.items}


class KindHandlers:
    """What each verb does for one kind; the route functions only unpack the request."""

    def __init__(
        self, kind: KindInfo, store: Store, options: ServerOptions, slots: limits.WatchSlots | None = None,
    ) -> None:
        self.kind = kind
        self.store = store
        self.options = options
        self.slots = slots or limits.WatchSlots(options.max_watches or limits.default_max_watches())
        self.tables = tables.KindTables(kind)

    def list(
        self, namespace: str | None, *, labels: str | None, fields: str | None, limit: int | None,
        token: str | None, resource_version: str | None, watching: bool, timeout: int | None,
        bookmarks: bool, table: tables.TableRequest | None = None, send_initial: bool | None = None,
        match: str | None = None,
    ) -> Response:
        if watching:
            options = params.watch_options(namespace, labels, fields, resource_version, bookmarks)
            transform = self.tables.watch_transform(table) if table else None
            if send_initial is not None:
                watch.check_watch_list(send_initial, match, bookmarks)
                return watch.respond_list(self.store, self.kind, options, send_initial=send_initial,
                                          timeout_seconds=timeout, options=self.options, slots=self.slots,
                                          transform=transform)
            return watch.respond(self.store, self.kind, options, timeout_seconds=timeout,
                                 options=self.options, slots=self.slots, transform=transform)
        result = self.store.list(self.kind, params.list_options(namespace, labels, fields, limit, token))
        if table:
            return wire.json_response(self.tables.for_list(result, table))
        return wire.json_response(list_body(self.kind, result))

    def create(
        self, namespace: str | None, body: bytes, content_type: str | None, dry_run: bool,
        fields: apply.FieldManagement = apply.UNNAMED,
    ) -> Response:
        obj = wire.decode_object(body, content_type)
        created, warnings = admission.create_object(
            self.store, self.kind, obj, namespace=namespace, dry_run=dry_run,
            options=self.options.admission, track=apply.tracker(self.kind, fields),
        )
        return wire.json_response(created, status_code=201, warnings=warnings)

    def get(self, namespace: str | None, name: str, table: tables.TableRequest | None = None) -> Response:
        obj = self.store.get(self.kind, namespace, name)
        return wire.json_response(self.tables.for_object(obj, table) if table else obj)

    def replace(
        self, namespace: str | None, name: str, body: bytes, content_type: str | None, dry_run: bool,
        fields: apply.FieldManagement = apply.UNNAMED,
    ) -> Response:
        obj = wire.decode_object(body, content_type)
        updated, warnings = admission.update_object(
            self.store, self.kind, obj, namespace=namespace, name=name, dry_run=dry_run,
            options=self.options.admission, track=apply.tracker(self.kind, fields),
        )
        return wire.json_response(updated, warnings=warnings)

    def patch(
        self, namespace: str | None, name: str, body: bytes, content_type: str | None, dry_run: bool,
        fields: apply.FieldManagement = apply.UNNAMED,
    ) -> Response:
        if apply.is_apply(content_type):  # server-side apply (joch.server.apply)
            return apply.apply_patch(self.store, self.kind, self.options, namespace, name, body, dry_run, fields)
        if wire.media_type(content_type) == JSON_PATCH:
            ops = json_patch.decode(wire.decode_text(body))
            patched, warnings = admission.change_object(
                self.store, self.kind, namespace, name, lambda current: json_patch.apply(current, ops),
                pinned=json_patch.pinned(ops), dry_run=dry_run, options=self.options.admission,
                track=apply.tracker(self.kind, fields, patch=True),
            )
            return wire.json_response(patched, warnings=warnings)
        require_patch_type(content_type)
        patch = wire.decode_object(body, content_type, allow_yaml=False)
        patched, warnings = admission.patch_object(
            self.store, self.kind, namespace, name, patch, dry_run=dry_run,
            options=self.options.admission, track=apply.tracker(self.kind, fields, patch=True),
        )
        return wire.json_response(patched, warnings=warnings)

    def delete(
        self, namespace: str | None, name: str, body: bytes, content_type: str | None, dry_run: bool
    ) -> Response:
        preconditions: dict[str, str] = {}
        if body.strip():
            preconditions, all_dry = delete_options(wire.decode_object(body, content_type, allow_yaml=False))
            dry_run = dry_run or all_dry
        if dry_run:
            return wire.json_response(self._delete_preview(namespace, name, preconditions))
        deleted = self.store.delete(
            self.kind, namespace, name, resource_version=preconditions.get("resourceVersion"),
            uid=preconditions.get("uid"),
        )
        return wire.json_response(deleted)

    def delete_collection(
        self, namespace: str | None, *, labels: str | None, fields: str | None, body: bytes,
        content_type: str | None, dry_run: bool,
    ) -> Response:
        """``deletecollection``: every object the selectors match, deleted in one transaction (an
        object held back by finalizers gets its ``deletionTimestamp``); the answer is the list of them."""
        if body.strip():
            preconditions, all_dry = delete_options(wire.decode_object(body, content_type, allow_yaml=False))
            if preconditions:
                raise errors.BadRequest("DeleteOptions.preconditions cannot be used when deleting a collection: "
                                        "delete the objects one by one to give each a precondition")
            dry_run = dry_run or all_dry
        options = params.list_options(namespace, labels, fields, None, None)
        deleted: list[Obj] = []
        with self.store.transaction() as writer:
            listed = writer.list(self.kind, options)
            for obj in listed.items:
                m = obj["metadata"]
                if dry_run:
                    deleted.append(obj)
                    continue
                try:
                    deleted.append(writer.delete(self.kind, m.get("namespace"), m["name"]))
                except errors.NotFound:
                    continue
        result = ListResult(items=deleted, resource_version=listed.resource_version)
        return wire.json_response(list_body(self.kind, result))

    def replace_status(
        self, namespace: str | None, name: str, body: bytes, content_type: str | None, dry_run: bool,
        fields: apply.FieldManagement = apply.UNNAMED,
    ) -> Response:
        obj = wire.decode_object(body, content_type)
        track = apply.tracker(self.kind, fields, status=True)
        return wire.json_response(self._write_status(obj, namespace, name, dry_run, track))

    def patch_status(
        self, namespace: str | None, name: str, body: bytes, content_type: str | None, dry_run: bool,
        fields: apply.FieldManagement = apply.UNNAMED,
    ) -> Response:
        if apply.is_apply(content_type):
            return apply.apply_status_patch(self.store, self.kind, namespace, name, body, dry_run, fields)
        change: Callable[[Obj], Obj]
        precondition: str | None = None
        if wire.media_type(content_type) == JSON_PATCH:
            ops = json_patch.decode(wire.decode_text(body))
            change = lambda current: json_patch.apply(current, ops)  # noqa: E731
        else:
            require_patch_type(content_type)
            patch = wire.decode_object(body, content_type, allow_yaml=False)
            change = lambda current: merge.merge_patch(current, patch)  # noqa: E731
            given = patch.get("metadata")
            pinned = given.get("resourceVersion") if isinstance(given, dict) else None
            precondition = str(pinned) if pinned else None
        attempt = 0
        while True:
            attempt += 1
            current = self.store.get(self.kind, namespace, name)
            merged = change(current)
            if precondition is None and json_patch_pins(merged, current):
                precondition = str(merged["metadata"]["resourceVersion"])
            target = {**current, "status": merged.get("status")}
            target["metadata"] = {**current["metadata"],
                                  "resourceVersion": precondition or current["metadata"]["resourceVersion"]}
            try:
                track = apply.tracker(self.kind, fields, patch=True, status=True)
                return wire.json_response(self._write_status(target, namespace, name, dry_run, track))
            except errors.Conflict:
                if precondition or attempt >= STATUS_PATCH_ATTEMPTS:
                    raise

    def _write_status(
        self, obj: Obj, namespace: str | None, name: str, dry_run: bool, track: admission.Tracker | None = None,
    ) -> Obj:
        return admission.update_status(self.store, self.kind, obj, namespace=namespace, name=name,
                                       dry_run=dry_run, track=track)

    def _delete_preview(self, namespace: str | None, name: str, preconditions: dict[str, Any]) -> Obj:
        current = self.store.get(self.kind, namespace, name)
        metadata = current["metadata"]
        for key in ("uid", "resourceVersion"):
            wanted = preconditions.get(key)
            if wanted is not None and wanted != metadata.get(key):
                raise errors.Conflict(
                    f"precondition failed for {self.kind.resource} {name!r}: {key} is "
                    f"{metadata.get(key)!r}, the request expected {wanted!r}",
                    kind=self.kind.plural, name=name,
                )
        if metadata.get("finalizers") and not metadata.get("deletionTimestamp"):
            return {**current, "metadata": {**metadata, "deletionTimestamp": now()}}
        return current


def delete_options(body: dict[str, Any]) -> tuple[dict[str, str], bool]:
    """The ``preconditions`` (uid, resourceVersion) and whether ``dryRun`` is ``["All"]`` of a
    ``DeleteOptions`` body; a field of the wrong type is a 400, as the apiserver's decoder has it."""
    given = body.get("preconditions")
    given = {} if given is None else given
    if not isinstance(given, dict):
        raise errors.BadRequest("DeleteOptions.preconditions must be an object")
    preconditions: dict[str, str] = {}
    for key in ("uid", "resourceVersion"):
        value = given.get(key)
        if value is not None and not isinstance(value, str):
            shown = wire.dumps(value).decode()
            raise errors.BadRequest(f"DeleteOptions.preconditions.{key} must be a string, not {shown}")
        if value:
            preconditions[key] = value
    dry_run = body.get("dryRun")
    dry_run = [] if dry_run is None else dry_run
    if not isinstance(dry_run, list) or not all(isinstance(v, str) for v in dry_run):
        raise errors.BadRequest('DeleteOptions.dryRun must be a list of strings (["All"])')
    return preconditions, "All" in dry_run


# Async on purpose: FastAPI runs a sync dependency in the threadpool, a hop per request for nothing.
async def namespace_scope(namespace: Annotated[str, Path(description="the object's namespace")]) -> str | None:
    return params.check_namespace(namespace, where="the namespace in the URL")


async def _cluster() -> str | None:
    return None


def request_body(schema: dict[str, Any], *media: str) -> dict[str, Any]:
    """``openapi_extra`` documenting a body the handler reads itself."""
    return {"requestBody": {"required": True, "content": {m: {"schema": schema} for m in media}}}


Handlers = Callable[[Request], "KindHandlers"]
"""How an endpoint finds the handlers it calls: those of the app serving the request (``install``'s
routes, shared by every app of the process), or one fixed set (``lister(h)``)."""


def install(
    app: FastAPI, kind: KindInfo, store: Store, options: ServerOptions, schemas: KindSchemas,
    slots: limits.WatchSlots | None = None,
) -> None:
    """Add ``kind``'s routes to ``app``, serving through handlers over ``store`` and ``options``.

    The routes themselves are built once per process (``_routes``): FastAPI analyses each endpoint's
    parameters into pydantic validators when a route is made, about 4 ms a route and three quarters
    of building an app, and a test suite builds hundreds of apps. Their endpoints find this app's
    handlers through the request (``request.app``), so one set of routes serves every app, and
    serves only an app they were installed on (copied into another app, they answer 500), and
    ``app.dependency_overrides`` does not reach them."""
    h = KindHandlers(kind, store, options, slots)
    handlers_of(app)[kind] = h
    routes, create = _routes(kind, schemas)
    app.router.routes.extend(routes)
    creates_of(app)[create] = h


def handlers_of(app: FastAPI) -> dict[KindInfo, KindHandlers]:
    """Each kind's handlers on ``app`` (``install``), by kind and version."""
    if not hasattr(app.state, "kind_handlers"):
        app.state.kind_handlers = {}
    handlers: dict[KindInfo, KindHandlers] = app.state.kind_handlers
    return handlers


@functools.cache
def _routes(kind: KindInfo, schemas: KindSchemas) -> tuple[tuple[BaseRoute, ...], Callable[..., Response]]:
    """``kind``'s routes and its create endpoint, for every app of this process (see ``install``)."""
    router = APIRouter(route_class=server_errors.StatusRoute)

    def handlers(request: Request) -> KindHandlers:
        return handlers_of(request.app)[kind]

    async def read_body(request: Request) -> bytes:  # within the serving handlers' --max-body-bytes
        return await wire.body_reader(handlers(request).options.max_body_bytes)(request)

    base = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
    scope: Scope = namespace_scope if kind.namespaced else _cluster
    collection = f"{base}/namespaces/{{namespace}}/{kind.plural}" if kind.namespaced else f"{base}/{kind.plural}"
    item = f"{collection}/{{name}}"
    object_ref = schemas.object(kind)
    object_body = request_body(object_ref, wire.JSON, "application/yaml")
    patch_body = {"requestBody": {"required": True, "content": {
        wire.MERGE_PATCH: {"schema": {"type": "object"}},
        JSON_PATCH: {"schema": {"type": "array", "items": {"type": "object"}}},
        apply.APPLY_PATCH: {"schema": {"type": "object"}}}}}
    tags: list[str | Enum] = [kind.api_version]
    resource = kind.resource

    def add(path: str, endpoint: Callable[..., Response], method: str, verb: str,
            status_code: int = 200, extra: dict[str, Any] | None = None,
            responses: dict[int | str, Any] | None = None) -> None:
        router.add_api_route(
            path, endpoint, methods=[method], name=f"{verb}:{resource}", tags=tags,
            summary=f"{verb} {kind.kind}", status_code=status_code, openapi_extra=extra,
            responses=responses or schemas.responses(status_code, object_ref, f"the {kind.kind}",
                                                     body=method != "GET"),
        )

    add(collection, _lister(handlers, scope), "GET", "list", responses=schemas.list_responses(kind))
    if kind.namespaced:
        add(f"{base}/{kind.plural}", _lister(handlers, _cluster), "GET", "listAllNamespaces",
            responses=schemas.list_responses(kind))

    def create(
        request: Request, namespace: str | None = Depends(scope), body: bytes = Depends(read_body),
        content_type: ContentType = None, dry_run: params.DryRun = None, fields: apply.FieldManagement = FIELDS,
    ) -> Response:
        return handlers(request).create(namespace, body, content_type, params.dry_run(dry_run), fields)

    def read(
        request: Request, name: str, namespace: str | None = Depends(scope), accept: params.Accept = None,
        include_object: params.IncludeObject = None,
    ) -> Response:
        return handlers(request).get(namespace, name, tables.negotiate(accept, include_object))

    def replace(
        request: Request, name: str, namespace: str | None = Depends(scope), body: bytes = Depends(read_body),
        content_type: ContentType = None, dry_run: params.DryRun = None, fields: apply.FieldManagement = FIELDS,
    ) -> Response:
        return handlers(request).replace(namespace, name, body, content_type, params.dry_run(dry_run), fields)

    def patch(
        request: Request, name: str, namespace: str | None = Depends(scope), body: bytes = Depends(read_body),
        content_type: ContentType = None, dry_run: params.DryRun = None, fields: apply.FieldManagement = FIELDS,
    ) -> Response:
        return handlers(request).patch(namespace, name, body, content_type, params.dry_run(dry_run), fields)

    def delete(
        request: Request, name: str, namespace: str | None = Depends(scope), body: bytes = Depends(read_body),
        content_type: ContentType = None, dry_run: params.DryRun = None,
    ) -> Response:
        return handlers(request).delete(namespace, name, body, content_type, params.dry_run(dry_run))

    def replace_status(
        request: Request, name: str, namespace: str | None = Depends(scope), body: bytes = Depends(read_body),
        content_type: ContentType = None, dry_run: params.DryRun = None, fields: apply.FieldManagement = FIELDS,
    ) -> Response:
        return handlers(request).replace_status(namespace, name, body, content_type, params.dry_run(dry_run),
                                                fields)

    def patch_status(
        request: Request, name: str, namespace: str | None = Depends(scope), body: bytes = Depends(read_body),
        content_type: ContentType = None, dry_run: params.DryRun = None, fields: apply.FieldManagement = FIELDS,
    ) -> Response:
        return handlers(request).patch_status(namespace, name, body, content_type, params.dry_run(dry_run), fields)

    def delete_collection(
        request: Request, namespace: str | None = Depends(scope), label_selector: params.LabelSelector = None,
        field_selector: params.FieldSelector = None, body: bytes = Depends(read_body),
        content_type: ContentType = None, dry_run: params.DryRun = None,
    ) -> Response:
        return handlers(request).delete_collection(namespace, labels=label_selector, fields=field_selector,
                                                   body=body, content_type=content_type,
                                                   dry_run=params.dry_run(dry_run))

    add(collection, create, "POST", "create", 201, object_body)
    if collection_deletable(kind):  # not Namespaces (joch.api.namespaces): a 405, as the apiserver answers
        add(collection, delete_collection, "DELETE", "deletecollection", responses=schemas.list_responses(kind))
    add(item, read, "GET", "read", responses=schemas.read_responses(kind))
    add(item, replace, "PUT", "replace", extra=object_body)
    add(item, patch, "PATCH", "patch", extra=patch_body)
    add(item, delete, "DELETE", "delete")
    if kind.status_model is not None:  # a kind without status (a RoleBinding) has no status subresource
        add(f"{item}/status", read, "GET", "readStatus", responses=schemas.read_responses(kind))
        add(f"{item}/status", replace_status, "PUT", "replaceStatus", extra=object_body)
        add(f"{item}/status", patch_status, "PATCH", "patchStatus", extra=patch_body)
    return tuple(router.routes), create


def lister(h: KindHandlers, scope: Scope | None = None) -> Callable[..., Response]:
    """The list-or-watch endpoint of ``h``'s kind, scoped to the URL's namespace unless told otherwise."""
    return _lister(lambda _: h, scope or (namespace_scope if h.kind.namespaced else _cluster))


def _lister(handlers: Handlers, scope: Scope) -> Callable[..., Response]:
    def list_objects(
        request: Request,
        namespace: str | None = Depends(scope),
        label_selector: params.LabelSelector = None,
        field_selector: params.FieldSelector = None,
        limit: params.Limit = None,
        token: params.Continue = None,
        resource_version: params.ResourceVersion = None,
        watching: params.WatchFlag = False,
        timeout: params.TimeoutSeconds = None,
        bookmarks: params.AllowBookmarks = False,
        accept: params.Accept = None,
        include_object: params.IncludeObject = None,
        send_initial: params.SendInitialEvents = None,
        match: params.ResourceVersionMatch = None,
    ) -> Response:
        return handlers(request).list(
            namespace, labels=label_selector, fields=field_selector, limit=limit, token=token,
            resource_version=resource_version, watching=watching, timeout=timeout, bookmarks=bookmarks,
            table=tables.negotiate(accept, include_object), send_initial=send_initial, match=match,
        )

    return list_objects


def creates_of(app: FastAPI) -> dict[Callable[..., Response], KindHandlers]:
    """Each kind's create endpoint (``install``) and its handlers, kept on the app for ``FastCreates``."""
    if not hasattr(app.state, "creates"):
        app.state.creates = {}
    creates: dict[Callable[..., Response], KindHandlers] = app.state.creates
    return creates


class FastCreates:
    """The hot write path: ``POST`` of one object to a kind's collection, without a query string,
    answered here instead of through FastAPI's routing and per-request parameter resolution (about
    a third of a single create's CPU). It does what the route does with every parameter at its
    default: the namespace checked (a 400), the body read within ``--max-body-bytes`` (a 413),
    ``KindHandlers.create`` in the threadpool, errors answered as the route answers them
    (``errors.unexpected``). Installed inside the guard, authentication and the request context, so
    they run as for any request. Anything else (a query string, a NUL in the path, a kind whose
    create another route overrides) goes on to the routes unchanged.

    The kinds are found when the middleware stack is built (the first request): for each create
    endpoint ``install`` made, a probe of its collection path must reach that route first."""

    def __init__(self, app: ASGIApp, *, routes: FastAPI, max_body_bytes: int) -> None:
        self.app = app
        self.read_body = wire.body_reader(max_body_bytes)
        self.targets = _fast_targets(routes)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("query_string"):
            path: str = scope["path"]
            found = _target(self.targets, path) if "\x00" not in path else None
            if found is not None:
                target, namespace = found
                # What the router would have put in the scope, for middleware that reads it after
                # the call (a route template as a metrics label, a span name).
                scope["route"], scope["endpoint"] = target.route, target.route.endpoint
                scope["path_params"] = {"namespace": namespace} if namespace is not None else {}
                response = await self._create(scope, receive, target.handlers, namespace)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _create(self, scope: AsgiScope, receive: Receive, h: KindHandlers, namespace: str | None) -> Response:
        request = Request(scope, receive)
        try:
            if namespace is not None:
                namespace = params.check_namespace(namespace, where="the namespace in the URL")
            body = await self.read_body(request)
            headers = request.headers
            fields = apply.FieldManagement(user_agent=headers.get("user-agent"))
            return await run_in_threadpool(h.create, namespace, body, headers.get("content-type"), False, fields)
        except errors.JochError as exc:
            return server_errors.status_response(exc)
        except Exception as exc:  # noqa: BLE001 - answered and logged as the routes do (errors.unexpected)
            return server_errors.unexpected(request, exc)


NAMESPACE_SLOT = "*"


@dataclass(frozen=True)
class _Target:
    handlers: KindHandlers
    route: APIRoute


def _target(targets: dict[str, _Target], path: str) -> tuple[_Target, str | None] | None:
    """The create route and namespace of a collection path: ``/apis/G/V/namespaces/NS/PLURAL`` is
    looked up as ``/apis/G/V/namespaces/*/PLURAL``, any other path as itself (cluster-scoped)."""
    parts = path.split("/")
    if len(parts) > 3 and parts[-3] == "namespaces" and parts[-2]:
        namespace = parts[-2]
        parts[-2] = NAMESPACE_SLOT
        found = targets.get("/".join(parts))
        if found is not None and found.handlers.kind.namespaced:
            return found, namespace
    found = targets.get(path)
    return (found, None) if found is not None and not found.handlers.kind.namespaced else None


def _fast_targets(app: FastAPI) -> dict[str, _Target]:
    """Collection path (namespace as ``*``) -> its create route, for the create routes ``install``
    made that a POST to their path reaches first."""
    targets: dict[str, _Target] = {}
    creates = creates_of(app)
    routes = app.router.routes
    for route in routes:
        if not isinstance(route, APIRoute) or (h := creates.get(route.endpoint)) is None:
            continue
        probe = route.path.replace("{namespace}", "default")
        scope = {"type": "http", "method": "POST", "path": probe, "root_path": ""}
        first = next((r for r in routes if r.matches(scope)[0] == Match.FULL), None)
        if first is route:
            targets[route.path.replace("{namespace}", NAMESPACE_SLOT)] = _Target(h, route)
    return targets
