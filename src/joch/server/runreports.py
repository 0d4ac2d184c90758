"""The routes a runner that runs where the server cannot read its files (a Kubernetes Job's
container) reports its attempt to: see ``joch.runtime.reports`` for what each carries and the rules.

    PUT /v1/namespaces/{ns}/agentruns/{name}/attempts/{n}/artifacts/{artifact}   application/octet-stream
    PUT /v1/namespaces/{ns}/agentruns/{name}/attempts/{n}/log                    application/octet-stream
    PUT /v1/namespaces/{ns}/agentruns/{name}/attempts/{n}/record                 application/json

Like the usage callback, they are exempt from user authentication and authenticate themselves with
the attempt's run token (``metering.authenticate``: a Running run whose current attempt is ``n``;
every refusal the same 401). A server whose runtime takes no reports answers 404 saying so. What a
report cannot be is a 422 naming the part at fault.
"""

from __future__ import annotations

import tempfile
from typing import Any, BinaryIO, cast

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from joch.api import errors
from joch.controllers import metering
from joch.runtime.base import RunId
from joch.runtime.reports import ReportRefused, ReportStore
from joch.server import wire
from joch.server.metering import bearer
from joch.store.base import Store

TAGS: list[Any] = ["runs"]
BASE = "/v1/namespaces/{namespace}/agentruns/{name}/attempts/{attempt}"


SPOOL_BYTES = 8 * 1024 * 1024  # an upload larger than this waits on disk, not in memory


RECORD_BYTES = 4 * 1024 * 1024  # a record is the runner's state.json: small


async def _spooled(request: Request, limit: int | None) -> BinaryIO:
    """The request's body in a file (memory up to ``SPOOL_BYTES``), at most ``limit`` bytes (the
    runtime's report limit: a 413 naming it). Read only once the run token was checked, so a caller
    without one cannot make the server write anything."""
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if limit is not None and size > limit:
                raise errors.RequestEntityTooLarge(
                    f"the upload is larger than the limit of {limit} bytes (joch server --max-artifact-bytes "
                    "and --max-log-bytes)")
            spool.write(chunk)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return cast(BinaryIO, spool)


def install(app: FastAPI, store: Store) -> None:
    read_record = wire.body_reader(RECORD_BYTES)

    def receiver(request: Request, namespace: str, name: str, attempt: int) -> tuple[ReportStore, Any, RunId]:
        run = metering.authenticate(store, namespace, name, bearer(request.headers.get("authorization")))
        if (run.get("status") or {}).get("attempt") != attempt:
            raise metering.unauthorized()
        runtime = getattr(request.app.state, "runtime", None)
        found = runtime.reports() if runtime is not None else None
        if found is None:
            raise errors.NotFound("this server's runtime takes no run reports (only the kubernetes runtime's "
                                  "runners report over HTTP)")
        reports, on_report = found
        return reports, on_report, RunId(namespace=namespace, name=name, uid=str(run["metadata"]["uid"]),
                                         attempt=attempt)

    # The token is checked first (in the threadpool: it reads the store), then the body is read on
    # the event loop, then the store and the files are written in the threadpool.
    def store_artifact(reports: ReportStore, run: RunId, artifact: str, body: BinaryIO) -> Response:
        try:
            record = reports.put_artifact(run.uid, run.attempt, artifact, body)
        except ReportRefused as exc:
            raise errors.Invalid(str(exc)) from None
        return wire.json_response({"kind": "ArtifactReceived", "apiVersion": "v1", "name": record.name,
                                   "sha256": record.sha256, "size": record.size})

    def log(reports: ReportStore, run: RunId, body: BinaryIO) -> Response:
        try:
            reports.put_log(run.uid, run.attempt, body)
        except ReportRefused as exc:
            raise errors.Invalid(str(exc)) from None
        return wire.json_response({"kind": "LogReceived", "apiVersion": "v1"})

    def record(reports: ReportStore, on_report: Any, run: RunId, body: bytes) -> Response:
        try:
            state = reports.put_record(run.uid, run.attempt, body)
        except ReportRefused as exc:
            raise errors.Invalid(str(exc)) from None
        on_report(run)
        return wire.json_response({"kind": "RecordReceived", "apiVersion": "v1", "phase": state.phase})

    async def put_artifact(request: Request, namespace: str, name: str, attempt: int, artifact: str) -> Response:
        reports, _, run = await run_in_threadpool(receiver, request, namespace, name, attempt)
        with await _spooled(request, reports.limit) as body:
            return await run_in_threadpool(store_artifact, reports, run, artifact, body)

    async def put_log(request: Request, namespace: str, name: str, attempt: int) -> Response:
        reports, _, run = await run_in_threadpool(receiver, request, namespace, name, attempt)
        with await _spooled(request, reports.limit) as body:
            return await run_in_threadpool(log, reports, run, body)

    async def put_record(request: Request, namespace: str, name: str, attempt: int) -> Response:
        kind = wire.media_type(request.headers.get("content-type"))
        if not wire.is_json(kind):
            raise wire.unsupported(kind, wire.JSON)
        reports, on_report, run = await run_in_threadpool(receiver, request, namespace, name, attempt)
        body = await read_record(request)
        return await run_in_threadpool(record, reports, on_report, run, body)

    app.add_api_route(f"{BASE}/artifacts/{{artifact}}", put_artifact, methods=["PUT"], tags=TAGS,
                      summary="A Job runner's artifact (authenticated by the run's own token)")
    app.add_api_route(f"{BASE}/log", put_log, methods=["PUT"], tags=TAGS,
                      summary="A Job runner's whole log, once the agent ended (run token)")
    app.add_api_route(f"{BASE}/record", put_record, methods=["PUT"], tags=TAGS,
                      summary="A Job runner's record of the attempt (run token)")
