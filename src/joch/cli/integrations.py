"""``joch trigger fire`` and ``joch sync source``: the two integration commands that act (``get`` and
``describe`` of the integration kinds come from the registry like every other kind).

* ``trigger fire`` POSTs ``/v1/namespaces/NS/triggerrules/RULE/fire`` and prints the decision: the
  run it started, or why it was deduplicated or rejected (exit code 1 for a rejection, so scripts
  notice; a deduplicated fire with ``--key`` is what the key is for, exit 0).
* ``sync source`` sets the source's ``joch.dev/sync-requested-at`` annotation (a merge patch, so it
  needs only ``patch`` on the source) and, with ``--wait`` (the default), polls the source until its
  ``status.observedSyncRequest`` is that time, then prints the outcome: the counts, or the error the
  tracker gave. A source no controller picks up within ``--timeout`` is an error saying so.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import typer

from joch.api import errors
from joch.cli.client import Client
from joch.cli.resolve import ResourceType

SOURCES = ResourceType(group="joch.dev", version="v1alpha1", kind="ImplementationSource",
                       plural="implementationsources", singular="implementationsource", namespaced=True,
                       short_names=("source", "sources", "isrc"))
MERGE_PATCH = "application/merge-patch+json"
SYNC_REQUESTED = "joch.dev/sync-requested-at"
POLL_SECONDS = 0.5


def fire_path(namespace: str, rule: str) -> str:
    return f"/v1/namespaces/{namespace}/triggerrules/{rule}/fire"


def fire(client: Client, namespace: str, rule: str, *, parameters: dict[str, str], key: str | None,
         text: str | None) -> int:
    """Fire ``rule``; prints the decision; the exit code (1 when rejected)."""
    body: dict[str, Any] = {}
    if key:
        body["key"] = key
    if parameters:
        body["parameters"] = parameters
    if text is not None:
        body["text"] = text
    execution = client.request("POST", fire_path(namespace, rule), json_body=body)
    if not isinstance(execution, dict):
        raise client.not_joch(f"POST {fire_path(namespace, rule)} answered JSON that is not an object")
    for line in fired(execution):
        typer.echo(line)
    return 1 if (execution.get("spec") or {}).get("decision") == "Rejected" else 0


def fired(execution: dict[str, Any]) -> list[str]:
    spec = execution.get("spec") or {}
    name = (execution.get("metadata") or {}).get("name")
    decision = spec.get("decision")
    lines = [f"triggerexecution.runtime.joch.dev/{name}: {decision}"]
    run = (spec.get("runRef") or {}).get("name")
    if run:
        lines.append(f"agentrun.runtime.joch.dev/{run} created")
    if decision != "Dispatched" and (spec.get("reason") or spec.get("message")):
        lines.append(f"{spec.get('reason') or decision}: {spec.get('message') or ''}".rstrip(": "))
    return lines


def sync(client: Client, namespace: str, name: str, *, wait: bool, timeout: float) -> int:
    """Ask for a sync of source ``name`` now; with ``wait``, wait for it and print the outcome."""
    path = SOURCES.path(namespace=namespace, name=name)
    asked = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    client.request("PATCH", path, content=json.dumps({"metadata": {"annotations": {SYNC_REQUESTED: asked}}}),
                   content_type=MERGE_PATCH)
    typer.echo(f"implementationsource.joch.dev/{name} sync requested")
    if not wait:
        return 0
    deadline = time.monotonic() + timeout
    while True:
        source = client.get_object(path)
        status = source.get("status") or {}
        if status.get("observedSyncRequest") == asked:
            break
        if time.monotonic() >= deadline:
            raise errors.ServiceUnavailable(
                f'ImplementationSource "{name}" did not sync within {timeout:g}s: is a controller running '
                "(joch server without --no-controllers, or joch controller)? See joch describe source " + name)
        time.sleep(POLL_SECONDS)
    failed = bool(status.get("lastError"))
    for line in outcome(status):
        typer.echo(line, err=failed)  # a failed sync is an error: one ``error:`` line on stderr
    return 1 if failed else 0


def outcome(status: dict[str, Any]) -> list[str]:
    if status.get("lastError"):
        return [f"error: {status['lastError']}"]
    counts = status.get("counts") or {}
    said = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("created", "updated", "stale", "diverged"))
    return [f"synced at {status.get('lastSyncedAt')}: {counts.get('issues', 0)} issue(s) held; {said}"]
