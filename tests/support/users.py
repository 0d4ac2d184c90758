"""A real server with token authentication and a few known users, for tests of what the server does
with an identity (who decided, who created).

``users_server`` starts the real app with a kube-apiserver-style token file (see
``joch.server.auth``) holding one token per user in ``USERS``; ``as_user(name)`` is the
``Authorization`` header of that user. Requests without it are made as ``admin`` (group
``system:masters``), the client's default header. Everything after the token is the production path.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx

from joch.server.app import create_app
from joch.server.auth.options import AuthOptions
from joch.server.options import ServerOptions
from joch.server.testing import LiveServer, ServerThread
from joch.store.base import Store

MASTERS = "system:masters"
USERS: dict[str, tuple[str, ...]] = {
    "admin": (MASTERS,),
    "carol": (MASTERS,),
    "dave": (MASTERS,),
    "erin": (MASTERS,),
    "system:joch:controller": ("system:joch:controllers",),
}


def token_of(name: str) -> str:
    return "t-" + hashlib.sha256(name.encode()).hexdigest()[:24]


def as_user(name: str, *groups: str) -> dict[str, str]:
    """The headers of a request made by ``name`` (one of ``USERS``, with exactly those groups)."""
    assert name in USERS and (not groups or set(groups) <= set(USERS[name])), f"{name} {groups} not in USERS"
    return {"Authorization": f"Bearer {token_of(name)}"}


def token_file(folder: Path) -> Path:
    path = folder / "tokens.csv"
    path.write_text("".join(f'{token_of(n)},{n},uid-{i},"{",".join(g)}"\n' for i, (n, g) in enumerate(USERS.items())))
    return path


@contextmanager
def users_server(store: Store, options: ServerOptions | None = None) -> Iterator[LiveServer]:
    with tempfile.TemporaryDirectory() as folder:
        options = replace(options or ServerOptions(), auth=AuthOptions(token_file=token_file(Path(folder))))
        with ServerThread(create_app(store, options=options)) as thread, httpx.Client(
            base_url=thread.url, timeout=httpx.Timeout(60.0), headers=as_user("admin"),
        ) as http:
            yield LiveServer(thread.url, http, store)
