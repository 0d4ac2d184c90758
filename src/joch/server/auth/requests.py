"""What a request asks to do, in RBAC's terms: kube-apiserver's ``RequestInfo`` for Joch's routes.

``resolve(method, path, query)`` answers a ``RequestInfo``: for a resource request the verb
(``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``), the API group, the
resource (the plural), the subresource, the namespace and the name; for anything else the path
and the verb of the method (a "non-resource URL"). It reads only the method, the path and the
query string, never the body. The query string is read as the route's handler reads it (Starlette's
``QueryParams``: a repeated parameter is its last value, blank ones kept), so ``?kind=Agent&kind=``
is not authorized as a watch of Agents and served as a watch of every kind. The routes it knows:

* ``/apis/GROUP/VERSION[/namespaces/NS]/PLURAL[/NAME[/SUB]]`` and ``/api/v1/...``: as the apiserver
  reads them (``?watch=true`` on a collection is ``watch``; a GET of a collection is ``list``; a
  DELETE of a collection is ``deletecollection``).
  ``RUN/log``, ``RUN/artifacts[/NAME]`` are ``get`` on ``agentruns/log`` and ``agentruns/artifacts``.
* ``/v1/namespaces/NS/agents|executions|approvals[/NAME[/SUB]]``: the same, ``executions`` being
  ``agentruns``; ``agents/NAME/manifest`` is ``get agents/manifest``; ``POST approvals/NAME/decide``
  is ``update approvals/decide`` (what the approver role grants); ``POST agentruns/render`` (a run
  rendered, never stored or started) is ``create agentruns``: it shows what its caller could run.
* ``POST /v1/namespaces/NS/triggerrules/NAME/fire`` (``joch trigger fire``) is ``create`` on
  ``triggerrules/fire`` (group joch.dev), which editors hold: firing a rule starts a run, as
  creating one does. The webhook routes (``/v1/webhooks/...``) never get here: the middleware
  exempts them, as each verifies its delivery's signature itself (``joch.server.webhooks``).
* ``GET /v1/resources/watch`` and ``WATCH /v1/resources``: ``watch`` on the kind of ``?kind=``
  (every kind when none: ``resource="*"``) in ``?namespace=`` (every namespace when none).
* ``GET /v1/audit``: ``list`` on ``auditevents`` (ops.joch.dev) in ``?namespace=``.
* ``GET /v1/cost`` and ``/v1/namespaces/NS/cost``: ``list`` on ``agentruns`` (every namespace, or NS).
* ``POST /v1/resources/apply`` and ``/create``: ``batch``: the documents span kinds and
  namespaces, so the route authorizes each document itself before writing anything
  (``joch.server.auth.rbac.authorize_documents``).
* ``/v1/whoami`` and the self-reviews (``selfsubjectreviews``, ``selfsubjectaccessreviews``):
  ``anyone``: every authenticated user may ask who they are and what they may do.
* ``/mcp`` (``joch.mcp.http``): ``anyone``. Each MCP tool call is a request of its own to these
  routes with the same token, authorized here like any other.
* Discovery (``/version``, ``/api``, ``/apis``, ``/apis/GROUP[/VERSION]``, ``/openapi.json``, ``/openapi/v2``,
  ``/openapi/v3/...``,
  ``/docs``): ``anyone``.

Any other path (and any path with an empty segment) is a non-resource URL, which RBAC grants only to
cluster-wide admins: a route added later is closed until it is mapped here, not open.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.datastructures import QueryParams

from joch.api import REGISTRY, errors, kinds
from joch.api.registry import Registry

METHOD_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete"}
TRUE = frozenset({"true", "1", "yes", "on", "t", "y"})
DISCOVERY = frozenset({"/api", "/apis", "/openapi.json", "/openapi/v2", "/docs", "/docs/oauth2-redirect",
                       "/v1/whoami", "/version"})
MCP = "/mcp"
SELF_REVIEWS = frozenset({
    "/apis/authentication.k8s.io/v1/selfsubjectreviews",
    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
})
V1_ALIASES = {"executions": kinds.AGENT_RUN, "agents": kinds.AGENT, "approvals": kinds.APPROVAL}
AUDIT_RESOURCE = ("ops.joch.dev", "auditevents")
ALL = "*"


@dataclass(frozen=True)
class RequestInfo:
    verb: str
    path: str
    resource: str = ""  # empty: a non-resource URL
    api_group: str = ""
    subresource: str = ""
    namespace: str = ""  # empty: every namespace (or a cluster-scoped object)
    name: str = ""
    anyone: bool = False  # any authenticated user may (discovery, whoami, self-reviews)
    batch: bool = False  # the route authorizes each document of its body itself

    @property
    def is_resource_request(self) -> bool:
        return bool(self.resource)


def resolve(method: str, path: str, query: str = "", registry: Registry = REGISTRY) -> RequestInfo:
    method = method.upper()
    verb = METHOD_VERBS.get(method, method.lower())
    if path in DISCOVERY or path in SELF_REVIEWS or path == MCP:
        return RequestInfo(verb=verb, path=path, anyone=True)
    parts = path.removesuffix("/").split("/")[1:]
    if "" in parts:  # "//": no route has an empty segment; never read it as a shorter path
        return RequestInfo(verb=verb, path=path)
    if parts[:2] == ["openapi", "v3"]:  # the index and each group version's document (joch.server.openapi)
        return RequestInfo(verb=verb, path=path, anyone=method in ("GET", "HEAD"))
    if (parts[:1] == ["apis"] and len(parts) <= 3) or parts == ["api", "v1"]:
        return RequestInfo(verb=verb, path=path, anyone=method in ("GET", "HEAD"))  # discovery
    if parts[:1] == ["apis"]:
        return _rest(method, path, parts[1], parts[3:], query)
    if parts[:2] == ["api", "v1"]:
        return _rest(method, path, "", parts[2:], query)
    if parts[:1] == ["v1"]:
        return _v1(method, verb, path, parts[1:], query, registry)
    return RequestInfo(verb=verb, path=path)


def _rest(method: str, path: str, group: str, rest: list[str], query: str) -> RequestInfo:
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces" and not (len(rest) == 2 or rest[2:] in (["status"], ["finalize"])):
        namespace, rest = rest[1], rest[2:]
    # else: /namespaces/NAME[/status] is the Namespace object itself (cluster-scoped), as the apiserver reads it
    if not rest:
        return RequestInfo(verb=METHOD_VERBS.get(method, method.lower()), path=path)
    resource, name, subresource = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
    return RequestInfo(verb=_verb(method, bool(name), query), path=path, resource=resource, api_group=group,
                       subresource=subresource, namespace=namespace, name=name)


def _verb(method: str, named: bool, query: str) -> str:
    if method in ("GET", "HEAD") and not named:
        watching = (QueryParams(query).get("watch") or "").lower() in TRUE
        return "watch" if watching else "list"
    if method == "WATCH":
        return "watch"
    if method == "DELETE" and not named:
        return "deletecollection"
    return METHOD_VERBS.get(method, method.lower())


def _v1(method: str, verb: str, path: str, rest: list[str], query: str, registry: Registry) -> RequestInfo:
    params = QueryParams(query)
    namespace = params.get("namespace") or ""
    if rest in (["resources", "apply"], ["resources", "create"]) and method == "POST":
        # The audit log's verb; each document is authorized as the create or update it is.
        return RequestInfo(verb=rest[1], path=path, namespace=namespace, batch=True)
    if (rest == ["resources", "watch"] and method == "GET") or (rest == ["resources"] and method == "WATCH"):
        kind = params.get("kind") or ""
        group, resource = "", ALL
        if kind:
            try:
                info = registry.resolve(kind)
                group, resource = info.group, info.plural
            except errors.NotFound:  # the route answers the 404, to whoever may watch that
                resource = kind
        return RequestInfo(verb="watch", path=path, resource=resource, api_group=group, namespace=namespace)
    if rest == ["audit"]:
        group, resource = AUDIT_RESOURCE
        return RequestInfo(verb="list", path=path, resource=resource, api_group=group, namespace=namespace)
    if method == "GET" and (rest == ["cost"] or (len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "cost")):
        # Spend is summed from runs' metered usage: who may list a namespace's runs may read it.
        return RequestInfo(verb="list", path=path, resource=kinds.AGENT_RUN.plural, api_group=kinds.AGENT_RUN.group,
                           namespace=rest[1] if len(rest) == 3 else "")
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, alias, tail = rest[1], rest[2], rest[3:]
        try:
            info = V1_ALIASES.get(alias) or registry.resolve(alias)
        except errors.NotFound:
            return RequestInfo(verb=verb, path=path)
        if tail == ["render"] and method == "POST" and info is kinds.AGENT_RUN:
            return RequestInfo(verb="create", path=path, resource=info.plural, api_group=info.group,
                               namespace=namespace)
        name = tail[0] if tail else ""
        subresource = tail[1] if len(tail) > 1 else ""
        if subresource == "decide" and method == "POST":
            verb = "update"  # deciding is writing the approval's decision, which the approver role grants
        else:
            verb = _verb(method, bool(name), query)
        return RequestInfo(verb=verb, path=path, resource=info.plural, api_group=info.group,
                           subresource=subresource, namespace=namespace, name=name)
    return RequestInfo(verb=verb, path=path)
