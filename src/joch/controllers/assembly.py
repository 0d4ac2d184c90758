"""The controllers ``joch server`` and ``joch controller`` run, built in one place."""

from __future__ import annotations

from joch.api import errors
from joch.controllers.base import Controller
from joch.controllers.options import ControllerOptions
from joch.runtime.base import Runtime
from joch.store.base import Store


def build_runtime(options: ControllerOptions) -> Runtime:
    """The runtime the controllers drive: the local one, and with ``options.kubernetes`` the
    Kubernetes one beside it (``runtime.routing``: each run goes where its ``runtime.type`` says)."""
    from dataclasses import replace

    from joch.runtime.local import LocalRuntime

    local = LocalRuntime(options.data_dir, sandbox=options.sandbox, hide=options.sandbox_hide,
                         sandbox_reason=options.sandbox_reason, agent_user=options.agent_user, api_url=options.api_url)
    if options.kubernetes is None:
        return local
    from joch.runtime.kubernetes.runtime import KubernetesRuntime
    from joch.runtime.routing import Runtimes

    settings = options.kubernetes
    if not settings.api_url:
        settings = replace(settings, api_url=options.api_url or "")
    limits = [n for n in (options.max_artifact_bytes, options.max_log_bytes) if n is not None]
    # Every upload within the runner's own limits, plus room for the notes a cut log gets.
    limit = max(limits) + 64 * 1024 if len(limits) == 2 else None
    try:
        return Runtimes(local, KubernetesRuntime(options.data_dir, settings, report_limit=limit))
    except Exception as exc:  # noqa: BLE001 - lightkube's configuration errors have no common base
        local.close()
        where = f"--kube-config {settings.kubeconfig}" if settings.kubeconfig else "--kube-in-cluster"
        raise errors.BadRequest(f"the Kubernetes runtime cannot start ({where}): {exc}") from None
    except BaseException:
        local.close()
        raise


def build_controllers(store: Store, runtime: Runtime, options: ControllerOptions) -> list[Controller]:
    from joch.controllers.agents import AgentController
    from joch.controllers.approvals import ApprovalController
    from joch.controllers.budgets import BudgetController
    from joch.controllers.deliveries import DeliveryController
    from joch.controllers.namespaces import NamespaceController
    from joch.controllers.runs import RunController
    from joch.controllers.sources import SourceController
    from joch.controllers.triggers import TriggerController
    from joch.controllers.writeback import WriteBackController
    from joch.controllers.writeintents import WriteIntentController

    return [AgentController(), RunController(runtime, options), ApprovalController(),
            BudgetController(options.resync_period), SourceController(), TriggerController(), DeliveryController(),
            WriteBackController(runtime), WriteIntentController(runtime), NamespaceController()]
