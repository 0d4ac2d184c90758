"""A user swapping a run's dispatch Approval for one of their own, with the real run controller."""

from __future__ import annotations

import time
from collections.abc import Callable

from integration.controllers.test_runs import Env, agent, make_env, provider, repo, script
from joch.api import errors, kinds
from joch.api.identity import RequestContext, UserInfo, acting_as

__all__ = ["make_env", "repo"]


def test_an_approval_a_user_made_for_the_run_is_not_adopted_as_its_dispatch_approval(
        make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", script("pass")),
              agent("a", "p", requiresApproval=True, approvalTimeoutSeconds=3600, approvalSeparationOfDuties=True))
    with acting_as(RequestContext(UserInfo("carol"))):
        name = env.create_run("mine")
    run = env.wait(name, {"AwaitingApproval"})
    # What an editor may send: delete the run's Approval, then create one of the same name that
    # names the run as an owner (without controller: true, which admission refuses) and drops the
    # Agent's separation of duties and expiry, so the run's creator could approve it.
    with env.store.transaction() as w:
        w.delete(kinds.APPROVAL, "default", f"{name}-dispatch")
        w.create(kinds.APPROVAL, {"metadata": {"name": f"{name}-dispatch", "namespace": "default", "ownerReferences": [
            {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "name": name,
             "uid": run["metadata"]["uid"], "controller": False}]},
            "spec": {"runRef": {"name": name}, "action": "dispatch", "requestedBy": "carol",
                     "separationOfDuties": False}})
    deadline = time.monotonic() + 30
    while True:
        try:  # between the controller's delete of the user's Approval and its own, there is none
            spec = env.store.get(kinds.APPROVAL, "default", f"{name}-dispatch")["spec"]
        except errors.NotFound:
            spec = {}
        if spec.get("separationOfDuties"):
            break
        assert time.monotonic() < deadline, f"the run adopted the user's Approval: {spec}"
        time.sleep(0.1)
    assert spec.get("expiresAt")
    assert env.run(name)["status"]["phase"] == "AwaitingApproval"
