"""``joch server``: turning command-line choices into a call to ``joch.server.serve``.

The web stack is imported only here and only when the command runs, so every other command
starts without loading FastAPI and uvicorn. Problems a user can fix are reported as ``JochError``
before the server starts, instead of as uvicorn log lines or a traceback: a data directory that
cannot be created, a port outside 1-65535 (``socket.bind`` would raise ``OverflowError``), a port
already taken (checked by binding it once; uvicorn would log and exit with its own code 3, which
here means "not found"), and a store URL the store layer refuses (``open_store`` raises
``ValueError`` for those).
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from joch.api import errors


def store_url(*, data_dir: Path, store: str | None) -> str:
    if store:
        return store
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.BadRequest(f'cannot create the data directory "{data_dir}": {exc.strerror or exc}') from None
    return f"sqlite:///{data_dir.resolve() / 'joch.db'}"


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


def run(*, data_dir: Path, store: str | None, host: str, port: int, apply_paths: list[str] | None) -> None:
    check_port(host, port)
    url = store_url(data_dir=data_dir, store=store)
    from joch import server  # lazy: only this command needs the web stack

    try:
        server.serve(store_url=url, host=host, port=port, apply_paths=apply_paths or None)
    except ValueError as exc:
        raise errors.BadRequest(str(exc)) from None
