"""OpenAPI shapes for each kind, derived from the registry's spec and status models.

These pydantic models exist only for ``/openapi.json``: handlers never validate with them
(admission does that, with its own error messages) and return already-encoded JSON. Model names
are the kind name, prefixed with the group when two groups declare the same kind, so component
names stay readable and unique.

Routes reference the schemas as plain ``$ref`` response and request bodies, and ``install``
merges the components into FastAPI's generated document. Handing FastAPI the models instead
(``responses={200: {"model": ...}}``) would make it build a pydantic ``TypeAdapter`` per route and
status code — about a thousand for the built-in kinds, most of a second per app — for nothing
but documentation. The schemas of a registry are computed once per process.
"""

from __future__ import annotations

import functools
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


Ref = dict[str, str]


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
        self.components: dict[str, Any] = top.get("$defs", {})
        self.status = self._refs[Status]

    def object(self, info: KindInfo) -> Ref:
        return self._refs[self.objects[info.key]]

    def list(self, info: KindInfo) -> Ref:
        return self._refs[self.lists[info.key]]

    def responses(self, code: int, ref: Ref | None, description: str) -> dict[int | str, Any]:
        """OpenAPI responses: ``code`` with ``ref`` as its JSON body, and the Status errors."""
        ok: dict[str, Any] = {"description": description}
        if ref is not None:
            ok["content"] = {"application/json": {"schema": ref}}
        return {code: ok, **self.errors()}

    def errors(self) -> dict[int | str, Any]:
        return {code: {"description": why, "content": {"application/json": {"schema": self.status}}}
                for code, why in ERRORS}


ERRORS = ((400, "Bad request"), (404, "Not found"), (409, "Conflict"), (410, "Expired"),
          (415, "Unsupported media type"), (422, "Invalid"))


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
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _group_prefix(group: str) -> str:
    return "".join(part.capitalize() for part in group.split(".") if part)


def _object_model(name: str, info: KindInfo) -> type[BaseModel]:
    # Built at runtime from registry values, so typed as Any for mypy.
    api_version: Any = Literal[info.api_version]
    kind: Any = Literal[info.kind]
    spec: Any = info.spec_model if info.spec_required else info.spec_model | None
    status: Any = info.status_model | None
    return create_model(
        name,
        __doc__=f"{info.api_version} {info.kind}",
        apiVersion=(api_version, ...),
        kind=(kind, ...),
        metadata=(ObjectMeta, ...),
        spec=(spec, ... if info.spec_required else None),
        status=(status, None),
    )
