"""Codex CLI's ``codex exec --json`` events (one JSON object a line on stdout).

What it reads, as Codex CLI 0.169.0 prints it:

* ``{"type": "thread.started", "thread_id": "01a2…"}``: the session id (``codex exec resume ID``).
* ``{"type": "turn.completed", "usage": {"input_tokens", "cached_input_tokens", "output_tokens",
  "reasoning_output_tokens", …}}``: token usage. The figures are the thread's running totals (a
  resumed thread's first turn counts the turns before it too), so each event reports the difference
  from the previous ``turn.completed`` of this output. ``cached_input_tokens`` are part of
  ``input_tokens`` and reasoning tokens part of ``output_tokens``, as in OpenAI's usage. The events
  name no model: the run's Agent's ``modelRoute`` prices them.
* ``{"type": "turn.failed", "error": {"message": …}}``: the turn ended in an error (the model
  unreachable after Codex's retries, say): the CLI's own verdict. The ``{"type": "error"}`` events
  before it ("Reconnecting... 2/5 …") are retries in progress and say nothing on their own.

Anything else — other events, Codex's log lines on stderr, a line that is not JSON — tells nothing.

Resuming: ``codex exec`` runs one turn and reports usage only when it ends, so an attempt that was
cut short (its runner lost) reported nothing; the attempt that resumes its thread reports the
thread's total, which is exactly what both used. (Were a turn to end before an attempt is resumed,
its tokens would be counted again: Joch resumes only attempts that did not finish.)
"""

from __future__ import annotations

import json
from typing import Any

from joch.runtime.agentoutput import Observation


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class Parser:
    def __init__(self) -> None:
        self._turns = 0
        self._totals = {"inputTokens": 0, "cachedTokens": 0, "outputTokens": 0}

    def feed(self, line: str) -> Observation | None:
        text = line.strip()
        if not text.startswith("{"):
            return None
        try:
            event = json.loads(text)
        except ValueError:
            return None
        if not isinstance(event, dict):
            return None
        kind = event.get("type")
        if kind == "thread.started" and isinstance(event.get("thread_id"), str) and event["thread_id"]:
            return Observation(session_id=event["thread_id"])
        if kind == "turn.completed" and isinstance(event.get("usage"), dict):
            return self._usage(event["usage"])
        if kind == "turn.failed":
            error = event.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            return Observation(error=f"codex: the turn failed: {message or 'no message'}")
        return None

    def finish(self) -> Observation | None:
        return None

    def _usage(self, usage: dict[str, Any]) -> Observation | None:
        totals = {"inputTokens": _count(usage.get("input_tokens")),
                  "cachedTokens": _count(usage.get("cached_input_tokens")),
                  "outputTokens": _count(usage.get("output_tokens"))}
        delta = {key: max(0, totals[key] - self._totals[key]) for key in totals}
        self._totals = {key: max(totals[key], self._totals[key]) for key in totals}
        self._turns += 1
        delta["cachedTokens"] = min(delta["cachedTokens"], delta["inputTokens"])
        if not any(delta.values()):
            return None
        return Observation(usage=[{"id": f"codex-turn-{self._turns}", **delta}])
