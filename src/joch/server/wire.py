"""Bytes on the wire: reading request bodies, writing JSON responses and ``Warning`` headers.

Handlers return a ready ``Response`` built here rather than a dict for FastAPI to encode: objects
are already plain JSON dicts, so FastAPI's ``jsonable_encoder`` walk would only cost time on the
hot path (apply throughput is a goal) without adding anything.

Bodies are read by an async dependency (``body_reader``) with a size limit checked while the body
streams in, so the sync handlers that call the store run in the threadpool with the bytes in hand
and a huge upload is refused before it is buffered.

Content types. Object bodies (POST, PUT, DELETE options) are JSON: ``application/json`` or any
``application/*+json``; ``application/yaml`` (and its aliases) is accepted too for POST and PUT,
parsed by admission's document loader so YAML is held to the same rules as in ``apply``. Anything
else — ``text/plain``, ``image/png``, the ``application/x-www-form-urlencoded`` that ``curl -d``
sends, and a body with no ``Content-Type`` at all — is a 415 naming the accepted types, never a
guess: those are the bodies a web page can send cross-origin without a CORS preflight (see
``joch.server.guard``, which refuses them for every write before a route runs). kubectl and the
CLI always say ``application/json``. PATCH accepts a JSON merge patch, a JSON patch (RFC 6902) and a
server-side apply patch (``joch.server.apply``), and names them in the 415 otherwise (strategic merge is
a feature of Kubernetes' built-in types, which kubectl does not ask of custom resources).

Every object body is checked for the shape a handler relies on before it reads anything
(``metadata.envelope_causes``: ``apiVersion`` and ``kind`` strings, ``metadata`` a mapping whose
name, namespace, uid and resourceVersion are strings): a 422 ``Invalid`` naming each field, for
every route that takes a body, instead of an ``AttributeError`` in whichever handler met it first.

JSON bodies are held to the document loader's limits before and after parsing: nesting deeper
than ``documents.MAX_DEPTH`` is a 400 naming the line (Python's JSON parser recurses, so a body of
100,000 ``[`` would otherwise be a ``RecursionError``), and a lone UTF-16 surrogate escape
(``"\\ud800"``), which the store cannot encode, is a 400 naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response

from joch.admission import documents, metadata
from joch.api import errors
from joch.api.meta import has_huge_float

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"})
BODY = "request body"
WARNINGS_TOTAL = 8 * 1024  # bytes of Warning headers (the apiserver keeps 4 Ki runes of text)
WARNING_ITEM = 256  # characters of one warning once the total is exceeded (the apiserver's too)
HEADER_OVERHEAD = len("Warning: \r\n")
LEFT_OUT_ROOM = 64  # for the last warning saying how many were left out


def dumps(body: Any) -> bytes:
    """Compact UTF-8 JSON, by orjson (a hundred times quicker than ``json`` on a stored object).
    What orjson refuses goes through ``json``: a lone surrogate quoted back in an error message
    cannot be UTF-8, and as ``\\udXXX`` it is the JSON escape of itself, where a strict encode
    would fail the response; an integer beyond 64 bits; a key that is not a string. A NaN or
    infinite number (which JSON has no notation for) is answered as ``null``."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace")


def json_response(body: Any, *, status_code: int = 200, warnings: Iterable[str] = ()) -> Response:
    response = Response(dumps(body), status_code=status_code, media_type=JSON)
    for header in warning_headers(warnings):
        response.headers.append("Warning", header)
    return response


def warning_headers(warnings: Iterable[str]) -> list[str]:
    """The ``Warning`` header values for ``warnings``, within the apiserver's bounds: duplicates
    once; past ``WARNINGS_TOTAL`` bytes of headers in all, each warning cut to ``WARNING_ITEM``
    characters and those that still do not fit left out, with a last warning saying how many.
    Unbounded, an apply of 1,000 objects whose references did not exist yet sent 222 KB of headers,
    which clients refuse to read (the CLI, through httpx, past 100 KiB: it reported the committed
    apply as a server that did not answer)."""
    texts = list(dict.fromkeys(warnings))
    headers = [warning_header(text) for text in texts]
    if sum(len(h) + HEADER_OVERHEAD for h in headers) <= WARNINGS_TOTAL:
        return headers
    kept: list[str] = []
    used = 0
    for index, text in enumerate(texts):
        header = warning_header(text if len(text) <= WARNING_ITEM else text[:WARNING_ITEM - 3] + "...")
        if used + len(header) + HEADER_OVERHEAD > WARNINGS_TOTAL - LEFT_OUT_ROOM:
            kept.append(warning_header(f"{len(texts) - index} more warnings left out of the headers"))
            break
        kept.append(header)
        used += len(header) + HEADER_OVERHEAD
    return kept


def warning_header(text: str) -> str:
    """``299 - "text"`` as Kubernetes writes it: one line, quoted, representable in latin-1."""
    flat = " ".join(text.split())
    escaped = flat.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{escaped.encode("latin-1", "backslashreplace").decode("latin-1")}"'


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def body_reader(limit: int, flag: str | None = None) -> Callable[[Request], Awaitable[bytes]]:
    """Reads a body of at most ``limit`` bytes; a larger one is a 413 naming the limit (and the
    ``joch server`` flag that sets it, when there is one)."""

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit, flag)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit, flag)
            chunks.append(chunk)
        return b"".join(chunks)

    return read_body


def _too_large(limit: int, flag: str | None) -> errors.RequestEntityTooLarge:
    where = f" (joch server {flag})" if flag else ""
    return errors.RequestEntityTooLarge(f"the request body is larger than the limit of {limit} bytes{where}")


def decode_text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.BadRequest(
            f"the request body is not valid UTF-8 (byte {exc.start}): send JSON or YAML encoded as UTF-8"
        ) from None


def is_json(kind: str) -> bool:
    return kind == JSON or (kind.startswith("application/") and kind.endswith("+json"))


def require_manifests(content_type: str | None) -> None:
    """The body of ``/v1/resources/apply`` and ``create``: YAML or JSON."""
    kind = media_type(content_type)
    if not is_json(kind) and kind not in YAML_TYPES:
        raise unsupported(kind, "application/yaml or application/json")


def decode_object(body: bytes, content_type: str | None, *, allow_yaml: bool = True) -> dict[str, Any]:
    """The JSON object in a request body (or the YAML document when the type says YAML)."""
    kind = media_type(content_type)
    yaml_body = kind in YAML_TYPES and allow_yaml
    if not yaml_body and not is_json(kind):
        raise unsupported(kind, "application/json or application/yaml" if allow_yaml else JSON)
    if not body.strip():
        raise errors.BadRequest("the request body is empty: send the object as JSON")
    value, raw = _load_yaml(decode_text(body)) if yaml_body else (_load_json(decode_text(body)), None)
    if not isinstance(value, dict):
        raise errors.BadRequest(f"the request body must be a JSON object, not {type(value).__name__}")
    causes = metadata.envelope_causes(value, raw=raw)
    if causes:
        shown = ", ".join(f"{c.field}: {c.message}" for c in causes)
        raise errors.Invalid(f"the request body is invalid: {shown}", causes=causes)
    return value


def unsupported(kind: str, accepted: str) -> errors.UnsupportedMediaType:
    if not kind:
        return errors.UnsupportedMediaType(
            f"the request has a body but no Content-Type: send {accepted} and say so in the Content-Type "
            "header (curl: -H 'Content-Type: application/json')"
        )
    hint = ""
    if kind == "application/x-www-form-urlencoded":
        hint = " (curl -d sends this type: add -H 'Content-Type: application/json')"
    return errors.UnsupportedMediaType(
        f"the body's media type {kind!r} is not supported{hint}: send {accepted} "
        f"and say so in the Content-Type header"
    )




def _load_json(text: str) -> Any:
    text = text.removeprefix("\ufeff")
    documents.check_nesting(text, BODY)
    try:  # orjson refuses lone surrogates, NaN and Infinity: json below reads or names them
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    else:  # orjson reads an integer beyond 64 bits as a float; json keeps it exact
        if not has_huge_float(value):
            return value
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.BadRequest(
            f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:  # check_nesting refuses such a body first; kept as the backstop
        raise errors.BadRequest(
            f"the request body nests more than {documents.MAX_DEPTH} levels deep"
        ) from None
    documents.check_surrogates(value, text, BODY, ref="")
    return value


def _load_yaml(text: str) -> tuple[Any, documents.RawScalars]:
    # Admission's loader: duplicate keys and alias bombs are refused as they are for `apply`.
    docs = documents.load_documents(text, BODY)
    if len(docs) != 1:
        raise errors.BadRequest(
            f"the request body holds {len(docs)} objects; send exactly one "
            "(POST /v1/resources/apply takes several)"
        )
    return docs[0].obj, docs[0].raw
