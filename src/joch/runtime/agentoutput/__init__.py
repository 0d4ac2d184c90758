"""Reading an agent CLI's own output: usage, cost, its session id and its own verdict.

The runner feeds every line the agent prints (after redaction) to the parser its provider names
(``AgentProvider.spec.outputFormat``, ``RunnerSpec.output_format``). A parser never needs the agent's
cooperation: it reads what the CLI prints anyway in the non-interactive mode the preset starts it
in (Claude Code's ``--output-format stream-json`` result, Codex's ``exec --json`` events, Aider's
``Tokens: … Cost: …`` lines). Each format lives in its own module and is checked against the real
CLI's output in the tests.

What a parser reports (``Observation``):

* ``usage``: usage events as the run callback takes them (``joch.controllers.metering``):
  ``{"id", "model", "inputTokens", "outputTokens", "cachedTokens", "costUsd"?}``. Each event is a
  delta (what this line adds), never a running total, and its ``id`` is stable for the same output
  (the runner prefixes it with the attempt), so a retried report is counted once.
* ``session_id``: the CLI's session (thread) id, as soon as it is printed: the runner records it at
  once, so a retry after the runner was killed can resume it. It lands in the resumed attempt's
  argv (``resume {{ session.id }}``), and anything the agent runs can print a line that looks like
  one: only an id ``valid_session_id`` accepts is taken (letters, digits, ``.``, ``_``, ``:``, ``-``,
  not starting with ``-``), never one that would read as an option (``--dangerously-…``).
* ``error``: the CLI's own final result says it failed (Claude Code's ``"is_error": true``), in words.

Like the runner, these modules import only the standard library: they load in every run.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

FORMATS: dict[str, str] = {
    "claude-code": "joch.runtime.agentoutput.claude",
    "codex": "joch.runtime.agentoutput.codex",
    "aider": "joch.runtime.agentoutput.aider",
    "gemini": "joch.runtime.agentoutput.gemini",
    "opencode": "joch.runtime.agentoutput.opencode",
}
"""``outputFormat`` value → the module whose ``Parser`` reads it."""


@dataclass
class Observation:
    usage: list[dict[str, Any]] = field(default_factory=list)
    session_id: str | None = None
    error: str | None = None


class Parser(Protocol):
    def feed(self, line: str) -> Observation | None:
        """One complete line of the agent's output (without its newline); None when it tells nothing."""

    def finish(self) -> Observation | None:
        """The output has ended: what could only be known at the end (a summary line without a
        successor, say); None when nothing."""


MAX_EVENT_TOKENS = 1_000_000_000
MAX_EVENT_COST_USD = 1_000_000
"""What the run callback takes of one event (``joch.controllers.metering``'s limits, not imported:
this package loads in every run)."""
MAX_EVENT_ID = 200


def bounded(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` as the run callback accepts it, whatever the line it came from said: any line the
    agent prints can look like its CLI's usage report, and the callback refuses a batch with one bad
    event in it (its other, real events too) — a forged ``Infinity``, ``1e300`` or 10**30 tokens
    would have the run's real usage go unmetered. Figures are cut to the callback's limits (so a
    forged figure is counted, not dropped: an overspend stops the run), a long id is hashed (still
    the same for the same line), a model name the callback cannot take is left out."""
    out: dict[str, Any] = {}
    ident = str(event.get("id", ""))
    out["id"] = ident if 0 < len(ident) <= MAX_EVENT_ID else "h-" + hashlib.sha256(ident.encode()).hexdigest()[:40]
    model = event.get("model")
    if isinstance(model, str) and 0 < len(model) <= 253:
        out["model"] = model
    for key in ("inputTokens", "outputTokens", "cachedTokens"):
        value = event.get(key)
        if key in event:
            out[key] = min(max(value, 0), MAX_EVENT_TOKENS) if isinstance(value, int) and not isinstance(
                value, bool) else 0
    if "cachedTokens" in out:
        out["cachedTokens"] = min(out["cachedTokens"], out.get("inputTokens", 0))
    cost = event.get("costUsd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and not math.isnan(cost):
        out["costUsd"] = float(min(max(cost, 0), MAX_EVENT_COST_USD))
    return out


SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


def valid_session_id(session_id: object) -> bool:
    """Whether ``session_id`` may be recorded and passed to a resumed CLI: a UUID, a ``ses_…`` or
    thread id, never an option, a path or more than one argument."""
    return isinstance(session_id, str) and SESSION_ID.fullmatch(session_id) is not None


def parser_for(output_format: str | None) -> Parser | None:
    """A new parser for ``output_format`` (None: no format, nothing is parsed); ``ValueError`` for a
    format no module reads, or whose module does not exist yet."""
    if output_format is None:
        return None
    module = FORMATS.get(output_format)
    if module is None:
        raise ValueError(f'unknown output format "{output_format}" (known: {", ".join(sorted(FORMATS))})')
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError:
        raise ValueError(f'output format "{output_format}" has no parser ({module})') from None
    parser: Parser = loaded.Parser()
    return parser
