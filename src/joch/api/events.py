"""The Event object (ops.joch.dev) about another object, as Kubernetes shapes it.

An Event lives in its object's namespace, is named ``<object name>.<16 hex>`` like Kubernetes'
``<name>.<nanoseconds hex>``, and is labelled with the object's uid (``events.joch.dev/involved-uid``)
so ``joch describe`` finds an object's events with one label-selector list. Controllers write them
(``joch.controllers.events``) and so does admission (a policy warning).
"""

from __future__ import annotations

import secrets as _secrets
from typing import Any, Literal

from joch.api.meta import DEFAULT_NAMESPACE, now

INVOLVED_UID = "events.joch.dev/involved-uid"
MAX_MESSAGE = 1024


def event(
    obj: dict[str, Any], *, reason: str, message: str, type: Literal["Normal", "Warning"] = "Normal",
    component: str = "joch-controller-manager",
) -> dict[str, Any]:
    m = obj["metadata"]
    stamp = now()
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    name = f"{m['name'][:236]}.{_secrets.token_hex(8)}"
    return {
        "apiVersion": "ops.joch.dev/v1alpha1",
        "kind": "Event",
        # A cluster-scoped object's Events go to the default namespace, as in Kubernetes.
        "metadata": {"name": name, "namespace": m.get("namespace") or DEFAULT_NAMESPACE,
                     "labels": {INVOLVED_UID: m["uid"]}},
        "spec": {
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": m["name"],
                               "namespace": m.get("namespace"), "uid": m["uid"]},
            "reason": reason,
            "message": message,
            "type": type,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": component},
        },
    }
