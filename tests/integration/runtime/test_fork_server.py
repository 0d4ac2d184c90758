"""The local runtime's fork server: runners forked from one pre-imported process, told apart by
their start time, replaced when it dies, bypassed when it cannot be used; ends noticed at once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from integration.runtime.helpers import pid_alive, python_agent, spec, wait_for
from joch.runtime import local as local_module
from joch.runtime import runner
from joch.runtime.base import RunId, RunState
from joch.runtime.local import LocalRuntime

GATED = ("import os, sys, time\n"
         "open(sys.argv[2], 'a').write('started\\n')\n"
         "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n")


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[1])


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def finished(rt: LocalRuntime, ref: dict[str, Any]) -> RunState:
    return wait_for(lambda: (s := rt.status(ref)).finished and s, 15)  # type: ignore[no-any-return]


def gated_run(rt: LocalRuntime, tmp_path: Path, uid: str) -> tuple[dict[str, Any], Path, Path]:
    go, starts = tmp_path / f"go-{uid}", tmp_path / f"starts-{uid}"
    ref = rt.submit(spec([*python_agent(GATED), str(go), str(starts)], uid=uid))
    wait_for(starts.exists)
    return ref, go, starts


def test_runners_are_forked_from_one_fork_server(local: LocalRuntime, tmp_path: Path) -> None:
    first, go_first, _ = gated_run(local, tmp_path, "f-1")
    second, go_second, _ = gated_run(local, tmp_path, "f-2")
    server = parent_of(first["runnerPid"])
    assert server == parent_of(second["runnerPid"]) != os.getpid()
    assert runner.FORK_SERVER in cmdline(server)
    assert first["runnerStart"] == runner.process_start(first["runnerPid"])
    assert local.status(first).phase == "Running"
    go_first.touch()
    go_second.touch()
    assert finished(local, first).phase == finished(local, second).phase == "Succeeded"
    wait_for(lambda: not Path(f"/proc/{first['runnerPid']}").exists())  # reaped by the fork server
    assert (Path(first["dir"]) / "runner.log").read_text() == ""


def test_runners_outlive_their_fork_server_which_is_replaced(local: LocalRuntime, tmp_path: Path) -> None:
    first, go, starts = gated_run(local, tmp_path, "f-3")
    server = parent_of(first["runnerPid"])
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: not pid_alive(server))

    second = local.submit(spec(["true"], uid="f-4"))
    assert finished(local, second).phase == "Succeeded"
    assert parent_of(first["runnerPid"]) != server  # the first runner goes on, adopted by init
    assert local.status(first).phase == "Running"
    go.touch()
    assert finished(local, first).phase == "Succeeded" and starts.read_text() == "started\n"


def test_without_the_fork_server_runners_are_executed(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path / "data", poll_interval=0.02)
    try:
        rt._forks._usable = False  # as where there is no /proc or no fork
        ref, go, _ = gated_run(rt, tmp_path, "f-5")
        assert parent_of(ref["runnerPid"]) == os.getpid()
        assert f"{ref['dir']}/spec.json" in cmdline(ref["runnerPid"])
        go.touch()
        assert finished(rt, ref).phase == "Succeeded"
    finally:
        rt.close()


def test_a_pid_that_started_at_another_time_is_not_the_runner(local: LocalRuntime) -> None:
    s = spec(["true"], uid="f-6")
    files = local.files(s.run)
    files.dir.mkdir(parents=True)
    files.spec.write_text(s.to_json())
    # This process is alive, and its command line does not matter once a start time is known.
    start = runner.process_start(os.getpid())
    assert start is not None
    ref = {"type": "local", "id": "f-6/1", "runnerPid": os.getpid(), "runnerStart": start + 1}
    state = local.status(ref)
    assert (state.phase, state.reason) == ("Lost", "RunnerLost")


def test_an_unanswered_request_never_starts_a_second_runner(local: LocalRuntime, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    real_spawn = local._forks.spawn

    def spawn_then_die(**kwargs: Any) -> tuple[int, int | None]:
        real_spawn(**kwargs)  # the runner starts, but the answer is lost
        raise local_module._Unanswered

    monkeypatch.setattr(local._forks, "spawn", spawn_then_die)
    ref, go, starts = gated_run(local, tmp_path, "f-7")
    assert isinstance(ref["runnerPid"], int) and local.status(ref).phase == "Running"
    go.touch()
    assert finished(local, ref).phase == "Succeeded"
    assert starts.read_text() == "started\n"  # one agent process, ever


def test_an_ended_run_is_noticed_before_the_next_poll(tmp_path: Path) -> None:
    rt = LocalRuntime(tmp_path / "data", poll_interval=30)
    try:
        seen: list[RunId] = []
        rt.subscribe(seen.append)
        s = spec(["true"], uid="f-8")
        started = time.monotonic()
        rt.submit(s)
        wait_for(lambda: s.run in seen, timeout=10)
        assert time.monotonic() - started < 10  # not the 30 s poll
    finally:
        rt.close()
