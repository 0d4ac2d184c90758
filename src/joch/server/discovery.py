"""Kubernetes discovery built from the kind registry: ``/api``, ``/apis``, ``/apis/{group}[/{version}]``
and ``/version``. The self-review groups kubectl uses (``authentication.k8s.io/v1``
``selfsubjectreviews``, ``authorization.k8s.io/v1`` ``selfsubjectaccessreviews``) are listed
too; ``joch.server.auth.reviews`` serves them.

The documents are computed once when the app is built (the registry does not change while a
server runs) and served as pre-encoded bytes.

The core group (``/api``, ``/api/v1``) lists the registry's core kinds (Namespace) and the views
``joch.server.events_view`` serves (``CORE_VIEWS``: core v1 Events; ``VIEW_RESOURCES``:
``events.k8s.io/v1``). ``/api`` lists ``v1`` only when ``/api/v1`` has resources: kubectl's
discovery cache treats an empty resource list as a failed fetch, and ``kubectl api-resources``
then exits with "received empty response for: v1".

The OpenAPI documents clients read (``/openapi/v3``, ``/openapi/v2``) are ``joch.server.openapi``'s.

Only the legacy (unaggregated) discovery format is served; clients asking for aggregated
discovery (``application/json;g=apidiscovery.k8s.io;v=v2``) receive plain JSON and, as kubectl
does, fall back to the legacy walk.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from fastapi import FastAPI
from starlette.responses import Response

from joch.api import errors
from joch.api.namespaces import collection_deletable
from joch.api.registry import KindInfo, Registry
from joch.server import wire
from joch.server.options import ServerOptions
from joch.server.schemas import error_responses

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
# The self-reviews of joch.server.auth.reviews: kubectl finds them here (auth whoami, auth can-i).
REVIEW_RESOURCES: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("authentication.k8s.io", "v1"): [{"name": "selfsubjectreviews", "singularName": "selfsubjectreview",
                                       "namespaced": False, "kind": "SelfSubjectReview", "verbs": ["create"]}],
    ("authorization.k8s.io", "v1"): [{"name": "selfsubjectaccessreviews", "singularName": "selfsubjectaccessreview",
                                      "namespaced": False, "kind": "SelfSubjectAccessReview", "verbs": ["create"]}],
}
STATUS_VERBS = ["get", "patch", "update"]
# Served by joch.server.events_view as views of Joch's own Events, not kinds of the registry.
_EVENTS_VIEW = {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event",
                "verbs": ["get", "list", "watch"], "shortNames": ["ev"]}
CORE_VIEWS: list[dict[str, Any]] = [_EVENTS_VIEW]
VIEW_RESOURCES: dict[tuple[str, str], list[dict[str, Any]]] = {("events.k8s.io", "v1"): [_EVENTS_VIEW]}


def resource_list(group_version: str, kinds: list[KindInfo]) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for info in kinds:
        resources.append({
            "name": info.plural,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": VERBS if collection_deletable(info) else [v for v in VERBS if v != "deletecollection"],
            "shortNames": list(info.short_names),
            "categories": list(info.categories),
        })
        if info.status_model is None:  # no status subresource
            continue
        resources.append({
            "name": f"{info.plural}/status",
            "singularName": "",
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": STATUS_VERBS,
        })
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": resources}


def api_group(name: str, kinds: list[KindInfo]) -> dict[str, Any]:
    versions: list[dict[str, str]] = []
    for info in kinds:
        entry = {"groupVersion": info.api_version, "version": info.version}
        if entry not in versions:
            versions.append(entry)
    # Registration order decides preference: the first version registered for a group wins.
    return {"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": versions,
            "preferredVersion": versions[0]}


def _static(body: dict[str, Any]) -> Callable[[], Response]:
    encoded = wire.dumps(body)

    def endpoint() -> Response:
        return Response(encoded, media_type=wire.JSON)

    return endpoint


def install(app: FastAPI, registry: Registry, options: ServerOptions) -> None:
    core_kinds = registry.groups().get("", [])
    core = {"kind": "APIVersions", "apiVersion": "v1", "versions": ["v1"] if core_kinds else [],
            "serverAddressByClientCIDRs": []}
    core_resources = resource_list("v1", core_kinds)
    core_resources["resources"].extend(CORE_VIEWS)
    groups = {name: api_group(name, kinds) for name, kinds in registry.groups().items() if name}
    by_group_version: dict[tuple[str, str], list[KindInfo]] = {}
    for info in registry:
        if info.group:
            by_group_version.setdefault((info.group, info.version), []).append(info)
    for group, version in [*VIEW_RESOURCES, *REVIEW_RESOURCES]:
        entry = {"groupVersion": f"{group}/{version}", "version": version}
        groups[group] = {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [entry],
                         "preferredVersion": entry}
    group_list = {"kind": "APIGroupList", "apiVersion": "v1", "groups": list(groups.values())}
    group_bodies = {name: wire.dumps(body) for name, body in groups.items()}
    version_bodies = {key: wire.dumps(resource_list(f"{key[0]}/{key[1]}", kinds))
                      for key, kinds in by_group_version.items()}
    for (group, version), listed in {**VIEW_RESOURCES, **REVIEW_RESOURCES}.items():
        version_bodies[(group, version)] = wire.dumps({"kind": "APIResourceList", "apiVersion": "v1",
                                                       "groupVersion": f"{group}/{version}", "resources": listed})

    tags: list[str | Enum] = ["discovery"]
    app.add_api_route("/api", _static(core), methods=["GET"], tags=tags, summary="Core API versions")
    app.add_api_route("/api/v1", _static(core_resources), methods=["GET"], tags=tags,
                      summary="Core v1 resources")
    app.add_api_route("/apis", _static(group_list), methods=["GET"], tags=tags, summary="API groups")
    app.add_api_route("/version", _static(options.version.to_dict()), methods=["GET"], tags=tags,
                      summary="Server version")

    def get_group(group: str) -> Response:
        body = group_bodies.get(group)
        if body is None:
            raise errors.NotFound(f"the server could not find the requested API group {group!r}")
        return Response(body, media_type=wire.JSON)

    def get_group_version(group: str, version: str) -> Response:
        body = version_bodies.get((group, version))
        if body is None:
            raise errors.NotFound(
                f"the server could not find the requested API group version {group}/{version}"
            )
        return Response(body, media_type=wire.JSON)

    unknown = error_responses((404, "No such API group (or version)"))
    app.add_api_route("/apis/{group}", get_group, methods=["GET"], tags=tags, summary="An API group",
                      responses=unknown)
    app.add_api_route("/apis/{group}/{version}", get_group_version, methods=["GET"], tags=tags,
                      summary="The resources of a group version", responses=unknown)
