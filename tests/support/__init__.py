"""Helpers shared by test modules (importable as ``support`` through pytest's ``pythonpath``)."""

from __future__ import annotations

from typing import Any


def provider(name: str, *, binary: str = "echo", labels: dict[str, str] | None = None,
             namespace: str | None = None) -> dict[str, Any]:
    """An AgentProvider manifest, the smallest valid object of a kind with no references."""
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": metadata,
            "spec": {"binary": binary}}
