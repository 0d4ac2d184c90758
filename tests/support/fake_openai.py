"""A fake OpenAI model on 127.0.0.1 that real agent CLIs talk to: Chat Completions and Responses,
streamed or not, with a scripted edit.

The script is one edit, "write file PATH with CONTENT", then a final message:

* Responses (``POST /v1/responses``, Codex CLI): the first turn answers with the tool the request
  offers for editing — ``apply_patch`` (a custom/freeform tool: the patch as its ``input``; or a
  function taking ``{"input": patch}``), else a shell tool (``shell``/``exec_command``/
  ``local_shell``) running a ``printf`` into the file; once the request carries the tool's output,
  the final message.
* Chat Completions (``POST /v1/chat/completions``): a request offering a ``write`` tool, or an
  ``apply_patch`` function (OpenCode, for GPT models), gets that tool call first, then the final
  message once the request carries the tool's result; a request without tools
  (aider) gets the edit as text in the format its system prompt asks for (SEARCH/REPLACE blocks,
  else the whole file), and the final message once aider reports the edit applied.

Every answer reports usage (``USAGE``; in the final chunk of a stream when ``stream_options.
include_usage`` asks for it, and always in ``response.completed``). ``mode="down"`` answers 500 to
every model request (clients retry that), ``mode="unauthorized"`` 401 (they give up at once);
``refused_url()`` is a URL where nothing listens. Each request is recorded
(path, headers, JSON body) for the test to assert on the model asked for and the key sent.
"""

from __future__ import annotations

import json
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

USAGE = {"input": 1200, "cached": 200, "output": 80}
"""The tokens every model answer reports: input (of which cached) and output."""


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def model(self) -> str | None:
        return self.body.get("model") if isinstance(self.body, dict) else None

    def bearer(self) -> str | None:
        value = self.headers.get("authorization", "")
        return value.removeprefix("Bearer ") if value.startswith("Bearer ") else None


@dataclass
class Script:
    """The scripted turn: write ``content`` to ``path``, then say ``final``. With ``command``, a CLI
    that offers a shell tool (Codex) runs that shell command instead (to show what the agent's
    process sees, say ``printf %s "$HOME" > home.txt``)."""

    path: str = "hello.txt"
    content: str = "hello from the fake model\n"
    final: str = "I wrote hello.txt."
    command: str | None = None


@dataclass
class FakeOpenAI:
    script: Script = field(default_factory=Script)
    mode: Literal["ok", "down", "unauthorized"] = "ok"
    hold: bool = False
    """The first request that carries a tool's output (the agent is mid-task, its edit made) waits
    until ``release()``, then answers 500; ``held`` is set while it waits. For stopping an agent
    mid-run (killing its runner, going over a budget)."""
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.held = threading.Event()
        self._released = threading.Event()
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-openai", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    @property
    def url(self) -> str:
        """The base URL with ``/v1``, as OpenAI clients take it."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def release(self) -> None:
        self._released.set()

    def wait_released(self, seconds: float) -> None:
        self._released.wait(seconds)

    def take_hold(self) -> bool:
        """Whether this request is the one to hold (the first to ask, once)."""
        with self._lock:
            if not self.hold or self.held.is_set():
                return False
            self.held.set()
            return True

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, entry: Recorded) -> None:
        with self._lock:
            self.requests.append(entry)

    def model_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path.rstrip("/").endswith(("/responses", "/chat/completions"))]


def refused_url() -> str:
    """An OpenAI base URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or a list of parts with ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


class _Handler(BaseHTTPRequestHandler):
    server_fake: FakeOpenAI
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # --- plumbing --------------------------------------------------------------------------------

    def _body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode(errors="replace")

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events: Iterator[tuple[str | None, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for name, data in events:
            chunk = (f"event: {name}\n" if name else "") + "data: " + (
                data if isinstance(data, str) else json.dumps(data)) + "\n\n"
            self.wfile.write(chunk.encode())
            self.wfile.flush()

    def do_GET(self) -> None:
        fake = self.server_fake
        fake.record(Recorded("GET", self.path, {k.lower(): v for k, v in self.headers.items()}, None))
        if self.path.split("?")[0].rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [
                {"id": "gpt-test", "object": "model", "created": 0, "owned_by": "fake"}], "models": []})
            return
        self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        fake = self.server_fake
        body = self._body()
        fake.record(Recorded("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        path = self.path.split("?")[0].rstrip("/")
        if fake.mode == "down":
            self._json(500, {"error": {"message": "the fake model is down", "type": "server_error"}})
            return
        if fake.mode == "unauthorized":
            self._json(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                       "code": "invalid_api_key"}})
            return
        if not isinstance(body, dict):
            self._json(400, {"error": {"message": "expected a JSON object", "type": "invalid_request_error"}})
            return
        if path.endswith("/responses"):
            self._responses(body)
        elif path.endswith("/chat/completions"):
            self._chat(body)
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    # --- Responses -------------------------------------------------------------------------------

    def _responses(self, body: dict[str, Any]) -> None:
        script = self.server_fake.script
        items = body.get("input") if isinstance(body.get("input"), list) else []
        answered = any(isinstance(i, dict) and str(i.get("type", "")).endswith("_output") for i in items)
        if answered and self.server_fake.take_hold():
            self.server_fake.wait_released(120)
            self._json(500, {"error": {"message": "held, then released", "type": "server_error"}})
            return
        tools = {str(t.get("name") or t.get("type")): t for t in body.get("tools") or [] if isinstance(t, dict)}
        output: dict[str, Any]
        if answered or not tools:
            output = {"type": "message", "id": _id("msg"), "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": script.final, "annotations": []}]}
        else:
            output = _responses_edit(tools, script)
        model = str(body.get("model") or "gpt-test")
        response_id = _id("resp")
        usage = {"input_tokens": USAGE["input"], "input_tokens_details": {"cached_tokens": USAGE["cached"]},
                 "output_tokens": USAGE["output"], "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": USAGE["input"] + USAGE["output"]}
        base = {"id": response_id, "object": "response", "created_at": int(time.time()), "model": model}
        if not body.get("stream"):
            self._json(200, {**base, "status": "completed", "output": [output], "usage": usage})
            return

        def events() -> Iterator[tuple[str | None, Any]]:
            seq = iter(range(1_000_000))
            yield "response.created", {"type": "response.created", "sequence_number": next(seq),
                                       "response": {**base, "status": "in_progress", "output": []}}
            started = dict(output)
            if output["type"] == "message":
                started["content"] = []
                started["status"] = "in_progress"
            yield "response.output_item.added", {"type": "response.output_item.added",
                                                 "sequence_number": next(seq), "output_index": 0,
                                                 "item": started}
            if output["type"] == "message":
                yield "response.output_text.delta", {"type": "response.output_text.delta",
                                                     "sequence_number": next(seq), "item_id": output["id"],
                                                     "output_index": 0, "content_index": 0,
                                                     "delta": script.final}
            yield "response.output_item.done", {"type": "response.output_item.done",
                                                "sequence_number": next(seq), "output_index": 0, "item": output}
            yield "response.completed", {"type": "response.completed", "sequence_number": next(seq),
                                         "response": {**base, "status": "completed", "output": [output],
                                                      "usage": usage}}

        self._sse(events())

    # --- Chat Completions ------------------------------------------------------------------------

    def _chat(self, body: dict[str, Any]) -> None:
        script = self.server_fake.script
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        tools = {str((t.get("function") or {}).get("name")): t for t in body.get("tools") or []
                 if isinstance(t, dict)}
        content: str | None = None
        call: dict[str, Any] | None = None
        if any(m.get("role") == "tool" for m in messages) and self.server_fake.take_hold():
            self.server_fake.wait_released(120)
            self._json(500, {"error": {"message": "held, then released", "type": "server_error"}})
            return
        if tools:
            if any(m.get("role") == "tool" for m in messages):
                content = script.final
            else:
                call = _chat_edit(tools, script)
                if call is None:
                    content = script.final
        else:
            system = "\n".join(_text_of(m.get("content")) for m in messages if m.get("role") == "system")
            last_user = next((_text_of(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
            content = script.final if "I applied" in last_user or "Applied edit" in last_user else _aider_edit(
                system, script)
        model = str(body.get("model") or "gpt-test")
        completion_id = _id("chatcmpl")
        created = int(time.time())
        usage = {"prompt_tokens": USAGE["input"], "completion_tokens": USAGE["output"],
                 "total_tokens": USAGE["input"] + USAGE["output"],
                 "prompt_tokens_details": {"cached_tokens": USAGE["cached"]}}
        finish = "tool_calls" if call else "stop"
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if call:
                message["tool_calls"] = [call]
            self._json(200, {"id": completion_id, "object": "chat.completion", "created": created, "model": model,
                             "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                             "usage": usage})
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish_reason: str | None) -> tuple[None, Any]:
            return None, {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                          "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

        def events() -> Iterator[tuple[str | None, Any]]:
            yield chunk({"role": "assistant", "content": ""}, None)
            if call:
                yield chunk({"tool_calls": [{"index": 0, **call}]}, None)
            elif content:
                middle = len(content) // 2
                yield chunk({"content": content[:middle]}, None)
                yield chunk({"content": content[middle:]}, None)
            yield chunk({}, finish)
            if include_usage:
                yield None, {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                             "model": model, "choices": [], "usage": usage}
            yield None, "[DONE]"

        self._sse(events())


def _patch(script: Script) -> str:
    """Codex's apply_patch format: a new file, every line prefixed with ``+``."""
    lines = "".join(f"+{line}\n" for line in script.content.splitlines())
    return f"*** Begin Patch\n*** Add File: {script.path}\n{lines}*** End Patch\n"


def _shell_command(script: Script) -> str:
    if script.command is not None:
        return script.command
    return f"printf %s {shlex.quote(script.content)} > {shlex.quote(script.path)}"


def _responses_edit(tools: dict[str, dict[str, Any]], script: Script) -> dict[str, Any]:
    call_id = _id("call")
    patch = None if script.command is not None else tools.get("apply_patch")
    if patch is not None and patch.get("type") == "custom":
        return {"type": "custom_tool_call", "id": _id("ctc"), "call_id": call_id, "name": "apply_patch",
                "input": _patch(script), "status": "completed"}
    if patch is not None:
        return {"type": "function_call", "id": _id("fc"), "call_id": call_id, "name": "apply_patch",
                "arguments": json.dumps({"input": _patch(script)}), "status": "completed"}
    for name in ("exec_command", "shell_command", "shell"):
        if name in tools:
            command: Any = _shell_command(script)
            params = (tools[name].get("parameters") or {}).get("properties") or {}
            if name == "shell" or params.get("command", {}).get("type") == "array":
                command = ["bash", "-lc", command]
            key = "cmd" if "cmd" in params else "command"
            return {"type": "function_call", "id": _id("fc"), "call_id": call_id, "name": name,
                    "arguments": json.dumps({key: command}), "status": "completed"}
    if "local_shell" in tools:
        return {"type": "local_shell_call", "id": _id("lsc"), "call_id": call_id, "status": "completed",
                "action": {"type": "exec", "command": ["bash", "-lc", _shell_command(script)]}}
    raise ValueError(f"no editing tool offered (tools: {sorted(tools)})")


def _chat_edit(tools: dict[str, dict[str, Any]], script: Script) -> dict[str, Any] | None:
    """A tool call writing the file with the request's ``write`` tool (``filePath`` and ``content``),
    else its ``apply_patch`` function (OpenCode offers it for GPT models: ``patchText``), else None."""
    def params(name: str) -> dict[str, Any]:
        found: dict[str, Any] = ((tools[name].get("function") or {}).get("parameters") or {}).get("properties") or {}
        return found

    if "write" in tools:
        path_key = next((k for k in ("filePath", "file_path", "path") if k in params("write")), "filePath")
        arguments = {path_key: script.path, "content": script.content}
        name = "write"
    elif "apply_patch" in tools:
        patch_key = next((k for k in ("patchText", "patch", "input") if k in params("apply_patch")), "input")
        arguments = {patch_key: _patch(script)}
        name = "apply_patch"
    else:
        return None
    return {"id": _id("call"), "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _aider_edit(system: str, script: Script) -> str:
    """Aider's edit, in the format its system prompt describes: SEARCH/REPLACE blocks (``diff``),
    else the whole file (``whole``)."""
    fence = "```"
    if "SEARCH/REPLACE" in system:
        body = f"{script.path}\n{fence}\n<<<<<<< SEARCH\n=======\n{script.content}>>>>>>> REPLACE\n{fence}\n"
    else:
        body = f"{script.path}\n{fence}\n{script.content}{fence}\n"
    return f"I will create {script.path}.\n\n{body}"
