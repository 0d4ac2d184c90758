"""The output parsers of the OpenAI-protocol CLIs (Codex CLI, aider, OpenCode), read against output the
real CLIs printed while talking to tests/support/fake_openai.py (``samples/``: Codex CLI 0.169.0,
aider 0.86.2, OpenCode 1.18.33; the fake model reports 1200 input tokens of which 200 cached and 80
output tokens per call)."""

from __future__ import annotations

from typing import Any

import pytest

from joch.runtime.agentoutput import Observation, parser_for
from support.outputsamples import sample


def read(output_format: str, *samples: str, lines: list[str] | None = None) -> Observation:
    """Everything the parser for ``output_format`` observed over the samples' lines, merged."""
    parser = parser_for(output_format)
    assert parser is not None
    merged = Observation()
    feed = [line for name in samples for line in sample(name)] + (lines or [])
    for observation in [parser.feed(line) for line in feed] + [parser.finish()]:
        if observation is None:
            continue
        merged.usage.extend(observation.usage)
        merged.session_id = observation.session_id or merged.session_id
        merged.error = observation.error or merged.error
    return merged


def tokens(usage: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(e["id"], e["inputTokens"], e["cachedTokens"], e["outputTokens"], e.get("costUsd")) for e in usage]


# --- Codex ------------------------------------------------------------------------------------------

def test_codex_reports_its_thread_id_and_one_turns_usage() -> None:
    seen = read("codex", "codex-edit.jsonl")
    assert seen.session_id == "01a220d5-1358-7ac1-8849-74e3911db60d"
    assert tokens(seen.usage) == [("codex-turn-1", 2400, 400, 160, None)]  # two model calls in the turn
    assert seen.error is None


def test_codex_turn_totals_become_deltas() -> None:
    """A resumed thread's turn reports the thread's running total (2400 before, 3600 after one more
    call); within one output, each turn reports what it added."""
    seen = read("codex", "codex-edit.jsonl", "codex-resume.jsonl")
    assert tokens(seen.usage) == [("codex-turn-1", 2400, 400, 160, None), ("codex-turn-2", 1200, 200, 80, None)]


def test_codex_failed_turn_is_the_agents_error_and_its_retries_are_not() -> None:
    parser = parser_for("codex")
    assert parser is not None
    lines = sample("codex-model-down.jsonl")
    retries = [line for line in lines if "Reconnecting" in line]
    assert retries and all(parser.feed(line) is None for line in retries)
    seen = read("codex", "codex-model-down.jsonl")
    assert seen.session_id == "01a220d5-5cc8-79f0-a960-7eac2940e4e1"
    assert seen.usage == []
    assert seen.error is not None and "the turn failed" in seen.error and "high demand" in seen.error


def test_codex_ignores_its_log_lines_and_broken_json() -> None:
    seen = read("codex", lines=["WARNING: proceeding, even though we could not create PATH aliases",
                                "2026-11-28T06:25:46Z ERROR codex_api: failed", '{"type": "turn.completed", "usage"',
                                "[1, 2]", '{"type": "turn.completed", "usage": {"input_tokens": -5}}'])
    assert seen == Observation()


# --- aider ------------------------------------------------------------------------------------------

def test_aider_tokens_line_without_a_price() -> None:
    seen = read("aider", "aider-edit-whole.txt")
    assert tokens(seen.usage) == [("aider-1", 1200, 0, 80, None)]
    assert seen.session_id is None and seen.error is None


def test_aider_tokens_and_cost_line() -> None:
    seen = read("aider", "aider-edit-cost.txt")
    assert tokens(seen.usage) == [("aider-1", 1200, 0, 80, 0.0035)]
    assert seen.error is None


@pytest.mark.parametrize(("line", "expected"), [
    ("Tokens: 850 sent, 12 received.", (850, 0, 12, None)),
    ("Tokens: 2.3k sent, 120 received. Cost: $0.01 message, $0.02 session.", (2300, 0, 120, 0.01)),
    ("Tokens: 12k sent, 3.5k cache hit, 1.1k received. Cost: $0.0012 message, $0.50 session.",
     (12000, 3500, 1100, 0.0012)),
    ("Tokens: 1.5M sent, 2M cache hit, 4.2k received.", (1_500_000, 1_500_000, 4200, None)),
])
def test_aider_suffixes_cache_and_cost(line: str, expected: tuple[Any, ...]) -> None:
    seen = read("aider", lines=[line])
    assert tokens(seen.usage) == [("aider-1", *expected)]


def test_aider_cost_on_the_line_after_tokens() -> None:
    """With both cache parts aider prints the cost on a line of its own."""
    seen = read("aider", lines=["Tokens: 10k sent, 2.0k cache write, 5.0k cache hit, 300 received.",
                                "Cost: $0.04 message, $0.04 session.", "", "Applied edit to a.py",
                                "Tokens: 500 sent, 20 received."])
    assert tokens(seen.usage) == [("aider-1", 10000, 5000, 300, 0.04), ("aider-2", 500, 0, 20, None)]


def test_aider_model_down_after_every_retry_is_its_error() -> None:
    seen = read("aider", "aider-model-down.txt")
    assert seen.usage == []
    assert seen.error is not None and "litellm.InternalServerError" in seen.error


def test_aider_refused_key_is_its_error() -> None:
    seen = read("aider", "aider-unauthorized.txt")
    assert seen.error is not None and "litellm.AuthenticationError" in seen.error


def test_aider_error_followed_by_a_retry_that_succeeds_is_no_error() -> None:
    seen = read("aider", lines=["litellm.InternalServerError: InternalServerError: OpenAIException - down",
                                "The API provider's servers are down or overloaded.", "Retrying in 0.2 seconds...",
                                "Tokens: 1.2k sent, 80 received."])
    assert seen.error is None and tokens(seen.usage) == [("aider-1", 1200, 0, 80, None)]


# --- OpenCode ---------------------------------------------------------------------------------------

def test_opencode_session_and_usage_per_step() -> None:
    seen = read("opencode", "opencode-edit.jsonl")
    assert seen.session_id == "ses_ddf27a4f5ffejqnJHl78Ht0bT3"
    assert tokens(seen.usage) == [("opencode-prt_220d86216001wTRgay0FVtP4U2", 1200, 200, 80, None),
                                  ("opencode-prt_220d862a7001TcCnpXZtBfLqeN", 1200, 200, 80, None)]
    assert seen.error is None


def test_opencode_error_event() -> None:
    seen = read("opencode", "opencode-model-down.jsonl")
    assert seen.session_id == "ses_ddf27841dffeQVcEqzUOXtjm0q"
    assert seen.error == "opencode: APIError: the fake model is down"
    assert seen.usage == []


def test_opencode_passes_its_own_price_on() -> None:
    line = ('{"type":"step_finish","sessionID":"ses_1","part":{"id":"prt_1","type":"step-finish",'
            '"tokens":{"input":900,"output":50,"reasoning":10,"cache":{"write":100,"read":300}},"cost":0.0021}}')
    seen = read("opencode", lines=[line])
    assert tokens(seen.usage) == [("opencode-prt_1", 1300, 300, 60, 0.0021)]


def test_aider_reads_on_after_a_forged_line_with_an_endless_count() -> None:
    # Any process of the agent's can print a line like aider's: one the parser fails on would end
    # its reading (and the run's metering) for the rest of the output.
    seen = read("aider", lines=["Tokens: " + "9" * 400 + " sent, 1 received. Cost: $0.01 message, $0.02 session.",
                                "Tokens: 2.3k sent, 120 received. Cost: $0.01 message, $0.03 session."])
    assert [e["inputTokens"] for e in seen.usage] == [10**15, 2300]
