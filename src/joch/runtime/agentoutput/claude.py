"""Claude Code's ``claude -p --output-format stream-json --verbose`` output (``outputFormat: claude-code``).

Each line is one JSON object. The ones read here (checked against Claude Code 2.1.197):

* ``{"type": "system", "subtype": "init", "session_id": …}`` — the first line: the session to
  ``--resume``.
* ``{"type": "assistant", "message": {"id", "model", "usage": {…}}}`` — one line per content block
  of each model response, so several lines can carry the same message and the same usage. The
  usage is the one of the response's *start*: its input and cache figures are final, its
  ``output_tokens`` is not (usually 1). Error messages Claude Code makes up itself have model
  ``<synthetic>`` and cost nothing.
* ``{"type": "result", "is_error", "subtype", "result", "errors"?, "session_id", "total_cost_usd",
  "usage", "modelUsage": {model: {inputTokens, outputTokens, cacheReadInputTokens,
  cacheCreationInputTokens, costUSD}}}`` — the last line: what the whole process spent, per model
  (title generation included), priced by Claude Code itself.

Usage is reported twice over without counting anything twice: while the agent works, one event
per model response (the first line of each message id), so a Budget can stop a run mid-way; its
cost is an estimate from Anthropic's list prices (``PRICES``), because the CLI prints no cost
before the end. The result then adds, per model, what its totals hold beyond what was reported
already — tokens and ``costUSD`` — so a run that ends normally sums to exactly Claude Code's own
``total_cost_usd`` and token counts (an estimate above the real cost is not taken back: events
are never negative). A run killed before its result keeps the estimates.

``"is_error": true`` (an API error after the retries, ``error_max_turns``, ``error_max_budget_usd``…)
is the agent's own verdict that it failed: ``Observation.error``. (Claude Code exits 1 then, too.)
"""

from __future__ import annotations

from typing import Any

from joch.runtime.agentoutput import Observation
from joch.runtime.agentoutput._common import count_in, json_object, money

PRICES: tuple[tuple[str, float, float], ...] = (
    ("opus-4-1", 15.0, 75.0),
    ("opus-4-0", 15.0, 75.0),
    ("opus-4-2025", 15.0, 75.0),
    ("3-opus", 15.0, 75.0),
    ("opus", 5.0, 25.0),
    ("3-5-haiku", 0.8, 4.0),
    ("3-haiku", 0.25, 1.25),
    ("haiku", 1.0, 5.0),
    ("sonnet", 3.0, 15.0),
)
"""``(part of the model name, input, output USD per million tokens)``, the first match applies; a
model matching none is priced as Sonnet. Cache reads cost a tenth of input, cache writes 1.25 times.
Only for the estimates made before the result: the result's own cost replaces them."""

SYNTHETIC = "<synthetic>"


class Parser:
    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.reported: dict[str, dict[str, float]] = {}  # model → tokens and cost reported so far
        self.model: str | None = None
        self.results = 0

    def feed(self, line: str) -> Observation | None:
        event = json_object(line)
        if event is None:
            return None
        kind = event.get("type")
        if kind == "system" and event.get("subtype") == "init":
            if isinstance(event.get("model"), str):
                self.model = event["model"]
            return _session(event)
        if kind == "assistant":
            return self._assistant(event.get("message"))
        if kind == "result":
            return self._result(event)
        return None

    def finish(self) -> Observation | None:
        return None

    def _assistant(self, message: Any) -> Observation | None:
        if not isinstance(message, dict):
            return None
        ident, model, usage = message.get("id"), message.get("model"), message.get("usage")
        if not isinstance(ident, str) or not isinstance(usage, dict) or ident in self.seen:
            return None
        self.seen.add(ident)
        if not isinstance(model, str) or not model or model == SYNTHETIC:
            return None
        self.model = model
        fresh, cache_read, cache_write = (count_in(usage, k) for k in (
            "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
        output = count_in(usage, "output_tokens")
        cost = estimate(model, fresh, cache_read, cache_write, output)
        tokens = {"inputTokens": fresh + cache_read + cache_write, "cachedTokens": cache_read, "outputTokens": output}
        if not any(tokens.values()):
            return None
        self._add(model, tokens, cost)
        return Observation(usage=[{"id": f"msg-{ident}", "model": model, **tokens, "costUsd": cost}])

    def _result(self, event: dict[str, Any]) -> Observation:
        self.results += 1
        tag = event.get("uuid") if isinstance(event.get("uuid"), str) else f"{event.get('session_id')}-{self.results}"
        usage: list[dict[str, Any]] = []
        for model, (tokens, cost) in _totals(event, self.model).items():
            before = self.reported.get(model, {})
            delta = {k: max(0, v - int(before.get(k, 0))) for k, v in tokens.items()}
            delta["cachedTokens"] = min(delta["cachedTokens"], delta["inputTokens"])
            extra = round(max(0.0, cost - before.get("costUsd", 0.0)), 9)
            if any(delta.values()) or extra:
                self._add(model, delta, extra)
                usage.append({"id": f"result-{tag}-{model}", "model": model, **delta, "costUsd": extra})
        error = None
        if event.get("is_error") is True:
            error = _error(event)
        observation = _session(event) or Observation()
        observation.usage, observation.error = usage, error
        return observation

    def _add(self, model: str, tokens: dict[str, int], cost: float) -> None:
        sums = self.reported.setdefault(model, {})
        for key, value in tokens.items():
            sums[key] = sums.get(key, 0) + value
        sums["costUsd"] = sums.get("costUsd", 0.0) + cost


def estimate(model: str, fresh: int, cache_read: int, cache_write: int, output: int) -> float:
    """The list price in USD of one response's tokens (``PRICES``), rounded to 1e-9."""
    price_in, price_out = next(((i, o) for part, i, o in PRICES if part in model), (3.0, 15.0))
    dollars = (fresh * price_in + cache_read * price_in * 0.1 + cache_write * price_in * 1.25
               + output * price_out) / 1e6
    return round(dollars, 9)


def _totals(event: dict[str, Any], model: str | None) -> dict[str, tuple[dict[str, int], float]]:
    """Per model: the result's token totals (in the usage events' terms) and its cost."""
    per_model = event.get("modelUsage")
    out: dict[str, tuple[dict[str, int], float]] = {}
    if isinstance(per_model, dict) and per_model:
        for name, figures in per_model.items():
            if not isinstance(figures, dict) or name == SYNTHETIC:
                continue
            cache_read = count_in(figures, "cacheReadInputTokens")
            tokens = {"inputTokens": count_in(figures, "inputTokens") + cache_read
                      + count_in(figures, "cacheCreationInputTokens"),
                      "cachedTokens": cache_read, "outputTokens": count_in(figures, "outputTokens")}
            out[str(name)] = (tokens, money(figures.get("costUSD")))
        return out
    usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
    cost = money(event.get("total_cost_usd"))
    cache_read = count_in(usage, "cache_read_input_tokens")
    tokens = {"inputTokens": count_in(usage, "input_tokens") + cache_read
              + count_in(usage, "cache_creation_input_tokens"),
              "cachedTokens": cache_read, "outputTokens": count_in(usage, "output_tokens")}
    if model and (any(tokens.values()) or cost):
        out[model] = (tokens, cost)
    return out


def _error(event: dict[str, Any]) -> str:
    words = [str(e) for e in event.get("errors") or () if e] if isinstance(event.get("errors"), list) else []
    result = event.get("result")
    if isinstance(result, str) and result.strip():
        words.append(result.strip())
    subtype = event.get("subtype")
    kind = f" ({subtype})" if isinstance(subtype, str) and subtype not in ("", "success") else ""
    return f"Claude Code reported an error{kind}: {'; '.join(words) or 'no message'}"


def _session(event: dict[str, Any]) -> Observation | None:
    session = event.get("session_id")
    return Observation(session_id=session) if isinstance(session, str) and session else None
