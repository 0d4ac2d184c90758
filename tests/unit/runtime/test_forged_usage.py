"""Usage lines the agent forges in its output (anything it runs can print a line that looks like its
CLI's report): what the runner posts is still what the run callback takes, so the run's real usage
in the same batch is not refused with it."""

from __future__ import annotations

import json
from typing import Any

from joch.api import errors
from joch.controllers import metering
from joch.runtime import runner
from joch.runtime.agentoutput import claude

FORGED = [
    '{"type":"result","session_id":"s","uuid":"u1","total_cost_usd":Infinity,"modelUsage":{"claude-sonnet-4-5":'
    '{"inputTokens":1000000000000000000000000000000,"outputTokens":-5,"costUSD":1e300},"":{"costUSD":NaN}}}',
    '{"type":"assistant","message":{"id":"' + "m" * 5000 + '","model":"' + "x" * 300 + '","usage":'
    '{"input_tokens":10,"output_tokens":2}}}',
]


def test_forged_usage_lines_do_not_get_the_real_usage_refused() -> None:
    accepted: list[dict[str, Any]] = []

    def post(*events: dict[str, Any]) -> None:
        # The callback's own validation of the body the runner sends.
        try:
            parsed = metering.parse_events(json.loads(json.dumps({"events": list(events)})))
        except errors.Invalid as exc:
            raise runner.UsageNotReported(str(exc)) from None
        accepted.extend(event.model_dump(exclude_none=True) for event in parsed)

    parser = claude.Parser()
    reporter = runner.UsageReporter(post, "a1-")
    real = {"id": "msg-real", "model": "claude-sonnet-4-5", "inputTokens": 120, "outputTokens": 30,
            "cachedTokens": 0, "costUsd": 0.001}
    events = [real]
    for line in FORGED:
        seen = parser.feed(line)
        assert seen is not None
        events += seen.usage
    reporter.add(events)
    reporter.close(10)
    assert len(accepted) == len(events) and accepted[0]["id"] == "a1-msg-real"
    forged = accepted[1]
    assert forged["costUsd"] == metering.MAX_EVENT_COST_USD  # counted as the most one event may cost
    assert forged["inputTokens"] == metering.MAX_EVENT_TOKENS and forged["outputTokens"] == 0
    assert all(len(e["id"]) <= 256 for e in accepted) and "model" not in accepted[-1]


def test_the_runner_s_limits_are_the_callback_s() -> None:
    from joch.runtime import agentoutput

    assert (agentoutput.MAX_EVENT_TOKENS, agentoutput.MAX_EVENT_COST_USD) == (
        metering.MAX_EVENT_TOKENS, metering.MAX_EVENT_COST_USD)


def test_an_event_the_callback_refuses_does_not_take_the_rest_of_its_batch() -> None:
    posted: list[list[str]] = []

    def post(*events: dict[str, Any]) -> None:
        # Events without a model or a cost, for an Agent without a modelRoute: the callback's 422.
        if any("model" not in e and "costUsd" not in e for e in events):
            raise runner.UsageNotReported("usage was not recorded (422: model: required)", refused=True)
        posted.append([e["id"] for e in events])

    reporter = runner.UsageReporter(post, "a1-")
    reporter.add([{"id": "real-1", "model": "m", "inputTokens": 1}, {"id": "forged", "inputTokens": 5},
                  {"id": "real-2", "costUsd": 0.5}])
    reporter.close(10)
    assert posted == [["a1-real-1"], ["a1-real-2"]]
