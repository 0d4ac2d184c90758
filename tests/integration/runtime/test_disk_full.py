"""Runs on a full disk: the run ends ``Failed`` with reason ``DiskFull`` and a message naming the
file and the space left (not a ``Running`` run whose monitor logs a traceback every poll, nor
``RunnerLost`` once space returns), the agent is stopped, and runs work again when space returns.
The runtime's data dir is a real 2 MiB tmpfs."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from integration.runtime.helpers import group_members, python_agent, spec, wait_for
from joch.runtime import runner
from joch.runtime.base import RunState
from joch.runtime.local import LocalRuntime
from support.disks import fill, tmpfs

FLOOD = "import sys\nwhile True: sys.stdout.write('x' * 65536)\n"
FILL_AND_FAIL = ("import sys\n"
                 "try:\n"
                 "    with open('junk', 'wb') as f:\n"
                 "        while True: f.write(b'x' * 65536)\n"
                 "except OSError:\n"
                 "    sys.exit(3)\n")  # silently: a line of output would fail on the log first


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", size="2m") as mounted:
        yield mounted


@pytest.fixture
def small(disk: Path) -> Iterator[LocalRuntime]:
    rt = LocalRuntime(disk / "data", poll_interval=0.02)
    yield rt
    rt.close()


def finished(rt: LocalRuntime, ref: dict[str, object], timeout: float = 20) -> RunState:
    return wait_for(lambda: (s := rt.status(ref)).finished and s, timeout)  # type: ignore[no-any-return]


def quiet(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("joch")]


def test_an_agent_whose_output_fills_the_disk_fails_disk_full(
        small: LocalRuntime, disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    ref = small.submit(spec(python_agent(FLOOD), uid="flood"))
    state = finished(small, ref)

    assert (state.phase, state.reason) == ("Failed", "DiskFull")
    log = small.files(spec([], uid="flood").run).log
    assert state.message is not None
    assert state.message.startswith(f"the disk is full: cannot write {log} (")
    assert state.message.endswith("bytes free on its filesystem); the agent was stopped")
    assert state.pid is not None
    wait_for(lambda: group_members(state.pid or 0) == [], timeout=5)
    assert runner.read_state(small.files(spec([], uid="flood").run).state) == state  # recorded, durably
    assert not quiet(caplog), quiet(caplog)  # no traceback, no repeated warnings

    small.cleanup(ref, keep_records=False)  # space returns
    again = small.submit(spec(python_agent("print('fine')"), uid="after"))
    assert (finished(small, again).phase, b"".join(small.logs(again))) == ("Succeeded", b"fine\n")


def test_an_agent_that_fails_on_a_full_disk_is_disk_full_not_agent_failed(small: LocalRuntime, disk: Path) -> None:
    ref = small.submit(spec(python_agent(FILL_AND_FAIL), uid="filler"))
    state = finished(small, ref)
    assert (state.phase, state.reason, state.exit_code) == ("Failed", "DiskFull", 3)
    assert state.message is not None and state.message.startswith("agent exited with code 3; the disk is full: ")
    assert str(disk / "data") in state.message


def test_a_runner_that_could_not_record_its_end_on_a_full_disk_is_disk_full_not_lost(
        small: LocalRuntime, disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    ref = small.submit(spec(python_agent("import time; print('up', flush=True); time.sleep(60)"), uid="stuck"))
    files = small.files(spec([], uid="stuck").run)
    wait_for(lambda: b"".join(small.logs(ref)) == b"up\n")
    agent = runner.read_state(files.state)
    assert agent is not None and agent.pid is not None
    files.reserve.unlink()  # so nothing can be freed to write the record
    ballast = fill(disk)
    os.kill(ref["runnerPid"], signal.SIGKILL)  # as if it died writing

    with ThreadPoolExecutor(4) as pool:  # callers racing the monitor to decide its end get one answer
        answers = list(pool.map(lambda _: finished(small, ref), range(4)))
    state = finished(small, ref)
    assert answers == [state] * 4
    assert (state.phase, state.reason) == ("Failed", "DiskFull")
    assert state.message == (f"the runner ended without recording an outcome while the agent ran; agent killed, "
                             f"and the disk holding {files.dir} is full (0 bytes free)")
    wait_for(lambda: group_members(agent.pid or 0) == [], timeout=5)
    for _ in range(5):
        assert small.status(ref) == state  # the same answer every time, though it is not on disk yet
    assert runner.read_state(files.state) == agent
    warned = quiet(caplog)
    assert len(warned) == 1 and "is recorded once space returns" in warned[0], warned  # once, no traceback

    ballast.unlink()
    recorded = wait_for(lambda: (s := runner.read_state(files.state)) is not None and s.finished and s)
    assert (recorded.phase, recorded.reason, recorded.message) == ("Failed", "DiskFull", state.message)
    assert small.status(ref) == recorded
