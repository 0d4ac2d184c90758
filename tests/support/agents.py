"""The real agent CLIs the tests drive: where ``scripts/agent-clis`` installed them, and what a test
does when one is missing.

``make test`` runs ``scripts/agent-clis`` first, which installs the pinned CLIs (Codex CLI, Claude
Code, Gemini CLI, OpenCode from ``tests/agents/package-lock.json``; aider from
``tests/agents/aider.lock``) into ``${JOCH_AGENT_CACHE:-~/.cache/joch-agents}`` and links each into
its ``bin/``. A test asks for one with ``require_agent("codex")``: outside CI a missing CLI skips the
test (a machine without npm, say); in CI (``CI`` set) it fails it, since there the CLIs must be there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

AGENTS = ("codex", "claude", "gemini", "opencode", "aider")
"""The CLIs ``scripts/agent-clis`` installs, by the name of their executable."""

ROOT = Path(__file__).resolve().parents[2]


def agent_cache() -> Path:
    """The directory ``scripts/agent-clis`` installs into."""
    configured = os.environ.get("JOCH_AGENT_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "joch-agents"


def agent_binary(name: str) -> Path | None:
    """The installed executable ``name`` (one of ``AGENTS``) as an absolute path with its links
    resolved, or None when it is not installed (or its link points nowhere)."""
    if name not in AGENTS:
        raise ValueError(f'unknown agent CLI "{name}" (known: {", ".join(AGENTS)})')
    link = agent_cache() / "bin" / name
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return target if target.is_file() and os.access(target, os.X_OK) else None


def require_agent(name: str) -> Path:
    """``agent_binary(name)``, or skip the test when it is missing (fail it instead under CI)."""
    found = agent_binary(name)
    if found is not None:
        return found
    problem = (f"the {name} CLI is not installed in {agent_cache() / 'bin'} "
               f"(run scripts/agent-clis or `make agent-clis`)")
    if os.environ.get("CI"):
        pytest.fail(f"{problem}; CI must run the real agent CLIs")
    pytest.skip(problem)


def agent_bin_dir() -> Path:
    """The directory holding one link per installed CLI: put it first on an agent's PATH, so a
    provider can name its binary plainly (``binary: codex``)."""
    return agent_cache() / "bin"
