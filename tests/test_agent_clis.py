"""scripts/agent-clis (what `make test` installs the real agent CLIs with): the versions installed
are the pinned ones, a warm cache is a quick no-op, and tests/support/agents.py finds each CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from support.agents import AGENTS, agent_binary, require_agent

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "tests" / "agents"


def pinned() -> dict[str, str]:
    """Each CLI's pinned version, from tests/agents/package.json and aider.in."""
    npm = json.loads((PINS / "package.json").read_text())["dependencies"]
    aider = re.search(r"^aider-chat==(\S+)$", (PINS / "aider.in").read_text(), re.M)
    assert aider is not None
    return {"codex": npm["@openai/codex"], "claude": npm["@anthropic-ai/claude-code"],
            "gemini": npm["@google/gemini-cli"], "opencode": npm["opencode-ai"], "aider": aider.group(1)}


def test_the_npm_lock_pins_what_package_json_asks_for() -> None:
    lock = json.loads((PINS / "package-lock.json").read_text())
    wanted = json.loads((PINS / "package.json").read_text())["dependencies"]
    assert lock["packages"][""]["dependencies"] == wanted
    for name, version in wanted.items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == version, name
    aider_lock = (PINS / "aider.lock").read_text()
    assert f"aider-chat=={pinned()['aider']} \\" in aider_lock
    assert all("--hash=sha256:" in block for block in aider_lock.split("\n\n") if "==" in block)


@pytest.mark.parametrize("name", AGENTS)
def test_each_installed_cli_is_the_pinned_version(name: str, tmp_path: Path) -> None:
    binary = require_agent(name)
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "HOME": str(tmp_path)}, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert pinned()[name] in done.stdout.splitlines()[0], done.stdout


def test_a_warm_cache_is_a_quick_no_op() -> None:
    if any(agent_binary(name) is None for name in AGENTS):
        require_agent(next(name for name in AGENTS if agent_binary(name) is None))
    started = time.monotonic()
    done = subprocess.run([str(ROOT / "scripts" / "agent-clis")], capture_output=True, text=True, timeout=120,
                          check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")  # nothing installed again
    assert time.monotonic() - started < 10


def test_an_unknown_cli_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match='unknown agent CLI "cursor"'):
        agent_binary("cursor")


def test_a_cache_without_the_clis_finds_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOCH_AGENT_CACHE", str(tmp_path))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "codex").symlink_to(tmp_path / "gone")
    assert [agent_binary(name) for name in AGENTS] == [None] * len(AGENTS)
