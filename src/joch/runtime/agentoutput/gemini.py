"""Gemini CLI's ``gemini -p … --output-format stream-json`` (or ``json``) output (``outputFormat: gemini``).

``stream-json`` prints one JSON object a line (checked against Gemini CLI 0.61.0):

* ``{"type": "init", "session_id", "model"}`` — the first line: the session to ``--resume``;
* ``message``, ``tool_use``, ``tool_result`` lines — the conversation, no usage in them;
* ``{"type": "result", "status": "success"|"error", "error"?: {"type", "message"}, "stats":
  {"input_tokens", "output_tokens", "cached", "total_tokens", "models": {model: {the same}}}}`` —
  the last line. ``input_tokens`` counts the whole prompt, ``cached`` the part of it served from
  the cache; ``total_tokens`` also counts the thinking (and tool-prompt) tokens, which
  ``output_tokens`` leaves out: the difference is added to the output (thinking is billed so).

``json`` prints one indented object at the end instead (``{"session_id", "response"|"error",
"stats": {"models": {model: {"tokens": {"prompt", "candidates", "cached", "thoughts", "tool"}}}}}``),
read when its closing brace arrives.

The CLI prints no cost and no usage before the end: one usage event per model at the result,
without ``costUsd`` — Joch prices it with the ``Model`` of that name (or ``spec.modelId``).
``"status": "error"`` (or the ``json`` form's ``error``) is the agent's own verdict that it failed.
"""

from __future__ import annotations

import json
from typing import Any

from joch.runtime.agentoutput import Observation


class Parser:
    def __init__(self) -> None:
        self.session: str | None = None
        self.results = 0
        self.block: list[str] | None = None  # the lines of a ``json``-format object being read

    def feed(self, line: str) -> Observation | None:
        if self.block is not None:
            self.block.append(line)
            if line.rstrip() == "}":
                text, self.block = "\n".join(self.block), None
                return self._whole(_json(text))
            return None
        if line.rstrip() == "{":
            self.block = [line]
            return None
        event = _json(line)
        if event is None:
            return None
        kind = event.get("type")
        if kind == "init":
            return self._session(event)
        if kind == "result":
            tokens = {name: _stream_tokens(figures) for name, figures in _models(event).items()}
            error = _error(event.get("error")) if event.get("status") == "error" else None
            return self._result(tokens, error)
        return None

    def finish(self) -> Observation | None:
        return None

    def _whole(self, body: dict[str, Any] | None) -> Observation | None:
        if body is None:
            return None
        observation = self._session(body) or Observation()
        tokens = {name: _json_tokens(figures.get("tokens")) for name, figures in _models(body).items()
                  if isinstance(figures, dict)}
        error = _error(body["error"]) if body.get("error") else None
        result = self._result(tokens, error)
        observation.usage, observation.error = result.usage, result.error
        return observation

    def _session(self, event: dict[str, Any]) -> Observation | None:
        session = event.get("session_id")
        if not isinstance(session, str) or not session:
            return None
        self.session = session
        return Observation(session_id=session)

    def _result(self, tokens: dict[str, dict[str, int]], error: str | None) -> Observation:
        self.results += 1
        usage = [{"id": f"result-{self.session or 'none'}-{self.results}-{model}", "model": model, **figures}
                 for model, figures in tokens.items() if any(figures.values())]
        return Observation(usage=usage, session_id=self.session, error=error)


def _models(body: dict[str, Any]) -> dict[str, Any]:
    stats = body.get("stats")
    models = stats.get("models") if isinstance(stats, dict) else None
    return models if isinstance(models, dict) else {}


def _stream_tokens(figures: Any) -> dict[str, int]:
    prompt, output, cached, total = (_count(figures, k) for k in ("input_tokens", "output_tokens", "cached",
                                                                  "total_tokens"))
    output += max(0, total - prompt - output)
    return {"inputTokens": prompt, "cachedTokens": min(cached, prompt), "outputTokens": output}


def _json_tokens(figures: Any) -> dict[str, int]:
    prompt = _count(figures, "prompt") + _count(figures, "tool")
    cached = min(_count(figures, "cached"), prompt)
    return {"inputTokens": prompt, "cachedTokens": cached,
            "outputTokens": _count(figures, "candidates") + _count(figures, "thoughts")}


def _error(error: Any) -> str:
    message = error.get("message") if isinstance(error, dict) else error
    return f"Gemini CLI reported an error: {message}" if message else "Gemini CLI reported an error"


def _json(text: str) -> dict[str, Any] | None:
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _count(figures: Any, key: str) -> int:
    value = figures.get(key) if isinstance(figures, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
