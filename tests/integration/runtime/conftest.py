"""Fixtures for the runtime tests: a real upstream repository, runner runs, a local runtime."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from integration.runtime.helpers import Repo, RunnerRun, make_repo, run_files_factory
from joch.runtime.local import LocalRuntime


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return make_repo(tmp_path / "upstream")


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., RunnerRun]:
    return run_files_factory(tmp_path)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = LocalRuntime(tmp_path / "data", poll_interval=0.02)
    yield rt
    rt.close()
