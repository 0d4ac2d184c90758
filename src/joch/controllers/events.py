"""Kubernetes-style Event objects about other objects, written by controllers on every transition.

An Event lives in its object's namespace, is named ``<object name>.<16 hex>`` like Kubernetes'
``<name>.<nanoseconds hex>``, and is labelled with the object's uid (``events.joch.dev/involved-uid``)
so ``joch describe`` finds an object's events with one label-selector list instead of reading every
Event in the namespace. Events are written in the caller's transaction when it has one, so a status
change and the Event that reports it commit together.
"""

from __future__ import annotations

import secrets as _secrets
from typing import Literal

from joch.api import kinds
from joch.api.meta import now
from joch.store.base import Obj, Writer

INVOLVED_UID = "events.joch.dev/involved-uid"
MAX_MESSAGE = 1024


def event(
    obj: Obj, *, reason: str, message: str, type: Literal["Normal", "Warning"] = "Normal",
    component: str = "joch-controller-manager",
) -> Obj:
    m = obj["metadata"]
    stamp = now()
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    name = f"{m['name'][:236]}.{_secrets.token_hex(8)}"
    return {
        "apiVersion": kinds.EVENT.api_version,
        "kind": "Event",
        "metadata": {"name": name, "namespace": m.get("namespace"), "labels": {INVOLVED_UID: m["uid"]}},
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


def record(
    writer: Writer, obj: Obj, *, reason: str, message: str, type: Literal["Normal", "Warning"] = "Normal",
    component: str = "joch-controller-manager",
) -> Obj:
    return writer.create(kinds.EVENT, event(obj, reason=reason, message=message, type=type, component=component))
