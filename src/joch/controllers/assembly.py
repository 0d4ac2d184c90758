"""The controllers ``joch server`` and ``joch controller`` run, built in one place."""

from __future__ import annotations

from joch.controllers.base import Controller
from joch.controllers.options import ControllerOptions
from joch.runtime.base import Runtime
from joch.store.base import Store


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
