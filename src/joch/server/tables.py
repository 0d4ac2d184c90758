"""Kubernetes ``Table`` responses: the columns ``kubectl get`` and ``joch get`` print, from the registry.

A client asks for a Table with ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` (``v1beta1``
is accepted too and answered in that version), usually followed by a plain ``application/json``
fallback, on any list, watch or get route. The answer has the shape of the apiserver's
(``k8s.io/apimachinery`` ``metav1.Table``; the Kubernetes docs, "API concepts", "Receiving
resources as Tables")::

    {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
     "metadata": {"resourceVersion": "42", "continue": "..."},        # a list's ListMeta
     "columnDefinitions": [{"name": "NAME", "type": "string", "format": "name",
                            "description": "...", "priority": 0}, ...],
     "rows": [{"cells": ["coder", "echo", "True", "5m"],
               "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                          "metadata": {...}}}]}

``?includeObject=Metadata`` (the default) puts that ``PartialObjectMetadata`` in each row — kubectl
reads the namespace for ``-A`` from it — ``Object`` the whole object, ``None`` nothing. Columns and
cells come from ``joch.api.columns``: NAME first (``format: name``), then ``KindInfo.columns``;
``wide`` columns have priority 1, which kubectl shows only with ``-o wide``. Cells are rendered
here, ages included, because kubectl prints cells as they come.

Negotiation: the media ranges of ``Accept`` are tried in order of their ``q``; the first that is a
JSON Table in a known version, or plain JSON (``application/json``, ``application/*``, ``*/*``),
wins. Anything Joch does not serve (``as=PartialObjectMetadataList``, YAML, protobuf) is skipped, and
when nothing is left the answer is plain JSON, as it was before Tables: lenient where the apiserver
would answer 406, so no existing client breaks.

Watches (``kubectl get -w``) follow the apiserver: each event's object is a Table with one row; the
first event carries the column definitions, later ones an empty list ("use the last columns", as
kubectl's printer reads it). A BOOKMARK becomes a row-less Table holding its ``resourceVersion``; an
ERROR keeps its ``Status``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

from joch.api import columns, errors
from joch.api.registry import KindInfo
from joch.store.base import ListResult, Obj


def list_metadata(result: ListResult) -> dict[str, Any]:
    """The ``metadata`` of a list, plain or as a Table: the revision a watch resumes from, and the
    continue token when there are more pages."""
    metadata: dict[str, Any] = {"resourceVersion": result.resource_version}
    if result.continue_token:
        metadata["continue"] = result.continue_token
    return metadata

GROUP = "meta.k8s.io"
VERSIONS = ("v1", "v1beta1")
Include = Literal["None", "Metadata", "Object"]
INCLUDE: tuple[Include, ...] = ("None", "Metadata", "Object")
_PLAIN = frozenset({"application/json", "application/*", "*/*"})


@dataclass(frozen=True)
class TableRequest:
    version: str = "v1"
    include: Include = "Metadata"

    @property
    def api_version(self) -> str:
        return f"{GROUP}/{self.version}"


def negotiate(accept: str | None, include_object: str | None) -> TableRequest | None:
    """The Table the client asked for, or ``None`` for the plain JSON object or list."""
    if not accept or "table" not in accept.lower():  # the fast path of every plain request
        return None
    for media_type, parameters in _ranges(accept):
        target = parameters.get("as")
        if target is None:
            if media_type in _PLAIN:
                return None
            continue
        if (media_type == "application/json" and target == "Table" and parameters.get("g") == GROUP
                and parameters.get("v") in VERSIONS):
            return TableRequest(parameters["v"], _include(include_object))
    return None


def _ranges(accept: str) -> list[tuple[str, dict[str, str]]]:
    """``(media type, parameters)`` by descending ``q``, in written order otherwise; q=0 dropped."""
    ranges: list[tuple[float, int, str, dict[str, str]]] = []
    for index, part in enumerate(accept.split(",")):
        media_type, *raw = (piece.strip() for piece in part.split(";"))
        parameters = {}
        for item in raw:
            key, _, val = item.partition("=")
            parameters[key.strip().lower()] = val.strip().strip('"')
        try:
            q = float(parameters.pop("q", "1"))
        except ValueError:
            q = 1.0
        if media_type and q > 0:
            ranges.append((-q, index, media_type.lower(), parameters))
    return [(media_type, parameters) for _, _, media_type, parameters in sorted(ranges, key=lambda r: r[:2])]


def _include(value: str | None) -> Include:
    if not value:
        return "Metadata"
    for known in INCLUDE:
        if value == known:
            return known
    raise errors.BadRequest(
        f'unrecognized includeObject value "{value}": use None, Metadata (the default) or Object'
    )


class KindTables:
    """The Tables of one kind; column definitions are computed once."""

    def __init__(self, kind: KindInfo) -> None:
        self.kind = kind
        self.columns = columns.for_kind(kind)
        self.definitions = columns.definitions(self.columns)

    def for_list(self, result: ListResult, request: TableRequest) -> dict[str, Any]:
        return self._table(result.items, request, list_metadata(result))

    def for_object(self, obj: Obj, request: TableRequest, *, headers: bool = True) -> dict[str, Any]:
        version = (obj.get("metadata") or {}).get("resourceVersion")
        return self._table([obj], request, {"resourceVersion": version} if version else {}, headers=headers)

    def watch_transform(self, request: TableRequest) -> WatchTables:
        return WatchTables(self, request)

    def _table(
        self, objects: list[Obj], request: TableRequest, metadata: dict[str, Any], *, headers: bool = True
    ) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC)
        return {
            "kind": "Table",
            "apiVersion": request.api_version,
            "metadata": metadata,
            "columnDefinitions": self.definitions if headers else [],
            "rows": [self._row(obj, request, now) for obj in objects],
        }

    def _row(self, obj: Obj, request: TableRequest, now: dt.datetime) -> dict[str, Any]:
        row: dict[str, Any] = {"cells": columns.cells(obj, self.columns, now)}
        if request.include == "Object":
            row["object"] = obj
        elif request.include == "Metadata":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": request.api_version,
                             "metadata": obj.get("metadata") or {}}
        return row


class WatchTables:
    """Turns the objects of one watch stream into Tables; only the first carries the columns."""

    def __init__(self, tables: KindTables, request: TableRequest) -> None:
        self._tables = tables
        self._request = request
        self._headers = True

    def __call__(self, event_type: str, obj: Any) -> Any:
        headers, self._headers = self._headers, False
        if event_type == "ERROR" or not isinstance(obj, dict):
            return obj
        if event_type == "BOOKMARK":
            version = (obj.get("metadata") or {}).get("resourceVersion")
            return {"kind": "Table", "apiVersion": self._request.api_version,
                    "metadata": {"resourceVersion": version},
                    "columnDefinitions": self._tables.definitions if headers else [], "rows": []}
        return self._tables.for_object(obj, self._request, headers=headers)
