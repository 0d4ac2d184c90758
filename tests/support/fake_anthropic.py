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
``PYTHONPATH=tests python -m support.fake_anthropic --port 8765`` runs one by hand.
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

SECRET_HEADERS = frozenset({"x-api-key", "authorization"})
CWD = re.compile(r"(?:Primary working directory|Working directory):\s*(\S+)")
TEXT = ("text", "content")
"""Where a request's text stands (the keys of its JSON objects)."""


@dataclass
class FakeAnthropic(ScriptedAgentModel):
    """The script's fields are ``ScriptedAgentModel``'s; ``cached_tokens`` is reported as
    ``cache_read_input_tokens``, a wrong ``x-api-key`` gets a 401 ``authentication_error``."""

    reported: dict[str, int] = field(default_factory=lambda: {"input": 0, "output": 0, "cached": 0})
    """The usage the fake reported in all its answers (input_tokens, output_tokens, cache reads)."""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler(self)

    def agent_requests(self) -> list[Recorded]:
        """The recorded ``/v1/messages`` requests that were agent turns (they offered the tools)."""
        with self._lock:
            return [r for r in self.requests if r.path.startswith("/v1/messages") and _is_agent_turn(r.body)]

    # -- answers --------------------------------------------------------------------------------

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The assistant message (a Messages API ``message`` object) for a request ``body``."""
        model = str(body.get("model") or "claude-fake")
        if not _is_agent_turn(body):
            return self._message(model, [{"type": "text", "text": "Fake title"}], "end_turn", 20, 5)
        done = _tool_uses(body.get("messages") or [])
        edit = self.next_edit(done)
        if edit is not None:
            path, content = edit
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
    found = CWD.search(text_of(body.get("system"), TEXT) + "\n" + text_of(body.get("messages"), TEXT))
    return str(PurePosixPath(found.group(1)) / path) if found else path


def _sse(message: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """The streamed form of ``message``: the events the Messages API sends, in order."""
    usage = message["usage"]
    start = dict(message, content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
    events: list[tuple[str | None, Any]] = [("message_start", {"type": "message_start", "message": start}),
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


def _handler(fake: FakeAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(FakeHandler):
        secret_headers = SECRET_HEADERS

        def extra_headers(self) -> dict[str, str]:
            return {"request-id": f"req_fake{next(fake._ids):06d}"}

        def do_GET(self) -> None:
            fake.record(self._recorded(None))
            if self.path.startswith("/v1/models"):
                self._json(200, {"data": [{"type": "model", "id": "claude-fake", "display_name": "Fake"}],
                                 "has_more": False, "first_id": "claude-fake", "last_id": "claude-fake"})
            else:
                self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": "not found"}})

        def do_POST(self) -> None:
            body = self._body(empty={})
            fake.record(self._recorded(body))
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
                    self._sse(_sse(message))
                else:
                    self._json(200, message)
            else:
                self._json(200, {})

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
    serve_by_hand(fake, "Anthropic", options.log)


if __name__ == "__main__":
    main()
