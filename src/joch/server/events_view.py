"""Joch's Events (``ops.joch.dev/v1alpha1`` ``Event``) as the Kubernetes Event kinds, read-only.

kubectl finds an object's events by listing core v1 Events (``/api/v1/namespaces/NS/events``) with
a field selector on ``involvedObject`` (name, namespace, kind, uid); tools built on the newer API
read ``events.k8s.io/v1``. Both are served here as views: each Joch Event is translated on the
way out (``to_core``, ``to_events_v1``), and nothing is stored twice. Writes stay on the
``ops.joch.dev`` kind, where controllers and admission make them.

Routes, for both ``/api/v1`` and ``/apis/events.k8s.io/v1``: list (every namespace, or one), get,
and watch (``?watch=1``, watch-list included). Field selectors are evaluated on the core shape,
with the labels the apiserver supports for Events (``FIELDS``), ``=``, ``==`` and ``!=``; a
``involvedObject.uid=`` selector (what describe sends) narrows the store query by the
``events.joch.dev/involved-uid`` label, so describe costs one indexed list, not a scan. A field the
apiserver does not support is a 400 naming the supported ones. A client asking for a ``Table``
(``kubectl get events``) gets the columns of Joch's Event kind (TYPE, REASON, OBJECT, MESSAGE, AGE).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI
from starlette.responses import Response

from joch.api import errors, kinds
from joch.api.events import INVOLVED_UID
from joch.server import limits, params, resources, tables, watch, wire
from joch.server.options import ServerOptions
from joch.server.schemas import error_responses
from joch.store.base import ListOptions, ListResult, Obj, Store

EVENT = kinds.EVENT
FIELDS = ("metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
          "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
          "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent",
          "source", "type")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*$")


@dataclass(frozen=True)
class Shape:
    """One of the two Event APIs: where it is served and how an Event looks there."""

    api_version: str
    base: str
    translate: Callable[[Obj], Obj]


def to_core(obj: Obj) -> Obj:
    spec = obj.get("spec") or {}
    source = spec.get("source") or {}
    return {
        "apiVersion": "v1", "kind": "Event", "metadata": _metadata(obj),
        "involvedObject": {k: v for k, v in (spec.get("involvedObject") or {}).items() if v is not None},
        "reason": spec.get("reason", ""), "message": spec.get("message", ""), "type": spec.get("type", "Normal"),
        "count": spec.get("count", 1), "firstTimestamp": spec.get("firstTimestamp"),
        "lastTimestamp": spec.get("lastTimestamp"), "eventTime": None,
        "source": source, "reportingComponent": source.get("component", ""), "reportingInstance": "",
    }


def to_events_v1(obj: Obj) -> Obj:
    spec = obj.get("spec") or {}
    source = spec.get("source") or {}
    first = spec.get("firstTimestamp")
    out: Obj = {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": _metadata(obj),
        "eventTime": _micro(first), "reportingController": source.get("component", ""),
        "reportingInstance": source.get("component", ""), "action": spec.get("reason", ""),
        "reason": spec.get("reason", ""), "note": spec.get("message", ""), "type": spec.get("type", "Normal"),
        "regarding": {k: v for k, v in (spec.get("involvedObject") or {}).items() if v is not None},
        "deprecatedSource": source, "deprecatedFirstTimestamp": first,
        "deprecatedLastTimestamp": spec.get("lastTimestamp"), "deprecatedCount": spec.get("count", 1),
    }
    if (spec.get("count") or 1) > 1:
        out["series"] = {"count": spec["count"], "lastObservedTime": _micro(spec.get("lastTimestamp"))}
    return out


def _metadata(obj: Obj) -> Obj:
    m = obj.get("metadata") or {}
    return {k: v for k, v in m.items() if k in ("name", "namespace", "uid", "resourceVersion",
                                                  "creationTimestamp", "labels", "annotations")}


def _micro(stamp: str | None) -> str | None:
    return stamp.replace("Z", ".000000Z") if stamp and stamp.endswith("Z") and "." not in stamp else stamp


Requirement = tuple[str, bool, str]  # field, equal (= / ==) or not (!=), value


def parse_fields(selector: str | None) -> list[Requirement]:
    out: list[Requirement] = []
    for part in (selector or "").split(","):
        if not part.strip():
            continue
        m = _REQUIREMENT.match(part)
        if not m:
            raise errors.BadRequest(f"unable to parse field selector requirement {part!r}: use field=value")
        if m.group(1) not in FIELDS:
            raise errors.BadRequest(f'field label not supported: "{m.group(1)}" (supported for events: '
                                    f"{', '.join(FIELDS)})")
        out.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return out


def _value(core: Obj, field: str) -> str:
    if field == "source":
        return str((core.get("source") or {}).get("component") or "")
    value: Any = core
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def selected(requirements: list[Requirement]) -> Callable[[Obj], bool]:
    def keep(obj: Obj) -> bool:
        core = to_core(obj)
        return all((_value(core, f) == v) == equal for f, equal, v in requirements)

    return keep


def _labels(label_selector: str | None, requirements: list[Requirement]) -> str | None:
    """The store's label selector: the caller's, narrowed to the involved uid when one is selected."""
    uid = next((v for f, equal, v in requirements if f == "involvedObject.uid" and equal and v), None)
    parts = [p for p in (label_selector, f"{INVOLVED_UID}={uid}" if uid else None) if p]
    return ",".join(parts) or None


def _watch_transform(shape: Shape) -> watch.Transform:
    def transform(event_type: str, obj: Any) -> Any:
        if event_type in ("ADDED", "MODIFIED", "DELETED"):
            return shape.translate(obj)
        if event_type == "BOOKMARK":
            return {**obj, "apiVersion": shape.api_version}
        return obj

    return transform


def install(app: FastAPI, store: Store, options: ServerOptions, slots: limits.WatchSlots) -> None:
    for shape in (Shape("v1", "/api/v1", to_core), Shape("events.k8s.io/v1", "/apis/events.k8s.io/v1", to_events_v1)):
        _install(app, store, options, slots, shape)


def _install(app: FastAPI, store: Store, options: ServerOptions, slots: limits.WatchSlots, shape: Shape) -> None:
    list_kind = {"kind": "EventList", "apiVersion": shape.api_version}
    event_tables = tables.KindTables(EVENT)
    tags: list[Any] = [shape.api_version]

    def listing(namespace: str | None, label_selector: str | None, field_selector: str | None,
                limit: int | None, token: str | None, resource_version: str | None, watching: bool,
                timeout: int | None, bookmarks: bool, send_initial: bool | None, match: str | None,
                table: tables.TableRequest | None) -> Response:
        requirements = parse_fields(field_selector)
        labels = _labels(label_selector, requirements)
        keep = selected(requirements) if requirements else None
        if watching:
            opts = params.watch_options(namespace, labels, None, resource_version, bookmarks)
            transform = event_tables.watch_transform(table) if table else _watch_transform(shape)
            if send_initial is not None:
                watch.check_watch_list(send_initial, match, bookmarks)
                return watch.respond_list(store, EVENT, opts, send_initial=send_initial, timeout_seconds=timeout,
                                          options=options, slots=slots, transform=transform, keep=keep)
            return watch.respond(store, EVENT, opts, timeout_seconds=timeout, options=options, slots=slots,
                                 transform=transform, keep=keep)
        result = store.list(EVENT, ListOptions(namespace=namespace, label_selector=labels,
                                               limit=params.page_limit(limit) if not keep else None,
                                               continue_token=token or None))
        kept = [obj for obj in result.items if keep is None or keep(obj)]
        if table:
            return wire.json_response(event_tables.for_list(
                ListResult(items=kept, resource_version=result.resource_version,
                           continue_token=result.continue_token), table))
        items = [shape.translate(obj) for obj in kept]
        metadata: Obj = {"resourceVersion": result.resource_version}
        if result.continue_token:
            metadata["continue"] = result.continue_token
        return wire.json_response({**list_kind, "metadata": metadata, "items": items})

    def list_all(
        label_selector: params.LabelSelector = None, field_selector: params.FieldSelector = None,
        limit: params.Limit = None, token: params.Continue = None, resource_version: params.ResourceVersion = None,
        watching: params.WatchFlag = False, timeout: params.TimeoutSeconds = None,
        bookmarks: params.AllowBookmarks = False, send_initial: params.SendInitialEvents = None,
        match: params.ResourceVersionMatch = None, accept: params.Accept = None,
        include_object: params.IncludeObject = None,
    ) -> Response:
        return listing(None, label_selector, field_selector, limit, token, resource_version, watching, timeout,
                       bookmarks, send_initial, match, tables.negotiate(accept, include_object))

    def list_namespaced(
        namespace: str | None = Depends(resources.namespace_scope),
        label_selector: params.LabelSelector = None, field_selector: params.FieldSelector = None,
        limit: params.Limit = None, token: params.Continue = None, resource_version: params.ResourceVersion = None,
        watching: params.WatchFlag = False, timeout: params.TimeoutSeconds = None,
        bookmarks: params.AllowBookmarks = False, send_initial: params.SendInitialEvents = None,
        match: params.ResourceVersionMatch = None, accept: params.Accept = None,
        include_object: params.IncludeObject = None,
    ) -> Response:
        return listing(namespace, label_selector, field_selector, limit, token, resource_version, watching,
                       timeout, bookmarks, send_initial, match, tables.negotiate(accept, include_object))

    def read(name: str, namespace: str | None = Depends(resources.namespace_scope), accept: params.Accept = None,
             include_object: params.IncludeObject = None) -> Response:
        try:
            obj = store.get(EVENT, namespace, name)
        except errors.NotFound:
            resource = "events" if shape.api_version == "v1" else "events.events.k8s.io"
            raise errors.NotFound(f'{resource} "{name}" not found', kind="events", name=name) from None
        table = tables.negotiate(accept, include_object)
        return wire.json_response(event_tables.for_object(obj, table) if table else shape.translate(obj))

    summary = f"Joch's Events as {shape.api_version} Events (read-only)"
    app.add_api_route(f"{shape.base}/events", list_all, methods=["GET"], tags=tags, summary=summary,
                      name=f"listAllNamespaces:events:{shape.api_version}")
    app.add_api_route(f"{shape.base}/namespaces/{{namespace}}/events", list_namespaced, methods=["GET"], tags=tags,
                      summary=summary, name=f"list:events:{shape.api_version}")
    app.add_api_route(f"{shape.base}/namespaces/{{namespace}}/events/{{name}}", read, methods=["GET"], tags=tags,
                      summary=summary, name=f"read:events:{shape.api_version}",
                      responses=error_responses((404, "No such Event")))
