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
headers without the key, JSON body) in ``requests``. ``python tests/support/fake_gemini.py --port 8775``
runs one by hand.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import PurePosixPath
from typing import Any

SECRET_HEADERS = frozenset({"x-goog-api-key", "authorization"})
CWD = re.compile(r"(?:current working directory|working directory)[^/\n]*?(/\S*[^\s.,:;'\"`)])", re.IGNORECASE)
WRITE = "write_file"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeGemini:
    edits: list[tuple[str, str]] = field(default_factory=lambda: [("hello.txt", "hello from the fake model\n")])
    final_text: str = "I wrote the file."
    mode: str = "ok"  # ok | error | down
    loop: bool = False
    input_tokens: int = 1200
    output_tokens: int = 300
    cached_tokens: int = 0  # reported as cachedContentTokenCount on the agent's turns
    thought_tokens: int = 0  # reported as thoughtsTokenCount on the agent's turns (billed as output)
    delay: float = 0.0  # seconds to wait before each agent turn's answer
    hold_turn: int | None = None  # this agent turn (1 = the first) waits for release(): a run to kill mid-way
    api_key: str | None = None  # when set, any other x-goog-api-key gets a 400 API_KEY_INVALID
    max_loop: int = 200  # a looping script still ends after this many calls
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)
    reported: dict[str, int] = field(default_factory=lambda: {"input": 0, "output": 0, "cached": 0, "thoughts": 0})
    """The usage the fake reported in all its answers."""

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._wake = threading.Event()
        self._released = threading.Event()
        self._turns = 0

    @property
    def url(self) -> str:
        assert self._server is not None, "the fake is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeGemini:
        self._server = _Server(("127.0.0.1", self.port), _handler(self))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def release(self) -> None:
        """Let the held turn (``hold_turn``) be answered."""
        self._released.set()

    def stop(self) -> None:
        self._wake.set()
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeGemini:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def record(self, recorded: Recorded) -> None:
        with self._lock:
            self.requests.append(recorded)

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
        with self._lock:
            self._turns += 1
            turn = self._turns
        if turn == self.hold_turn:
            self._released.wait()
        if self.delay:
            self._wake.wait(self.delay)
        done = _calls(body.get("contents") or [])
        if (self.loop and done < self.max_loop) or done < len(self.edits):
            path, content = self.edits[done] if done < len(self.edits) else (f"loop-{done}.txt", f"turn {done}\n")
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
    found = CWD.search(_text(body.get("contents")) + "\n" + _text(body.get("systemInstruction")))
    return str(PurePosixPath(found.group(1)) / path) if found else path


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    if isinstance(value, dict):
        return "\n".join(_text(v) for k, v in value.items() if k in ("text", "parts"))
    return ""


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


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a CLI killed while its answer was held) is not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler(fake: FakeGemini) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            fake.record(Recorded("GET", self.path, self._headers(), None))
            if "/models" in self.path:
                self._json(200, {"models": [{"name": "models/gemini-fake", "supportedGenerationMethods": [
                    "generateContent", "countTokens"]}]})
            else:
                self._json(404, _error(404, "NOT_FOUND", "not found"))

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = None
            fake.record(Recorded("POST", self.path, self._headers(), body))
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

        def _headers(self) -> dict[str, str]:
            return {k.lower(): ("<redacted>" if k.lower() in SECRET_HEADERS else v) for k, v in self.headers.items()}

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, response: dict[str, Any]) -> None:
            # The text first, then the rest with the usage: the real API's chunks come that way.
            parts = response["candidates"][0]["content"]["parts"]
            chunks = [dict(response, candidates=[{"content": {"role": "model", "parts": [p]}, "index": 0}],
                           usageMetadata={"promptTokenCount": response["usageMetadata"]["promptTokenCount"],
                                          "totalTokenCount": response["usageMetadata"]["promptTokenCount"]})
                      for p in parts[:-1]]
            chunks.append(dict(response, candidates=[dict(response["candidates"][0],
                                                          content={"role": "model", "parts": parts[-1:]})]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
                self.wfile.flush()
            self.close_connection = True

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
    fake.start()
    print(f"fake Gemini at {fake.url}", flush=True)
    seen = 0
    try:
        while True:
            threading.Event().wait(0.5)
            if options.log and len(fake.requests) > seen:
                with open(options.log, "a", encoding="utf-8") as out:
                    for r in fake.requests[seen:]:
                        out.write(json.dumps(r.__dict__) + "\n")
                seen = len(fake.requests)
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
