"""An audit record: one decision about one action, in the shape the audit log stores and serves.

``{id, time, actor, groups, verb, kind, namespace, name, decision, reason, requestId, sourceIP}``
(DESIGN.md §4, the Kradle seed's audit event). ``actor``, ``groups``, ``requestId`` and
``sourceIP`` left empty are filled by the store from the current request
(``joch.api.identity.current_request``); ``id`` and ``time`` are always the store's. An entry never
holds a secret value or a request body: ``reason`` is a sentence written by Joch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Decision = Literal["allowed", "denied"]


@dataclass(frozen=True)
class AuditEntry:
    verb: str
    kind: str = ""
    namespace: str | None = None
    name: str | None = None
    decision: Decision = "allowed"
    reason: str = ""
    actor: str = ""
    groups: tuple[str, ...] = ()
    request_id: str = ""
    source_ip: str = ""
