"""Running a server: open the store, optionally apply manifests, serve with uvicorn until stopped.

``serve`` owns the store: it opens it from the URL (which also applies migrations) with the Secret
key ring it is given — always: a server encrypts Secrets at rest — and closes it when uvicorn
returns. Manifests given with ``apply_paths`` (files, or directories whose ``*.yaml``,
``*.yml`` and ``*.json`` files are read in name order, not recursively, like ``kubectl apply -f``;
admission's ``load_paths`` reads them) are applied as one atomic apply before the port opens, so
``make run`` serves a populated store or fails loudly. ``apply_missing_paths`` (``--apply-missing``,
what ``make run`` uses) only creates the objects that do not exist yet: a restart must not revert
what a user changed in the store since the first start.

uvicorn runs on uvloop with httptools' parser (llhttp, in C), about twice as cheap per request as
the pure-Python h11 and asyncio's loop. The seed's ``WATCH /v1/resources`` uses a custom HTTP
method, which llhttp rejects and h11 accepts: ``_HttpProtocol`` hands a connection whose next
request starts with ``WATCH`` (between requests) to uvicorn's h11 protocol, which serves the rest of
that connection. A short graceful-shutdown timeout ends open watch streams on Ctrl-C instead of
waiting for them forever. Access logging is off by default: at the target request rates it costs
more than it tells.

With ``controllers`` (``joch server`` passes them unless ``--no-controllers``), the controller
manager runs in-process next to uvicorn: a ``LocalRuntime`` in ``controllers.data_dir`` runs the
agents (handing each the server's URL, ``runtime_url``, for its usage callback), and the app
serves their logs and artifacts through it. The manager starts after the manifests are applied
(its first list sees them) and before the port opens, and on shutdown it
stops (releasing the leader lease) before the runtime and then the store are closed.

Authentication (``joch.server.auth``): on an address other than loopback, anyone who can connect
could create runs and so run commands as this user, so ``serve`` refuses to start there without an
authenticator (``--token-file`` or ``--oidc-issuer-url``), saying how to configure one. On
loopback, no authenticator means auth none: every caller is ``system:anonymous`` and allowed.

Resources: ``serve`` raises the process's soft open-file limit to the hard one first (see
``joch.server.limits``; the default ``max_watches`` then follows the raised limit). Should the
process still run out of descriptors, ``accept()`` failing is reported once a minute as one line,
not as a traceback per attempt (asyncio retries it every second by itself), and requests that
cannot open what they need answer 503 with ``Retry-After`` (``joch.store.exhaustion``).

SIGINT and SIGTERM stop the server gracefully and ``serve`` then *returns* (so the store is closed
and ``joch server`` exits 0). uvicorn itself re-raises the signal after its shutdown, which turns
Ctrl-C into a ``KeyboardInterrupt`` traceback and SIGTERM into a kill that skips closing the
store; ``_Server`` keeps uvicorn's handlers but not the re-raise.

Logging: ``log_format`` ``text`` (the default) or ``json`` (``joch.telemetry.logs``); tracing, when
the environment configures it, was started by the caller (``joch.telemetry.tracing.configured``) and
``create_app`` then adds the request spans.

Audit retention (``ServerOptions.audit_retention``, ``--audit-retention``) runs on its own thread
from start to shutdown (``joch.server.retention``).

Several processes (``joch server --workers N``, ``joch.cli.supervising``): the supervisor accepts the
connections and hands each to a worker in turn; a worker calls ``serve`` with its end of that channel
(``handoff``, a Unix ``SOCK_SEQPACKET`` socket carrying one connection's descriptor per message), and
uvicorn then listens on nothing itself: each connection received is served as uvicorn serves one
it accepted (``loop.connect_accepted_socket`` with uvicorn's protocol). Letting the workers accept
from one shared socket instead leaves the spread to the kernel, which handed 3 of the bench's 4
keep-alive clients to one worker, with the other mostly idle. Only the ``primary`` one (worker 0)
applies manifests, runs the controllers and audit retention; the others serve HTTP, with the same
runtime built from ``controllers`` (its constructor starts nothing but an idle monitor thread) so
they serve run logs and artifacts too. ``on_ready`` is called once uvicorn serves (worker 0 tells
the supervisor, which then starts the others and begins handing connections over).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import HANDLED_SIGNALS

from joch.admission import apply as admission
from joch.admission import documents
from joch.admission import paths as local_paths
from joch.admission.validation import resolve_kind
from joch.api import errors
from joch.api.meta import DEFAULT_NAMESPACE
from joch.controllers import manager as managing
from joch.controllers.options import ControllerOptions
from joch.runtime.base import Runtime
from joch.server import guard, limits, retention
from joch.server.app import create_app
from joch.server.auth import options as auth_options
from joch.server.options import ServerOptions
from joch.store import KeyRing, exhaustion, open_store
from joch.store.base import Store
from joch.telemetry import logs

logger = logging.getLogger("joch.server")
GRACEFUL_SHUTDOWN_SECONDS = 3


def serve(
    *, store_url: str, host: str = "127.0.0.1", port: int = 8080, apply_paths: Sequence[str] | None = None,
    options: ServerOptions | None = None, log_level: str = "info", access_log: bool = False,
    controllers: ControllerOptions | None = None, apply_missing_paths: Sequence[str] | None = None,
    secret_keys: KeyRing | None = None, log_format: str = "text", handoff: socket.socket | None = None,
    primary: bool = True, on_ready: Callable[[], None] | None = None,
) -> None:
    options = replace(options or ServerOptions(), bind_host=host)
    logs.configure(log_format, log_level)
    auth_options.check_exposure(host, options.auth)
    limits.raise_fd_limit()
    if secret_keys is None:
        # The server always encrypts Secrets at rest: joch server passes the ring it loaded
        # (--secret-key-file, JOCH_SECRET_KEY or DATA_DIR/secret.key; ``sealing.load_ring``).
        raise ValueError("serve needs the Secret key ring (secret_keys): joch server loads it from "
                         "--secret-key-file, JOCH_SECRET_KEY or DATA_DIR/secret.key")
    store = open_store(store_url, secret_keys=secret_keys)
    runtime: Runtime | None = None
    try:
        if apply_paths and primary:
            apply_manifests(store, apply_paths, options)
        if apply_missing_paths and primary:
            create_missing(store, apply_missing_paths, options)
        if controllers is not None:
            from joch.controllers.assembly import build_runtime

            if controllers.api_url is None:
                controllers = replace(controllers, api_url=runtime_url(host, port))
            runtime = build_runtime(controllers)
        app = create_app(store, options=options, runtime=runtime)
        # Start-up built tens of thousands of long-lived objects (routes, schemas, validators);
        # moving them out of the collector's reach keeps full collections short while a request
        # builds a 1,000-object list.
        gc.collect()
        gc.freeze()
        config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level,
            access_log=access_log, http=_HttpProtocol, loop="uvloop",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
            # JSON: uvicorn's lines go to the root logger's JSON handler instead of its own text one.
            log_config=None if log_format == "json" else LOGGING_CONFIG,
        )
        pruning = retention.AuditPruner(store, options.audit_retention) if primary else nullcontext()
        with pruning, _controllers(store, runtime, controllers if primary else None):
            _Server(config, store, on_ready=on_ready, handoff=handoff).run(sockets=None if handoff is None else [])
    finally:
        if runtime is not None:
            runtime.close()
        store.close()


def runtime_url(host: str, port: int) -> str:
    """This server's URL as local agents reach it (their ``JOCH_API_URL``): a wildcard bind is
    reached on 127.0.0.1, an IPv6 address in brackets."""
    if guard.is_wildcard(host) or not host:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _controllers(
    store: Store, runtime: Runtime | None, options: ControllerOptions | None,
) -> AbstractContextManager[object]:
    if runtime is None or options is None:
        return nullcontext()
    return managing.running(store, runtime, options)


class _Server(uvicorn.Server):
    """uvicorn's server with Joch's signal handling, and watches that end when shutdown starts:
    open watch streams then finish their responses instead of being cancelled after the grace
    period (which logs a traceback per stream)."""

    def __init__(self, config: uvicorn.Config, store: Store, *, on_ready: Callable[[], None] | None = None,
                 handoff: socket.socket | None = None) -> None:
        super().__init__(config)
        self._store = store
        self._on_ready = on_ready
        self._handoff = handoff
        self._starting: set[asyncio.Task[None]] = set()  # connections being set up (kept from the GC)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_loop_exception)
        await super().startup(sockets)
        if self.started and self._handoff is not None:
            self._handoff.setblocking(False)
            loop.add_reader(self._handoff.fileno(), self._take_connections)
        if self.started and self._on_ready is not None:
            self._on_ready()

    def _take_connections(self) -> None:
        """Serve the connections the supervisor handed over (see the module docstring)."""
        assert self._handoff is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self._handoff, 16, 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                logger.warning("the supervisor's connection channel failed (%s); stopping", exc)
                message, fds = b"", []
            if not message and not fds:  # the supervisor has gone: stop as on SIGTERM
                loop.remove_reader(self._handoff.fileno())
                self.should_exit = True
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                if self.should_exit:
                    conn.close()
                    continue
                task = loop.create_task(self._serve_connection(conn))
                self._starting.add(task)
                task.add_done_callback(self._starting.discard)

    async def _serve_connection(self, conn: socket.socket) -> None:
        config = self.config
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: config.http_protocol_class(  # type: ignore[call-arg]
                    config=config, server_state=self.server_state, app_state=self.lifespan.state),
                conn)
        except OSError:  # the client went away before it was served
            conn.close()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._handoff is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._handoff.fileno())
            self._handoff.close()
        self._store.stop_watches()
        await super().shutdown(sockets)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, except that a connection whose next request is a ``WATCH``
    (llhttp refuses methods it does not know) goes to uvicorn's h11 protocol from that request on."""

    _in_message = False

    def on_message_begin(self) -> None:
        self._in_message = True
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self._in_message = False
        super().on_message_complete()

    _head = b""  # the start of a request line too short to tell whether it is a WATCH

    def data_received(self, data: bytes) -> None:
        if self._head:
            data, self._head = self._head + data, b""
        if data[:len(WATCH)] == WATCH[:len(data)] and self._between_requests():
            if len(data) < len(WATCH):
                self._head = data
                return
            self._hand_to_h11(data)
            return
        super().data_received(data)

    def _between_requests(self) -> bool:
        return not self._in_message and not self.pipeline and (self.cycle is None or self.cycle.response_complete)

    def _hand_to_h11(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        self.connections.discard(self)
        h11 = H11Protocol(config=self.config, server_state=self.server_state, app_state=self.app_state,
                          _loop=self.loop)
        self.transport.set_protocol(h11)
        h11.connection_made(self.transport)
        h11.data_received(data)


WATCH = b"WATCH "
_accept_failed = exhaustion.ThrottledLog(logger)


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """asyncio's handler, except for ``accept()`` out of descriptors: one line a minute instead of a
    traceback per retry (asyncio retries by itself)."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exhaustion.is_exhausted(exc):
        _accept_failed.warning(f"cannot accept connections: {exc.strerror or exc}; open connections must end "
                               "first (raise the open-file limit, ulimit -n, or lower --max-watches)")
        return
    loop.default_exception_handler(context)


def apply_manifests(store: Store, paths: Sequence[str], options: ServerOptions) -> admission.ApplyResult:
    result = admission.apply_documents(store, _load(paths), dry_run=False, options=options.admission)
    for line in result.lines():
        logger.info("%s", line)
    return result


def create_missing(store: Store, paths: Sequence[str], options: ServerOptions) -> admission.ApplyResult:
    """``--apply-missing``: create the objects that do not exist yet and leave the others as they
    are (saying so), so a restart does not revert edits made since the first start. Every document
    is still validated; the missing ones are created atomically, as ``joch create -f`` would."""
    docs = _load(paths)
    admission.apply_documents(store, docs, dry_run=True, options=options.admission)  # all valid, or nothing
    missing = []
    for doc in docs:
        existing = _existing(store, doc)
        if existing is None:
            missing.append(doc)
        else:
            logger.info("%s exists; left as it is (--apply-missing creates only missing objects)", existing)
    result = admission.create_documents(store, missing, options=options.admission)
    for line in result.lines():
        logger.info("%s", line)
    return result


def _load(paths: Sequence[str]) -> list[documents.Document]:
    # A relative repository path in a file is relative to that file, as for `joch apply -f`.
    return [local_paths.resolved(doc) for doc in documents.load_paths(list(paths))]


def _existing(store: Store, doc: documents.Document) -> str | None:
    """``agent.joch.dev/demo`` when the document's object is stored already, else None."""
    kind = resolve_kind(doc.obj)
    metadata = doc.obj.get("metadata") or {}
    name = metadata.get("name")
    if not name:
        return None  # generateName: always a new object
    namespace = (metadata.get("namespace") or DEFAULT_NAMESPACE) if kind.namespaced else None
    try:
        store.get(kind, namespace, name)
    except errors.NotFound:
        return None
    return f"{kind.singular}.{kind.group}/{name}"
