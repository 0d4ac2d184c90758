"""Aider's own report lines, from its plain output (``--no-pretty``).

What it reads, as aider 0.86.2 prints it:

* ``Tokens: 2.3k sent, 1.1k cache write, 512 cache hit, 120 received. Cost: $0.01 message, $0.02
  session.``: the usage of one message (aider resets the figures after printing them, so each line
  is a delta). Counts have aider's rounding: ``850``, ``2.3k`` (one decimal below 10k), ``12k``,
  and ``M`` above that is read too. The cache parts and the cost are there only when known; with
  both cache parts aider puts ``Cost: …`` on the next line. ``$… message`` becomes the event's
  ``costUsd``; without it the run's Model prices the tokens. Each line is an event ``aider-<n>``.
* ``litellm.InternalServerError: …``, ``litellm.APIConnectionError: …``, ``litellm.Authentication
  Error: …``: a model call failed. Aider retries some errors (``Retrying in 2.0 seconds...``
  follows) and gives up on others or after about a minute, then goes on and exits 0 as if all was
  well. An error that no retry and no answered call (a ``Tokens:`` line) follows is aider's last
  word: ``finish`` reports it as the agent's error, so the run fails instead of succeeding with
  nothing done.

Aider has no session id.
"""

from __future__ import annotations

import re
from typing import Any

from joch.runtime.agentoutput import Observation

_TOKENS = re.compile(r"^Tokens: (?P<body>.*?\breceived\.)\s*(?P<cost>Cost: .*)?$")
_PART = re.compile(r"(?P<count>\d+(?:\.\d+)?)(?P<unit>[kKmM]?) (?P<what>sent|cache write|cache hit|received)\b")
_COST = re.compile(r"^Cost: \$(?P<message>\d+(?:\.\d+)?) message\b")
_ERROR = re.compile(r"^litellm\.\w+: ")
_RETRY = re.compile(r"^Retrying in \d+(?:\.\d+)? seconds")
_UNITS = {"": 1, "k": 1_000, "m": 1_000_000}


MAX_COUNT = 10**15  # a count above this (a forged line's 10**400: inf, which round() fails on) is read as this


def _tokens(count: str, unit: str) -> int:
    return round(min(float(count) * _UNITS[unit.lower()], MAX_COUNT))


class Parser:
    def __init__(self) -> None:
        self._reports = 0
        self._pending: dict[str, Any] | None = None  # a Tokens line whose Cost may follow on the next line
        self._error: str | None = None

    def feed(self, line: str) -> Observation | None:
        text = line.strip()
        cost = _COST.match(text)
        if cost and self._pending is not None:
            event, self._pending = self._pending, None
            event["costUsd"] = float(cost.group("message"))
            return Observation(usage=[event])
        observation = Observation()
        if self._pending is not None:
            observation.usage.append(self._pending)
            self._pending = None
        tokens = _TOKENS.match(text)
        if tokens:
            self._error = None
            event = self._event(tokens.group("body"))
            if tokens.group("cost"):
                message = _COST.match(tokens.group("cost"))
                if message:
                    event["costUsd"] = float(message.group("message"))
                observation.usage.append(event)
            else:
                self._pending = event
        elif _RETRY.match(text):
            self._error = None
        elif _ERROR.match(text):
            self._error = text
        return observation if observation.usage else None

    def finish(self) -> Observation | None:
        observation = Observation()
        if self._pending is not None:
            observation.usage.append(self._pending)
            self._pending = None
        if self._error is not None:
            observation.error = f"aider: its last model call failed: {self._error}"
        return observation if observation.usage or observation.error else None

    def _event(self, body: str) -> dict[str, Any]:
        self._reports += 1
        parts = {m.group("what"): _tokens(m.group("count"), m.group("unit")) for m in _PART.finditer(body)}
        sent = parts.get("sent", 0)
        return {"id": f"aider-{self._reports}", "inputTokens": sent,
                "cachedTokens": min(parts.get("cache hit", 0), sent), "outputTokens": parts.get("received", 0)}
