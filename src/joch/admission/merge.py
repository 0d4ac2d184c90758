"""JSON merge patch (RFC 7386), what ``kubectl patch --type merge`` and ``PATCH`` with
``application/merge-patch+json`` send.

A mapping in the patch merges into the target key by key; ``null`` deletes a key; anything else
(a scalar, a list) replaces the value whole — lists are never merged element-wise. The function is
pure: neither argument is modified and the result shares no mutable value with them.
"""

from __future__ import annotations

import copy
from typing import Any


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(target)
    _merge_into(result, patch)
    return result


def _merge_into(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            current = target.get(key)
            if not isinstance(current, dict):
                current = {}
                target[key] = current
            _merge_into(current, value)
        else:
            target[key] = copy.deepcopy(value)
