"""``joch cost``: metered spend summed by the server (``GET /v1/cost``), printed as a table or JSON.

The server sums its usage table (``joch.server.metering``), so the CLI never lists runs: the answer
includes runs since deleted and costs one request whatever their number. ``--since`` is passed as
given (``7d``, ``24h``, an RFC 3339 time) and interpreted by the server, so both agree on "now".
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import typer

from joch.api import errors
from joch.cli import printers
from joch.cli.client import Client

GROUPS = ("agent", "namespace", "team", "model")
HEADERS = {"agent": ("NAMESPACE", "AGENT"), "namespace": ("NAMESPACE",), "team": ("TEAM",), "model": ("MODEL",)}


def report(client: Client, *, by: str, since: str | None, namespace: str | None) -> dict[str, Any]:
    if by not in GROUPS:
        raise errors.BadRequest(f'--by must be one of {", ".join(GROUPS)} (got "{by}")')
    path = "/v1/cost" if namespace is None else f"/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/cost"
    params = {"by": by, **({"since": since} if since else {})}
    return client.get_object(path, params)


def lines(body: dict[str, Any]) -> list[str]:
    by = str(body.get("by") or "agent")
    keys = {"agent": ("namespace", "agent"), "namespace": ("namespace",), "team": ("team",),
            "model": ("model",)}[by]
    headers = [*HEADERS[by], "RUNS", "INPUT", "OUTPUT", "CACHED", "COST"]
    rows = [[_cell(item.get(k), by) for k in keys] + _figures(item) for item in body.get("items") or []]
    total = body.get("total") or {}
    rows.append(["TOTAL", *[""] * (len(keys) - 1), *_figures(total)])
    return printers.render_table(headers, rows)


def _cell(value: Any, by: str) -> str:
    if value in (None, ""):
        return "<none>" if by != "team" else "<no team>"
    return str(value)


def _figures(item: dict[str, Any]) -> list[str]:
    return [str(item.get("runs") or 0), str(item.get("inputTokens") or 0), str(item.get("outputTokens") or 0),
            str(item.get("cachedTokens") or 0), usd(float(item.get("costUsd") or 0))]


def usd(amount: float) -> str:
    if abs(amount - round(amount, 2)) < 1e-9:
        return f"${amount:.2f}"
    return "$" + f"{amount:.6f}".rstrip("0")


def show(client: Client, *, by: str, since: str | None, namespace: str | None, output: str | None) -> None:
    body = report(client, by=by, since=since, namespace=namespace)
    if output == "json":
        typer.echo(printers.to_json(body))
        return
    if output == "yaml":
        typer.echo(printers.to_yaml(body), nl=False)
        return
    where = f'namespace "{namespace}"' if namespace else "all namespaces"
    typer.echo(f"Spend in {where} since {body.get('since') or 'the beginning'}, by {by}:")
    for line in lines(body):
        typer.echo(line)
