"""``open_tracker``: the client for an ImplementationSource's provider, with its credentials read
through ``secrets`` (the controller reveals them from the store at the last moment)."""

from __future__ import annotations

import importlib
import time
from typing import Any

from joch.api.integrations import ImplementationSourceSpec
from joch.integrations.base import Clock, SecretLookup, Tracker, TrackerError


def open_tracker(source: dict[str, Any], secrets: SecretLookup, clock: Clock = time.time) -> Tracker:
    """A ``Tracker`` for the stored ImplementationSource ``source``; ``TrackerError("Invalid")`` when its
    spec does not name the provider's settings."""
    spec = ImplementationSourceSpec.model_validate(source.get("spec") or {})
    if spec.provider == "github" and spec.github is not None:
        github: Any = importlib.import_module("joch.integrations.github")
        tracker: Tracker = github.GitHubTracker(spec.github, secrets, clock=clock)
        return tracker
    if spec.provider == "linear" and spec.linear is not None:
        linear: Any = importlib.import_module("joch.integrations.linear")
        tracker = linear.LinearTracker(spec.linear, secrets, clock=clock)
        return tracker
    name = (source.get("metadata") or {}).get("name")
    raise TrackerError("Invalid", f'ImplementationSource "{name}": provider is "{spec.provider}" but '
                                  f"spec.{spec.provider} is not set")
