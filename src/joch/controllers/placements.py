"""Where a run's attempt executes (``runtime.base.Placement``), resolved from the run and its
compiled Agent manifest when the attempt is dispatched.

* ``type``: the run's ``spec.runtime.type``, else its Agent's (``local`` by default).
* ``image``: the run's ``spec.workload.image``, else the provider's ``workload.image``, else the
  runtime config's ``image`` (the run's ``runtime.config`` over the Agent's); none: the runtime's
  default image.
* ``resources``: the run's ``workload.resources``, else the provider's, else the Agent's
  ``resources``, as Kubernetes quantities.
* ``service_account``: the runtime config's ``serviceAccountName``, which must be one of the Agent's
  ``security.allowedServiceAccounts`` (``ServiceAccountNotAllowed`` otherwise: an Agent chooses what
  its runs may act as, not the run's author).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from joch.runtime import base as rt

_RESOURCE_NAMES = {"cpu": "cpu", "memory": "memory", "ephemeralStorage": "ephemeral-storage"}


class PlacementProblem(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def placement_of(run: Mapping[str, Any], manifest: Mapping[str, Any]) -> rt.Placement:
    spec = run.get("spec") or {}
    agent = manifest.get("spec") or {}
    provider = agent.get("provider") or {}
    agent_runtime = agent.get("runtime") or {}
    run_runtime = spec.get("runtime") or {}
    type_ = str(run_runtime.get("type") or agent_runtime.get("type") or "local")
    config = {**(agent_runtime.get("config") or {}), **(run_runtime.get("config") or {})}
    run_workload = spec.get("workload") or {}
    provider_workload = provider.get("workload") or {}
    image = run_workload.get("image") or provider_workload.get("image") or config.get("image")
    resources = run_workload.get("resources") or provider_workload.get("resources") or agent.get("resources") or {}
    account = config.get("serviceAccountName")
    if account is not None:
        allowed = ((agent.get("security") or {}).get("allowedServiceAccounts")) or []
        if account not in allowed:
            shown = ", ".join(allowed) if allowed else "none"
            raise PlacementProblem("ServiceAccountNotAllowed", (
                f'runtime.config.serviceAccountName: "{account}" is not one of the Agent\'s '
                f"security.allowedServiceAccounts ({shown}); add it there or choose an allowed one"))
    return rt.Placement(
        type=type_, image=str(image) if image else None, service_account=str(account) if account else None,
        resources={_RESOURCE_NAMES[k]: str(v) for k, v in resources.items() if k in _RESOURCE_NAMES and v is not None})
