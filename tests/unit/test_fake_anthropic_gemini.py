"""The fake Anthropic and Gemini models' wire formats, without the CLIs: the Messages API's event
stream in order with the tool call's input streamed as JSON pieces and usage at start and end; the
Gemini API's SSE chunks with a function call and usageMetadata; the script's turns; failure modes."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

from support.fake_anthropic import FakeAnthropic
from support.fake_gemini import FakeGemini

WRITE = {"name": "Write", "description": "write a file", "input_schema": {"type": "object"}}
SYSTEM = [{"type": "text", "text": "Primary working directory: /work/repo\nIs a git repository: true"}]


def sse(text: str) -> list[tuple[str | None, dict[str, Any]]]:
    events: list[tuple[str | None, dict[str, Any]]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name = next((line[7:] for line in block.splitlines() if line.startswith("event: ")), None)
        data = next((line[6:] for line in block.splitlines() if line.startswith("data: ")), None)
        if data:
            events.append((name, json.loads(data)))
    return events


def messages(fake: FakeAnthropic, body: dict[str, Any], key: str = "k") -> httpx.Response:
    return httpx.post(f"{fake.url}/v1/messages?beta=true", json=body, headers={"x-api-key": key}, timeout=10)


def test_anthropic_streams_a_write_call_then_the_final_text() -> None:
    with FakeAnthropic(api_key="k", cached_tokens=10) as fake:
        first = {"model": "claude-x", "stream": True, "system": SYSTEM, "tools": [WRITE],
                 "messages": [{"role": "user", "content": "write hello.txt"}]}
        response = messages(fake, first)
        assert response.headers["content-type"] == "text/event-stream"
        events = sse(response.text)
        names = [name for name, _ in events]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
        assert all(name == data["type"] for name, data in events)
        start = events[0][1]["message"]
        assert (start["usage"]["input_tokens"], start["usage"]["cache_read_input_tokens"]) == (1200, 10)
        tool = next(d["content_block"] for n, d in events if n == "content_block_start"
                    and d["content_block"]["type"] == "tool_use")
        assert (tool["name"], tool["input"]) == ("Write", {})
        pieces = "".join(d["delta"]["partial_json"] for n, d in events
                         if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
        assert json.loads(pieces) == {"file_path": "/work/repo/hello.txt", "content": "hello from the fake model\n"}
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use" and events[-2][1]["usage"]["output_tokens"] == 300

        second = dict(first, stream=False, messages=[
            *first["messages"], {"role": "assistant", "content": [dict(tool, input={"file_path": "x"})]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool["id"], "content": "ok"}]}])
        final = messages(fake, second).json()
        assert (final["content"], final["stop_reason"]) == ([{"type": "text", "text": "I wrote the file."}], "end_turn")
        assert len(fake.agent_requests()) == 2
        assert fake.reported == {"input": 2400, "output": 600, "cached": 20}
        assert {r.headers["x-api-key"] for r in fake.requests} == {"<redacted>"}


def test_anthropic_failure_modes_and_a_request_without_tools() -> None:
    with FakeAnthropic(api_key="k") as fake:
        assert messages(fake, {"model": "m", "messages": []}, key="wrong").status_code == 401
        title = messages(fake, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}).json()
        assert title["content"][0]["type"] == "text" and fake.agent_requests() == []
    for mode, status, kind in (("error", 400, "invalid_request_error"), ("down", 500, "api_error")):
        with FakeAnthropic(mode=mode) as fake:
            response = messages(fake, {"model": "m", "messages": []})
            assert (response.status_code, response.json()["error"]["type"]) == (status, kind)


def test_anthropic_holds_a_turn_until_released() -> None:
    with FakeAnthropic(hold_turn=1) as fake:
        body = {"model": "m", "tools": [WRITE], "messages": [{"role": "user", "content": "go"}]}
        answers: list[httpx.Response] = []
        waiting = threading.Thread(target=lambda: answers.append(messages(fake, body)))
        waiting.start()
        waiting.join(0.5)
        assert answers == []
        fake.release()
        waiting.join(10)
        assert answers[0].json()["stop_reason"] == "tool_use"


def test_gemini_streams_a_function_call_with_usage_then_the_final_text() -> None:
    with FakeGemini(api_key="g", cached_tokens=100, thought_tokens=7) as fake:
        url = f"{fake.url}/v1beta/models/gemini-x:streamGenerateContent?alt=sse"
        tools = [{"functionDeclarations": [{"name": "write_file"}, {"name": "replace"}]}]
        body: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "write hello.txt"}]}], "tools": tools}
        chunks = [data for _, data in sse(httpx.post(url, json=body, headers={"x-goog-api-key": "g"}, timeout=10).text)]
        parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
        assert parts[0] == {"text": "I'll write hello.txt."}
        assert parts[1]["functionCall"] == {"name": "write_file", "args": {
            "file_path": "hello.txt", "content": "hello from the fake model\n"}}
        assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
        assert chunks[-1]["usageMetadata"] == {"promptTokenCount": 1200, "candidatesTokenCount": 300,
                                               "totalTokenCount": 1507, "cachedContentTokenCount": 100,
                                               "thoughtsTokenCount": 7}
        body["contents"] += [{"role": "model", "parts": [parts[1]]},
                             {"role": "user", "parts": [{"functionResponse": {"name": "write_file", "response": {}}}]}]
        final = httpx.post(url.replace("streamGenerateContent?alt=sse", "generateContent"), json=body,
                           headers={"x-goog-api-key": "g"}, timeout=10).json()
        assert final["candidates"][0]["content"]["parts"] == [{"text": "I wrote the file."}]
        assert httpx.post(url, json=body, headers={"x-goog-api-key": "wrong"}, timeout=10).status_code == 400
        schema = {"type": "object", "properties": {"reasoning": {"type": "string"}, "next_speaker": {
            "type": "string", "enum": ["user", "model"]}}}
        asked_json = {"contents": [], "generationConfig": {"responseMimeType": "application/json",
                                                           "responseJsonSchema": schema}}
        checked = httpx.post(url.replace("streamGenerateContent?alt=sse", "generateContent"), json=asked_json,
                             headers={"x-goog-api-key": "g"}, timeout=10).json()
        assert json.loads(checked["candidates"][0]["content"]["parts"][0]["text"])["next_speaker"] == "user"
    with FakeGemini(mode="down") as fake:
        response = httpx.post(f"{fake.url}/v1beta/models/m:generateContent", json={}, timeout=10)
        assert (response.status_code, response.json()["error"]["status"]) == (500, "INTERNAL")
