"""Kubernetes-style Event objects about other objects, written by controllers on every transition.

The Event's shape (name, ``events.joch.dev/involved-uid`` label) is ``joch.api.events``. Events are
written in the caller's transaction when it has one, so a status change and the Event that reports
it commit together.
"""

from __future__ import annotations

from typing import Literal

from joch.api import kinds
from joch.api.events import INVOLVED_UID as INVOLVED_UID
from joch.api.events import MAX_MESSAGE as MAX_MESSAGE
from joch.api.events import event as event
from joch.store.base import Obj, Writer


def record(
    writer: Writer, obj: Obj, *, reason: str, message: str, type: Literal["Normal", "Warning"] = "Normal",
    component: str = "joch-controller-manager",
) -> Obj:
    return writer.create(kinds.EVENT, event(obj, reason=reason, message=message, type=type, component=component))
