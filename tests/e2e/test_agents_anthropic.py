"""The Claude Code and Gemini CLI presets run their real CLIs through Joch: a real ``joch server``
process, the pinned ``claude`` and ``gemini`` (``scripts/agent-clis``), and a fake model on
127.0.0.1 (tests/support/fake_anthropic.py, fake_gemini.py) that answers with a scripted edit.

The server runs with its default ``--sandbox auto`` (bwrap where it works, the agent as uid 65534
when the tests run as root); the resume tests run without the sandbox too. Each test applies only
a Secret, the preset from examples/providers/ as it is and an Agent pointing the preset's
``baseUrl`` parameter at the fake (plus a Model or a Budget where the test is about pricing): no
hand-edited environment, nothing in the server's HOME. A missing CLI skips its test outside CI and
fails it in CI (tests/support/agents.py).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import stop_server, wait_ready
from support.agents import agent_bin_dir, require_agent
from support.fake_anthropic import FakeAnthropic
from support.fake_gemini import FakeGemini

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "examples" / "providers"
JOCH = Path(sys.executable).with_name("joch")
RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"
KEY = "sk-ant-fake-key-for-joch-e2e"
GEMINI_KEY = "AIza-fake-key-for-joch-e2e"
CALLS = re.compile(r'"tool_result"|"functionResponse"|"write_file"')
"""What a CLI's session store holds once the first turn's tool call is in it (Claude Code, Gemini CLI)."""
GEMINI_PRICING = {"inputPerMillionUsd": 1.25, "cachedInputPerMillionUsd": 0.31, "outputPerMillionUsd": 10.0}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          capture_output=True, text=True, check=True, timeout=30)
    return done.stdout


@dataclass
class Joch:
    base: str
    log: Path
    repo: Path

    def apply(self, *documents: str | dict[str, Any]) -> None:
        body = "\n---\n".join(d if isinstance(d, str) else json.dumps(d) for d in documents)
        r = httpx.post(f"{self.base}/v1/resources/apply", content=body, headers={"content-type": "application/yaml"},
                       timeout=30)
        assert r.status_code == 200, r.text

    def start(self, name: str, agent: str, text: str = "Create hello.txt.") -> None:
        run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
               "spec": {"agentRef": {"name": agent}, "implementation": {"inline": {"text": text}},
                        "execution": {"coordinates": {"git": {"url": str(self.repo)}}}}}
        r = httpx.post(f"{self.base}{RUNS}", json=run, timeout=10)
        assert r.status_code in (200, 201), r.text

    def run(self, name: str) -> dict[str, Any]:
        r = httpx.get(f"{self.base}{RUNS}/{name}", timeout=10)
        r.raise_for_status()
        run: dict[str, Any] = r.json()
        return run

    def wait_ended(self, name: str, seconds: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while (status := self.run(name).get("status") or {}).get("phase") not in ("Succeeded", "Failed", "Cancelled"):
            assert time.monotonic() < deadline, (status, self.log.read_text()[-3000:])
            time.sleep(0.2)
        return status

    def artifact(self, name: str, artifact: str) -> str:
        r = httpx.get(f"{self.base}{RUNS}/{name}/artifacts/{artifact}", timeout=10)
        assert r.status_code == 200, (artifact, r.text)
        return r.text

    def logs(self, name: str) -> str:
        r = httpx.get(f"{self.base}{RUNS}/{name}/log", timeout=10)
        return r.text if r.status_code == 200 else f"(no logs: {r.status_code})"


@pytest.fixture
def joch(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Joch]:
    """A ``joch server`` whose PATH finds the installed CLIs, and a repository with one commit for the
    runs to change. Its ``--sandbox`` is the default, ``auto`` (bwrap where it works, as uid 65534
    when the server runs as root), unless a test asks for another mode with
    ``@pytest.mark.parametrize("joch", ["none"], indirect=True)``."""
    sandbox = getattr(request, "param", "auto")
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch", "main")
    (repo / "README.md").write_text("# a repository\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "--quiet", "-m", "first")
    port = free_port()
    log = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JOCH_", "ANTHROPIC_", "CLAUDE_", "GEMINI_", "GOOGLE_"))}
    env["PATH"] = f"{agent_bin_dir()}{os.pathsep}{env.get('PATH', '')}"
    server = subprocess.Popen([str(JOCH), "server", "--data-dir", str(tmp_path / "data"), "--port", str(port),
                               "--sandbox", sandbox], stdout=log.open("a"), stderr=subprocess.STDOUT, text=True,
                              env=env, cwd=tmp_path)
    joch = Joch(f"http://127.0.0.1:{port}", log, repo)
    try:
        wait_ready(joch.base, server)
        yield joch
    finally:
        stop_server(server)
    assert "Traceback" not in log.read_text(), log.read_text()


def setup_claude(joch: Joch, base_url: str, *extra: dict[str, Any], retry_limit: int = 0, **parameters: str) -> str:
    """Apply the Secret, the preset file as it is and an Agent pointing it at ``base_url``."""
    joch.apply(
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "anthropic"},
         "spec": {"stringData": {"api-key": KEY}}},
        (PRESETS / "claude-code.yaml").read_text(),
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "claude"},
         "spec": {"providerRef": {"name": "claude-code"}, "security": {"allowedSecrets": ["anthropic"]},
                  "defaults": {"retryLimit": retry_limit,
                               "parameters": {"baseUrl": base_url, "maxRetries": "0", **parameters}}}},
        *extra,
    )
    return "claude"


def setup_gemini(joch: Joch, base_url: str, *, retry_limit: int = 0, **parameters: str) -> str:
    """Apply the Secret, the preset file as it is, a Model pricing the fake's model and an Agent
    pointing the preset at ``base_url``."""
    joch.apply(
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "gemini"},
         "spec": {"stringData": {"api-key": GEMINI_KEY}}},
        (PRESETS / "gemini.yaml").read_text(),
        {"apiVersion": "model.joch.dev/v1alpha1", "kind": "Model", "metadata": {"name": "gemini-pro"},
         "spec": {"provider": "google", "modelId": "gemini-2.5-pro", "pricing": GEMINI_PRICING}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "gemini"},
         "spec": {"providerRef": {"name": "gemini"}, "security": {"allowedSecrets": ["gemini"]},
                  "defaults": {"retryLimit": retry_limit,
                               "parameters": {"baseUrl": base_url, "maxAttempts": "1", **parameters}}}},
    )
    return "gemini"


def changed_files(patch: str) -> list[str]:
    return [line.split(" b/", 1)[1] for line in patch.splitlines() if line.startswith("diff --git ")]


def assert_only_the_edit(joch: Joch, name: str, status: dict[str, Any]) -> None:
    assert status["phase"] == "Succeeded", (status.get("reason"), status.get("message"), status.get("attempt"),
                                            joch.logs(name)[-3000:], joch.log.read_text()[-3000:])
    patch = joch.artifact(name, "changes.patch")
    assert changed_files(patch) == ["hello.txt"], patch
    assert "+hello from the fake model" in patch


def result_line(log: str) -> dict[str, Any]:
    """The last JSON line of a stream-JSON log whose type is ``result``."""
    for line in reversed(log.splitlines()):
        if line.startswith("{") and '"type":"result"' in line.replace(" ", ""):
            found: dict[str, Any] = json.loads(line)
            return found
    raise AssertionError(f"no result line in the log:\n{log[-3000:]}")


def session_of(log: str) -> str:
    for line in log.splitlines():
        if line.startswith("{") and '"session_id"' in line:
            session: str = json.loads(line)["session_id"]
            return session
    raise AssertionError(f"no session id in the log:\n{log[-3000:]}")


# --- Claude Code ----------------------------------------------------------------------------------

def test_claude_code_edits_and_its_usage_and_own_cost_land_in_status(joch: Joch) -> None:
    require_agent("claude")
    with FakeAnthropic(api_key=KEY, cached_tokens=400) as fake:
        agent = setup_claude(joch, fake.url)
        joch.start("claude-1", agent)
        status = joch.wait_ended("claude-1")
    assert_only_the_edit(joch, "claude-1", status)
    asked = fake.agent_requests()
    assert len(asked) == 2  # the Write call, then the final message
    assert {r.body["model"] for r in asked} == {"claude-sonnet-5"}  # the preset's `sonnet`
    assert {r.headers["user-agent"].split()[0] for r in asked} == {"claude-cli/2.1.197"}
    log = joch.logs("claude-1")
    result = result_line(log)
    assert result["is_error"] is False
    # Usage: everything the fake reported (the title request included), as Claude Code counted it;
    # cost: Claude Code's own total_cost_usd.
    assert status["usage"] == {"inputTokens": fake.reported["input"] + fake.reported["cached"],
                               "cachedTokens": fake.reported["cached"], "outputTokens": fake.reported["output"]}
    assert status["costUsd"] == pytest.approx(result["total_cost_usd"], abs=1e-6)
    assert status["costUsd"] > 0
    assert status["session"]["id"] == session_of(log) == result["session_id"]
    invocation = status["invocation"]
    assert invocation["argv"][:4] == ["claude", "-p", "--output-format", "stream-json"]
    assert "--resume" not in invocation["argv"]
    assert invocation["version"] == "2.1.197 (Claude Code)"
    assert {"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "HOME"} <= set(invocation["env"])
    assert KEY not in json.dumps(joch.run("claude-1")) and KEY not in log


def test_a_budget_stops_claude_code_while_it_keeps_spending(joch: Joch) -> None:
    """The fake keeps asking for another file (100k input tokens a turn, about $0.30 at Sonnet's
    price): the Budget's $0.50 a day is crossed after two turns and the run is stopped mid-way."""
    require_agent("claude")
    budget = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Budget", "metadata": {"name": "daily"},
              "spec": {"period": "day", "limitUsd": 0.5, "onExceed": "deny"}}
    with FakeAnthropic(api_key=KEY, loop=True, input_tokens=100_000, delay=0.5) as fake:
        agent = setup_claude(joch, fake.url, budget)
        joch.start("claude-spender", agent)
        status = joch.wait_ended("claude-spender", seconds=120)
        turns = len(fake.agent_requests())
    assert (status["phase"], status["reason"]) == ("Failed", "BudgetExceeded"), (status, joch.logs("claude-spender"))
    assert "daily" in status["message"] and "over its limit of $0.50" in status["message"], status
    assert status["costUsd"] > 0.5
    assert turns < 20, turns  # stopped while it ran, not after the fake's 200 turns


def test_claude_code_with_the_model_unreachable_fails(joch: Joch) -> None:
    require_agent("claude")
    closed = f"http://127.0.0.1:{free_port()}"
    agent = setup_claude(joch, closed)
    joch.start("claude-unreachable", agent)
    status = joch.wait_ended("claude-unreachable")
    assert status["phase"] == "Failed", (status, joch.logs("claude-unreachable"))
    assert "Unable to connect to API" in result_line(joch.logs("claude-unreachable"))["result"]



def claude_refused(joch: Joch) -> dict[str, Any]:
    """A run of Claude Code whose every model call the API refuses (HTTP 400): Claude Code ends
    with ``"is_error": true`` and exit code 1."""
    require_agent("claude")
    with FakeAnthropic(api_key=KEY, mode="error") as fake:
        agent = setup_claude(joch, fake.url)
        joch.start("claude-error", agent)
        status = joch.wait_ended("claude-error")
    assert status["phase"] == "Failed", (status, joch.logs("claude-error"))
    assert result_line(joch.logs("claude-error"))["is_error"] is True
    return status


def test_claude_codes_is_error_fails_the_run(joch: Joch) -> None:
    claude_refused(joch)


def test_claude_codes_is_error_is_the_runs_reason_and_message(joch: Joch) -> None:
    status = claude_refused(joch)
    assert status["reason"] == "AgentReportedError", status
    assert "API Error: 400 the fake refuses this request" in status["message"], status


def kill_runner_mid_turn(joch: Joch, name: str, asked: Callable[[], list[Any]], transcript: str) -> str:
    """Once the agent waits for its second answer (the fake holds it), its session is recorded and
    the CLI's own session store in attempt 1's HOME (files matching the glob ``transcript``) holds
    the first turn's tool call, kill -9 the run's runner and wait for the second attempt; the
    session id. (The CLIs write their session store a moment after the turn: a runner killed before
    that leaves nothing to resume, and the retry fails.)"""
    deadline = time.monotonic() + 60
    while True:
        status = joch.run(name).get("status") or {}
        uid = joch.run(name)["metadata"]["uid"]
        home = joch.log.parent / "data" / "runs" / uid / "1" / "home"
        stored = any(p.is_file() and CALLS.search(p.read_text(errors="replace")) for p in home.glob(transcript))
        if len(asked()) >= 2 and (status.get("session") or {}).get("id") and "runnerPid" in status.get(
                "runtimeRef", {}) and stored:
            break
        assert time.monotonic() < deadline, (status, joch.logs(name))
        time.sleep(0.1)
    assert status["attempt"] == 1, status
    os.kill(int(status["runtimeRef"]["runnerPid"]), 9)
    session: str = status["session"]["id"]
    while (joch.run(name).get("status") or {}).get("attempt") != 2:  # attempt 1's agent is gone by then
        assert time.monotonic() < deadline + 60, (joch.run(name).get("status"), joch.logs(name))
        time.sleep(0.1)
    return session


@pytest.mark.parametrize("joch", ["auto", "none"], indirect=True)
def test_claude_code_resumes_its_session_after_its_runner_is_killed(joch: Joch) -> None:
    """The runner is killed (-9) while Claude Code waits for its second answer, its Write done; the
    retry runs ``claude --resume <the same session>`` in the same worktree, and the conversation
    goes on from the tool result instead of starting over."""
    require_agent("claude")
    with FakeAnthropic(api_key=KEY, hold_turn=2) as fake:
        agent = setup_claude(joch, fake.url, retry_limit=1)
        joch.start("claude-resume", agent)
        session = kill_runner_mid_turn(joch, "claude-resume", fake.agent_requests, ".claude/projects/*/*.jsonl")
        fake.release()
        status = joch.wait_ended("claude-resume", seconds=120)
        asked = fake.agent_requests()
    assert_only_the_edit(joch, "claude-resume", status)
    assert status["attempt"] == 2, status
    assert (status["session"]["id"], status["session"]["resumedFromAttempt"]) == (session, 1), status
    argv = status["invocation"]["argv"]
    assert argv[argv.index("--resume") + 1] == session, argv
    resumed = asked[-1]
    assert resumed.headers["x-claude-code-session-id"] == session
    # The resumed conversation holds attempt 1's Write call and its result: nothing was redone.
    calls = [b for m in resumed.body["messages"] if m["role"] == "assistant" for b in m["content"]
             if isinstance(b, dict) and b.get("type") == "tool_use"]
    assert [c["name"] for c in calls] == ["Write"]
    assert len([r for r in asked if r.headers.get("x-claude-code-session-id") == session]) == len(asked)


# --- Gemini CLI -----------------------------------------------------------------------------------

def test_gemini_edits_and_its_usage_is_priced_by_the_model(joch: Joch) -> None:
    require_agent("gemini")
    with FakeGemini(api_key=GEMINI_KEY, cached_tokens=400, thought_tokens=50) as fake:
        agent = setup_gemini(joch, fake.url)
        joch.start("gemini-1", agent)
        status = joch.wait_ended("gemini-1")
    assert_only_the_edit(joch, "gemini-1", status)
    asked = fake.agent_requests()
    assert len(asked) == 2 and {r.path.split(":")[0] for r in asked} == {"/v1beta/models/gemini-2.5-pro"}
    log = joch.logs("gemini-1")
    assert result_line(log)["status"] == "success"
    reported = fake.reported
    assert status["usage"] == {"inputTokens": reported["input"], "cachedTokens": reported["cached"],
                               "outputTokens": reported["output"] + reported["thoughts"]}
    expected = ((reported["input"] - reported["cached"]) * GEMINI_PRICING["inputPerMillionUsd"]
                + reported["cached"] * GEMINI_PRICING["cachedInputPerMillionUsd"]
                + (reported["output"] + reported["thoughts"]) * GEMINI_PRICING["outputPerMillionUsd"]) / 1e6
    assert status["costUsd"] == pytest.approx(expected, abs=1e-6)
    assert status["session"]["id"] == session_of(log)
    invocation = status["invocation"]
    assert invocation["version"] == "0.61.0"
    assert {"GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL", "HOME"} <= set(invocation["env"])
    assert GEMINI_KEY not in json.dumps(joch.run("gemini-1")) and GEMINI_KEY not in log


def test_gemini_with_the_model_unreachable_fails(joch: Joch) -> None:
    require_agent("gemini")
    agent = setup_gemini(joch, f"http://127.0.0.1:{free_port()}")
    joch.start("gemini-unreachable", agent)
    status = joch.wait_ended("gemini-unreachable")
    assert status["phase"] == "Failed", (status, joch.logs("gemini-unreachable"))
    assert result_line(joch.logs("gemini-unreachable"))["status"] == "error"


def gemini_refused(joch: Joch) -> dict[str, Any]:
    require_agent("gemini")
    with FakeGemini(api_key=GEMINI_KEY, mode="error") as fake:
        agent = setup_gemini(joch, fake.url)
        joch.start("gemini-error", agent)
        status = joch.wait_ended("gemini-error")
    assert status["phase"] == "Failed", (status, joch.logs("gemini-error"))
    assert result_line(joch.logs("gemini-error"))["status"] == "error"
    return status


def test_gemini_refused_by_the_model_fails(joch: Joch) -> None:
    gemini_refused(joch)


def test_gemini_refused_by_the_model_fails_with_its_own_message(joch: Joch) -> None:
    status = gemini_refused(joch)
    assert status["reason"] == "AgentReportedError", status
    assert "the fake refuses this request" in status["message"], status


@pytest.mark.parametrize("joch", ["auto", "none"], indirect=True)
def test_gemini_resumes_its_session_after_its_runner_is_killed(joch: Joch) -> None:
    require_agent("gemini")
    with FakeGemini(api_key=GEMINI_KEY, hold_turn=2) as fake:
        agent = setup_gemini(joch, fake.url, retry_limit=1)
        joch.start("gemini-resume", agent)
        session = kill_runner_mid_turn(joch, "gemini-resume", fake.agent_requests, ".gemini/tmp/*/chats/*.jsonl")
        fake.release()
        status = joch.wait_ended("gemini-resume", seconds=120)
        asked = fake.agent_requests()
    assert_only_the_edit(joch, "gemini-resume", status)
    assert status["attempt"] == 2, status
    assert (status["session"]["id"], status["session"]["resumedFromAttempt"]) == (session, 1), status
    argv = status["invocation"]["argv"]
    assert argv[argv.index("--resume") + 1] == session, argv
    # The resumed conversation holds attempt 1's write_file call: nothing was redone.
    calls = [p["functionCall"]["name"] for c in asked[-1].body["contents"] if c.get("role") == "model"
             for p in c.get("parts") or () if "functionCall" in p]
    assert calls == ["write_file"], asked[-1].body["contents"]
