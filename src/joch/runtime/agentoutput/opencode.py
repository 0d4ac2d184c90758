"""OpenCode's ``opencode run --format json`` events (one JSON object a line on stdout).

What it reads, as OpenCode 1.18.33 prints it:

* ``sessionID`` (on every event): the session id (``opencode run --session ID``).
* ``{"type": "step_finish", "part": {"id": "prt_…", "tokens": {"input", "output", "reasoning",
  "cache": {"read", "write"}}, "cost": 0.0012}}``: one model call's usage. OpenCode's ``input``
  leaves out the cached tokens, so the event's ``inputTokens`` adds ``cache.read`` and
  ``cache.write`` back (``cachedTokens`` = ``cache.read``); reasoning tokens count as output.
  ``cost`` is OpenCode's own price: passed on as ``costUsd`` when above zero (zero means OpenCode
  knows no price; the run's Model prices it then). The part id keeps the event's id stable.
* ``{"type": "error", "error": {"name": "APIError", "data": {"message": …}}}``: the session
  ended in an error (the model unreachable after OpenCode's retries, say).
"""

from __future__ import annotations

from typing import Any

from joch.runtime.agentoutput import Observation
from joch.runtime.agentoutput._common import count, json_object


class Parser:
    def __init__(self) -> None:
        self._session: str | None = None
        self._steps = 0

    def feed(self, line: str) -> Observation | None:
        event = json_object(line)
        if event is None:
            return None
        observation = Observation()
        session = event.get("sessionID")
        if isinstance(session, str) and session and session != self._session:
            self._session = observation.session_id = session
        kind = event.get("type")
        part = event.get("part")
        if kind == "step_finish" and isinstance(part, dict) and isinstance(part.get("tokens"), dict):
            usage = self._usage(part)
            if usage is not None:
                observation.usage.append(usage)
        elif kind == "error":
            observation.error = f"opencode: {_error_text(event.get('error'))}"
        if observation.usage or observation.session_id or observation.error:
            return observation
        return None

    def finish(self) -> Observation | None:
        return None

    def _usage(self, part: dict[str, Any]) -> dict[str, Any] | None:
        self._steps += 1
        tokens = part["tokens"]
        cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else {}
        cached = count(cache.get("read"))
        event: dict[str, Any] = {
            "id": f"opencode-{part['id']}" if isinstance(part.get("id"), str) else f"opencode-step-{self._steps}",
            "inputTokens": count(tokens.get("input")) + cached + count(cache.get("write")),
            "cachedTokens": cached,
            "outputTokens": count(tokens.get("output")) + count(tokens.get("reasoning")),
        }
        cost = part.get("cost")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and 0 < cost < float("inf"):
            event["costUsd"] = float(cost)
        if not (event["inputTokens"] or event["outputTokens"] or "costUsd" in event):
            return None
        return event


def _error_text(error: Any) -> str:
    if not isinstance(error, dict):
        return "the session failed"
    data = error.get("data")
    message = (data.get("message") if isinstance(data, dict) else None) or error.get("message")
    name = error.get("name")
    if name and message:
        return f"{name}: {message}"
    return str(message or name or "the session failed")
