"""A sandboxed agent shares the host's network namespace, so it reaches the run callback on
127.0.0.1 (``JOCH_API_URL``) as it reaches a model API. bubblewrap is not needed to check the command
line; ``tests/integration/controllers/test_cost.py`` runs a sandboxed agent against the callback
where bubblewrap works."""

from __future__ import annotations

from pathlib import Path

from joch.runtime import runner, sandbox, workspace


def test_the_sandbox_does_not_unshare_the_network(tmp_path: Path) -> None:
    checkout = workspace.Checkout(root=tmp_path / "w", path=tmp_path / "w", base=None, mirror=None)
    files = runner.RunFiles(tmp_path / "run")
    command = sandbox.sandboxed("/usr/bin/python3", ["-c", "pass"], checkout=checkout, files=files,
                                home=tmp_path / "home", hide=())
    assert "--unshare-pid" in command
    assert not {"--unshare-net", "--unshare-all", "--unshare-user-try"} & set(command)
