"""``joch server``: turning command-line choices into a call to ``joch.server.serve``.

The web stack is imported only here and only when the command runs, so every other command
starts without loading FastAPI and uvicorn. Problems a user can fix are reported as ``JochError``
before the server starts, instead of as uvicorn log lines or a traceback: a data directory that
cannot be created, a port outside 1-65535 (``socket.bind`` would raise ``OverflowError``), a port
already taken (checked by binding it once; uvicorn would log and exit with its own code 3, which
here means "not found"), and a store URL the store layer refuses (``open_store`` raises
``ValueError`` for those).

``joch controller`` runs the same controllers as ``joch server`` without the web stack: it opens the
store, campaigns for the leader lease and runs the controllers until SIGINT or SIGTERM, then stops
them, releases the lease and exits 0. Both commands build their ``ControllerOptions`` in
``controller_options``; ``--lease-duration`` sets the renew deadline and retry period in
client-go's proportions (15 : 10 : 2), so one flag cannot make an inconsistent trio.
"""

from __future__ import annotations

import errno
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from joch.api import errors
from joch.controllers.options import ControllerOptions, default_identity


def store_url(*, data_dir: Path, store: str | None) -> str:
    if store:
        _check_sqlite_directory(store)
        return store
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.BadRequest(f'cannot create the data directory "{data_dir}": {exc.strerror or exc}') from None
    return f"sqlite:///{data_dir.resolve() / 'joch.db'}"


def _check_sqlite_directory(url: str) -> None:
    """A typo in a ``--store sqlite:///…`` path must not quietly create a new, empty store (and its
    directories) that a server then leads as if nothing were wrong."""
    if not url.startswith("sqlite:"):
        return
    parts = urlsplit(url)
    path = (parts.netloc + parts.path) if parts.netloc else parts.path
    if path.startswith("//"):
        path = path[1:]
    directory = Path(path).parent
    if path and not directory.is_dir():
        raise errors.BadRequest(f'the directory "{directory}" of the SQLite store in --store does not exist: '
                                f"create it (mkdir -p {directory}) or fix the URL")


MAX_PORT = 65535


def check_port(host: str, port: int) -> None:
    if not 1 <= port <= MAX_PORT:
        raise errors.BadRequest(f"--port must be between 1 and {MAX_PORT} (got {port})")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except (OSError, UnicodeError) as exc:  # UnicodeError: a --host that is not a valid name
            taken = isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE
            why = "the address is already in use (is another `joch server` running?)" if taken else (
                getattr(exc, "strerror", None))
            raise errors.BadRequest(f"cannot listen on {host}:{port}: {why or exc}") from None


def controller_options(
    *, data_dir: Path, max_concurrent_runs: int | None, max_concurrent_runs_per_namespace: int | None,
    lease_duration: float, identity: str | None,
) -> ControllerOptions:
    for flag, value in (("--max-concurrent-runs", max_concurrent_runs),
                        ("--max-concurrent-runs-per-namespace", max_concurrent_runs_per_namespace)):
        if value is not None and value < 1:
            raise errors.BadRequest(f"{flag} must be at least 1 (got {value})")
    if not lease_duration > 0:
        raise errors.BadRequest(f"--lease-duration must be a positive number of seconds (got {lease_duration:g})")
    if identity is not None and not identity.strip():
        raise errors.BadRequest("--identity must not be empty")
    return ControllerOptions(
        data_dir=data_dir, identity=identity or default_identity(), lease_duration=lease_duration,
        renew_deadline=lease_duration * 10 / 15, retry_period=lease_duration * 2 / 15,
        max_concurrent_runs=max_concurrent_runs, max_concurrent_runs_per_namespace=max_concurrent_runs_per_namespace,
    )


@dataclass(frozen=True)
class ServerLimits:
    """The ``joch server`` flags that bound what one request or client may take (see
    ``joch.server.options.ServerOptions``); ``max_watches`` None derives it from the fd limit."""

    max_watches: int | None = None
    watch_buffer_events: int = 10_000
    max_apply_documents: int = 1000
    max_apply_bytes: int = 16 * 1024 * 1024

    def check(self) -> None:
        for flag, value in (("--max-watches", self.max_watches), ("--watch-buffer-events", self.watch_buffer_events),
                            ("--max-apply-documents", self.max_apply_documents),
                            ("--max-apply-bytes", self.max_apply_bytes)):
            if value is not None and value < 1:
                raise errors.BadRequest(f"{flag} must be at least 1 (got {value})")


def run(
    *, data_dir: Path, store: str | None, host: str, port: int, apply_paths: list[str] | None,
    controllers: ControllerOptions | None = None, limits: ServerLimits | None = None,
) -> None:
    limits = limits or ServerLimits()
    limits.check()
    check_port(host, port)
    url = store_url(data_dir=data_dir, store=store)
    from joch import server  # lazy: only this command needs the web stack

    options = server.ServerOptions(
        max_watches=limits.max_watches, watch_buffer_events=limits.watch_buffer_events,
        max_apply_documents=limits.max_apply_documents, max_apply_bytes=limits.max_apply_bytes,
    )
    try:
        server.serve(store_url=url, host=host, port=port, apply_paths=apply_paths or None, controllers=controllers,
                     options=options)
    except ValueError as exc:
        raise errors.BadRequest(str(exc)) from None


def run_controllers(*, data_dir: Path, store: str | None, options: ControllerOptions) -> None:
    """``joch controller``: run the controllers until SIGINT or SIGTERM."""
    import logging

    from joch.controllers import manager as managing
    from joch.runtime.local import LocalRuntime
    from joch.store import open_store

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    url = store_url(data_dir=data_dir, store=store)
    try:
        opened = open_store(url)
    except ValueError as exc:
        raise errors.BadRequest(str(exc)) from None
    try:
        runtime = LocalRuntime(options.data_dir)
        try:
            with managing.running(opened, runtime, options) as manager:
                with _stopping_on_signals(manager.request_stop):
                    manager.run()
        finally:
            runtime.close()
    finally:
        opened.close()


@contextmanager
def _stopping_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call ``stop`` (which must be signal-safe) instead of raising."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: stop()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
