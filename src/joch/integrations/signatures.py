"""Webhook signatures: HMAC-SHA256 of the raw body under the shared secret, compared in constant time.

* GitHub: ``X-Hub-Signature-256: sha256=<hex>``.
* Linear: ``Linear-Signature: <hex>`` (no prefix); the body carries ``webhookTimestamp`` (epoch
  milliseconds), and a delivery older than a minute is refused as a possible replay.
* Generic (a TriggerRule's webhook): ``X-Joch-Signature-256: sha256=<hex>``, or GitHub's header, so a
  sender that already signs like GitHub needs no change.

A missing header is simply a bad signature: callers answer 401 either way.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any


def sign(secret: bytes, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``body`` (what Linear sends; GitHub prefixes ``sha256=``)."""
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_github(secret: bytes, body: bytes, header: str | None) -> bool:
    if not header or not header.startswith("sha256="):
        return False
    return _same(sign(secret, body), header.removeprefix("sha256="))


def verify_linear(secret: bytes, body: bytes, header: str | None) -> bool:
    if not header:
        return False
    return _same(sign(secret, body), header)


def linear_fresh(payload: Mapping[str, Any], now: float, tolerance: float = 60.0) -> bool:
    """Whether the delivery's ``webhookTimestamp`` (ms) lies within ``tolerance`` seconds of ``now``."""
    stamp = payload.get("webhookTimestamp")
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        return False
    return abs(now - stamp / 1000.0) <= tolerance


def verify_generic(secret: bytes, body: bytes, headers: Mapping[str, str]) -> bool:
    """``headers``: any mapping; names are matched case-insensitively."""
    lowered = {k.lower(): v for k, v in headers.items()}
    header = lowered.get("x-joch-signature-256") or lowered.get("x-hub-signature-256")
    return verify_github(secret, body, header)


def _same(expected: str, given: str) -> bool:
    # bytes: compare_digest refuses str with non-ASCII characters, which a forged header may hold
    return hmac.compare_digest(expected.encode(), given.strip().lower().encode("utf-8", "replace"))
