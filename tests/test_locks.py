"""The lock files stay in step with pyproject.toml: every dependency is pinned, and the run lock
agrees with the dev lock on every package they share (``make lock`` regenerates both)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.M)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lock: str) -> dict[str, str]:
    return {_canonical(name): version for name, version in _PIN.findall((ROOT / lock).read_text())}


def _names(requirements: list[str]) -> set[str]:
    found = (_NAME.match(requirement) for requirement in requirements)
    return {_canonical(match.group(0)) for match in found if match}


def test_every_dependency_is_pinned_in_its_lock() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    build = _names(project["build-system"]["requires"])
    run = _names(project["project"]["dependencies"])
    dev = _names(project["project"]["optional-dependencies"]["dev"])
    assert run | build <= set(_pins("requirements.lock")), "run `make lock`"
    assert run | dev | build <= set(_pins("requirements-dev.lock")), "run `make lock`"


def test_the_run_lock_is_the_dev_lock_without_the_dev_tools() -> None:
    run, dev = _pins("requirements.lock"), _pins("requirements-dev.lock")
    assert {name: dev.get(name) for name in run} == run, "run `make lock`"
