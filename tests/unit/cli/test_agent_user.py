"""``joch server|controller --agent-user`` and ``--sandbox``'s reason, as the controller options
carry them to the local runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from joch.api import errors
from joch.cli.serving import controller_options
from joch.controllers.options import ControllerOptions


def options(tmp_path: Path, *, sandbox: str = "none", agent_user: str | None = None) -> ControllerOptions:
    return controller_options(data_dir=tmp_path / "data", max_concurrent_runs=1, max_concurrent_runs_per_namespace=None,
                              lease_duration=15.0, identity="x", sandbox=sandbox, agent_user=agent_user)


def test_the_agent_user_is_resolved_to_uid_and_gid(tmp_path: Path) -> None:
    assert options(tmp_path, agent_user="nobody").agent_user == "65534:65534"
    assert options(tmp_path, agent_user="4321:4322").agent_user == "4321:4322"
    assert options(tmp_path).agent_user is None


def test_an_unknown_agent_user_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(errors.BadRequest, match='--agent-user: no user "no-such-user-here"'):
        options(tmp_path, agent_user="no-such-user-here")


def test_the_reason_for_no_sandbox_is_kept_for_each_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert options(tmp_path, sandbox="none").sandbox_reason == "the server was started with --sandbox none"
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found
    chosen = options(tmp_path, sandbox="auto")
    assert chosen.sandbox == "none"
    assert chosen.sandbox_reason == "--sandbox auto: bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
