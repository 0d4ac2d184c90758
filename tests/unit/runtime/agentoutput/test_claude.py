"""The Claude Code stream-JSON parser against output captured from the real ``claude`` 2.1.197
(``-p --output-format stream-json --verbose``) talking to ``tests/support/fake_anthropic.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from joch.runtime.agentoutput import Observation, claude, parser_for
from joch.runtime.agentoutput.claude import estimate

FIXTURES = Path(__file__).with_name("samples")


def observe(lines: list[str]) -> list[Observation]:
    parser = parser_for("claude-code")
    assert parser is not None
    seen = [parser.feed(line) for line in lines]
    seen.append(parser.finish())
    return [o for o in seen if o is not None]


def fixture(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def usage(observations: list[Observation]) -> list[dict[str, Any]]:
    return [event for o in observations for event in o.usage]


def result_line(name: str) -> dict[str, Any]:
    last: dict[str, Any] = json.loads(fixture(name)[-1])
    return last


def test_the_session_id_is_known_from_the_first_line() -> None:
    lines = fixture("claude-success.jsonl")
    first = observe(lines[:1])
    assert first == [Observation(session_id=json.loads(lines[0])["session_id"])]


def test_usage_sums_to_claude_codes_own_totals_and_cost() -> None:
    result = result_line("claude-success.jsonl")
    events = usage(observe(fixture("claude-success.jsonl")))
    figures = result["modelUsage"]["claude-sonnet-5"]
    assert {e["model"] for e in events} == {"claude-sonnet-5"}
    assert sum(e["inputTokens"] for e in events) == figures["inputTokens"] + figures["cacheReadInputTokens"]
    assert sum(e["cachedTokens"] for e in events) == figures["cacheReadInputTokens"] == 800
    assert sum(e["outputTokens"] for e in events) == figures["outputTokens"]
    assert round(sum(e["costUsd"] for e in events), 9) == result["total_cost_usd"]
    assert all(e["cachedTokens"] <= e["inputTokens"] for e in events)


def test_a_response_printed_over_two_lines_is_counted_once_and_reported_as_it_comes() -> None:
    lines = fixture("claude-success.jsonl")
    ids = [json.loads(line)["message"]["id"] for line in lines if json.loads(line)["type"] == "assistant"]
    assert len(ids) == 3 and len(set(ids)) == 2  # a sentence and the Write call share one message
    before_result = usage(observe(lines[:-1]))
    assert [e["id"] for e in before_result] == [f"msg-{i}" for i in dict.fromkeys(ids)]
    assert all(e["costUsd"] > 0 for e in before_result)  # priced while running: a Budget can stop it


def test_the_same_output_gives_the_same_event_ids() -> None:
    assert usage(observe(fixture("claude-success.jsonl"))) == usage(observe(fixture("claude-success.jsonl")))


def test_is_error_is_the_agents_verdict() -> None:
    observations = observe(fixture("claude-api-error.jsonl"))
    errors = [o.error for o in observations if o.error]
    assert errors == ["Claude Code reported an error: API Error: 400 the fake refuses this request"]
    assert usage(observations) == []  # nothing was spent: the synthetic message costs nothing
    assert observe(fixture("claude-success.jsonl"))[-1].error is None


def test_an_error_result_names_its_kind_and_still_counts_what_was_spent() -> None:
    observations = observe(fixture("claude-max-turns.jsonl"))
    assert observations[-1].error == ("Claude Code reported an error (error_max_turns): "
                                      "Reached maximum number of turns (1)")
    assert round(sum(e["costUsd"] for e in usage(observations)), 9) == result_line("claude-max-turns.jsonl")[
        "total_cost_usd"]


def test_a_resumed_session_reports_only_what_its_own_process_spent() -> None:
    observations = observe(fixture("claude-resumed.jsonl"))
    result = result_line("claude-resumed.jsonl")
    assert observations[0].session_id == result["session_id"]
    assert round(sum(e["costUsd"] for e in usage(observations)), 9) == result["total_cost_usd"]


def test_an_estimate_above_the_result_is_not_taken_back() -> None:
    lines = [json.dumps({"type": "assistant", "message": {
                 "id": "m1", "model": "claude-opus-4-1", "usage": {"input_tokens": 1000, "output_tokens": 10}}}),
             json.dumps({"type": "result", "is_error": False, "session_id": "s", "uuid": "u", "total_cost_usd": 0.001,
                         "modelUsage": {"claude-opus-4-1": {"inputTokens": 1000, "outputTokens": 5,
                                                            "costUSD": 0.001}}})]
    events = usage(observe(lines))
    assert [e["id"] for e in events] == ["msg-m1"]
    assert events[0]["costUsd"] == estimate("claude-opus-4-1", 1000, 0, 0, 10) == 0.01575


def test_without_model_usage_the_result_totals_count_for_the_last_model() -> None:
    lines = [json.dumps({"type": "system", "subtype": "init", "session_id": "s", "model": "claude-haiku-4-5"}),
             json.dumps({"type": "result", "is_error": False, "session_id": "s", "total_cost_usd": 0.25,
                         "usage": {"input_tokens": 100, "cache_read_input_tokens": 50, "output_tokens": 7}})]
    assert usage(observe(lines)) == [{"id": "result-s-1-claude-haiku-4-5", "model": "claude-haiku-4-5",
                                      "inputTokens": 150, "cachedTokens": 50, "outputTokens": 7, "costUsd": 0.25}]


def test_other_lines_tell_nothing() -> None:
    assert observe(["", "not json", "[1, 2]", '{"type": "user", "message": {}}',
                    '{"type": "system", "subtype": "api_retry", "attempt": 1}', "{broken"]) == []


def test_a_forged_count_too_large_for_a_float_does_not_end_the_reading() -> None:
    # Any process of the agent's can print a line like Claude Code's: one the parser fails on would
    # end its reading (and the run's metering) for the rest of the output.
    parser = claude.Parser()
    forged = ('{"type":"assistant","message":{"id":"m1","model":"claude-sonnet-4-5","usage":{"input_tokens":1'
              + "0" * 400 + ',"output_tokens":1}}}')
    real = ('{"type":"assistant","message":{"id":"m2","model":"claude-sonnet-4-5","usage":{"input_tokens":10,'
            '"output_tokens":2}}}')
    first, second = parser.feed(forged), parser.feed(real)
    assert first is not None and first.usage[0]["inputTokens"] == claude.MAX_COUNT
    assert second is not None and second.usage[0]["inputTokens"] == 10
