"""What the runner recorded of an attempt, into the AgentRun's status (issue 9 §2)."""

from __future__ import annotations

from joch.api.kinds import AgentRunStatus
from joch.controllers.invocations import note_runtime_facts
from joch.runtime.base import Invocation, RefusedArtifact, RunState, Sandbox, Session


def test_every_recorded_fact_lands_in_status_and_validates() -> None:
    state = RunState(
        phase="Running", base_commit="3f2a" * 10,
        invocation=Invocation(argv=("codex", "exec", "[REDACTED]"), env=("CODEX_API_KEY", "HOME"),
                              executable="/usr/bin/codex", version="codex-cli 0.169.0", sha256="ab" * 32),
        sandbox=Sandbox(mode="none", network="on", reason="bwrap is not installed"),
        session=Session(id="s-1", resumed_from=1),
        omitted=(RefusedArtifact(name="big.bin", path="big.bin", size=2_000_000, message="over 1 MiB"),),
    )
    status = {"attempt": 2, "phase": "Running"}
    note_runtime_facts(status, state)
    assert status["invocation"] == {"argv": ["codex", "exec", "[REDACTED]"], "env": ["CODEX_API_KEY", "HOME"],
                                    "executable": "/usr/bin/codex", "version": "codex-cli 0.169.0",
                                    "sha256": "ab" * 32}
    assert status["baseCommit"] == "3f2a" * 10
    assert status["sandbox"] == {"mode": "none", "network": "on", "reason": "bwrap is not installed"}
    assert status["session"] == {"id": "s-1", "attempt": 2, "resumedFromAttempt": 1}
    assert status["omitted"] == [{"path": "big.bin", "size": 2_000_000, "message": "over 1 MiB"}]
    AgentRunStatus.model_validate(status)  # the status schema takes what the controller writes


def test_facts_not_recorded_yet_leave_status_as_it_is() -> None:
    status = {"attempt": 2, "session": {"id": "s-1", "attempt": 2, "resumedFromAttempt": 1}}
    note_runtime_facts(status, RunState(phase="Preparing"))
    assert status == {"attempt": 2, "session": {"id": "s-1", "attempt": 2, "resumedFromAttempt": 1}}
