"""A fake Gemini API (``generativelanguage.googleapis.com``) on 127.0.0.1, for driving the real
Gemini CLI in tests.

Gemini CLI talks to it through ``GOOGLE_GEMINI_BASE_URL`` (``http://127.0.0.1:<port>``) with any
``GEMINI_API_KEY``. The server answers ``POST /v1beta/models/<model>:generateContent`` (one JSON
body) and ``:streamGenerateContent?alt=sse`` (server-sent events, one ``data:`` chunk each), and
``:countTokens``, with a script instead of a model:

* the agent's turns (requests that declare the CLI's ``write_file`` tool) are answered, in order,
  with one ``write_file`` function call per scripted edit (a path relative to the working
  directory, made absolute against the one the CLI states in its first message), then with the
  final text;
* ``loop=True`` keeps writing ``loop-<n>.txt`` instead of giving the final text (``max_loop`` at most);
* ``hold_turn=n`` holds the n-th agent turn until ``release()`` (a run to kill mid-way);
* ``api_key`` set: a request with another ``x-goog-api-key`` gets a 400;
* a request asking for JSON (``generationConfig.responseMimeType`` ``application/json``: the CLI's
  own checks, such as "who speaks next") gets the smallest object its schema allows, with
  ``next_speaker`` ``user`` (the agent is done);
* ``mode="error"`` answers every request with HTTP 400 ``INVALID_ARGUMENT``, ``mode="down"`` with
  HTTP 500s, ``stop()`` refuses connections.

Each answer reports ``usageMetadata`` (``promptTokenCount``/``candidatesTokenCount`` from the
constructor; the sums of all answers in ``reported``). Every request is recorded (method, path,
headers without the key, JSON body) in ``requests``. ``PYTHONPATH=tests python -m support.fake_gemini --port 8775``
runs one by hand.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import PurePosixPath
from typing import Any

from support.fake_model import FakeHandler, Recorded, ScriptedAgentModel, serve_by_hand, text_of

SECRET_HEADERS = frozenset({"x-goog-api-key", "authorization"})
CWD = re.compile(r"(?:current working directory|working directory)[^/\n]*?(/\S*[^\s.,:;'\"`)])", re.IGNORECASE)
WRITE = "write_file"
TEXT = ("text", "parts")
"""Where a request's text stands (the keys of its JSON objects)."""


@dataclass
class FakeGemini(ScriptedAgentModel):
    """The script's fields are ``ScriptedAgentModel``'s; ``cached_tokens`` is reported as
    ``cachedContentTokenCount``, a wrong ``x-goog-api-key`` gets a 400 ``API_KEY_INVALID``."""

    thought_tokens: int = 0  # reported as thoughtsTokenCount on the agent's turns (billed as output)
    reported: dict[str, int] = field(default_factory=lambda: {"input": 0, "output": 0, "cached": 0, "thoughts": 0})
    """The usage the fake reported in all its answers."""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler(self)

    def agent_requests(self) -> list[Recorded]:
        """The recorded generate requests that were agent turns (they declared the tools)."""
        with self._lock:
            return [r for r in self.requests if "enerateContent" in r.path and _is_agent_turn(r.body)]

    def answer(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        """The ``GenerateContentResponse`` for a request ``body``."""
        config = body.get("generationConfig") or {}
        if config.get("responseMimeType") == "application/json":
            schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
            return self._response(model, [{"text": json.dumps(_example(schema))}], 50, 10)
        if not _is_agent_turn(body):
            return self._response(model, [{"text": "Fake answer."}], 20, 5)
        done = _calls(body.get("contents") or [])
        edit = self.next_edit(done)
        if edit is not None:
            path, content = edit
            call = {"functionCall": {"name": WRITE, "args": {"file_path": _absolute(path, body), "content": content}}}
            return self._response(model, [{"text": f"I'll write {path}."}, call], self.input_tokens,
                                  self.output_tokens, self.cached_tokens, self.thought_tokens)
        return self._response(model, [{"text": self.final_text}], self.input_tokens, self.output_tokens,
                              self.cached_tokens, self.thought_tokens)

    def _response(self, model: str, parts: list[dict[str, Any]], tokens_in: int, tokens_out: int,
                  cached: int = 0, thoughts: int = 0) -> dict[str, Any]:
        with self._lock:
            for key, value in (("input", tokens_in), ("output", tokens_out), ("cached", cached),
                               ("thoughts", thoughts)):
                self.reported[key] += value
        usage = {"promptTokenCount": tokens_in, "candidatesTokenCount": tokens_out,
                 "totalTokenCount": tokens_in + tokens_out + thoughts}
        if cached:
            usage["cachedContentTokenCount"] = cached
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": usage, "modelVersion": model, "responseId": f"fake{next(self._ids):06d}"}


def _is_agent_turn(body: Any) -> bool:
    tools = body.get("tools") if isinstance(body, dict) else None
    return any(isinstance(d, dict) and d.get("name") == WRITE
               for t in tools or () if isinstance(t, dict) for d in t.get("functionDeclarations") or ())


def _calls(contents: list[Any]) -> int:
    """How many function calls the model made so far in this conversation."""
    return sum(1 for c in contents if isinstance(c, dict) and c.get("role") == "model"
               for part in c.get("parts") or () if isinstance(part, dict) and "functionCall" in part)


def _absolute(path: str, body: dict[str, Any]) -> str:
    if PurePosixPath(path).is_absolute():
        return path
    found = CWD.search(text_of(body.get("contents"), TEXT) + "\n" + text_of(body.get("systemInstruction"), TEXT))
    return str(PurePosixPath(found.group(1)) / path) if found else path


def _example(schema: Any) -> Any:
    """The smallest value ``schema`` (OpenAPI or JSON Schema) allows; ``next_speaker`` is ``user``."""
    if not isinstance(schema, dict):
        return {}
    kind = str(schema.get("type") or "object").lower()
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "object":
        properties = schema.get("properties") or {}
        out = {name: _example(sub) for name, sub in properties.items()}
        if "next_speaker" in out:
            out["next_speaker"] = "user"
        return out
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 0
    if kind == "boolean":
        return False
    return "fake"


def _handler(fake: FakeGemini) -> type[BaseHTTPRequestHandler]:
    class Handler(FakeHandler):
        secret_headers = SECRET_HEADERS
        json_type = "application/json; charset=UTF-8"

        def do_GET(self) -> None:
            fake.record(self._recorded(None))
            if "/models" in self.path:
                self._json(200, {"models": [{"name": "models/gemini-fake", "supportedGenerationMethods": [
                    "generateContent", "countTokens"]}]})
            else:
                self._json(404, _error(404, "NOT_FOUND", "not found"))

        def do_POST(self) -> None:
            body = self._body(empty={})
            fake.record(self._recorded(body))
            route = self.path.split("?")[0]
            model = route.rsplit("/", 1)[-1].split(":")[0]
            if fake.api_key is not None and self.headers.get("x-goog-api-key") != fake.api_key:
                self._json(400, _error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key."))
            elif fake.mode == "down":
                self._json(500, _error(500, "INTERNAL", "the fake is down"))
            elif fake.mode == "error" or not isinstance(body, dict):
                self._json(400, _error(400, "INVALID_ARGUMENT", "the fake refuses this request"))
            elif route.endswith(":countTokens"):
                self._json(200, {"totalTokens": 1000})
            elif route.endswith(":streamGenerateContent"):
                self._stream(fake.answer(model, body))
            elif route.endswith(":generateContent"):
                self._json(200, fake.answer(model, body))
            else:
                self._json(404, _error(404, "NOT_FOUND", f"no route {route}"))

        def _stream(self, response: dict[str, Any]) -> None:
            # The text first, then the rest with the usage: the real API's chunks come that way.
            parts = response["candidates"][0]["content"]["parts"]
            chunks = [dict(response, candidates=[{"content": {"role": "model", "parts": [p]}, "index": 0}],
                           usageMetadata={"promptTokenCount": response["usageMetadata"]["promptTokenCount"],
                                          "totalTokenCount": response["usageMetadata"]["promptTokenCount"]})
                      for p in parts[:-1]]
            chunks.append(dict(response, candidates=[dict(response["candidates"][0],
                                                          content={"role": "model", "parts": parts[-1:]})]))
            self._sse(((None, chunk) for chunk in chunks), end="\r\n\r\n")

    return Handler


def _error(code: int, status: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8775)
    parser.add_argument("--mode", default="ok", choices=["ok", "error", "down"])
    parser.add_argument("--loop", action="store_true")
    parser.add_argument("--cached-tokens", type=int, default=0)
    parser.add_argument("--thought-tokens", type=int, default=0)
    parser.add_argument("--log", help="append each recorded request to this file (JSON lines)")
    options = parser.parse_args()
    fake = FakeGemini(mode=options.mode, loop=options.loop, port=options.port, cached_tokens=options.cached_tokens,
                      thought_tokens=options.thought_tokens)
    serve_by_hand(fake, "Gemini", options.log)


if __name__ == "__main__":
    main()
