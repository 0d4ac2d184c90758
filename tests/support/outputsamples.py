"""Output the real agent CLIs printed (``tests/unit/runtime/agentoutput/samples/``), and what a
``joch.runtime.agentoutput`` parser observes in it: for the parsers' unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from joch.runtime.agentoutput import Observation, parser_for

SAMPLES = Path(__file__).resolve().parents[1] / "unit" / "runtime" / "agentoutput" / "samples"


def sample(name: str) -> list[str]:
    """The lines of the captured output ``samples/<name>``."""
    return (SAMPLES / name).read_text().splitlines()


def observe(output_format: str, lines: list[str]) -> list[Observation]:
    """What a new parser for ``output_format`` observed over ``lines`` and their end, in order."""
    parser = parser_for(output_format)
    assert parser is not None
    seen = [parser.feed(line) for line in lines]
    seen.append(parser.finish())
    return [o for o in seen if o is not None]


def usage(observations: list[Observation]) -> list[dict[str, Any]]:
    """The usage events of ``observations``, in order."""
    return [event for o in observations for event in o.usage]
