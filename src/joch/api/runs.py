"""The AgentRun a user asks for in a few words: ``joch run`` and the MCP tool ``joch_create_run``.

Both take the same choices (an Agent, an ImplementationSpec or a text, a repository and where in it)
and must create the same object; each checks the choices in its own words (flags for the CLI,
argument names for MCP) before building it here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from joch.api import kinds


@dataclass(frozen=True)
class RunRequest:
    agent: str
    repo_url: str
    spec: str | None = None  # an ImplementationSpec's name, or
    text: str | None = None  # what to do, inline
    ref: str | None = None
    path: str | None = None
    name: str | None = None  # else generateName AGENT-
    timeout_seconds: int | None = None
    idempotency_key: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)


def agent_run(request: RunRequest) -> dict[str, Any]:
    spec: dict[str, Any] = {"agentRef": {"name": request.agent}}
    if request.spec is not None:
        spec["implementationRef"] = {"name": request.spec}
    else:
        spec["implementation"] = {"inline": {"text": request.text}}
    git = {"url": request.repo_url, **{k: v for k, v in (("ref", request.ref), ("path", request.path)) if v}}
    spec["execution"] = {"coordinates": {"git": git}}
    if request.timeout_seconds is not None:
        spec["timeoutSeconds"] = request.timeout_seconds
    if request.idempotency_key:
        spec["idempotencyKey"] = request.idempotency_key
    if request.parameters:
        spec["parameters"] = dict(request.parameters)
    metadata = {"name": request.name} if request.name else {"generateName": f"{request.agent}-"}
    return {"apiVersion": kinds.AGENT_RUN.api_version, "kind": kinds.AGENT_RUN.kind, "metadata": metadata,
            "spec": spec}
