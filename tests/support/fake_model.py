"""The HTTP plumbing the fake model servers share (``fake_openai``, ``fake_anthropic``, ``fake_gemini``).

``FakeModel`` is the server side: a threaded HTTP server on 127.0.0.1 (``port`` 0: any free one),
``start()``/``stop()`` and a context manager, the ``requests`` it recorded, and the events a held
or paced answer waits on (``release()``, ``stop()``). ``FakeHandler`` is the request side: the
JSON body, the headers as recorded (``secret_headers`` redacted), a JSON answer and a stream of
server-sent events. Each fake brings its wire format: its own handler's ``do_GET``/``do_POST``.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass
class Recorded:
    """One request the fake received; ``headers`` lower-cased, without the secret ones' values."""

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a CLI killed while its answer was held) is not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeModel:
    """A fake model's server. A subclass (a dataclass) calls ``_setup(port)`` from ``__post_init__``
    (``port`` 0: any free one) and gives ``handler()``."""

    requests: list[Recorded]
    listen_port: int = 0

    def _setup(self, port: int = 0) -> None:
        self.listen_port = port
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._wake = threading.Event()
        self._released = threading.Event()
        self._turns = 0

    def handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def _listen(self) -> _Server:
        if self._server is None:
            self._server = _Server(("127.0.0.1", self.listen_port), self.handler())
        return self._server

    @property
    def bound_port(self) -> int:
        port: int = self._listen().server_address[1]
        return port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``; the fake must be started."""
        assert self._server is not None, "the fake is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Self:
        server = self._listen()
        threading.Thread(target=server.serve_forever, name=f"fake-{type(self).__name__}", daemon=True).start()
        return self

    def release(self) -> None:
        """Let the held answer be given."""
        self._released.set()

    def stop(self) -> None:
        self._wake.set()
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def record(self, recorded: Recorded) -> None:
        with self._lock:
            self.requests.append(recorded)

    def _next_turn(self, hold_turn: int | None, delay: float) -> None:
        """Count an agent turn; the ``hold_turn``-th waits for ``release()``, each one ``delay`` seconds."""
        with self._lock:
            self._turns += 1
            turn = self._turns
        if turn == hold_turn:
            self._released.wait()
        if delay:
            self._wake.wait(delay)


@dataclass
class ScriptedAgentModel(FakeModel):
    """A fake model whose agent turns follow a script (``fake_anthropic``, ``fake_gemini``): one edit
    a turn, in order, then ``final_text``; ``loop`` keeps writing ``loop-<n>.txt`` instead (``max_loop``
    edits at most). The subclass knows its wire format and which requests are agent turns."""

    edits: list[tuple[str, str]] = field(default_factory=lambda: [("hello.txt", "hello from the fake model\n")])
    final_text: str = "I wrote the file."
    mode: str = "ok"  # ok | error | down
    loop: bool = False
    input_tokens: int = 1200
    output_tokens: int = 300
    cached_tokens: int = 0  # reported as cached input tokens on the agent's turns
    delay: float = 0.0  # seconds to wait before each agent turn's answer
    hold_turn: int | None = None  # this agent turn (1 = the first) waits for release(): a run to kill mid-way
    api_key: str | None = None  # when set, a request with another key gets the API's authentication error
    max_loop: int = 200  # a looping script still ends after this many edits
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._setup(self.port)

    def next_edit(self, done: int) -> tuple[str, str] | None:
        """An agent turn after ``done`` edits (held or paced as asked): the (path, content) it writes;
        None when the script is done."""
        self._next_turn(self.hold_turn, self.delay)
        if done < len(self.edits):
            return self.edits[done]
        if self.loop and done < self.max_loop:
            return f"loop-{done}.txt", f"turn {done}\n"
        return None


class FakeHandler(BaseHTTPRequestHandler):
    """The request side of a fake: reading, recording and answering (JSON or server-sent events)."""

    protocol_version = "HTTP/1.1"
    secret_headers: frozenset[str] = frozenset()
    json_type = "application/json"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def extra_headers(self) -> dict[str, str]:
        """Headers every answer carries (a request id, say)."""
        return {}

    def _body(self, empty: Any = None) -> Any:
        """The request's JSON body; ``empty`` without one, the text when it is not JSON."""
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return empty
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def _headers(self) -> dict[str, str]:
        return {k.lower(): ("<redacted>" if k.lower() in self.secret_headers else v) for k, v in self.headers.items()}

    def _recorded(self, body: Any) -> Recorded:
        return Recorded(self.command, self.path, self._headers(), body)

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", self.json_type)
        self.send_header("Content-Length", str(len(data)))
        for header, value in self.extra_headers().items():
            self.send_header(header, value)
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events: Iterable[tuple[str | None, Any]], end: str = "\n\n") -> None:
        """Stream ``events`` (name or None, data: a string as it is, else JSON), each ended by ``end``."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        for header, value in self.extra_headers().items():
            self.send_header(header, value)
        self.end_headers()
        self.close_connection = True
        for name, data in events:
            chunk = (f"event: {name}\n" if name else "") + "data: " + (
                data if isinstance(data, str) else json.dumps(data)) + end
            self.wfile.write(chunk.encode())
            self.wfile.flush()


def text_of(value: Any, keys: tuple[str, ...]) -> str:
    """All the text in a request's JSON ``value``: strings, in lists, under ``keys`` of objects."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(text_of(v, keys) for v in value)
    if isinstance(value, dict):
        return "\n".join(text_of(v, keys) for k, v in value.items() if k in keys)
    return ""


def serve_by_hand(fake: FakeModel, name: str, log: str | None) -> None:
    """Run ``fake`` until Ctrl-C, appending each recorded request to ``log`` (JSON lines) if given."""
    fake.start()
    print(f"fake {name} at {fake.url}", flush=True)
    seen = 0
    try:
        while True:
            threading.Event().wait(0.5)
            if log and len(fake.requests) > seen:
                with open(log, "a", encoding="utf-8") as out:
                    for r in fake.requests[seen:]:
                        out.write(json.dumps(r.__dict__) + "\n")
                seen = len(fake.requests)
    except KeyboardInterrupt:
        fake.stop()
