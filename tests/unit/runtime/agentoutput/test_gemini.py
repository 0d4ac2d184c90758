"""The Gemini CLI output parser against output captured from the real ``gemini`` 0.61.0
(``-p … --output-format stream-json`` and ``json``) talking to ``tests/support/fake_gemini.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from joch.runtime.agentoutput import Observation, parser_for

FIXTURES = Path(__file__).with_name("samples")


def observe(lines: list[str]) -> list[Observation]:
    parser = parser_for("gemini")
    assert parser is not None
    seen = [parser.feed(line) for line in lines]
    seen.append(parser.finish())
    return [o for o in seen if o is not None]


def fixture(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def usage(observations: list[Observation]) -> list[dict[str, Any]]:
    return [event for o in observations for event in o.usage]


def test_stream_json_gives_the_session_at_once_and_the_usage_at_the_end() -> None:
    lines = fixture("gemini-success.jsonl")
    session = json.loads(lines[0])["session_id"]
    assert observe(lines[:1]) == [Observation(session_id=session)]
    assert usage(observe(lines[:-1])) == []
    # The fake reported per turn: 1200 prompt tokens (400 cached), 300 output, 50 thinking; two turns.
    assert usage(observe(lines)) == [{"id": f"result-{session}-1-gemini-2.5-pro", "model": "gemini-2.5-pro",
                                      "inputTokens": 2400, "cachedTokens": 800, "outputTokens": 700}]
    assert all(o.error is None for o in observe(lines))


def test_the_json_format_is_read_when_its_object_closes() -> None:
    lines = fixture("gemini-success.json")
    body = json.loads("\n".join(lines))
    observations = observe(lines)
    assert len(observations) == 1
    assert observations[0].session_id == body["session_id"]
    assert observations[0].usage == [{"id": f"result-{body['session_id']}-1-gemini-2.5-pro", "model": "gemini-2.5-pro",
                                      "inputTokens": 2400, "cachedTokens": 800, "outputTokens": 600}]


def test_an_error_status_is_the_agents_verdict() -> None:
    observations = observe(fixture("gemini-api-error.jsonl"))
    assert [o.error for o in observations if o.error] == [
        'Gemini CLI reported an error: [API Error: {"error":{"code":400,"message":"the fake refuses this request",'
        '"status":"INVALID_ARGUMENT"}}]']
    assert usage(observations) == []


def test_the_json_formats_error_among_stderr_lines_is_read_too() -> None:
    observations = observe(fixture("gemini-api-error.log"))
    assert len(observations) == 1 and observations[0].session_id
    assert observations[0].error is not None and "the fake refuses this request" in observations[0].error


def test_a_resumed_session_keeps_its_id_and_reports_its_own_process_only() -> None:
    observations = observe(fixture("gemini-resumed.jsonl"))
    assert {o.session_id for o in observations} == {"471d1827-4d75-4991-ae47-f59e1a18c5cc"}
    assert [(e["inputTokens"], e["outputTokens"]) for e in usage(observations)] == [(1200, 300)]


def test_other_lines_tell_nothing() -> None:
    assert observe(["", "YOLO mode is enabled.", "[1]", '{"type": "message", "role": "user"}', "{broken",
                    '{"type": "tool_use", "tool_name": "write_file"}']) == []
