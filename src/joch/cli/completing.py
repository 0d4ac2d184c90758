"""Shell completion: ``joch completion bash|zsh|fish`` prints the script, and the completions it asks for.

The scripts are typer's (it ships click's protocol: the shell runs ``joch`` again with
``_JOCH_COMPLETE=complete_bash`` and the words typed so far, and prints what comes back). typer
registers its shell classes only for apps with ``add_completion`` (which would add
``--install-completion`` options to every command), so ``init`` registers them when a shell asks,
and not otherwise: completion costs nothing to commands that are not completing.

Commands and options complete from the command tree; resource types (``joch get <TAB>``) and
object names (``joch get agents <TAB>``) complete from the server the current settings point at,
like kubectl's ``__complete``: the discovery documents and a list of the type, with a short
timeout, and nothing (never an error on the terminal) when the server cannot be asked.
"""

from __future__ import annotations

import os
from typing import Any

import typer

from joch.api import errors

COMPLETE_VAR = "_JOCH_COMPLETE"
SHELLS = ("bash", "zsh", "fish")
TIMEOUT_SECONDS = 2.0


def asked() -> bool:
    return bool(os.environ.get(COMPLETE_VAR))


def init() -> None:
    from typer._completion_classes import completion_init

    completion_init()


def script(shell: str) -> str:
    if shell not in SHELLS:
        raise errors.BadRequest(f'unsupported shell "{shell}": give one of {", ".join(SHELLS)}')
    from typer._completion_shared import get_completion_script

    return get_completion_script(prog_name="joch", complete_var=COMPLETE_VAR, shell=shell) + "\n"


def _client(ctx: typer.Context) -> Any:
    from joch.cli import contexts
    from joch.cli.client import Client, server_url

    root = ctx.find_root().params
    context = contexts.current()
    url = server_url(ctx.params.get("server") or root.get("server"),
                     context_server=context.server if context else None, context=context.name if context else "")
    return Client(base_url=url, on_warning=lambda _: None, timeout=TIMEOUT_SECONDS,
                  token=contexts.token(root.get("token"), context))


def kinds(ctx: typer.Context, incomplete: str) -> list[str]:
    """Resource types (plurals, as kubectl completes them); after ``TYPE/``, that type's names; in a
    list of words (``joch edit agent <TAB>``), after a type, its names."""
    typed = next((v for v in ctx.params.values() if isinstance(v, list | tuple) and v), None)
    first = str(typed[0]) if typed else ""
    try:
        client = _client(ctx)
        try:
            if first and "/" not in first and "/" not in incomplete and "=" not in first:
                return [n for n in _names(client, ctx, first) if n.startswith(incomplete)]
            if "/" in incomplete:
                word, _, start = incomplete.partition("/")
                return [f"{word}/{n}" for n in _names(client, ctx, word) if n.startswith(start)]
            return sorted(rt.plural for rt in client.discovery if rt.plural.startswith(incomplete.lower()))
        finally:
            client.close()
    except errors.JochError:
        return []


def names(ctx: typer.Context, incomplete: str) -> list[str]:
    """Names of objects of the type already typed."""
    word = ctx.params.get("kind")
    if not isinstance(word, str) or not word or "/" in word:
        return []
    try:
        client = _client(ctx)
        try:
            return [n for n in _names(client, ctx, word) if n.startswith(incomplete)]
        finally:
            client.close()
    except errors.JochError:
        return []


def _names(client: Any, ctx: typer.Context, word: str) -> list[str]:
    from joch.cli import contexts, namespaces

    rt = client.discovery.resolve(word.split(",")[0])
    context = contexts.current()
    flag = ctx.params.get("namespace") or ctx.find_root().params.get("namespace")
    namespace = namespaces.choose(flag, context.namespace if context else None).name
    listing = client.get_object(rt.path(namespace=namespace))
    return sorted(str((o.get("metadata") or {}).get("name")) for o in listing.get("items") or [] if isinstance(o, dict))
