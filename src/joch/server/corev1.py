"""The core group (``/api/v1``) beyond the generic routes: deleting a Namespace, and the core v1
``Event`` view of Joch's Events.

Namespaces (the kind is ``joch.api.namespaces``; its list, get, create, update and watch are the
generic routes of ``joch.server.resources``). ``DELETE /api/v1/namespaces/{name}`` is the one verb
that differs, and is registered before the generic route so it wins:

* ``DELETE``: ``default`` and ``joch-system`` cannot be deleted: a 403 as the apiserver answers
  (``namespaces "default" is forbidden: this namespace may not be deleted``).
* ``POST /api/v1/namespaces`` also reads a protobuf body: ``kubectl create namespace`` sends one
  (client-go's typed clients encode core kinds as ``application/vnd.kubernetes.protobuf``, whatever
  discovery says). Only what that command can set is read: name, generateName, labels and
  annotations; the answer is JSON, which its ``Accept`` lists.
* Otherwise, in one transaction (``joch.store.namespaces.terminate``): the Namespace turns
  ``Terminating`` (admission then refuses new objects in it), every namespaced object in it is
  deleted, and when nothing is left the Namespace is deleted too. The cascade is synchronous:
  Joch's store is local, so there is nothing to wait for, and ``kubectl delete ns x`` (which waits
  for the object to be gone) returns at once. An object held back by finalizers (an AgentRun whose
  runtime cleanup has not run yet) keeps the Namespace ``Terminating``; the namespace controller
  (``joch.controllers.namespaces``) finishes the job once the finalizers are gone.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI
from fastapi.routing import APIRoute
from starlette.responses import Response

from joch.api import errors
from joch.api.namespaces import NAMESPACE, PERMANENT, TERMINATING
from joch.api.registry import Registry
from joch.server import params, resources, wire
from joch.server.auth import protobuf
from joch.server.options import ServerOptions
from joch.server.schemas import KindSchemas
from joch.store import namespaces
from joch.store.base import Obj, Store


def namespace_from_protobuf(body: bytes) -> Obj:
    """A protobuf ``Namespace`` (in its ``runtime.Unknown`` envelope) as the JSON object it stands for."""
    try:
        if not body.startswith(protobuf.MAGIC):
            raise ValueError("no k8s protobuf magic")
        raw = protobuf.fields(body[len(protobuf.MAGIC):]).get(2, b"")
        meta = protobuf.fields(raw).get(1, b"")
        metadata: dict[str, Any] = {}
        for number, value in protobuf.entries(meta):
            if number in (1, 2):
                metadata["name" if number == 1 else "generateName"] = value.decode()
            elif number in (11, 12):
                entry = protobuf.fields(value)
                key = "labels" if number == 11 else "annotations"
                metadata.setdefault(key, {})[entry.get(1, b"").decode()] = entry.get(2, b"").decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.BadRequest(f"the protobuf body is not a Namespace ({exc}); send it as application/json") from None
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def delete_namespace(store: Store, registry: Registry, name: str, *, dry_run: bool) -> Obj:
    if name in PERMANENT:
        raise errors.Forbidden(f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                               kind="namespaces", name=name)
    if dry_run:
        current = store.get(NAMESPACE, None, name)
        return {**current, "status": {"phase": TERMINATING}}
    namespace, _ = namespaces.terminate(store, name, registry)
    return namespace


def drop_shadowed(app: FastAPI) -> None:
    """Remove the routes an earlier one with the same path and method hides (the generic routes
    this module overrides): they would never answer, and would appear twice in ``/openapi.json``."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for route in app.router.routes:
        if isinstance(route, APIRoute):
            keys = {(route.path, method) for method in route.methods or ()}
            if keys <= seen:
                continue
            seen |= keys
        kept.append(route)
    app.router.routes[:] = kept


def install(app: FastAPI, store: Store, registry: Registry, options: ServerOptions, schemas: KindSchemas) -> None:
    """Routes that must come before the generic ones (call before ``resources.install``, and
    ``drop_shadowed`` after it)."""
    read_body = wire.body_reader(options.max_body_bytes)

    def delete(
        name: str, body: bytes = Depends(read_body), content_type: resources.ContentType = None,
        dry_run: params.DryRun = None,
    ) -> Response:
        dry = params.dry_run(dry_run)
        if body.strip():
            _, all_dry = resources.delete_options(wire.decode_object(body, content_type, allow_yaml=False))
            dry = dry or all_dry
        return wire.json_response(delete_namespace(store, registry, name, dry_run=dry))

    handlers = resources.KindHandlers(NAMESPACE, store, options)

    def create(
        body: bytes = Depends(read_body), content_type: resources.ContentType = None, dry_run: params.DryRun = None,
    ) -> Response:
        if wire.media_type(content_type) == protobuf.MEDIA_TYPE:
            body, content_type = wire.dumps(namespace_from_protobuf(body)), wire.JSON
        return handlers.create(None, body, content_type, params.dry_run(dry_run))

    app.add_api_route("/api/v1/namespaces", create, methods=["POST"], name="create:namespaces", tags=["v1"],
                      summary="create Namespace", status_code=201,
                      openapi_extra=resources.request_body(schemas.object(NAMESPACE), wire.JSON, "application/yaml",
                                                           protobuf.MEDIA_TYPE),
                      responses=schemas.responses(201, schemas.object(NAMESPACE), "the Namespace", body=True))
    app.add_api_route("/api/v1/namespaces/{name}", delete, methods=["DELETE"], name="delete:namespaces",
                      tags=["v1"], summary="delete Namespace (and everything in it)",
                      responses=schemas.responses(200, schemas.object(NAMESPACE), "the Namespace", body=True))
