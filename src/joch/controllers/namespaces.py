"""Finishes deleting namespaces: a Namespace left ``Terminating`` because some of its objects were
held back by finalizers (see ``joch.store.namespaces.terminate``) is looked at again every
``RECHECK`` seconds until it is empty, and then removed. Nothing watches the contained kinds: a
namespace in that state is rare and short-lived, and polling it costs one transaction."""

from __future__ import annotations

from joch.api import REGISTRY
from joch.api.namespaces import NAMESPACE, PERMANENT, TERMINATING
from joch.controllers.base import Context, Controller, Key, Result
from joch.store import namespaces

RECHECK = 2.0


class NamespaceController(Controller):
    name = "namespaces"
    kind = NAMESPACE

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx

    def reconcile(self, key: Key) -> Result | None:
        current = self.ctx.cache(NAMESPACE).get("", key.name)
        if current is None or key.name in PERMANENT or (current.get("status") or {}).get("phase") != TERMINATING:
            return None
        _, gone = namespaces.terminate(self.ctx.store, key.name, REGISTRY)
        return None if gone else Result(requeue_after=RECHECK)
