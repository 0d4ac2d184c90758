"""Small readers the output parsers share (standard library only, like the parsers)."""

from __future__ import annotations

import json
from typing import Any


def json_object(line: str) -> dict[str, Any] | None:
    """The JSON object ``line`` holds (white space around it allowed); None for anything else."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


MAX_COUNT = 10**15
"""A token count above this is read as this: a line any process of the agent's can forge must not
make a parser fail (an int too large for a float), which would end its reading of the output, and
the metering of the run with it."""


def count(value: Any) -> int:
    """``value`` when it is a positive whole number (not a bool), at most ``MAX_COUNT``; else 0."""
    return min(value, MAX_COUNT) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def count_in(figures: Any, key: str) -> int:
    """``count`` of ``figures[key]``; 0 when ``figures`` is not a mapping."""
    return count(figures.get(key) if isinstance(figures, dict) else None)


def money(value: Any) -> float:
    """``value`` as a float when it is a positive number (not a bool), else 0.0."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0.0
