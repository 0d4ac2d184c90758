"""Every failure leaves the server as a Kubernetes ``Status`` body; this is the one place mapping.

* ``JochError`` → its own ``to_status()`` and ``code`` (the hierarchy already knows both); one
  whose details carry ``retryAfterSeconds`` (429, 503) also gets a ``Retry-After`` header.
* FastAPI's ``RequestValidationError`` (a query parameter of the wrong type) → 400 ``BadRequest``
  with one cause per parameter; Kubernetes answers 400 for malformed requests, not 422, which Joch
  reserves for an object that fails admission.
* Starlette's ``HTTPException`` (unknown route, wrong method) → the Status of the same code.
* An ``OSError`` for a full disk (``ENOSPC``, ``EDQUOT``) that no layer below mapped → 507
  ``InsufficientStorage`` naming the file, logged as one line: it is the operator's to fix, not a bug.
  (The store maps its own full disk to ``InsufficientStorage`` with the database's path.)
* An ``OSError`` for want of file descriptors (``EMFILE``, ``ENFILE``) → 503 with ``Retry-After``,
  logged once a minute (``joch.store.exhaustion``): the condition passes when connections end.
* Anything else → 500 ``InternalError`` whose message names only the request; the traceback goes
  to the server log, never to the client. Routes use ``StatusRoute``, which turns such an error
  into the 500 itself: Starlette's outermost error middleware would answer the same body but then
  re-raise, and the ASGI server would log the traceback a second time. The app-level handler stays
  as the backstop for failures outside a route.
* A path parameter with a NUL character (``/agents/a%00b``) is a 404 before the handler runs: no
  object, namespace or artifact can have such a name (admission refuses NUL in every string), and
  PostgreSQL could not even be asked.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from joch.admission.diagnostics import printable
from joch.api import errors
from joch.server import wire
from joch.store import exhaustion

logger = logging.getLogger("joch.server")

_BY_CODE: dict[int, type[errors.JochError]] = {
    404: errors.NotFound,
    405: errors.MethodNotAllowed,
    413: errors.RequestEntityTooLarge,
    415: errors.UnsupportedMediaType,
}


def status_response(error: errors.JochError) -> Response:
    response = wire.json_response(error.to_status(), status_code=error.code)
    retry = error.extra.get("retryAfterSeconds")
    if isinstance(retry, int):
        response.headers["Retry-After"] = str(retry)
    return response


async def _joch_error(_: Request, exc: Exception) -> Response:
    if not isinstance(exc, errors.JochError):  # pragma: no cover - registered for JochError only
        raise exc
    return status_response(exc)


async def _validation_error(_: Request, exc: Exception) -> Response:
    causes: list[errors.Cause] = []
    if isinstance(exc, RequestValidationError):
        for problem in exc.errors():
            location = [str(part) for part in problem.get("loc", ()) if part not in ("query", "path")]
            causes.append(errors.Cause(field=".".join(location), message=str(problem.get("msg", ""))))
    fields = ", ".join(c.field for c in causes if c.field) or "the request"
    return status_response(errors.BadRequest(f"invalid request parameters: {fields}", causes=causes))


async def _http_error(request: Request, exc: Exception) -> Response:
    code = exc.status_code if isinstance(exc, HTTPException) else 500
    if code == 404:
        message = f"the server could not find the requested resource ({request.url.path})"
    elif code == 405:
        message = f"the server does not allow method {request.method} on {request.url.path}"
    else:
        message = str(getattr(exc, "detail", "")) or "request failed"
    cls = _BY_CODE.get(code)
    if cls is None:
        error: errors.JochError = errors.JochError(message)
        body = error.to_status() | {"code": code, "reason": "Unknown" if code < 500 else "InternalError"}
        return wire.json_response(body, status_code=code)
    return status_response(cls(message))


def _internal(request: Request) -> Response:
    return status_response(
        errors.Internal(f"an internal error occurred while serving {request.method} {request.url.path}")
    )


_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def _disk_full(request: Request, exc: Exception) -> Response | None:
    if not isinstance(exc, OSError) or exc.errno not in _DISK_FULL:
        return None
    what = f"cannot write {exc.filename}" if exc.filename else "a write failed"
    message = (f"the server's disk is full: {what} ({exc.strerror}) while serving {request.method} "
               f"{request.url.path}; free space there, then retry")
    logger.error("%s", message)
    return status_response(errors.InsufficientStorage(message))


async def _internal_error(request: Request, exc: Exception) -> Response:
    full = _disk_full(request, exc)
    if full is not None:
        return full
    logger.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return _internal(request)


_MAPPED = (errors.JochError, RequestValidationError, HTTPException)


class StatusRoute(APIRoute):
    """An ``APIRoute`` that answers an unexpected exception with a 500 Status and logs it once."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            if any("\x00" in value for value in request.path_params.values() if isinstance(value, str)):
                shown = printable(request.url.path)
                raise errors.NotFound(f"the server could not find the requested resource ({shown})")
            try:
                return await handler(request)
            except _MAPPED:
                raise
            except Exception as exc:  # noqa: BLE001 - a Status for any failure, the traceback logged (unexpected)
                return unexpected(request, exc)

        return guarded


def unexpected(request: Request, exc: Exception) -> Response:
    """The answer to an exception a handler did not map: a client gone (499, nobody reads it), a
    full disk (507), no descriptors left (503), anything else a 500 with the traceback logged."""
    if isinstance(exc, ClientDisconnect):
        return Response(status_code=499)
    full = _disk_full(request, exc)
    if full is not None:
        return full
    if exhaustion.is_exhausted(exc):  # out of descriptors: 503, Retry-After, logged once
        return status_response(exhaustion.unavailable(f"{request.method} {request.url.path}"))
    logger.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return _internal(request)


def install(app: FastAPI) -> None:
    app.add_exception_handler(errors.JochError, _joch_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
