"""``joch mcp``: Joch as an MCP server on stdin/stdout, for Claude Code, Codex and other MCP clients.

The server speaks to the Joch server of the current context (``--server``, ``JOCH_SERVER``,
``JOCH_TOKEN`` and ``joch config`` as for every command) with that context's token: each tool is
an API request as that user (``joch.mcp``). The MCP SDK is imported when the command runs, so
every other command starts without it.
"""

from __future__ import annotations

import signal

import typer

from joch.cli import client as clients
from joch.cli.app import ServerOption, _target, command


@command("mcp")
def mcp_command(ctx: typer.Context, server: ServerOption = None) -> None:
    """Serve Joch's tools to an MCP client over stdio, as the user of the current context.

    Tools: list, get, apply (with dry run) and delete resources; explain a kind; create a run and
    wait for it; a run's status, log, artifacts and changes.patch; list and decide approvals; the
    audit log; spend. Resources: joch://runs/NS/NAME/log, joch://runs/NS/NAME/patch,
    joch://agents/NS/NAME/manifest. Prompts: joch_triage_run, joch_write_agent. Everything is
    authorised and audited as the context's user, exactly as the same request from the CLI.

    Claude Code: `claude mcp add joch -- joch mcp` (or `claude mcp add joch -e JOCH_SERVER=URL
    -e JOCH_TOKEN=TOKEN -- joch mcp` to pin a server and user). Codex, in ~/.codex/config.toml:
    `[mcp_servers.joch]` with `command = "joch"` and `args = ["mcp"]`. `joch server` also serves
    MCP over streamable HTTP at /mcp (bearer token auth)."""
    import anyio
    import httpx

    from joch.mcp import serve_stdio

    url, token = _target(ctx, server)
    # The SDK reads stdin in a worker thread that no cancellation interrupts, so the usual
    # KeyboardInterrupt would wait for the next line or EOF: Ctrl-C ends the process at once, as it
    # ends `cat` (nothing is lost: every answer is written whole before the next is read).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    http = httpx.AsyncClient(base_url=url, timeout=60.0, verify=clients._tls_context(url))

    async def serve() -> None:
        async with http:
            await serve_stdio(http, token)

    anyio.run(serve)
