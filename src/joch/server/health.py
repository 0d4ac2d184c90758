"""Liveness and readiness.

``/healthz`` (and ``/livez``, kube-apiserver's name for it, which the Helm chart's liveness and startup
probes ask) answers as long as the process serves HTTP. ``/readyz`` also asks the store for its
revision, so a load balancer stops sending traffic to a replica whose database is gone; any
failure there is a 503 ``ServiceUnavailable`` Status, and its cause goes to the log only.

A full disk is a reason not to be ready too: the store's (``Store.storage_problem``) or the
runtime's, where run logs and artifacts are written (``Runtime.storage_problem``). Then the 503's
message says which disk is full, since that is what an operator must act on (it names a path, not a
secret), and readiness returns by itself once space does. A change of readiness is logged once,
not at every probe.
"""

from __future__ import annotations

import logging
import threading

from fastapi import FastAPI
from starlette.responses import Response

from joch.api import errors
from joch.server import wire
from joch.server.schemas import error_responses
from joch.store.base import Store

logger = logging.getLogger("joch.server")
OK = b'{"ok":true}'


class _Reported:
    """The last readiness problem logged, so a probe every few seconds does not repeat it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._problem: str | None = None

    def changed(self, problem: str | None) -> bool:
        with self._lock:
            changed, self._problem = problem != self._problem, problem
        return changed


def install(app: FastAPI, store: Store) -> None:
    reported = _Reported()

    def healthz() -> Response:
        return Response(OK, media_type=wire.JSON)

    def readyz() -> Response:
        try:
            revision = store.current_revision()
        except Exception:
            logger.error("readiness check failed: the store does not answer", exc_info=True)
            raise errors.ServiceUnavailable("the store is not answering") from None
        problem = _storage_problem(app, store)
        if reported.changed(problem):
            if problem is not None:
                logger.error("not ready: %s", problem)
            else:
                logger.info("ready again: the disk has room")
        if problem is not None:
            raise errors.ServiceUnavailable(f"not ready: {problem}")
        return wire.json_response({"ok": True, "revision": revision})

    app.add_api_route("/healthz", healthz, methods=["GET"], tags=["health"], summary="Liveness")
    app.add_api_route("/livez", healthz, methods=["GET"], tags=["health"], summary="Liveness")
    app.add_api_route("/readyz", readyz, methods=["GET"], tags=["health"], summary="Readiness",
                      responses=error_responses((503, "the store does not answer, or a disk is full")))


def _storage_problem(app: FastAPI, store: Store) -> str | None:
    problem = store.storage_problem()
    runtime = getattr(app.state, "runtime", None)
    if problem is None and runtime is not None:
        problem = runtime.storage_problem()
    return problem
