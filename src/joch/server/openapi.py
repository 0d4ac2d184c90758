"""``/openapi/v3`` and ``/openapi/v2``: each kind's schema in the documents Kubernetes clients read.

``/openapi.json`` (``joch.server.schemas``) describes every route for people and generators; these
describe the kinds as the kube-apiserver does, for ``kubectl explain``, ``kubectl apply`` and the
client libraries:

* ``/openapi/v3`` is the index: for each group version a path (``apis/joch.dev/v1alpha1``, or
  ``api/v1`` for the core group) and the ``serverRelativeURL`` of its document, with a ``hash``
  query that changes when the document does (clients cache by it).
* ``/openapi/v3/apis/GROUP/VERSION`` is an OpenAPI 3.0 document: ``components.schemas`` holds each
  kind's schema (``joch.api.openapi.kind_schema`` with ``metadata`` spelled out) and its list, each
  tagged ``x-kubernetes-group-version-kind``, named as the apiserver names them
  (``dev.joch.v1alpha1.Agent``). ``paths`` has each kind's object and collection routes, also
  tagged with the GVK: kubectl looks for the PATCH operation of a kind there, and when it takes
  the ``fieldValidation`` parameter it leaves validation to the server (which is strict whatever
  is asked) instead of validating on the client. The PATCH request types listed do not include
  strategic merge, so ``kubectl apply`` computes a JSON merge patch, as for any custom resource.
* ``/openapi/v2`` is Swagger 2.0 with the same schemas under ``definitions`` (``nullable`` has no
  Swagger spelling and is dropped). kubectl asks for it only as protobuf, for client-side
  validation when the v3 document does not settle it; it is answered with an empty protobuf
  ``Document`` (zero bytes), which makes kubectl skip client-side validation, so admission stays
  the one validation. Other clients get the JSON document.

Documents are built on first request and cached per registry: they never change while a server runs.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from collections.abc import Iterator
from enum import Enum
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from joch import __version__
from joch.api import errors
from joch.api.openapi import kind_schema, object_meta_schema
from joch.api.registry import KindInfo, Registry
from joch.server import wire

GVK = "x-kubernetes-group-version-kind"
OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml")
COMMON_QUERY = ("dryRun", "fieldManager", "fieldValidation", "pretty")


def schema_name(info: KindInfo, kind: str | None = None) -> str:
    """The apiserver's component name: the group reversed, the version, the kind (``dev.joch.v1alpha1.Agent``)."""
    prefix = ".".join(reversed(info.group.split("."))) if info.group else "io.k8s.api.core"
    return f"{prefix}.{info.version}.{kind or info.kind}"


def group_version_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def object_schema(info: KindInfo) -> dict[str, Any]:
    """``kind_schema`` with ``metadata`` spelled out and the GVK extension, as a v3 component."""
    schema = copy.deepcopy(kind_schema(info))
    schema["properties"]["metadata"] = copy.deepcopy(object_meta_schema())
    schema[GVK] = [{"group": info.group, "version": info.version, "kind": info.kind}]
    return schema


def list_schema(info: KindInfo) -> dict[str, Any]:
    return {
        "type": "object", "required": ["items"],
        "description": f"A list of {info.kind} objects.",
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"type": "object", "properties": {"resourceVersion": {"type": "string"},
                                                          "continue": {"type": "string"}}},
            "items": {"type": "array", "items": {"$ref": f"#/components/schemas/{schema_name(info)}"}},
        },
        GVK: [{"group": info.group, "version": info.version, "kind": f"{info.kind}List"}],
    }


@functools.cache
def documents(registry: Registry) -> dict[str, bytes]:
    """Each group version's v3 document, encoded, by its path (``apis/joch.dev/v1alpha1``)."""
    by_gv: dict[str, list[KindInfo]] = {}
    for info in registry:
        by_gv.setdefault(group_version_path(info.group, info.version), []).append(info)
    return {path: wire.dumps(_v3(kinds)) for path, kinds in by_gv.items()}


@functools.cache
def index(registry: Registry) -> bytes:
    paths = {path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={_hash(body)}"}
             for path, body in documents(registry).items()}
    return wire.dumps({"paths": paths})


@functools.cache
def swagger(registry: Registry) -> bytes:
    definitions: dict[str, Any] = {}
    for info in registry:
        definitions[schema_name(info)] = _swagger_schema(object_schema(info))
        listed = _swagger_schema(list_schema(info))
        listed["properties"]["items"]["items"] = {"$ref": f"#/definitions/{schema_name(info)}"}
        definitions[schema_name(info, f"{info.kind}List")] = listed
    return wire.dumps({"swagger": "2.0", "info": {"title": "Joch", "version": __version__}, "paths": {},
                       "definitions": definitions})


def install(app: FastAPI, registry: Registry) -> None:
    tags: list[str | Enum] = ["discovery"]

    def get_index() -> Response:
        return Response(index(registry), media_type=wire.JSON)

    def get_document(path: str) -> Response:
        body = documents(registry).get(path)
        if body is None:
            raise errors.NotFound(f"the server has no OpenAPI v3 document for {path!r} (see /openapi/v3)")
        return Response(body, media_type=wire.JSON)

    def get_v2(request: Request) -> Response:
        if "protobuf" in request.headers.get("accept", ""):
            return Response(b"", media_type=OPENAPI_V2_PROTOBUF)
        return Response(swagger(registry), media_type=wire.JSON)

    app.add_api_route("/openapi/v3", get_index, methods=["GET"], tags=tags, include_in_schema=False)
    app.add_api_route("/openapi/v3/{path:path}", get_document, methods=["GET"], tags=tags, include_in_schema=False)
    app.add_api_route("/openapi/v2", get_v2, methods=["GET"], tags=tags, include_in_schema=False)


def _v3(kinds: list[KindInfo]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for info in kinds:
        schemas[schema_name(info)] = object_schema(info)
        schemas[schema_name(info, f"{info.kind}List")] = list_schema(info)
        paths.update(_paths(info))
    first = kinds[0]
    return {"openapi": "3.0.0",
            "info": {"title": "Joch", "version": __version__,
                     "description": f"The kinds of {first.api_version}"},
            "paths": paths, "components": {"schemas": schemas}}


def _paths(info: KindInfo) -> dict[str, Any]:
    base = f"/{group_version_path(info.group, info.version)}"
    if info.namespaced:
        base += "/namespaces/{namespace}"
    collection, item = f"{base}/{info.plural}", f"{base}/{info.plural}/{{name}}"
    gvk = {"group": info.group, "version": info.version, "kind": info.kind}
    one = {"$ref": f"#/components/schemas/{schema_name(info)}"}
    many = {"$ref": f"#/components/schemas/{schema_name(info, f'{info.kind}List')}"}

    def operation(action: str, answer: dict[str, Any], *, body: tuple[str, ...] = ()) -> dict[str, Any]:
        op: dict[str, Any] = {
            "operationId": f"{action}{info.kind}", "x-kubernetes-action": action, GVK: gvk,
            "parameters": list(_query(*COMMON_QUERY)) if body else [],
            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": answer}}}},
        }
        if body:
            op["requestBody"] = {"required": True, "content": {t: {"schema": {"type": "object"}} for t in body}}
        return op

    names = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    if info.namespaced:
        names.append({"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}})
    return {
        collection: {"parameters": names[1:],
                     "get": operation("list", many), "post": operation("post", one, body=("application/json",))},
        item: {"parameters": names,
               "get": operation("get", one), "put": operation("put", one, body=("application/json",)),
               "patch": operation("patch", one, body=PATCH_TYPES), "delete": operation("delete", {"type": "object"})},
    }


def _query(*names: str) -> Iterator[dict[str, Any]]:
    for name in names:
        yield {"name": name, "in": "query", "schema": {"type": "string"}}


def _swagger_schema(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _swagger_schema(value) for key, value in node.items() if key != "nullable"}
    if isinstance(node, list):
        return [_swagger_schema(value) for value in node]
    return node


def _hash(body: bytes) -> str:
    return hashlib.sha512(body).hexdigest()[:64].upper()
