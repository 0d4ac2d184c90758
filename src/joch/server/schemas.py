"""OpenAPI shapes for each kind, derived from the registry's spec and status models.

A kind registered with ``body="top"`` (a RoleBinding) shows its spec model's fields at the top
level of its object schema, with no ``spec``, and a ``status`` only when it declares one.

These pydantic models exist only for ``/openapi.json``: handlers never validate with them
(admission does that, with its own error messages) and return already-encoded JSON. Model names
are the kind name, prefixed with the group when two groups declare the same kind, so component
names stay readable and unique.

Routes reference the schemas as plain ``$ref`` response and request bodies, and ``install``
merges the components into FastAPI's generated document. Handing FastAPI the models instead
(``responses={200: {"model": ...}}``) would make it build a pydantic ``TypeAdapter`` per route and
status code — about a thousand for the built-in kinds, most of a second per app — for nothing
but documentation. The schemas of a registry are computed once per process.

The document describes what the server sends, every variant of it:

* A list route answers a ``KindList``, or with ``watch=true`` a stream of ``WatchEvent``s (one JSON
  object per line, ``application/json`` as the apiserver sends it), or a ``Table`` when the
  ``Accept`` header asks for one (``tables``); a read route the object or its ``Table``. The 200
  schema is ``anyOf`` those, so no variant contradicts it.
* Errors are ``Status`` bodies with the codes a route can answer: 400, 404, 409, 410, 415 and 422
  everywhere, 413 where a body is read (``wire.body_reader``), 503 where the runtime is needed. The
  422 ``HTTPValidationError`` FastAPI documents on its own for every route with parameters is
  replaced by the 400 ``Status`` the server answers instead (``errors``).
* Streams that are not JSON (Server-Sent Events, a run's log, an artifact's bytes) are documented
  with their own media type only.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field, create_model
from pydantic.json_schema import models_json_schema

from joch.api.meta import ObjectMeta
from joch.api.registry import KindInfo, Registry


class ListMeta(BaseModel):
    resourceVersion: str
    continue_: str | None = Field(default=None, alias="continue")  # a keyword in Python


class StatusCause(BaseModel):
    reason: str
    message: str
    field: str


class StatusDetails(BaseModel):
    name: str | None = None
    kind: str | None = None
    causes: list[StatusCause] | None = None


class Status(BaseModel):
    """A Kubernetes ``Status``: every error body the server sends."""

    kind: Literal["Status"]
    apiVersion: Literal["v1"]
    metadata: dict[str, Any]
    status: Literal["Failure", "Success"]
    message: str
    reason: str
    code: int
    details: StatusDetails | None = None


Ref = dict[str, Any]
STATUS_REF: Ref = {"$ref": "#/components/schemas/Status"}
WATCH_EVENT_REF: Ref = {"$ref": "#/components/schemas/WatchEvent"}
TABLE_REF: Ref = {"$ref": "#/components/schemas/Table"}

# Written by hand: their ``object`` fields hold any kind's object (Kubernetes' RawExtension).
WATCH_EVENT: dict[str, Any] = {
    "title": "WatchEvent", "type": "object", "required": ["type", "object"],
    "description": "One event of a watch stream (`watch=true`); the stream is one such JSON object per line.",
    "properties": {
        "type": {"type": "string", "enum": ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]},
        "object": {"type": "object", "description": "the object as of the event; a Status for ERROR; only "
                   "apiVersion, kind and metadata.resourceVersion for BOOKMARK; a one-row Table when "
                   "a Table was asked for"},
    },
}
TABLE: dict[str, Any] = {
    "title": "Table", "type": "object", "required": ["kind", "apiVersion", "metadata", "columnDefinitions", "rows"],
    "description": "The answer to `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (what kubectl get asks for).",
    "properties": {
        "kind": {"const": "Table"},
        "apiVersion": {"type": "string", "enum": ["meta.k8s.io/v1", "meta.k8s.io/v1beta1"]},
        "metadata": {"type": "object"},
        "columnDefinitions": {"type": "array", "items": {"type": "object"}},
        "rows": {"type": "array", "items": {"type": "object", "required": ["cells"], "properties": {
            "cells": {"type": "array"}, "object": {"type": "object"}}}},
    },
}
AUDIT_EVENT_LIST_REF: Ref = {"$ref": "#/components/schemas/AuditEventList"}
AUDIT_EVENT: dict[str, Any] = {
    "title": "AuditEvent", "type": "object",
    "required": ["id", "time", "actor", "groups", "verb", "kind", "namespace", "name", "decision", "reason",
                 "requestId", "sourceIP"],
    "description": "One row of the audit log (`joch.server.audit`): who did what to which object, and "
                   "whether it was allowed.",
    "properties": {
        "id": {"type": "integer", "description": "increases with every row"},
        "time": {"type": "string", "format": "date-time"},
        "actor": {"type": "string"},
        "groups": {"type": "array", "items": {"type": "string"}},
        "verb": {"type": "string"},
        "kind": {"type": "string"},
        "namespace": {"type": "string", "description": "empty for a cluster-scoped object"},
        "name": {"type": "string"},
        "decision": {"type": "string", "enum": ["allowed", "denied"]},
        "reason": {"type": "string"},
        "requestId": {"type": "string", "description": "the request's Audit-Id; empty outside a request"},
        "sourceIP": {"type": "string"},
    },
}
AUDIT_EVENT_LIST: dict[str, Any] = {
    "title": "AuditEventList", "type": "object", "required": ["kind", "apiVersion", "metadata", "items"],
    "description": "A page of audit events, newest first; `metadata.continue` fetches the next (older) page.",
    "properties": {
        "kind": {"const": "AuditEventList"},
        "apiVersion": {"const": "v1"},
        "metadata": {"type": "object", "properties": {"continue": {"type": "string"}}},
        "items": {"type": "array", "items": {"$ref": "#/components/schemas/AuditEvent"}},
    },
}
SERVER_SENT_EVENTS: dict[str, Any] = {
    # Before OpenAPI 3.2 (``itemSchema``), the schema of a text/event-stream describes each event.
    "type": "object",
    "description": "A text/event-stream: per change an event `ADDED`, `MODIFIED` or `DELETED` with "
                   "`id:` the store revision (send it back as Last-Event-ID to resume) and `data:` the object "
                   "as JSON; `: heartbeat` comments while idle; an `ERROR` event (no id) whose data is a "
                   "Status ends the stream.",
    "properties": {
        "event": {"type": "string", "enum": ["ADDED", "MODIFIED", "DELETED", "ERROR"]},
        "id": {"type": "string"},
        "data": {"type": "string", "description": "the object (or, for ERROR, a Status) as JSON"},
    },
    "required": ["event", "data"],
}


class KindSchemas:
    """The object and list schemas of every kind, as ``$ref``s and the components they point to."""

    def __init__(self, registry: Registry) -> None:
        counts = Counter(info.kind for info in registry)
        self.objects: dict[str, type[BaseModel]] = {}
        self.lists: dict[str, type[BaseModel]] = {}
        for info in registry:
            name = info.kind if counts[info.kind] == 1 else _group_prefix(info.group) + info.kind
            obj: Any = _object_model(name, info)
            self.objects[info.key] = obj
            self.lists[info.key] = create_model(
                f"{name}List",
                apiVersion=(str, ...),
                kind=(str, ...),
                metadata=(ListMeta, ...),
                items=(list[obj], ...),
            )

        models: list[type[BaseModel]] = [*self.objects.values(), *self.lists.values(), Status]
        mode: Literal["validation"] = "validation"
        refs, top = models_json_schema([(m, mode) for m in models],
                                       ref_template="#/components/schemas/{model}")
        self._refs: dict[object, Ref] = {model: dict(ref) for (model, _), ref in refs.items()}
        self.components: dict[str, Any] = {**top.get("$defs", {}), "WatchEvent": WATCH_EVENT, "Table": TABLE,
                                                  "AuditEvent": AUDIT_EVENT, "AuditEventList": AUDIT_EVENT_LIST}
        if self._refs[Status] != STATUS_REF:  # a kind named Status would take the name
            raise RuntimeError(f"the Status schema is {self._refs[Status]}, not {STATUS_REF}")

    def object(self, info: KindInfo) -> Ref:
        return self._refs[self.objects[info.key]]

    def list(self, info: KindInfo) -> Ref:
        return self._refs[self.lists[info.key]]

    def responses(
        self, code: int, ref: Ref | None, description: str, *, body: bool = False, also: tuple[Ref, ...] = (),
        media_type: str | None = None,
    ) -> dict[int | str, Any]:
        """OpenAPI responses: ``code`` with ``ref`` as its JSON body (or ``anyOf`` it and ``also``;
        or a stream of ``media_type``), and the Status errors (413 too when the route reads a ``body``)."""
        ok: dict[str, Any] = {"description": description}
        if media_type is not None:
            ok["content"] = {media_type: {"schema": ref or {"type": "string", "format": "binary"}}}
        elif ref is not None:
            ok["content"] = {"application/json": {"schema": {"anyOf": [ref, *also]} if also else ref}}
        return {code: ok, **error_responses(*ERRORS, *((BODY_ERROR,) if body else ()))}

    def list_responses(self, info: KindInfo) -> dict[int | str, Any]:
        return self.responses(200, self.list(info), f"the {info.kind}List; with watch=true a stream of "
                              "WatchEvents, one per line; a Table when the Accept header asks for one",
                              also=(WATCH_EVENT_REF, TABLE_REF))

    def read_responses(self, info: KindInfo) -> dict[int | str, Any]:
        return self.responses(200, self.object(info), f"the {info.kind}; a Table when the Accept header asks "
                              "for one", also=(TABLE_REF,))


def error_responses(*codes: tuple[int, str]) -> dict[int | str, Any]:
    """``Status`` responses for these ``(code, why)``s."""
    return {code: {"description": why, "content": {"application/json": {"schema": STATUS_REF}}}
            for code, why in codes}


ERRORS = ((400, "Bad request"), (404, "Not found"), (409, "Conflict"), (410, "Expired"),
          (415, "Unsupported media type"), (422, "Invalid"))
BODY_ERROR = (413, "Request entity too large")
UNAVAILABLE = (503, "Service unavailable")


@functools.cache
def for_registry(registry: Registry) -> KindSchemas:
    return KindSchemas(registry)


def install(app: FastAPI, schemas: KindSchemas) -> None:
    """Generate ``/openapi.json`` once, with the kind schemas among its components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description,
                              routes=app.routes)
            components = doc.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in schemas.components.items():
                components.setdefault(name, schema)
            _status_for_validation_errors(doc)
            _answers_of_every_route(doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _status_for_validation_errors(doc: dict[str, Any]) -> None:
    """FastAPI's own 422 ``HTTPValidationError`` → the 400 ``Status`` the server answers instead."""
    fastapi_ref = "#/components/schemas/HTTPValidationError"
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            documented = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema")
            if documented == {"$ref": fastapi_ref}:
                del responses["422"]
                responses.setdefault("400", error_responses((400, "Bad request"))[400])
    components = doc.get("components", {}).get("schemas", {})
    if fastapi_ref not in json.dumps(doc.get("paths", {})):
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)


GUARD_ERRORS = ((400, "Bad request (a Host the server does not answer to)"),
                (401, "Unauthorized (no valid bearer token, on a server that authenticates)"),
                (403, "Forbidden (a browser page of another origin, or a role that does not allow it)"),
                (503, "Service unavailable (out of file descriptors; retry after Retry-After)"))
WRITE_ERRORS = ((415, "Unsupported media type"), (507, "Insufficient storage (a disk is full)"))
WATCH_ERRORS = ((429, "Too many open watches and followed logs (retry after Retry-After)"),)
_WRITES = ("post", "put", "patch", "delete")


def _answers_of_every_route(doc: dict[str, Any]) -> None:
    """What the layers around every handler may answer (``guard``, ``auth``, ``errors``, ``limits``):
    the Host and Origin checks and authentication on every route, a full disk on writes, the watch cap on watches and
    followed logs."""
    for path, operations in doc.get("paths", {}).items():
        for method, operation in operations.items():
            codes = list(GUARD_ERRORS)
            if method in _WRITES:
                codes += WRITE_ERRORS
            params = {param.get("name") for param in operation.get("parameters", [])}
            if "watch" in params or "follow" in params or path.endswith("/watch") or method == "watch":
                codes += WATCH_ERRORS
            responses = operation.setdefault("responses", {})
            for code, why in codes:
                responses.setdefault(str(code), error_responses((code, why))[code])


def _group_prefix(group: str) -> str:
    return "".join(part.capitalize() for part in group.split(".") if part)


def _object_model(name: str, info: KindInfo) -> type[BaseModel]:
    # Built at runtime from registry values, so typed as Any for mypy.
    api_version: Any = Literal[info.api_version]
    kind: Any = Literal[info.kind]
    fields: dict[str, Any] = {"apiVersion": (api_version, ...), "kind": (kind, ...),
                              "metadata": (ObjectMeta, ...)}
    if info.body == "top":  # the spec model's fields are the object's own (a RoleBinding's roleRef)
        fields.update((field, (f.annotation, f)) for field, f in info.spec_model.model_fields.items())
    else:
        spec: Any = info.spec_model if info.spec_required else info.spec_model | None
        fields["spec"] = (spec, ... if info.spec_required else None)
    if info.status_model is not None:
        status: Any = info.status_model | None
        fields["status"] = (status, None)
    model: type[BaseModel] = create_model(name, __doc__=f"{info.api_version} {info.kind}", **fields)
    return model
