"""``joch audit``: the server's audit log (``GET /v1/audit``) as a table, JSON or YAML.

The server answers newest first, in pages; this pages through ``metadata.continue`` until
``--limit`` rows are printed or the log has no more (each request asks for at most the server's
page maximum). The table is kubectl-style plain text (``printers``): TIME (to the second, UTC),
ACTOR, VERB, KIND, NAMESPACE, NAME, DECISION, REASON, newest first. ``-o json|yaml`` print one
``AuditEventList`` holding every row fetched. Filters go to the server as they are (it parses
``--since``, resolves ``--kind`` and says which parameter is wrong); the namespace is the one
``-n`` or ``JOCH_NAMESPACE`` names, every namespace (and rows without one, such as a failed
authentication) with ``-A``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import typer

from joch.api import errors
from joch.api.audit import MAX_LIMIT
from joch.cli import printers
from joch.cli.client import Client

HEADERS = ("TIME", "ACTOR", "VERB", "KIND", "NAMESPACE", "NAME", "DECISION", "REASON")
FIELDS = ("time", "actor", "verb", "kind", "namespace", "name", "decision", "reason")


@dataclass(frozen=True)
class AuditRequest:
    namespace: str | None  # None: every namespace
    since: str | None = None
    until: str | None = None
    actor: str | None = None
    verb: str | None = None
    kind: str | None = None
    name: str | None = None
    decision: str | None = None
    limit: int = 500
    output: str | None = None

    def params(self) -> dict[str, str]:
        given = {"since": self.since, "until": self.until, "actor": self.actor, "verb": self.verb,
                 "kind": self.kind, "namespace": self.namespace, "name": self.name, "decision": self.decision}
        return {key: value for key, value in given.items() if value}


def events(client: Client, request: AuditRequest) -> Iterator[dict[str, Any]]:
    if request.limit < 1:
        raise errors.BadRequest(f"--limit must be at least 1 (got {request.limit})")
    left = request.limit
    token: str | None = None
    while left > 0:
        params = {**request.params(), "limit": str(min(left, MAX_LIMIT))}
        if token:
            params["continue"] = token
        page = client.get_object("/v1/audit", params)
        items = page.get("items")
        if page.get("kind") != "AuditEventList" or not isinstance(items, list):
            raise client.not_joch("GET /v1/audit did not answer an AuditEventList")
        for item in items[:left]:
            if isinstance(item, dict):
                yield item
        left -= len(items)
        token = (page.get("metadata") or {}).get("continue")
        if not token or not items:
            return


def show(client: Client, request: AuditRequest) -> None:
    items = list(events(client, request))
    if request.output in ("json", "yaml"):
        typer.echo(printers.dump({"kind": "AuditEventList", "apiVersion": "v1", "metadata": {}, "items": items},
                                 request.output), nl=False)
        return
    if not items:
        where = f" in {request.namespace} namespace" if request.namespace else ""
        typer.echo(f"No audit events found{where}.", err=True)
        return
    rows = [row(item) for item in items]
    for line in printers.render_table(HEADERS, rows):
        typer.echo(line)


def row(item: dict[str, Any]) -> list[str]:
    cells = [printers.text(item.get(field)) for field in FIELDS]
    cells[0] = short_time(str(item.get("time") or ""))
    return cells


def short_time(value: str) -> str:
    """``2026-01-02T15:04:05Z``: the stored microseconds are for ordering, not for reading."""
    head, dot, _ = value.partition(".")
    return f"{head}Z" if dot else (value or printers.text(None))
