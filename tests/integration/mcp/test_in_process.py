"""``/mcp``'s tools call the server in process (``joch.mcp.http.in_process_client``): an answer is
read as the app sends it, so the first megabyte of a huge artifact costs a megabyte, and a reader
that stops early stops the app's streaming response (it sees its client hang up)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from joch.mcp.api import Api
from joch.mcp.http import in_process_client

CHUNK = b"+" + b"y" * (64 * 1024 - 2) + b"\n"
CHUNKS = 4096  # 256 MiB, were it all sent


def test_reading_the_start_of_a_huge_answer_stops_the_app_sending_it() -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(CHUNKS):
            sent += 1
            yield CHUNK

    async def huge(_: Request) -> StreamingResponse:
        return StreamingResponse(chunks(), media_type="application/octet-stream")

    app = Starlette(routes=[Route("/huge", huge)])

    async def scenario() -> tuple[int, bool]:
        async with anyio.create_task_group() as tasks:
            async with in_process_client(app, tasks) as http:
                excerpt = await Api(http, None).excerpt("/huge", 1_000_000)
            await anyio.sleep(0.2)  # the app's task notices its reader left
            tasks.cancel_scope.cancel()
        return len(excerpt.text), excerpt.truncated

    length, truncated = anyio.run(scenario)
    assert (length, truncated) == (1_000_000, True)
    assert sent < 40, f"the app sent {sent} of {CHUNKS} chunks for a reader that wanted 16"


def test_an_answer_read_to_its_end_is_whole() -> None:
    async def small(_: Request) -> StreamingResponse:
        return StreamingResponse(iter([b"a\n", b"b\n"]), media_type="text/plain")

    app = Starlette(routes=[Route("/small", small)])

    async def scenario() -> str:
        async with anyio.create_task_group() as tasks, in_process_client(app, tasks) as http:
            text = await Api(http, None).text("/small")
            tasks.cancel_scope.cancel()
        return text

    assert anyio.run(scenario) == "a\nb\n"


def test_a_caller_that_gives_up_before_the_answer_begins_stops_the_app_too() -> None:
    """Else the app would wait forever to hand its next chunk to a reader that is gone."""
    ended = anyio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(CHUNKS):
            yield CHUNK

    async def slow(_: Request) -> StreamingResponse:
        await anyio.sleep(0.3)  # the caller's patience ends before the answer begins
        return StreamingResponse(chunks(), media_type="application/octet-stream")

    routes = Starlette(routes=[Route("/slow", slow)])

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await routes(scope, receive, send)
        finally:
            ended.set()

    async def scenario() -> bool:
        async with anyio.create_task_group() as tasks, in_process_client(app, tasks) as http:
            with anyio.move_on_after(0.1):
                await Api(http, None).excerpt("/slow", 1_000_000)
            with anyio.move_on_after(3):
                await ended.wait()
            tasks.cancel_scope.cancel()
            return ended.is_set()

    assert anyio.run(scenario), "the app was still waiting to send its answer"
