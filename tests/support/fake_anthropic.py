"""A fake Anthropic Messages API on 127.0.0.1, for driving the real Claude Code CLI in tests.

Claude Code talks to it through ``ANTHROPIC_BASE_URL`` (``http://127.0.0.1:<port>``) with any
``ANTHROPIC_API_KEY``. The server speaks the wire format the CLI reads — ``POST /v1/messages``,
streamed as server-sent events (``message_start``, ``content_block_start``/``delta``/``stop``,
``message_delta`` with usage, ``message_stop``) or as one JSON body — and answers with a script
instead of a model:

* the agent's turns (requests that offer the CLI's ``Write`` tool) are answered, in order, with
  a sentence and one ``Write`` tool call per scripted edit (the file path made absolute against the working
  directory the CLI states in its system prompt), then with the final text;
* ``loop=True`` keeps writing ``loop-<n>.txt`` instead of giving the final text (a budget test's
  agent that keeps spending; ``max_loop`` calls at most);
* ``hold_turn=n`` holds the n-th agent turn until ``release()`` (a run to kill mid-way);
* ``api_key`` set: a request with another ``x-api-key`` gets a 401;
* requests without the tool (a title, a quota probe) get a short text answer;
* ``mode="error"`` answers every request with an HTTP 400 ``invalid_request_error`` (Claude Code
  ends with ``"is_error": true``), ``mode="down"`` with HTTP 500s, ``stop()`` refuses connections.

Each answer reports ``usage`` (``input_tokens``/``output_tokens`` from the constructor; the sums of
all answers in ``reported``). Every request is recorded (method, path, headers without the key,
JSON body) in ``requests``.
``python tests/support/fake_anthropic.py --port 8765`` runs one by hand.
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

SECRET_HEADERS = frozenset({"x-api-key", "authorization"})
CWD = re.compile(r"(?:Primary working directory|Working directory):\s*(\S+)")


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeAnthropic:
    edits: list[tuple[str, str]] = field(default_factory=lambda: [("hello.txt", "hello from the fake model\n")])
    final_text: str = "I wrote the file."
    mode: str = "ok"  # ok | error | down
    loop: bool = False
    input_tokens: int = 1200
    output_tokens: int = 300
    cached_tokens: int = 0  # reported as cache_read_input_tokens on the agent's turns
    delay: float = 0.0  # seconds to wait before each agent turn's answer
    hold_turn: int | None = None  # this agent turn (1 = the first) waits for release(): a run to kill mid-way
    api_key: str | None = None  # when set, any other x-api-key gets a 401 authentication_error
    max_loop: int = 200  # a looping script still ends after this many tool calls
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)
    reported: dict[str, int] = field(default_factory=lambda: {"input": 0, "output": 0, "cached": 0})
    """The usage the fake reported in all its answers (input_tokens, output_tokens, cache reads)."""

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._released = threading.Event()
        self._turns = 0

    @property
    def url(self) -> str:
        assert self._server is not None, "the fake is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeAnthropic:
        self._server = _Server(("127.0.0.1", self.port), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
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

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def agent_requests(self) -> list[Recorded]:
        """The recorded ``/v1/messages`` requests that were agent turns (they offered the tools)."""
        with self._lock:
            return [r for r in self.requests if r.path.startswith("/v1/messages") and _is_agent_turn(r.body)]

    # -- answers --------------------------------------------------------------------------------

    def record(self, recorded: Recorded) -> None:
        with self._lock:
            self.requests.append(recorded)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The assistant message (a Messages API ``message`` object) for a request ``body``."""
        model = str(body.get("model") or "claude-fake")
        if not _is_agent_turn(body):
            return self._message(model, [{"type": "text", "text": "Fake title"}], "end_turn", 20, 5)
        with self._lock:
            self._turns += 1
            turn = self._turns
        if turn == self.hold_turn:
            self._released.wait()
        if self.delay:
            self._wake.wait(self.delay)
        done = _tool_uses(body.get("messages") or [])
        if (self.loop and done < self.max_loop) or done < len(self.edits):
            path, content = self.edits[done] if done < len(self.edits) else (f"loop-{done}.txt", f"turn {done}\n")
            tool = {"type": "tool_use", "id": f"toolu_fake{next(self._ids):06d}", "name": "Write",
                    "input": {"file_path": _absolute(path, body), "content": content}}
            say = {"type": "text", "text": f"I'll write {path}."}
            return self._message(model, [say, tool], "tool_use", self.input_tokens, self.output_tokens,
                                 self.cached_tokens)
        return self._message(model, [{"type": "text", "text": self.final_text}], "end_turn",
                             self.input_tokens, self.output_tokens, self.cached_tokens)

    def _message(self, model: str, content: list[dict[str, Any]], stop: str, tokens_in: int,
                 tokens_out: int, cached: int = 0) -> dict[str, Any]:
        with self._lock:
            self.reported["input"] += tokens_in
            self.reported["output"] += tokens_out
            self.reported["cached"] += cached
        return {"id": f"msg_fake{next(self._ids):06d}", "type": "message", "role": "assistant", "model": model,
                "content": content, "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}}


def _is_agent_turn(body: Any) -> bool:
    tools = body.get("tools") if isinstance(body, dict) else None
    return any(isinstance(t, dict) and t.get("name") == "Write" for t in tools or ())


def _tool_uses(messages: list[Any]) -> int:
    """How many tool calls the assistant made so far in this conversation."""
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant"
               for block in m.get("content") or () if isinstance(block, dict) and block.get("type") == "tool_use")


def _absolute(path: str, body: dict[str, Any]) -> str:
    if PurePosixPath(path).is_absolute():
        return path
    found = CWD.search(_text(body.get("system")) + "\n" + _text(body.get("messages")))
    return str(PurePosixPath(found.group(1)) / path) if found else path


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    if isinstance(value, dict):
        return "\n".join(_text(v) for k, v in value.items() if k in ("text", "content"))
    return ""


def _sse(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The streamed form of ``message``: the events the Messages API sends, in order."""
    usage = message["usage"]
    start = dict(message, content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start}),
                                                 ("ping", {"type": "ping"})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {"type": "text", "text": ""}}))
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "text_delta", "text": block["text"]}}))
        else:
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": dict(block, input={})}))
            encoded = json.dumps(block["input"])
            for cut in range(0, len(encoded), 40):
                events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta", "partial_json": encoded[cut:cut + 40]}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                     "usage": {"output_tokens": usage["output_tokens"]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a CLI killed while its answer was held) is not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler(fake: FakeAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            fake.record(Recorded("GET", self.path, self._headers(), None))
            if self.path.startswith("/v1/models"):
                self._json(200, {"data": [{"type": "model", "id": "claude-fake", "display_name": "Fake"}],
                                 "has_more": False, "first_id": "claude-fake", "last_id": "claude-fake"})
            else:
                self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": "not found"}})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = None
            fake.record(Recorded("POST", self.path, self._headers(), body))
            path = self.path.split("?")[0]
            if fake.api_key is not None and self.headers.get("x-api-key") != fake.api_key:
                self._json(401, {"type": "error", "error": {"type": "authentication_error",
                                                            "message": "invalid x-api-key"}})
            elif fake.mode == "down":
                self._json(500, {"type": "error", "error": {"type": "api_error", "message": "the fake is down"}})
            elif fake.mode == "error" or not isinstance(body, dict):
                self._json(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                            "message": "the fake refuses this request"}})
            elif path == "/v1/messages/count_tokens":
                self._json(200, {"input_tokens": 1000})
            elif path == "/v1/messages":
                message = fake.answer(body)
                if body.get("stream"):
                    self._stream(message)
                else:
                    self._json(200, message)
            else:
                self._json(200, {})

        def _headers(self) -> dict[str, str]:
            return {k.lower(): ("<redacted>" if k.lower() in SECRET_HEADERS else v) for k, v in self.headers.items()}

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("request-id", f"req_fake{next(fake._ids):06d}")
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, message: dict[str, Any]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.send_header("request-id", f"req_fake{next(fake._ids):06d}")
            self.end_headers()
            for event, data in _sse(message):
                self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
            self.close_connection = True

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--mode", default="ok", choices=["ok", "error", "down"])
    parser.add_argument("--loop", action="store_true")
    parser.add_argument("--cached-tokens", type=int, default=0)
    parser.add_argument("--log", help="append each recorded request to this file (JSON lines)")
    options = parser.parse_args()
    fake = FakeAnthropic(mode=options.mode, loop=options.loop, port=options.port, cached_tokens=options.cached_tokens)
    fake.start()
    print(f"fake Anthropic at {fake.url}", flush=True)
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
