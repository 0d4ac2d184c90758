"""The run controller and what an API client can write: a forged ``status.runtimeRef`` gets no
process signalled, and one naming another run gets that run neither followed nor removed; a Secret
key stored before admission checked it fails the run clearly."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from integration.controllers.test_runs import Env, agent, alive, make_env, provider, repo, script, start_sleeper
from joch.api import errors, kinds
from joch.runtime import runner

__all__ = ["make_env", "repo"]  # fixtures


def test_a_forged_runtime_ref_and_cancel_signal_only_the_runs_own_runner(make_env: Callable[..., Env]) -> None:
    env = make_env()
    name, pid_file = start_sleeper(env)
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = env.run(name)
        forged = {**run["status"]["runtimeRef"], "runnerPid": victim.pid,
                  "runnerStart": runner.process_start(victim.pid)}
        run = env.store.update_status(kinds.AGENT_RUN, {**run, "status": {**run["status"], "runtimeRef": forged}})
        env.store.update(kinds.AGENT_RUN, {**run, "spec": {**run["spec"], "cancel": True}})
        run = env.wait(name, {"Succeeded", "Failed", "Cancelled"})
        assert run["status"]["phase"] == "Cancelled", run["status"]
        assert not alive(int(pid_file.read_text()))  # the run's own agent was stopped
        assert victim.poll() is None and alive(victim.pid)  # the process the reference named was not
    finally:
        victim.kill()
        victim.wait()


def test_a_stored_secret_key_that_cannot_be_an_env_name_fails_the_run_clearly(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p", security={"allowedSecrets": ["keys"]}))
    # Written past admission, as a Secret stored by an older version would be.
    env.store.create(kinds.SECRET, {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret",
                                    "metadata": {"name": "keys", "namespace": "default"},
                                    "spec": {"data": {"A=B": base64.b64encode(b"value").decode()}}})
    name = env.create_run(secrets=["keys"])
    run = env.wait(name, {"Succeeded", "Failed"})
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "InvalidSecretKey"), run["status"]
    assert 'Secret "keys" key "A=B" cannot be passed to the agent' in run["status"]["message"]


def test_a_runtime_ref_naming_another_run_is_not_followed(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("done", script("print('the other run')")), agent("d", "done"))
    other = env.create_run(agent="d")
    other_run = env.wait(other, {"Succeeded", "Failed"})
    assert other_run["status"]["phase"] == "Succeeded", other_run["status"]
    other_dir = Path(other_run["status"]["runtimeRef"]["dir"])
    assert (other_dir / "log").read_text() == "the other run\n"
    name, pid_file = start_sleeper(env)
    run = env.run(name)
    # Another run's reference written into this run's status (any API client can write status).
    run = env.store.update_status(kinds.AGENT_RUN, {**run, "status": {**run["status"],
                                                                     "runtimeRef": other_run["status"]["runtimeRef"]}})
    time.sleep(1.0)  # the controller has looked at it (resyncs, and the status write wakes it)
    assert env.run(name)["status"]["phase"] == "Running"  # not the other run's Succeeded
    assert alive(int(pid_file.read_text()))
    env.store.delete(kinds.AGENT_RUN, "default", name)  # its finalizer stops and removes its own files
    deadline = time.monotonic() + 20
    while not _gone(env, name):
        assert time.monotonic() < deadline, env.run(name)
        time.sleep(0.05)
    assert not alive(int(pid_file.read_text()))  # its own agent was stopped
    assert (other_dir / "log").read_text() == "the other run\n"  # the other run's files are still there


def _gone(env: Env, name: str) -> bool:
    try:
        env.run(name)
    except errors.NotFound:
        return True
    return False


def test_a_repository_inside_the_data_dir_fails_the_run(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")), agent("a", "p"))
    first = env.wait(env.create_run(), {"Failed", "Succeeded"})
    assert first["status"]["phase"] == "Succeeded", first["status"]
    (mirror,) = (env.data_dir / "mirrors").glob("*.git")  # the repository of every run of this URL
    for url in (str(mirror), f"file://{mirror}", f"{env.data_dir}/workspaces/../mirrors/{mirror.name}"):
        run = env.wait(env.create_run(execution={"coordinates": {"git": {"url": url}}}), {"Failed", "Succeeded"})
        assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "InvalidPath"), (url, run["status"])
        assert "inside this server's data directory" in run["status"]["message"]
