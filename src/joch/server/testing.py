"""A real Joch server on an ephemeral localhost port, for tests (the server's, the CLI's, e2e).

``ServerThread`` runs uvicorn in a background thread: watches, Server-Sent Events and the custom
``WATCH`` method behave as in production, which an in-process ASGI transport does not guarantee.
``tls`` (a certificate and key file) serves HTTPS, for clients that send bearer tokens only over
TLS (kubectl). The socket is bound before the thread starts, so the URL is known up front and no port can be
taken in between; ``start`` returns once uvicorn accepts connections.

``live_server`` bundles that with an httpx client; ``ndjson`` and ``sse_events`` read the two
streaming formats, and ``is_status`` recognises a Kubernetes ``Status`` error body.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from joch.api import REGISTRY, errors
from joch.server.app import create_app
from joch.server.options import ServerOptions
from joch.store.base import Obj, Store


class ServerThread:
    def __init__(
        self, app: FastAPI, *, host: str = "127.0.0.1", startup_timeout: float = 10.0,
        tls: tuple[str, str] | None = None,
    ) -> None:
        # An explicit IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
        # and without it every response written in two parts waits out a 40 ms delayed ACK.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        port = self._socket.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://{host}:{port}"
        certfile, keyfile = tls or (None, None)
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, http="h11", lifespan="off",
            timeout_graceful_shutdown=1, ssl_certfile=certfile, ssl_keyfile=keyfile,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name=f"joch-server-{port}",
            daemon=True,
        )
        self._startup_timeout = startup_timeout

    def start(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the test server at {self.url} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass
class LiveServer:
    url: str
    http: httpx.Client
    store: Store

    def path(self, resource: str, name: str | None = None, *, namespace: str | None = "default",
             sub: str | None = None) -> str:
        """The REST path of a resource (any name kubectl accepts); ``namespace=None`` for the
        all-namespaces collection."""
        info = REGISTRY.resolve(resource)
        out = f"/apis/{info.group}/{info.version}" if info.group else f"/api/{info.version}"
        if info.namespaced and namespace is not None:
            out += f"/namespaces/{namespace}"
        out += f"/{info.plural}"
        if name is not None:
            out += f"/{name}"
        return out + (f"/{sub}" if sub else "")

    def create(self, obj: Obj, *, namespace: str = "default") -> Obj:
        """POST ``obj`` to its collection; the stored object, or the server's error raised."""
        info = REGISTRY.for_object(str(obj.get("apiVersion")), str(obj.get("kind")))
        response = self.http.post(self.path(info.plural, namespace=namespace), json=obj)
        body: Obj = response.json()
        if response.status_code != 201:
            raise errors.from_status(body)
        return body


@contextmanager
def live_server(store: Store, options: ServerOptions | None = None) -> Iterator[LiveServer]:
    with ServerThread(create_app(store, options=options)) as thread, httpx.Client(
        base_url=thread.url, timeout=httpx.Timeout(60.0)  # a loaded machine took over 10 s for /openapi.json
    ) as http:
        yield LiveServer(thread.url, http, store)


def ndjson(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The events of a Kubernetes watch stream, as they arrive."""
    for line in response.iter_lines():
        if line.strip():
            event: dict[str, Any] = json.loads(line)
            yield event


def sse_events(response: httpx.Response) -> Iterator[dict[str, str]]:
    """Server-sent events as dicts of their fields; a comment line comes as ``{"comment": text}``."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            yield {"comment": line[1:].strip()}
        elif line == "":
            if fields:
                yield fields
            fields = {}
        else:
            key, _, value = line.partition(":")
            fields[key] = value[1:] if value.startswith(" ") else value


def is_status(body: Any, code: int, reason: str) -> bool:
    """Whether ``body`` is a failure ``Status`` with this code and reason."""
    return (isinstance(body, dict) and body.get("kind") == "Status" and body.get("status") == "Failure"
            and body.get("code") == code and body.get("reason") == reason)
