"""``AgentRun.spec.idempotencyKey``: at most one run per key in a namespace, checked at admission.

The key is free text (up to 253 characters), so it cannot be a label value itself; admission labels
the run with a digest of it (``runtime.joch.dev/idempotency-key``, 40 hex characters of its
sha256) and looks for another run carrying that label. Admission runs inside the write transaction,
which holds the store's write lock, so two creates with one key cannot both pass the check. The key
is immutable once set: changing it would let one run answer for two requests.
"""

from __future__ import annotations

import hashlib
from typing import Any

from joch.api import kinds
from joch.api.errors import Cause
from joch.api.meta import dig
from joch.api.registry import KindInfo
from joch.store.base import ListOptions, Writer

LABEL = "runtime.joch.dev/idempotency-key"


def key_label(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def check_idempotency(
    reader: Writer, kind: KindInfo, obj: dict[str, Any], metadata: dict[str, Any], old: dict[str, Any] | None,
) -> list[Cause]:
    """Causes for a reused or changed key; labels ``metadata`` with the key's digest otherwise."""
    if kind is not kinds.AGENT_RUN:
        return []
    key = dig(obj, "spec.idempotencyKey")
    before = dig(old, "spec.idempotencyKey") if old is not None else None
    if old is not None and key != before:
        return [Cause("spec.idempotencyKey", f"field is immutable (it is {_show(before)}); create a new "
                      "run for a new key", "FieldValueInvalid")]
    if not isinstance(key, str) or not key:
        return []
    labels = dict(metadata.get("labels") or {})
    labels[LABEL] = key_label(key)
    metadata["labels"] = labels
    if old is not None:
        return []
    namespace = metadata.get("namespace") or ""
    found = reader.list(kinds.AGENT_RUN, ListOptions(namespace=namespace, label_selector=f"{LABEL}={labels[LABEL]}"))
    for other in found.items:
        if dig(other, "spec.idempotencyKey") == key:
            name = other["metadata"]["name"]
            return [Cause("spec.idempotencyKey", f'idempotency key "{key}" is already used by AgentRun "{name}" '
                          f'in namespace "{namespace}"; that run answers this request (joch get run {name}), '
                          "or use a new key", "FieldValueDuplicate")]
    return []


def _show(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else "unset"

