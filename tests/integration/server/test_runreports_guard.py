"""The Job runner's report routes (``joch.server.runreports``) are exempt from user authentication,
so they must check the run token before they take a body: a caller without one must not make the
server spool an upload of any size to disk or hold a record of any size in memory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from joch.server.app import create_app
from joch.store import open_store

BASE = "/v1/namespaces/default/agentruns/nobody/attempts/1"
CHUNK = b"x" * 65536


def _put(app: Any, path: str, content_type: str, chunks: int) -> tuple[int, int]:
    """PUT ``chunks`` chunks to ``path`` through the ASGI app; its status and how many chunks it read."""
    pulled = 0
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled >= chunks:
            await asyncio.sleep(3600)
        pulled += 1
        return {"type": "http.request", "body": CHUNK, "more_body": pulled < chunks}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "PUT",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", content_type.encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    return status, pulled


@pytest.mark.parametrize(("tail", "content_type"), [("artifacts/big.bin", "application/octet-stream"),
                                                    ("log", "application/octet-stream"),
                                                    ("record", "application/json")])
def test_a_report_without_a_token_is_refused_before_its_body_is_read(
    tmp_path: Path, tail: str, content_type: str
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'joch.db'}")
    try:
        status, pulled = _put(create_app(store), f"{BASE}/{tail}", content_type, chunks=200)  # 12.5 MiB
    finally:
        store.close()
    assert status == 401
    assert pulled <= 1, f"the server read {pulled} chunks of an unauthenticated upload"
