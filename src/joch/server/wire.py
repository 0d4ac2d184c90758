"""Bytes on the wire: reading request bodies, writing JSON responses and ``Warning`` headers.

Handlers return a ready ``Response`` built here rather than a dict for FastAPI to encode: objects
are already plain JSON dicts, so FastAPI's ``jsonable_encoder`` walk would only cost time on the
hot path (apply throughput is a goal) without adding anything.

Bodies are read by an async dependency (``body_reader``) with a size limit checked while the body
streams in, so the sync handlers that call the store run in the threadpool with the bytes in hand
and a huge upload is refused before it is buffered.

Object bodies are JSON; ``application/yaml`` (and its aliases) is accepted too for POST and PUT,
parsed by admission's document loader so YAML is held to the same rules as in ``apply``. PATCH
accepts ``application/merge-patch+json`` only and names it in the 415 otherwise (strategic merge
and server-side apply are Kubernetes built-in-type features).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import Request
from starlette.responses import Response

from joch.admission import documents
from joch.api import errors

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"})


def dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def json_response(body: Any, *, status_code: int = 200, warnings: Iterable[str] = ()) -> Response:
    response = Response(dumps(body), status_code=status_code, media_type=JSON)
    for text in warnings:
        response.headers.append("Warning", warning_header(text))
    return response


def warning_header(text: str) -> str:
    """``299 - "text"`` as Kubernetes writes it: one line, quoted, representable in latin-1."""
    flat = " ".join(text.split())
    escaped = flat.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{escaped.encode("latin-1", "backslashreplace").decode("latin-1")}"'


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def body_reader(limit: int) -> Callable[[Request], Awaitable[bytes]]:
    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    return read_body


def _too_large(limit: int) -> errors.RequestEntityTooLarge:
    return errors.RequestEntityTooLarge(f"the request body is larger than the limit of {limit} bytes")


def decode_text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.BadRequest(f"the request body is not valid UTF-8 (byte {exc.start})") from None


def decode_object(body: bytes, content_type: str | None, *, allow_yaml: bool = True) -> dict[str, Any]:
    """The JSON object in a request body (or the YAML document when the type says YAML)."""
    kind = media_type(content_type)
    if not body.strip():
        raise errors.BadRequest("the request body is empty: send the object as JSON")
    if kind in YAML_TYPES and allow_yaml:
        value = _load_yaml(decode_text(body))
    elif kind in ("", JSON, MERGE_PATCH, "text/plain") or kind.endswith("+json"):
        value = _load_json(body)
    else:
        accepted = "application/json or application/yaml" if allow_yaml else "application/json"
        raise errors.UnsupportedMediaType(
            f"the body's media type {kind!r} is not supported: send {accepted}"
        )
    if not isinstance(value, dict):
        raise errors.BadRequest(f"the request body must be a JSON object, not {type(value).__name__}")
    return value


def _load_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        raise errors.BadRequest(
            f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except UnicodeDecodeError as exc:
        raise errors.BadRequest(f"the request body is not valid UTF-8 (byte {exc.start})") from None


def _load_yaml(text: str) -> Any:
    # Admission's loader: duplicate keys and alias bombs are refused as they are for `apply`.
    docs = documents.load_documents(text, "request body")
    if len(docs) != 1:
        raise errors.BadRequest(
            f"the request body holds {len(docs)} objects; send exactly one "
            "(POST /v1/resources/apply takes several)"
        )
    return docs[0].obj


def require_merge_patch(content_type: str | None) -> None:
    kind = media_type(content_type)
    if kind != MERGE_PATCH:
        raise errors.UnsupportedMediaType(
            f"the patch type {kind or '(none)'!r} is not supported: "
            f"send a JSON merge patch with Content-Type: {MERGE_PATCH}"
        )
