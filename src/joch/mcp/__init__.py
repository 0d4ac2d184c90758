"""Joch as an MCP server (the official ``mcp`` SDK): tools, resources and prompts over Joch's HTTP API.

Two ways in, one server (``joch.mcp.server.create``): ``joch mcp`` speaks MCP over stdio as the user
of the CLI's current context (``serve_stdio``), and ``joch server`` serves streamable HTTP at
``/mcp`` (``joch.mcp.http.install``), acting as whoever's bearer token each MCP request carries.
Either way a tool is a request to the API with the caller's credentials, so authentication, RBAC,
admission and the audit log are exactly the API's. This package imports neither ``joch.server`` nor
``joch.cli``: the caller hands it the server's URL, the token and the HTTP client. The SDK is
imported when a server is built, not with the package.
"""

from __future__ import annotations

import httpx

from joch.mcp.api import Api


async def serve_stdio(http: httpx.AsyncClient, token: str | None) -> None:
    """Serve MCP on stdin/stdout until the client closes it; ``http`` has the server's base URL."""
    from joch.mcp.server import create

    caller = Api(http, token)
    await create(lambda _headers: caller).run_stdio_async()
