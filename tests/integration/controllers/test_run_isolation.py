"""The run controller and what an API client can write: a forged ``status.runtimeRef`` gets no
process signalled, a Secret key stored before admission checked it fails the run clearly."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Callable

from integration.controllers.test_runs import Env, agent, alive, make_env, provider, repo, script, start_sleeper
from joch.api import kinds
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
