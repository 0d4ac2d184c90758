"""``joch server``/``joch controller`` options that keep secrets away from agents: ``--store-file``,
the warning for a password in ``--store``, and ``--sandbox``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joch.cli import main, serving

runner = CliRunner()


def invoke(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(main.app, list(args), env={"JOCH_STORE": None, "JOCH_STORE_FILE": None, **(env or {})})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_the_store_url_comes_from_a_file(tmp_path: Path) -> None:
    url_file = tmp_path / "store-url"
    url_file.write_text("postgresql://joch:pw@db/joch\nignored\n")
    assert serving.store_source(None, url_file) == "postgresql://joch:pw@db/joch"


@pytest.mark.parametrize(("setup", "message"), [
    ("missing", 'cannot read --store-file "{path}": No such file or directory'),
    ("empty", '--store-file "{path}" is empty: write the store URL on its first line'),
    ("both", "give the store URL once: --store (JOCH_STORE) or --store-file (JOCH_STORE_FILE)"),
])
def test_store_file_mistakes_are_one_line(tmp_path: Path, setup: str, message: str) -> None:
    path = tmp_path / "store-url"
    if setup != "missing":
        path.write_text("" if setup == "empty" else "sqlite:///x.db\n")
    extra = ["--store", "sqlite:///y.db"] if setup == "both" else []
    code, out, err = invoke("server", "--store-file", str(path), *extra, "--data-dir", str(tmp_path / "d"),
                            "--port", "0", "--sandbox", "none")
    assert code == 2 and out == ""
    assert err == f"error: {message.format(path=path)}\n"


def test_a_password_in_store_is_warned_about(capsys: pytest.CaptureFixture[str]) -> None:
    assert serving.store_source("postgresql://joch:hunter2@db/joch", None) == "postgresql://joch:hunter2@db/joch"
    warning = capsys.readouterr().err
    assert warning.startswith("warning: the store URL in --store/JOCH_STORE has a password")
    assert "hunter2" not in warning
    serving.store_source("postgresql://joch@db/joch", None)
    assert capsys.readouterr().err == ""


def test_sandbox_bwrap_without_bubblewrap_refuses_to_start(tmp_path: Path) -> None:
    joch = Path(sys.executable).parent / "joch"
    done = subprocess.run([str(joch), "server", "--sandbox", "bwrap", "--data-dir", str(tmp_path / "d"), "--port",
                           "1"], env={**os.environ, "PATH": str(tmp_path)}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("error: --sandbox bwrap: bwrap is not installed (Debian/Ubuntu: apt-get install "
                           "bubblewrap); install bubblewrap, or choose --sandbox auto or none\n")


def test_sandbox_auto_without_bubblewrap_warns(tmp_path: Path) -> None:
    joch = Path(sys.executable).parent / "joch"
    done = subprocess.run([str(joch), "server", "--sandbox", "auto", "--data-dir", str(tmp_path / "d"), "--port",
                           "99999"], env={**os.environ, "PATH": str(tmp_path)}, capture_output=True, text=True,
                          timeout=60, check=False)
    warning, error = done.stderr.splitlines()
    assert warning.startswith("warning: agents run without a sandbox (bwrap is not installed")
    assert error == "error: --port must be between 1 and 65535 (got 99999)"


def test_an_unknown_sandbox_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = invoke("server", "--sandbox", "docker", "--data-dir", str(tmp_path / "d"))
    assert code == 2 and err == 'error: --sandbox must be auto, bwrap or none (got "docker")\n'
