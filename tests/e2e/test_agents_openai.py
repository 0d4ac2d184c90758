"""The OpenAI-protocol presets run their real CLIs through Joch: a real ``joch server`` process, the
pinned Codex CLI, aider and OpenCode (``scripts/agent-clis``), and a fake model on 127.0.0.1
(tests/support/fake_openai.py) that answers with a scripted edit.

Each test applies only a Secret, the preset from examples/providers/ as it is, and an Agent pointing
the preset's ``baseUrl`` parameter at the fake model (plus a Model to price the tokens): no
hand-edited environment, nothing in the server's HOME. A missing CLI skips its test outside CI and
fails it in CI (tests/support/agents.py).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import stop_server, wait_ready
from support.agents import agent_bin_dir, require_agent
from support.fake_openai import USAGE, FakeOpenAI, Script

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "examples" / "providers"
JOCH = Path(sys.executable).with_name("joch")
RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"
KEY = "sk-fake-key-for-joch-e2e"
PRICING = {"inputPerMillionUsd": 1.25, "cachedInputPerMillionUsd": 0.125, "outputPerMillionUsd": 10.0}


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
    runs to change. Its ``--sandbox`` is the default, ``auto`` (bwrap where it works, as another user
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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOCH_", "OPENAI_", "CODEX_"))}
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


def setup(joch: Joch, preset: str, fake: FakeOpenAI, *, retry_limit: int = 0, **parameters: str) -> str:
    """Apply the Secret, the preset file as it is, a Model pricing the fake's model and an Agent
    pointing the preset at the fake; the Agent's name."""
    model = parameters.setdefault("model", "gpt-test")
    joch.apply(
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "openai"},
         "spec": {"stringData": {"api-key": KEY}}},
        (PRESETS / f"{preset}.yaml").read_text(),
        {"apiVersion": "model.joch.dev/v1alpha1", "kind": "Model", "metadata": {"name": "fake-model"},
         "spec": {"provider": "openai", "modelId": model, "pricing": PRICING}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": preset},
         "spec": {"providerRef": {"name": preset}, "modelRoute": "fake-model",
                  "security": {"allowedSecrets": ["openai"]},
                  "defaults": {"parameters": {"baseUrl": fake.url, **parameters}, "retryLimit": retry_limit}}},
    )
    return preset


def changed_files(patch: str) -> list[str]:
    return [line.split(" b/", 1)[1] for line in patch.splitlines() if line.startswith("diff --git ")]


def assert_only_the_edit(joch: Joch, name: str, status: dict[str, Any]) -> None:
    assert status["phase"] == "Succeeded", (status, joch.logs(name), joch.log.read_text()[-3000:])
    patch = joch.artifact(name, "changes.patch")
    assert changed_files(patch) == ["hello.txt"], patch
    assert "+hello from the fake model" in patch


def assert_asked_with_the_key(fake: FakeOpenAI, model: str) -> None:
    asked = fake.model_requests()
    assert asked, "the CLI never reached the fake model"
    assert {r.bearer() for r in asked} == {KEY}
    assert model in {r.model for r in asked}


# --- Codex CLI ------------------------------------------------------------------------------------

def test_codex_edits_through_joch_and_its_usage_and_cost_land_in_status(joch: Joch) -> None:
    require_agent("codex")
    with FakeOpenAI() as fake:
        agent = setup(joch, "codex", fake, retries="0")
        joch.start("codex-1", agent)
        status = joch.wait_ended("codex-1")
    assert_only_the_edit(joch, "codex-1", status)
    assert_asked_with_the_key(fake, "gpt-test")
    assert {r.path for r in fake.model_requests()} == {"/v1/responses"}
    # One turn, two model calls (the edit, then the final message).
    calls = 2
    usage = status["usage"]
    assert (usage["inputTokens"], usage["cachedTokens"], usage["outputTokens"]) == (
        calls * USAGE["input"], calls * USAGE["cached"], calls * USAGE["output"])
    expected = calls * ((USAGE["input"] - USAGE["cached"]) * PRICING["inputPerMillionUsd"]
                        + USAGE["cached"] * PRICING["cachedInputPerMillionUsd"]
                        + USAGE["output"] * PRICING["outputPerMillionUsd"]) / 1e6
    assert status["costUsd"] == pytest.approx(expected)
    assert joch.artifact("codex-1", "summary").strip() == "I wrote hello.txt."
    assert (status.get("session") or {}).get("id"), status  # Codex's thread id, for resuming
    assert KEY not in json.dumps(joch.run("codex-1")) and KEY not in joch.logs("codex-1")


def test_codex_with_the_model_down_fails(joch: Joch) -> None:
    require_agent("codex")
    with FakeOpenAI(mode="down") as fake:
        agent = setup(joch, "codex", fake, retries="0")  # the preset's retries parameter keeps this short
        joch.start("codex-down", agent)
        status = joch.wait_ended("codex-down")
    assert status["phase"] == "Failed", (status, joch.logs("codex-down"))
    assert '"type":"turn.failed"' in joch.logs("codex-down")
    assert len(fake.model_requests()) <= 2


def test_two_concurrent_codex_runs_see_different_homes(joch: Joch) -> None:
    require_agent("codex")
    script = Script(command='printf "%s\\n" "$HOME" "$CODEX_HOME" > hello.txt', final="Done.")
    with FakeOpenAI(script=script) as fake:
        agent = setup(joch, "codex", fake, retries="0")
        for name in ("home-a", "home-b"):
            joch.start(name, agent)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            ended = dict(zip(("home-a", "home-b"), pool.map(joch.wait_ended, ("home-a", "home-b")), strict=True))
    homes = {}
    for name, status in ended.items():
        assert status["phase"] == "Succeeded", (status, joch.logs(name))
        patch = joch.artifact(name, "changes.patch")
        assert changed_files(patch) == ["hello.txt"], patch
        home, codex_home = [line[1:] for line in patch.splitlines() if line.startswith("+") and not
                            line.startswith("+++")]
        assert codex_home == f"{home}/.codex"
        homes[name] = home
    assert homes["home-a"] != homes["home-b"], homes
    assert os.path.expanduser("~") not in homes.values()


@pytest.mark.parametrize("joch", ["auto"], indirect=True)
def test_codex_runs_inside_jochs_sandbox_as_another_user(joch: Joch) -> None:
    """The preset in Joch's sandbox (bwrap; as uid 65534 when the server runs as root): Codex runs
    without a sandbox of its own and edits the worktree, in its own HOME."""
    require_agent("codex")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (make sandbox-tools)")
    script = Script(command='printf "%s\\n" "$HOME" "$(id -u)" > hello.txt', final="Done.")
    with FakeOpenAI(script=script) as fake:
        agent = setup(joch, "codex", fake, retries="0")
        joch.start("boxed", agent)
        status = joch.wait_ended("boxed")
    assert status["phase"] == "Succeeded", (status, joch.logs("boxed"))
    assert status["sandbox"]["mode"] == "bwrap", status["sandbox"]
    patch = joch.artifact("boxed", "changes.patch")
    assert changed_files(patch) == ["hello.txt"], patch
    home, uid = [line[1:] for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert home.endswith("/home") and home != os.path.expanduser("~")
    if os.geteuid() == 0:
        assert uid != "0"


# --- aider ----------------------------------------------------------------------------------------

def test_aider_edits_and_its_patch_holds_only_the_edit(joch: Joch) -> None:
    require_agent("aider")
    with FakeOpenAI() as fake:
        agent = setup(joch, "aider", fake, model="openai/gpt-test")
        joch.start("aider-1", agent)
        status = joch.wait_ended("aider-1")
    assert_only_the_edit(joch, "aider-1", status)  # no .aider.tags.cache.v4/, no .aider* history
    assert_asked_with_the_key(fake, "gpt-test")
    assert "hello.txt" in joch.artifact("aider-1", "summary")  # aider's chat transcript
    usage = status["usage"]
    # aider says "1.2k sent, 80 received"
    assert (usage["inputTokens"], usage["outputTokens"]) == (USAGE["input"], USAGE["output"])


def test_aider_with_a_refused_key_fails_instead_of_succeeding(joch: Joch) -> None:
    """Aider gives up on a 401 at once and exits 0: the run must still fail, with aider's error."""
    require_agent("aider")
    with FakeOpenAI(mode="unauthorized") as fake:
        agent = setup(joch, "aider", fake, model="openai/gpt-test")
        joch.start("aider-401", agent)
        status = joch.wait_ended("aider-401")
    assert status["phase"] == "Failed", (status, joch.logs("aider-401"))
    assert status["reason"] in ("AgentReportedError", "FailurePattern"), status
    assert "AuthenticationError" in status.get("message", ""), status


@pytest.mark.timeout(300)
def test_aider_with_the_model_down_fails_instead_of_succeeding(joch: Joch) -> None:
    """A model that answers 500 to everything: aider retries for about a minute (its own schedule,
    which no flag shortens), then exits 0 having done nothing. The run fails with aider's error."""
    require_agent("aider")
    with FakeOpenAI(mode="down") as fake:
        agent = setup(joch, "aider", fake, model="openai/gpt-test", timeout="5")
        joch.start("aider-down", agent)
        status = joch.wait_ended("aider-down", seconds=240)
    assert status["phase"] == "Failed", (status, joch.logs("aider-down"))
    assert status["reason"] in ("AgentReportedError", "FailurePattern"), status
    assert "InternalServerError" in status.get("message", ""), status
    assert len(fake.model_requests()) > 1  # it did retry


# --- OpenCode -------------------------------------------------------------------------------------

def test_opencode_edits_through_joch_and_reports_usage(joch: Joch) -> None:
    require_agent("opencode")
    with FakeOpenAI() as fake:
        agent = setup(joch, "opencode", fake)
        joch.start("opencode-1", agent)
        status = joch.wait_ended("opencode-1")
    assert_only_the_edit(joch, "opencode-1", status)
    assert_asked_with_the_key(fake, "gpt-test")
    usage = status["usage"]
    # OpenCode's two steps (the edit, the final message); its title request reports no step.
    assert (usage["inputTokens"], usage["cachedTokens"], usage["outputTokens"]) == (
        2 * USAGE["input"], 2 * USAGE["cached"], 2 * USAGE["output"])
    assert (status.get("session") or {}).get("id", "").startswith("ses_"), status


# --- resuming -------------------------------------------------------------------------------------

@pytest.mark.timeout(240)
@pytest.mark.parametrize("joch", ["auto", "none"], indirect=True)
def test_codex_resumes_its_session_after_the_runner_is_killed(joch: Joch) -> None:
    """The runner is killed (-9) while Codex waits for the model mid-task; the retry starts
    `codex exec resume <thread id>` in the same worktree with the same HOME, and Codex continues
    the conversation (its earlier tool call is in what it sends) instead of starting over."""
    require_agent("codex")
    with FakeOpenAI(hold=True) as fake:
        agent = setup(joch, "codex", fake, retry_limit=1, retries="0")
        joch.start("resumed", agent)
        assert fake.held.wait(60), joch.logs("resumed")  # attempt 1 made its edit and asks the model again
        deadline = time.monotonic() + 30
        while not ((run := joch.run("resumed"))["status"].get("session") or {}).get("id"):
            assert time.monotonic() < deadline, run["status"]
            time.sleep(0.1)
        thread = run["status"]["session"]["id"]
        os.kill(int(run["status"]["runtimeRef"]["runnerPid"]), 9)
        status = joch.wait_ended("resumed", seconds=120)
        fake.release()
    assert status["phase"] == "Succeeded", (status, joch.logs("resumed"))
    assert status["attempt"] == 2
    # Attempt 1 was killed before its turn ended, so it reported nothing; attempt 2's turn reports the
    # thread's total: attempt 1's answered call and its own (the held one was never answered).
    usage = status["usage"]
    assert (usage["inputTokens"], usage["outputTokens"]) == (2 * USAGE["input"], 2 * USAGE["output"])
    assert status["session"]["id"] == thread and status["session"]["resumedFromAttempt"] == 1, status["session"]
    assert "resume" in status["invocation"]["argv"] and thread in status["invocation"]["argv"]
    last = fake.model_requests()[-1].body
    assert any(i.get("type") == "function_call" for i in last["input"])  # attempt 1's tool call, continued
    assert "interrupted" in json.dumps(last["input"])
    patch = joch.artifact("resumed", "changes.patch")
    assert changed_files(patch) == ["hello.txt"], patch  # attempt 1's edit, kept in the same worktree


# --- budgets --------------------------------------------------------------------------------------

@pytest.mark.timeout(240)
def test_a_run_over_its_budget_stops_opencode_mid_run(joch: Joch) -> None:
    """OpenCode's usage is read per model call while it runs: once the first call (its edit) costs
    more than the run may spend, Joch stops it. The fake model holds the call after the edit, so
    OpenCode cannot finish before that."""
    require_agent("opencode")
    with FakeOpenAI(hold=True) as fake:
        agent = setup(joch, "opencode", fake)
        run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "capped"},
               "spec": {"agentRef": {"name": agent}, "implementation": {"inline": {"text": "Create hello.txt."}},
                        "execution": {"coordinates": {"git": {"url": str(joch.repo)}}}, "budgetUsd": 0.001}}
        r = httpx.post(f"{joch.base}{RUNS}", json=run, timeout=10)
        assert r.status_code in (200, 201), r.text
        status = joch.wait_ended("capped", seconds=120)
    assert (status["phase"], status["reason"]) == ("Failed", "BudgetExceeded"), status
    assert status["costUsd"] > 0.001, status


@pytest.mark.timeout(240)
def test_opencode_resumes_its_session_after_the_runner_is_killed(joch: Joch) -> None:
    """The same for OpenCode: the retry starts `opencode run --session <id>` and OpenCode sends the
    conversation so far (its earlier tool call) with the new message."""
    require_agent("opencode")
    with FakeOpenAI(hold=True) as fake:
        agent = setup(joch, "opencode", fake, retry_limit=1)
        joch.start("resumed", agent)
        assert fake.held.wait(60), joch.logs("resumed")
        deadline = time.monotonic() + 30
        while not ((run := joch.run("resumed"))["status"].get("session") or {}).get("id"):
            assert time.monotonic() < deadline, run["status"]
            time.sleep(0.1)
        session = run["status"]["session"]["id"]
        os.kill(int(run["status"]["runtimeRef"]["runnerPid"]), 9)
        status = joch.wait_ended("resumed", seconds=120)
        fake.release()
    assert status["phase"] == "Succeeded", (status, joch.logs("resumed"))
    assert status["attempt"] == 2
    assert status["session"]["id"] == session and status["session"]["resumedFromAttempt"] == 1, status["session"]
    argv = status["invocation"]["argv"]
    assert argv[argv.index("--session") + 1] == session
    last = [r.body for r in fake.model_requests() if r.body.get("tools")][-1]
    assert any(m.get("role") == "tool" for m in last["messages"])  # attempt 1's tool call and its result
    assert "interrupted" in json.dumps(last["messages"])
    assert changed_files(joch.artifact("resumed", "changes.patch")) == ["hello.txt"]
