"""Liveness and readiness.

``/healthz`` answers as long as the process serves HTTP. ``/readyz`` also asks the store for its
revision, so a load balancer stops sending traffic to a replica whose database is gone; any
failure there is a 503 ``ServiceUnavailable`` Status, and its cause goes to the log only.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from starlette.responses import Response

from joch.api import errors
from joch.server import wire
from joch.server.schemas import error_responses
from joch.store.base import Store

logger = logging.getLogger("joch.server")
OK = b'{"ok":true}'


def install(app: FastAPI, store: Store) -> None:
    def healthz() -> Response:
        return Response(OK, media_type=wire.JSON)

    def readyz() -> Response:
        try:
            revision = store.current_revision()
        except Exception:
            logger.error("readiness check failed: the store does not answer", exc_info=True)
            raise errors.ServiceUnavailable("the store is not answering") from None
        return wire.json_response({"ok": True, "revision": revision})

    app.add_api_route("/healthz", healthz, methods=["GET"], tags=["health"], summary="Liveness")
    app.add_api_route("/readyz", readyz, methods=["GET"], tags=["health"], summary="Readiness",
                      responses=error_responses((503, "the store does not answer")))
