"""The fake OpenAI model the agent-CLI tests talk to (tests/support/fake_openai.py) speaks the wire
formats the real CLIs read: checked here over real HTTP, the CLIs themselves in tests/e2e."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from support.fake_openai import USAGE, FakeOpenAI, Script, refused_url


def sse(response: httpx.Response) -> list[tuple[str | None, Any]]:
    events: list[tuple[str | None, Any]] = []
    name: str | None = None
    for line in response.text.splitlines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append((name, data if data == "[DONE]" else json.loads(data)))
            name = None
    return events


def test_chat_stream_puts_usage_in_a_last_chunk_when_asked() -> None:
    with FakeOpenAI() as fake:
        r = httpx.post(f"{fake.url}/chat/completions", headers={"Authorization": "Bearer k"}, timeout=10, json={
            "model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": "Use SEARCH/REPLACE blocks"},
                         {"role": "user", "content": "go"}]})
    assert r.headers["content-type"] == "text/event-stream"
    events = [data for _, data in sse(r)]
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["prompt_tokens"] == USAGE["input"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-2])
    assert "hello.txt\n```\n<<<<<<< SEARCH\n=======\nhello from the fake model\n>>>>>>> REPLACE\n```" in text
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    assert fake.requests[0].bearer() == "k" and fake.requests[0].model == "m"


def test_chat_tool_call_then_final_message() -> None:
    tools = [{"type": "function", "function": {"name": "write", "parameters": {
        "type": "object", "properties": {"filePath": {"type": "string"}, "content": {"type": "string"}}}}}]
    with FakeOpenAI(script=Script(path="a.txt", content="A\n")) as fake:
        first = httpx.post(f"{fake.url}/chat/completions", timeout=10, json={
            "model": "m", "tools": tools, "messages": [{"role": "user", "content": "go"}]}).json()
        call = first["choices"][0]["message"]["tool_calls"][0]
        assert first["choices"][0]["finish_reason"] == "tool_calls"
        assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
            "write", {"filePath": "a.txt", "content": "A\n"})
        second = httpx.post(f"{fake.url}/chat/completions", timeout=10, json={
            "model": "m", "tools": tools, "messages": [{"role": "user", "content": "go"},
                                                      {"role": "tool", "tool_call_id": call["id"], "content": "ok"}]})
    assert second.json()["choices"][0]["message"]["content"] == fake.script.final


def test_responses_stream_events_in_order_with_usage_at_completion() -> None:
    tools = [{"type": "custom", "name": "apply_patch"}]
    with FakeOpenAI() as fake:
        message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
        r = httpx.post(f"{fake.url}/responses", timeout=10,
                       json={"model": "m", "stream": True, "tools": tools, "input": [message]})
    events = sse(r)
    assert [name for name, _ in events] == ["response.created", "response.output_item.added",
                                            "response.output_item.done", "response.completed"]
    assert all(name == data["type"] for name, data in events)
    item = events[2][1]["item"]
    assert (item["type"], item["name"]) == ("custom_tool_call", "apply_patch")
    assert item["input"].startswith("*** Begin Patch\n*** Add File: hello.txt\n+hello from the fake model\n")
    usage = events[-1][1]["response"]["usage"]
    assert (usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], usage["output_tokens"]) == (
        USAGE["input"], USAGE["cached"], USAGE["output"])


def test_responses_shell_tool_runs_the_scripted_command() -> None:
    tools = [{"type": "function", "name": "exec_command", "parameters": {"properties": {"cmd": {"type": "string"}}}}]
    with FakeOpenAI(script=Script(command="echo $HOME > h")) as fake:
        r = httpx.post(f"{fake.url}/responses", timeout=10, json={"model": "m", "tools": tools, "input": []})
    item = r.json()["output"][0]
    assert (item["type"], item["name"], json.loads(item["arguments"])) == (
        "function_call", "exec_command", {"cmd": "echo $HOME > h"})


@pytest.mark.parametrize(("mode", "code"), [("down", 500), ("unauthorized", 401)])
def test_failure_modes(mode: str, code: int) -> None:
    with FakeOpenAI(mode=mode) as fake:  # type: ignore[arg-type]
        r = httpx.post(f"{fake.url}/chat/completions", json={"model": "m", "messages": []}, timeout=10)
    assert r.status_code == code and "error" in r.json()
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{refused_url()}/chat/completions", json={}, timeout=5)
