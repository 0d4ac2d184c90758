"""scripts/venv (what `make run` and `make test` set up with) refuses an interpreter it cannot use
in one line saying why, and creates nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HINT = "Joch needs Python >= 3.11 (set PYTHON=/path/to/python3.11)"


def venv(python: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / "scripts/venv"), python, str(tmp_path / "venv"), "requirements.lock"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_an_interpreter_that_does_not_run_is_named_with_its_first_words(tmp_path: Path) -> None:
    # What `make run PYTHON=python3.10` meets under pyenv when 3.10 is installed but not selected.
    shim = tmp_path / "python3.10"
    shim.write_text('#!/bin/sh\necho "pyenv: python3.10: command not found" >&2\necho >&2\n'
                    'echo "The `python3.10\' command exists in these Python versions:" >&2\nexit 127\n')
    shim.chmod(0o755)
    done = venv(str(shim), tmp_path)
    assert done.returncode == 1
    assert done.stderr == f"error: {shim} does not run (pyenv: python3.10: command not found); {HINT}\n"
    assert not (tmp_path / "venv").exists()


def test_an_old_python_is_named_with_its_version(tmp_path: Path) -> None:
    candidates = [shutil.which("python3.10"), *map(str, sorted(Path.home().glob(".pyenv/versions/3.10*/bin/python3")))]
    for old in filter(None, candidates):
        probe = subprocess.run([old, "-V"], capture_output=True, text=True, check=False)
        if probe.returncode == 0:
            break
    else:
        pytest.skip("no runnable python3.10 here")
    version = probe.stdout.split()[1]
    done = venv(old, tmp_path)
    assert done.returncode == 1
    assert done.stderr == (f"error: Joch needs Python >= 3.11; {old} is Python {version} "
                           "(set PYTHON=/path/to/python3.11)\n")
    assert not (tmp_path / "venv").exists()


def test_a_missing_interpreter(tmp_path: Path) -> None:
    done = venv("python3.9x", tmp_path)
    assert (done.returncode, done.stderr) == (1, f"error: python3.9x not found; {HINT}\n")
