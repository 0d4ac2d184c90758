"""The Joch seed's ``/v1`` routes, thin aliases over the same handlers as the Kubernetes routes.

* ``POST /v1/resources/apply``: a multi-document YAML (or JSON) body applied atomically through
  admission; any rejected document rejects the request with a 422 naming it and nothing is written.
  The answer is an ``ApplyResult`` with one item per document (in input order) and the
  kubectl-style ``lines`` (``agent.joch.dev/x created``). In the 422, every cause of
  ``details.documents[].causes`` also carries the ``line`` and ``column`` (1-based) where its field
  is written in the body (``joch.admission.positions``; ``exact: false`` when the field is not
  written and that is its closest written ancestor); a YAML syntax error's 400 has ``details.line``
  and ``details.column``. The console's apply page shows each problem at its line. A document carrying
  ``metadata.resourceVersion``/``uid`` (``get -o yaml`` output) is applied only over that version:
  409 ``Conflict`` naming the document otherwise.
* ``POST /v1/resources/create``: the same body, parameters and answer (201, every item
  ``created``), through ``admission.create_documents``: ``generateName`` is honoured, and a document
  whose object exists already is a 409 ``AlreadyExists`` naming it, with nothing written.
* Both take ``application/yaml`` or ``application/json``; other types and none are a 415.
  Each request is one write transaction, so its size is capped: more than
  ``ServerOptions.max_apply_documents`` objects or ``max_apply_bytes`` of body is a 413 naming the
  limit and the ``joch server`` flag that sets it. ``?namespace=`` must be a DNS-1123 label (400 otherwise).
  Every document is authorized (create, or update of an existing object, on its kind in its
  namespace) before anything is written: one the caller may not write is a 403 naming it. What a
  batch changed is logged, a line per object (``agent.joch.dev/x created by alice``).
* ``GET /v1/namespaces/{namespace}/agents[/{name}]``, ``executions[/{name}]`` (AgentRuns; ``POST``
  creates one), ``approvals[/{name}]``: the same list/get answers as the ``/apis`` routes. The run
  routes beyond the object (``executions/{name}/log``, ``approvals/{name}/decide``,
  ``agents/{name}/manifest``) are in ``joch.server.runs``.
* ``GET /v1/resources/watch`` and the seed's literal ``WATCH /v1/resources``: Server-Sent Events
  (see ``joch.server.sse``) across every kind or the one named by ``?kind=``. The ``WATCH`` route
  is left out of OpenAPI, which has no such method; the ``GET`` form is the documented one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header
from starlette.responses import Response

from joch.admission import apply as admission
from joch.admission import documents, positions
from joch.api import errors, kinds
from joch.api.identity import ANONYMOUS, current_user
from joch.api.registry import Registry
from joch.server import limits, params, resources, sse, wire
from joch.server.auth import rbac
from joch.server.options import ServerOptions
from joch.server.resources import ContentType, KindHandlers
from joch.server.schemas import SERVER_SENT_EVENTS, KindSchemas
from joch.store.base import Store

logger = logging.getLogger("joch.server.v1")
LastEventId = Annotated[str | None, Header(alias="last-event-id", description="resume after this id")]
TAGS: list[str | Enum] = ["v1"]


def _log_changes(result: admission.ApplyResult) -> None:
    """What a batch changed, a line per object as ``joch server --apply`` logs it (``unchanged`` and dry
    runs are not news); with ``--log-format json`` each line carries the request's id."""
    if result.dry_run:
        return
    for item in result.items:
        if item.action != "unchanged":
            logger.info("%s %s by %s", item.ref, item.action, (current_user() or ANONYMOUS).name)


def apply_body(result: admission.ApplyResult, dry_run: bool) -> dict[str, Any]:
    items = [
        {
            "index": item.index,
            "apiVersion": item.kind.api_version,
            "kind": item.kind.kind,
            "namespace": item.namespace,
            "name": item.name,
            "action": item.action,
            "resourceVersion": (item.object.get("metadata") or {}).get("resourceVersion"),
            "warnings": list(item.warnings),
        }
        for item in result.items
    ]
    return {"kind": "ApplyResult", "apiVersion": "v1", "dryRun": dry_run, "items": items,
            "lines": list(result.lines())}


@contextmanager
def located(text: str) -> Iterator[None]:
    """A rejected batch's causes, each with the line and column of its field in ``text``
    (``positions``): what an editor needs to show a problem where it is written."""
    try:
        yield
    except errors.Invalid as exc:
        positions.locate(exc.extra.get("documents"), text)
        raise


def install(
    app: FastAPI, store: Store, options: ServerOptions, registry: Registry, schemas: KindSchemas,
    slots: limits.WatchSlots | None = None,
) -> None:
    slots = slots or limits.WatchSlots(options.max_watches or limits.default_max_watches())
    read_manifests = wire.body_reader(options.max_apply_bytes, "--max-apply-bytes")
    read_body = wire.body_reader(options.max_body_bytes)

    def manifests(body: bytes, content_type: str | None, verb: str) -> tuple[str, list[documents.Document]]:
        wire.require_manifests(content_type)
        text = wire.decode_text(body)
        docs = documents.load_documents(text, wire.BODY)
        if not docs:
            raise errors.BadRequest(f"the request body holds no objects to {verb}")
        if len(docs) > options.max_apply_documents:
            # One request is one transaction, which holds the write lock while it admits and writes
            # every object: thousands of them would stall every other writer for seconds.
            raise errors.RequestEntityTooLarge(
                f"the request holds {len(docs)} objects; one {verb} takes at most {options.max_apply_documents} "
                "(joch server --max-apply-documents): split the manifests into several requests")
        return text, docs

    def authorized(docs: list[documents.Document], namespace: str | None, *, create_only: bool) -> None:
        authorizer: rbac.Authorizer = app.state.authorizer
        rbac.authorize_documents(authorizer, store, current_user() or ANONYMOUS, docs, namespace=namespace,
                                 create_only=create_only)

    def apply(
        body: bytes = Depends(read_manifests), content_type: ContentType = None, dry_run: params.DryRun = None,
        namespace: params.Namespace = None,
    ) -> Response:
        dry = params.dry_run(dry_run)
        ns = params.check_namespace(namespace)
        text, docs = manifests(body, content_type, "apply")
        authorized(docs, ns, create_only=False)
        with located(text):
            result = admission.apply_documents(store, docs, dry_run=dry, options=options.admission, namespace=ns)
        _log_changes(result)
        return wire.json_response(apply_body(result, dry), warnings=result.warnings())

    def create(
        body: bytes = Depends(read_manifests), content_type: ContentType = None, dry_run: params.DryRun = None,
        namespace: params.Namespace = None,
    ) -> Response:
        dry = params.dry_run(dry_run)
        ns = params.check_namespace(namespace)
        text, docs = manifests(body, content_type, "create")
        authorized(docs, ns, create_only=True)
        with located(text):
            result = admission.create_documents(store, docs, dry_run=dry, options=options.admission, namespace=ns)
        _log_changes(result)
        return wire.json_response(apply_body(result, dry), status_code=201, warnings=result.warnings())

    manifest_body = {"requestBody": {"required": True, "content": {
        "application/yaml": {"schema": {"type": "string"}},
        "application/json": {"schema": {"type": "object"}},
    }}}
    app.add_api_route(
        "/v1/resources/apply", apply, methods=["POST"], tags=TAGS, summary="Apply manifests atomically",
        responses=schemas.responses(200, None, "an ApplyResult", body=True), openapi_extra=manifest_body,
    )
    app.add_api_route(
        "/v1/resources/create", create, methods=["POST"], tags=TAGS, status_code=201,
        summary="Create manifests atomically (generateName honoured; existing objects are a 409)",
        responses=schemas.responses(201, None, "an ApplyResult, every item created", body=True),
        openapi_extra=manifest_body,
    )

    agents = KindHandlers(kinds.AGENT, store, options, slots)
    runs = KindHandlers(kinds.AGENT_RUN, store, options, slots)
    approvals = KindHandlers(kinds.APPROVAL, store, options, slots)
    app.add_api_route("/v1/namespaces/{namespace}/agents", resources.lister(agents),
                      methods=["GET"], tags=TAGS, summary="List agents",
                      responses=schemas.list_responses(kinds.AGENT))

    def get_agent(name: str, namespace: str | None = Depends(resources.namespace_scope)) -> Response:
        return agents.get(namespace, name)

    app.add_api_route("/v1/namespaces/{namespace}/agents/{name}", get_agent, methods=["GET"],
                      tags=TAGS, summary="Read an agent",
                      responses=schemas.responses(200, schemas.object(kinds.AGENT), "the Agent"))
    app.add_api_route("/v1/namespaces/{namespace}/executions", resources.lister(runs),
                      methods=["GET"], tags=TAGS, summary="List executions (AgentRuns)",
                      responses=schemas.list_responses(kinds.AGENT_RUN))

    def create_execution(
        namespace: str | None = Depends(resources.namespace_scope), body: bytes = Depends(read_body),
        content_type: ContentType = None, dry_run: params.DryRun = None,
    ) -> Response:
        return runs.create(namespace, body, content_type, params.dry_run(dry_run))

    app.add_api_route("/v1/namespaces/{namespace}/executions", create_execution, methods=["POST"],
                      tags=TAGS, summary="Create an execution (AgentRun)", status_code=201,
                      responses=schemas.responses(201, schemas.object(kinds.AGENT_RUN), "the AgentRun", body=True),
                      openapi_extra=resources.request_body(schemas.object(kinds.AGENT_RUN), wire.JSON,
                                                           "application/yaml"))
    app.add_api_route("/v1/namespaces/{namespace}/approvals", resources.lister(approvals),
                      methods=["GET"], tags=TAGS, summary="List approvals",
                      responses=schemas.list_responses(kinds.APPROVAL))

    def get_execution(name: str, namespace: str | None = Depends(resources.namespace_scope)) -> Response:
        return runs.get(namespace, name)

    def get_approval(name: str, namespace: str | None = Depends(resources.namespace_scope)) -> Response:
        return approvals.get(namespace, name)

    app.add_api_route("/v1/namespaces/{namespace}/executions/{name}", get_execution, methods=["GET"],
                      tags=TAGS, summary="Read an execution (AgentRun)",
                      responses=schemas.responses(200, schemas.object(kinds.AGENT_RUN), "the AgentRun"))
    app.add_api_route("/v1/namespaces/{namespace}/approvals/{name}", get_approval, methods=["GET"],
                      tags=TAGS, summary="Read an approval",
                      responses=schemas.responses(200, schemas.object(kinds.APPROVAL), "the Approval"))

    def watch_resources(
        last_event_id: LastEventId = None,
        kind: params.Kind = None,
        namespace: params.Namespace = None,
        label_selector: params.LabelSelector = None,
        field_selector: params.FieldSelector = None,
        resource_version: params.ResourceVersion = None,
        timeout: params.TimeoutSeconds = None,
    ) -> Response:
        info = registry.resolve(kind) if kind else None
        watch_options = params.watch_options(
            params.check_namespace(namespace), label_selector, field_selector,
            last_event_id or resource_version, False,
        )
        return sse.respond(store, info, watch_options, timeout_seconds=timeout, options=options, slots=slots)

    sse_doc = schemas.responses(200, SERVER_SENT_EVENTS, "Server-Sent Events: the current objects as ADDED "
                                "(without resourceVersion, or 0), then every change", media_type=sse.MEDIA_TYPE)
    app.add_api_route("/v1/resources/watch", watch_resources, methods=["GET"], tags=TAGS,
                      summary="Watch resources (Server-Sent Events)", response_class=Response,
                      responses=sse_doc)
    app.add_api_route("/v1/resources", watch_resources, methods=["WATCH"], include_in_schema=False,
                      name="watch:v1-resources")
