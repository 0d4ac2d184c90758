"""Write-back end to end: a real store, the real controllers, real ``joch runner`` processes, the fake
GitHub (``support.fake_github``, GitHub's REST wire format on 127.0.0.1), a real bare repository to
push to, and the real server for ``approve``/``deny``. What the fake GitHub holds is read from
the fake itself."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from joch.admission.apply import apply_documents, create_documents
from joch.admission.documents import load_documents
from joch.api import kinds
from joch.api.audit import AuditQuery
from joch.api.integrations import EXECUTION_ANNOTATION, RULE_LABEL, SOURCE_ITEM, SOURCE_LABEL, WRITE_INTENT
from joch.api.meta import parse_time
from joch.controllers.approvals import ApprovalController
from joch.controllers.assembly import build_controllers
from joch.controllers.base import Controller
from joch.controllers.manager import Manager
from joch.controllers.options import ControllerOptions
from joch.controllers.writeback import WriteBackController
from joch.controllers.writeintents import WriteIntentController, marker
from joch.runtime.local import LocalRuntime
from joch.server.app import create_app
from joch.server.testing import ServerThread
from joch.store import Store, open_store
from support import FakeClock, fake_github
from support.fake_linear import FakeLinear

PY = sys.executable
TOKEN = "ghp_writeback_test_token_0123456789"  # the fake accepts it; checked never to leak
POST = """
import json, os, urllib.request
def post(events):
    request = urllib.request.Request(os.environ['JOCH_CALLBACK_URL'], data=json.dumps({'events': events}).encode(),
        method='POST', headers={'Content-Type': 'application/json',
                                'Authorization': 'Bearer ' + os.environ['JOCH_RUN_TOKEN']})
    urllib.request.urlopen(request, timeout=10).read()
"""
AGENT_CODE = POST + """
with open('README.md', 'a') as f:
    f.write('Hello from Joch\\n')
post([{'id': 'e1', 'model': 'm', 'costUsd': 0.42}])
"""


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30, debug: Callable[[], Any] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}" + (f": {debug()}" if debug else "")
        time.sleep(0.05)


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    """The repository runs check out and branches are pushed to (``main`` with a README)."""
    work = tmp_path / "seed"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    (work / "README.md").write_text("# web\n")
    git("add", "README.md", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init", cwd=work)
    path = tmp_path / "web.git"
    git("clone", "-q", "--bare", str(work), str(path), cwd=tmp_path)
    return path


@pytest.fixture
def github(bare: Path) -> Iterator[fake_github.FakeGitHub]:
    for fake in fake_github.started(tokens={TOKEN}):
        fake.add_repo("acme/web", git_dir=bare)
        fake.create_issue("acme/web", "Add a greeting", "Say hello in the README.")
        yield fake


class GitHubReader:
    """What the fake GitHub holds (read from the fake itself: a request would use up a failure the
    test asked it for)."""

    def __init__(self, fake: fake_github.FakeGitHub) -> None:
        self.fake = fake

    def comments(self, number: int = 1) -> list[dict[str, Any]]:
        return self.fake.comments("acme/web", number)

    def pulls(self) -> list[dict[str, Any]]:
        return self.fake.pulls("acme/web")


@dataclass
class Env:
    store: Store
    runtime: LocalRuntime
    manager: Manager
    options: ControllerOptions
    url: str
    http: httpx.Client
    github: GitHubReader
    controllers: Callable[[], list[Controller]]

    def apply(self, *objs: dict[str, Any]) -> None:
        apply_documents(self.store, load_documents("\n---\n".join(json.dumps(o) for o in objs)), dry_run=False)

    def create_run(self, name: str, *, agent: str = "coder", git_url: str, **spec: Any) -> None:
        doc = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
               "spec": {"agentRef": {"name": agent}, "implementationRef": {"name": "gh-acme-web-1"},
                        "execution": {"coordinates": {"git": {"url": git_url, "ref": "main"}}}, **spec}}
        create_documents(self.store, load_documents(json.dumps(doc)), dry_run=False)

    def run(self, name: str) -> dict[str, Any]:
        return self.store.get(kinds.AGENT_RUN, "default", name)

    def phase(self, name: str) -> str | None:
        value = (self.run(name).get("status") or {}).get("phase")
        return str(value) if value else None

    def intent(self, name: str) -> dict[str, Any] | None:
        found = [i for i in self.store.list(WRITE_INTENT).items if i["metadata"]["name"] == name]
        return found[0] if found else None

    def intent_phase(self, name: str) -> str | None:
        value = ((self.intent(name) or {}).get("status") or {}).get("phase")
        return str(value) if value else None

    def decide(self, approval: str, decision: str, reason: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"decision": decision}
        if reason:
            body["reason"] = reason
        return self.http.post(f"/v1/namespaces/default/approvals/{approval}/decide", json=body)

    def restart(self, clock: FakeClock | None = None) -> None:
        """A new manager with new controllers, as a restarted server would have."""
        self.manager.stop()
        self.manager = Manager(self.store, self.controllers(), self.options, **({"clock": clock} if clock else {}))
        self.manager.start()
        assert self.manager.wait_started(10)


def source(github_url: str) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": "gh"},
            "spec": {"provider": "github", "pollIntervalSeconds": 0,
                     "github": {"owner": "acme", "repo": "web", "apiUrl": github_url,
                                "auth": {"tokenSecretRef": {"name": "gh-token", "key": "token"}}}}}


SECRET = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "gh-token"},
          "spec": {"stringData": {"token": TOKEN}}}
SPEC = {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSpec",
        "metadata": {"name": "gh-acme-web-1", "labels": {SOURCE_LABEL: "gh"}},
        "spec": {"text": "# Add a greeting\n\nSay hello in the README.", "summary": "Add a greeting",
                 "description": "Say hello in the README.",
                 "source": {"provider": "github", "externalId": "acme/web#1",
                            "url": "https://github.com/acme/web/issues/1"}}}


def provider(code: str = AGENT_CODE) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
            "spec": {"binary": PY, "argsTemplate": ["-c", code]}}


def agent(write_back: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "coder"},
            "spec": {"providerRef": {"name": "p"}, "writeBack": write_back, **spec}}


@pytest.fixture
def make_env(tmp_path: Path, github: fake_github.FakeGitHub) -> Iterator[Callable[..., Env]]:
    made: list[tuple[Env, ServerThread]] = []

    def make(*, only_writeback: bool = False, clock: FakeClock | None = None, store_url: str | None = None) -> Env:
        store = open_store(store_url or f"sqlite:///{tmp_path / 'joch.db'}")
        data = tmp_path / "data"
        options = ControllerOptions(data_dir=data, leader_election=False, grace_seconds=1.0, resync_period=2.0)
        app = create_app(store)
        thread = ServerThread(app)
        runtime = LocalRuntime(data, sandbox="none", api_url=thread.url)
        app.state.runtime = runtime
        thread.start()

        def controllers() -> list[Controller]:
            if only_writeback:  # the runs' status is the test's to write
                return [WriteBackController(runtime), WriteIntentController(runtime), ApprovalController()]
            return build_controllers(store, runtime, options)

        manager = Manager(store, controllers(), options, **({"clock": clock} if clock else {}))
        manager.start()
        assert manager.wait_started(10)
        env = Env(store, runtime, manager, options, thread.url, httpx.Client(base_url=thread.url, timeout=10),
                  GitHubReader(github), controllers)
        env.apply(SECRET, source(github.url), SPEC)
        made.append((env, thread))
        return env

    yield make
    for env, thread in made:
        env.manager.stop()
        env.runtime.close()
        env.http.close()
        thread.stop()
        env.store.close()


def no_token_leaks(env: Env) -> None:
    """The token is in no object, Event or audit row Joch wrote."""
    for kind in (WRITE_INTENT, kinds.AGENT_RUN, kinds.APPROVAL, kinds.EVENT):
        for obj in env.store.list(kind).items:
            assert TOKEN not in json.dumps(obj), obj
    rows = env.store.audit_events(AuditQuery())
    assert all(TOKEN not in json.dumps(row.__dict__, default=str) for row in rows.items)


# --- the whole path ----------------------------------------------------------------------------------

def test_a_run_from_an_issue_comments_once_and_opens_one_pull_request(
        make_env: Callable[..., Env], bare: Path, store_url: str) -> None:
    env = make_env(store_url=store_url)  # SQLite and PostgreSQL
    env.apply(provider(), agent({"comment": {}, "pullRequest": {"branchPrefix": "joch"}}))
    env.create_run("r1", git_url=str(bare))
    # the comment exists while the run is still going (created at start, edited in place later)
    first = wait_for(lambda: env.github.comments(), "the run's comment")
    assert len(first) == 1 and marker(env.run("r1")["metadata"]["uid"]) in first[0]["body"]

    run = wait_for(lambda: (r := env.run("r1")).get("status", {}).get("writeBack", {}).get("pullRequest") and r,
                   "the pull request in the run's status", timeout=60)
    assert run["status"]["phase"] == "Succeeded"
    [pull] = env.github.pulls()
    assert pull["head"]["ref"] == "joch/r1" and pull["base"]["ref"] == "main"
    assert pull["title"] == "Add a greeting"
    assert "Closes #1" in pull["body"]
    ref = run["status"]["writeBack"]["pullRequest"]
    assert ref["url"] == pull["html_url"] and ref["number"] == pull["number"] and ref["branch"] == "joch/r1"

    # the branch holds one commit: the patch on the run's base commit
    pushed = git("rev-parse", "refs/heads/joch/r1", cwd=bare)
    assert ref["commit"] == pushed
    assert git("rev-parse", f"{pushed}^", cwd=bare) == run["status"]["baseCommit"]
    assert git("show", f"{pushed}:README.md", cwd=bare) == "# web\nHello from Joch"

    def final_comment() -> dict[str, Any] | None:
        comments = env.github.comments()
        done = [c for c in comments if pull["html_url"] in c["body"] and "$0.4200" in c["body"]]
        return comments[0] if done and len(comments) == 1 else None

    comment = wait_for(final_comment, "the comment showing Succeeded, the PR and the cost")
    assert "**Succeeded**" in comment["body"] and comment["id"] == first[0]["id"]
    assert env.run("r1")["status"]["writeBack"]["commentUrl"] == comment["html_url"]

    # A crash between recording Sending and recording what was sent: the restarted controllers
    # find the comment by its marker and the pull request by its branch instead of writing again.
    env.manager.stop()
    for name in ("r1-comment", "r1-pr"):
        intent = env.intent(name)
        assert intent is not None and intent["status"]["phase"] == "Succeeded"
        status = {k: v for k, v in intent["status"].items() if k not in ("externalId", "url", "sentHash")}
        env.store.update_status(WRITE_INTENT, {**intent, "status": {**status, "phase": "Sending"}})
    env.restart()
    wait_for(lambda: env.intent_phase("r1-comment") == env.intent_phase("r1-pr") == "Succeeded", "the adoption")
    assert len(env.github.comments()) == 1 and len(env.github.pulls()) == 1
    github = env.github.fake
    assert len(github.calls("POST", "/repos/acme/web/issues/1/comments")) == 1
    assert len(github.calls("POST", "/repos/acme/web/pulls")) == 1
    pr_intent = env.intent("r1-pr")
    assert pr_intent is not None and pr_intent["status"]["url"] == pull["html_url"]
    assert pr_intent["status"]["externalId"] == str(pull["number"])
    audit = env.store.audit_events(AuditQuery())
    writes = [r for r in audit.items if r.verb == "write" and r.kind == "WriteIntent"]
    assert {r.reason for r in writes} >= {"comment on github:acme/web#1", "pull request on github:acme/web"}
    no_token_leaks(env)


# --- the comment follows the run ------------------------------------------------------------------------

def set_run_status(env: Env, name: str, **status: Any) -> None:
    run = env.run(name)
    env.store.update_status(kinds.AGENT_RUN, {**run, "status": {**(run.get("status") or {}), **status}})


def test_the_comment_is_edited_in_place_and_shows_cost_and_failure(make_env: Callable[..., Env], bare: Path) -> None:
    env = make_env(only_writeback=True)
    env.apply(provider(), agent({"comment": {}}))
    env.create_run("r2", git_url=str(bare))
    set_run_status(env, "r2", phase="Running", reason="Started")
    first = wait_for(lambda: [c for c in env.github.comments() if "**Running**" in c["body"]], "the first comment")
    set_run_status(env, "r2", phase="Failed", reason="AgentFailed", message="agent exited with code 3", costUsd=0.125)
    failed = wait_for(lambda: [c for c in env.github.comments() if "**Failed**" in c["body"]], "the failure")
    assert len(env.github.comments()) == 1 and failed[0]["id"] == first[0]["id"]
    body = failed[0]["body"]
    assert "(AgentFailed)" in body and "agent exited with code 3" in body and "$0.1250" in body
    assert env.intent("r2-pr") is None  # no pullRequest section: no pull request


def test_a_5xx_is_retried_with_backoff_then_sent(make_env: Callable[..., Env], bare: Path,
                                                 github: fake_github.FakeGitHub) -> None:
    clock = FakeClock(time.time())
    env = make_env(only_writeback=True, clock=clock)
    env.apply(provider(), agent({"comment": {}}))
    github.fail_next(502, times=1)
    env.create_run("r3", git_url=str(bare))
    set_run_status(env, "r3", phase="Running")
    wait_for(lambda: env.intent_phase("r3-comment") == "Retrying", "Retrying")
    intent = env.intent("r3-comment")
    assert intent is not None
    status = intent["status"]
    assert status["attempts"] == 1 and status["lastError"].startswith("Unavailable")
    due = parse_time(status["nextAttemptAt"]).timestamp()
    assert clock.time() + 3 <= due <= clock.time() + 7  # 5 s, with jitter
    time.sleep(0.8)
    assert env.github.comments() == [] and env.intent_phase("r3-comment") == "Retrying"
    clock.advance(7)
    wait_for(lambda: env.intent_phase("r3-comment") == "Succeeded", "the retry")
    assert len(env.github.comments()) == 1
    intent = env.intent("r3-comment")
    assert intent is not None and intent["status"]["attempts"] == 2
    no_token_leaks(env)


# --- approvals ----------------------------------------------------------------------------------------

WRITE_BACK_POLICY = {
    "apiVersion": "joch.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "reviewed-prs"},
    "spec": {"rules": [{"name": "prs", "phase": "writeBack", "action": "requireApproval",
                        "expression": 'object.spec.type == "pullRequest"', "message": "a person reviews every PR"}]},
}


def test_a_policy_holds_the_pull_request_until_it_is_approved(make_env: Callable[..., Env], bare: Path) -> None:
    env = make_env()
    env.apply(WRITE_BACK_POLICY, provider(), agent({"comment": {}, "pullRequest": {}}))
    env.create_run("r4", git_url=str(bare))
    wait_for(lambda: env.intent_phase("r4-pr") == "PendingApproval", "the approval gate", timeout=60)
    approval = env.store.get(kinds.APPROVAL, "default", "r4-pr")
    intent = env.intent("r4-pr")
    assert intent is not None
    assert approval["spec"]["action"] == "write-back" and approval["spec"]["runRef"]["name"] == "r4"
    assert approval["spec"]["policyRef"] == {"namespace": "default", "name": "reviewed-prs", "rule": "prs"}
    assert "a person reviews every PR" in approval["spec"]["reason"]
    assert [r["uid"] for r in approval["metadata"]["ownerReferences"]] == [intent["metadata"]["uid"]]
    wait_for(lambda: env.run("r4")["status"].get("writeBack", {}).get("pending") == ["r4-pr"], "pending in status")
    wait_for(lambda: any("joch approve approval r4-pr" in c["body"] for c in env.github.comments()),
             "the comment saying what waits")
    time.sleep(0.5)
    assert env.github.pulls() == []

    assert env.decide("r4-pr", "approve").status_code == 200
    wait_for(lambda: env.github.pulls(), "the pull request")
    wait_for(lambda: env.intent_phase("r4-pr") == "Succeeded", "Succeeded")
    assert env.phase("r4") == "Succeeded"


def test_a_denied_pull_request_is_rejected_and_the_comment_says_so(make_env: Callable[..., Env], bare: Path) -> None:
    env = make_env()
    env.apply(provider(), agent({"comment": {}, "pullRequest": {"requireApproval": True}}))
    env.create_run("r5", git_url=str(bare))
    wait_for(lambda: env.intent_phase("r5-pr") == "PendingApproval", "the approval gate", timeout=60)
    assert env.decide("r5-pr", "deny", "not this week").status_code == 200
    wait_for(lambda: env.intent_phase("r5-pr") == "Rejected", "Rejected")
    said = wait_for(lambda: [c for c in env.github.comments() if "Not written" in c["body"]], "the comment")
    assert "write-back Approval r5-pr denied by" in said[0]["body"] and "not this week" in said[0]["body"]
    assert len(env.github.comments()) == 1 and env.github.pulls() == []
    assert env.phase("r5") == "Succeeded"


def test_the_run_controller_ignores_write_back_approvals(make_env: Callable[..., Env], bare: Path) -> None:
    env = make_env()
    env.apply(provider(), agent({"comment": {}, "requireApproval": True}, requiresApproval=True))
    env.create_run("r6", git_url=str(bare))
    wait_for(lambda: env.phase("r6") == "AwaitingApproval", "the dispatch gate")
    wait_for(lambda: env.intent_phase("r6-comment") == "PendingApproval", "the write-back gate")
    wait_for(lambda: (env.store.get(kinds.APPROVAL, "default", "r6-comment").get("status") or {}).get("phase")
             == "Pending", "the write-back Approval pending")
    # Approving the comment sends it; the run stays where its own (dispatch) Approval holds it.
    assert env.decide("r6-comment", "approve").status_code == 200
    wait_for(lambda: env.github.comments(), "the comment")
    time.sleep(1.0)
    assert env.phase("r6") == "AwaitingApproval"
    assert env.store.get(kinds.APPROVAL, "default", "r6-dispatch")["status"]["phase"] == "Pending"
    assert env.store.get(kinds.APPROVAL, "default", "r6-comment")["status"]["phase"] == "Approved"
    # and the dispatch decision is the run's alone
    assert env.decide("r6-dispatch", "approve").status_code == 200
    wait_for(lambda: env.phase("r6") == "Succeeded", "the run", timeout=60)
    wait_for(lambda: any("**Succeeded**" in c["body"] for c in env.github.comments()), "the final comment")
    assert len(env.github.comments()) == 1


# --- Linear -------------------------------------------------------------------------------------------

LINEAR_KEY = "lin_api_writeback_0123456789"


@pytest.fixture
def linear() -> Iterator[FakeLinear]:
    with FakeLinear(api_key=LINEAR_KEY) as fake:
        fake.create_issue("Add a greeting", "Say hello in the README.")
        yield fake


def linear_objects(url: str) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "lin-key"},
         "spec": {"stringData": {"key": LINEAR_KEY}}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": "lin"},
         "spec": {"provider": "linear", "pollIntervalSeconds": 0,
                  "linear": {"teamKey": "ENG", "apiUrl": url,
                             "auth": {"apiKeySecretRef": {"name": "lin-key", "key": "key"}}}}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSpec",
         "metadata": {"name": "lin-eng-1", "labels": {SOURCE_LABEL: "lin"}},
         "spec": {"text": "# Add a greeting\n\nSay hello in the README.", "summary": "Add a greeting",
                  "source": {"provider": "linear", "externalId": "ENG-1",
                             "url": "https://linear.app/acme/issue/ENG-1/add-a-greeting"}}},
    ]


def test_a_run_from_a_linear_issue_comments_and_links_its_pull_request(
        make_env: Callable[..., Env], bare: Path, linear: FakeLinear) -> None:
    env = make_env()
    env.apply(*linear_objects(linear.url), provider(),
              agent({"comment": {}, "pullRequest": {"sourceRef": "gh", "base": "main"}}))
    env.create_run("r7", git_url=str(bare), implementationRef={"name": "lin-eng-1"})
    wait_for(lambda: linear.comments("ENG-1"), "the comment in Linear")
    [pull] = wait_for(lambda: env.github.pulls(), "the pull request", timeout=60)
    assert pull["head"]["ref"] == "joch/r7" and "Closes" not in (pull["body"] or "")
    wait_for(lambda: linear.attachments("ENG-1"), "the link on the Linear issue")
    [attachment] = linear.attachments("ENG-1")
    assert attachment["url"] == pull["html_url"]
    final = wait_for(lambda: [c for c in linear.comments("ENG-1") if pull["html_url"] in c["body"]
                              and "**Succeeded**" in c["body"]], "the final comment")
    assert len(linear.comments("ENG-1")) == 1 and marker(env.run("r7")["metadata"]["uid"]) in final[0]["body"]
    wait_for(lambda: env.intent_phase("r7-link") == "Succeeded", "the link intent Succeeded")
    assert env.github.comments() == []  # the issue is Linear's: nothing is written on GitHub's issue #1


def test_a_refused_token_fails_the_write_naming_the_secret_not_its_value(
        make_env: Callable[..., Env], bare: Path) -> None:
    env = make_env(only_writeback=True)
    wrong = "ghp_not_the_right_one_987654321"
    env.apply({**SECRET, "spec": {"stringData": {"token": wrong}}}, provider(), agent({"comment": {}}))
    env.create_run("r8", git_url=str(bare))
    set_run_status(env, "r8", phase="Running")
    wait_for(lambda: env.intent_phase("r8-comment") == "Failed", "Failed")
    intent = env.intent("r8-comment")
    assert intent is not None
    error = intent["status"]["lastError"]
    assert error.startswith("BadCredentials") and "gh-token" in error and intent["status"]["attempts"] == 1
    for kind in (WRITE_INTENT, kinds.AGENT_RUN, kinds.EVENT):
        assert all(wrong not in json.dumps(o) for o in env.store.list(kind).items)
    assert all(wrong not in r.reason for r in env.store.audit_events(AuditQuery()).items)
    assert env.github.comments() == []


def test_a_rate_limit_waits_for_retry_after(make_env: Callable[..., Env], bare: Path,
                                            github: fake_github.FakeGitHub) -> None:
    clock = FakeClock(time.time())
    env = make_env(only_writeback=True, clock=clock)
    env.apply(provider(), agent({"comment": {}, "maxAttempts": 2}))
    github.secondary_rate_limit(retry_after=120, times=1)
    env.create_run("r9", git_url=str(bare))
    set_run_status(env, "r9", phase="Running")
    wait_for(lambda: env.intent_phase("r9-comment") == "Retrying", "Retrying", debug=lambda: env.intent("r9-comment"))
    intent = env.intent("r9-comment")
    assert intent is not None and intent["status"]["lastError"].startswith("RateLimited")
    due = parse_time(intent["status"]["nextAttemptAt"]).timestamp()
    assert clock.time() + 118 <= due <= clock.time() + 122  # Retry-After, not the 5 s backoff
    clock.advance(30)
    time.sleep(0.8)
    assert env.intent_phase("r9-comment") == "Retrying" and env.github.comments() == [], env.intent("r9-comment")
    # the second attempt is the last one (maxAttempts 2): a second failure ends it
    github.fail_next(503, times=1)
    clock.advance(100)
    wait_for(lambda: env.intent_phase("r9-comment") == "Failed", "Failed after maxAttempts")
    intent = env.intent("r9-comment")
    assert intent is not None and intent["status"]["attempts"] == 2
    assert intent["status"]["lastError"].startswith("Unavailable")


def test_a_pull_request_with_no_github_source_is_explained_in_the_comment(
        make_env: Callable[..., Env], bare: Path, linear: FakeLinear) -> None:
    env = make_env()
    env.apply(*linear_objects(linear.url), provider(), agent({"comment": {}, "pullRequest": {}}))
    env.create_run("r10", git_url=str(bare), implementationRef={"name": "lin-eng-1"})
    said = wait_for(lambda: [c for c in linear.comments("ENG-1") if "Write failed" in c["body"]], "the comment",
                    timeout=60)
    assert 'ImplementationSource "lin" is not a GitHub source' in said[0]["body"]
    assert "writeBack.pullRequest.sourceRef" in said[0]["body"]
    assert env.intent("r10-pr") is None and env.github.pulls() == []


# --- a TriggerRule's writeBack --------------------------------------------------------------------------

def rule(write_back: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": "on-label"},
            "spec": {"sourceRef": {"name": "gh"}, "issue": {"label": "joch:demo"},
                     "run": {"agentRef": {"name": "coder"}}, "writeBack": write_back}}


def create_triggered_run(env: Env, name: str, git_url: str) -> None:
    doc = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
           "metadata": {"name": name, "labels": {RULE_LABEL: "on-label"},
                        "annotations": {SOURCE_ITEM: "github:acme/web#1", EXECUTION_ANNOTATION: name,
                                        kinds.CREATED_BY: "system:joch:trigger:default:on-label"}},
           "spec": {"agentRef": {"name": "coder"}, "implementation": {"inline": {"text": "say hello"}},
                    "execution": {"coordinates": {"git": {"url": git_url, "ref": "main"}}}}}
    execution = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "TriggerExecution",
                 "metadata": {"name": name, "labels": {RULE_LABEL: "on-label"}},
                 "spec": {"ruleRef": {"name": "on-label"}, "decision": "Dispatched", "runRef": {"name": name},
                          "dedupeKey": f"manual:{name}", "evaluatedAt": "2026-01-01T00:00:00Z",
                          "event": {"kind": "issue", "item": "github:acme/web#1"}}}
    create_documents(env.store, load_documents(json.dumps(execution) + "\n---\n" + json.dumps(doc)), dry_run=False)


def test_the_rules_template_wins_and_renders_in_the_sandbox(make_env: Callable[..., Env], bare: Path) -> None:
    env = make_env(only_writeback=True)
    env.apply(provider(), agent({"comment": {"template": "agent's template"}}),
              rule({"comment": {"template": "Rule: {{ run.name }} is {{ run.phase }} for {{ issue.item }}"}}))
    create_triggered_run(env, "r11", str(bare))
    set_run_status(env, "r11", phase="Running")
    [comment] = wait_for(lambda: [c for c in env.github.comments() if "Running" in c["body"]], "the comment")
    assert comment["body"].startswith("Rule: r11 is Running for github:acme/web#1\n")

    env.apply(rule({"comment": {"template": "{{ ''.__class__.__mro__ }}"}}))
    said = wait_for(lambda: [c for c in env.github.comments() if "could not be rendered" in c["body"]],
                    "the sandbox's refusal")
    assert "refused by the sandbox" in said[0]["body"]
    assert "fix writeBack.comment.template on the TriggerRule on-label" in said[0]["body"]
    assert len(env.github.comments()) == 1


def test_the_rule_can_require_approval_for_every_write(make_env: Callable[..., Env], bare: Path) -> None:
    env = make_env(only_writeback=True)
    env.apply(provider(), agent({"comment": {}}), rule({"requireApproval": True}))
    create_triggered_run(env, "r12", str(bare))
    set_run_status(env, "r12", phase="Running")
    wait_for(lambda: env.intent_phase("r12-comment") == "PendingApproval", "the gate")
    approval = env.store.get(kinds.APPROVAL, "default", "r12-comment")
    assert approval["spec"]["action"] == "write-back" and approval["status"]["phase"] == "Pending"
    time.sleep(0.5)
    assert env.github.comments() == []
    assert env.decide("r12-comment", "approve").status_code == 200
    wait_for(lambda: env.github.comments(), "the comment")


def test_an_approval_left_from_an_earlier_run_of_the_name_does_not_count(
        make_env: Callable[..., Env], bare: Path) -> None:
    env = make_env(only_writeback=True)
    env.apply(provider(), agent({"comment": {}, "requireApproval": True}))
    stray = env.store.create(kinds.APPROVAL, {"metadata": {"name": "r13-comment", "namespace": "default"},
                                              "spec": {"runRef": {"name": "r13"}, "action": "write-back"}})
    env.store.update_status(kinds.APPROVAL, {**stray, "status": {"phase": "Approved", "decidedBy": "mallory"}})
    env.create_run("r13", git_url=str(bare))
    set_run_status(env, "r13", phase="Running")
    wait_for(lambda: env.intent_phase("r13-comment") == "PendingApproval", "the gate")
    intent = env.intent("r13-comment")
    assert intent is not None
    approval = wait_for(lambda: (a := env.store.get(kinds.APPROVAL, "default", "r13-comment"))["metadata"]["uid"]
                        != stray["metadata"]["uid"] and a, "the intent's own Approval")
    assert [r["uid"] for r in approval["metadata"]["ownerReferences"]] == [intent["metadata"]["uid"]]
    assert approval["status"]["phase"] == "Pending"
    time.sleep(0.5)
    assert env.github.comments() == [] and env.intent_phase("r13-comment") == "PendingApproval"


def test_a_policy_can_deny_a_write(make_env: Callable[..., Env], bare: Path) -> None:
    env = make_env(only_writeback=True)
    env.apply({"apiVersion": "joch.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "quiet"},
               "spec": {"selector": {"kinds": ["WriteIntent"]},
                        "rules": [{"name": "no-comments", "phase": "writeBack", "action": "deny",
                                   "expression": 'object.spec.type == "comment" && object.spec.target.repo == "web"',
                                   "message": "the web team reads no bot comments"}]}},
              provider(), agent({"comment": {}}))
    env.create_run("r14", git_url=str(bare))
    set_run_status(env, "r14", phase="Running")
    wait_for(lambda: env.intent_phase("r14-comment") == "Rejected", "Rejected")
    intent = env.intent("r14-comment")
    assert intent is not None
    assert intent["status"]["lastError"] == ('Policy default/quiet rule "no-comments": the web team reads no bot '
                                             "comments")
    [row] = [r for r in env.store.audit_events(AuditQuery(verb="write")).items if r.name == "r14-comment"]
    assert row.decision == "denied" and "comment on github:acme/web#1" in row.reason
    time.sleep(0.5)
    assert env.github.comments() == []


def test_an_unexpected_error_while_sending_counts_the_attempt_and_backs_off(
        make_env: Callable[..., Env], bare: Path) -> None:
    """Not a TrackerError (here: a token Secret that is not UTF-8): the intent must not stay Sending,
    resent at once and forever with no attempt counted."""
    env = make_env(only_writeback=True)
    garbled = base64.b64encode(b"\xff\xfe\xfd").decode()
    env.apply({**SECRET, "spec": {"data": {"token": garbled}}}, provider(), agent({"comment": {}, "maxAttempts": 2}))
    env.create_run("r20", git_url=str(bare))
    set_run_status(env, "r20", phase="Running")
    wait_for(lambda: env.intent_phase("r20-comment") == "Retrying", "Retrying", debug=lambda: env.intent("r20-comment"))
    intent = env.intent("r20-comment")
    assert intent is not None and intent["status"]["attempts"] == 1
    assert intent["status"]["lastError"].startswith("Unavailable: unexpected UnicodeDecodeError")
    assert intent["status"]["nextAttemptAt"]
    assert env.github.comments() == []


def test_the_token_is_pushed_only_to_the_sources_own_repository(make_env: Callable[..., Env], bare: Path) -> None:
    """A run's git URL is the run author's to write: an https push there must not carry the source's
    token to another host or repository."""
    env = make_env(only_writeback=True)
    env.apply(provider(), agent({}))
    env.create_run("r21", git_url=str(bare))
    run = env.run("r21")
    content = {"gitUrl": "https://evil.invalid/acme/web.git", "branch": "joch/r21", "base": "main",
               "baseCommit": "0" * 40, "title": "t", "body": "b", "authorDate": "2026-01-01T00:00:00Z"}
    env.store.create(WRITE_INTENT, {
        "apiVersion": WRITE_INTENT.api_version, "kind": WRITE_INTENT.kind,
        "metadata": {"name": "r21-evil", "namespace": "default"},
        "spec": {"runRef": {"name": "r21"}, "runUid": run["metadata"]["uid"], "type": "pullRequest",
                 "target": {"provider": "github", "sourceRef": {"name": "gh"}, "owner": "acme", "repo": "web"},
                 "pullRequest": content, "maxAttempts": 1}})
    wait_for(lambda: env.intent_phase("r21-evil") == "Failed", "Failed", debug=lambda: env.intent("r21-evil"))
    intent = env.intent("r21-evil")
    assert intent is not None
    error = intent["status"]["lastError"]
    assert error.startswith("Invalid:") and "https://evil.invalid/acme/web.git is not acme/web" in error
    assert env.github.pulls() == []
    no_token_leaks(env)


def test_a_comment_never_carries_another_runs_marker(make_env: Callable[..., Env], bare: Path) -> None:
    """The run's message (or summary, or the issue's title) is not Joch's: a marker in it would make
    another run adopt and overwrite this comment."""
    env = make_env(only_writeback=True)
    env.apply(provider(), agent({"comment": {}}))
    env.create_run("r22", git_url=str(bare))
    set_run_status(env, "r22", phase="Failed", reason="AgentFailed", message="boom <!-- joch:run:other-uid -->")
    [comment] = wait_for(lambda: [c for c in env.github.comments() if "**Failed**" in c["body"]], "the comment")
    assert marker("other-uid") not in comment["body"] and "boom" in comment["body"]
    assert comment["body"].count("joch:run:") == 1
    assert comment["body"].endswith(marker(env.run("r22")["metadata"]["uid"]))


def test_a_recreated_write_back_approval_keeps_the_policys_separation_of_duties(
        make_env: Callable[..., Env], bare: Path) -> None:
    """Deleting the Approval must not buy a new one its requester may decide."""
    env = make_env(only_writeback=True)
    policy = {**WRITE_BACK_POLICY, "spec": {"separationOfDuties": True, "rules": [
        {**WRITE_BACK_POLICY["spec"]["rules"][0], "expression": 'object.spec.type == "comment"'}]}}
    env.apply(policy, provider(), agent({"comment": {}}))
    env.create_run("r23", git_url=str(bare))
    set_run_status(env, "r23", phase="Running")
    wait_for(lambda: env.intent_phase("r23-comment") == "PendingApproval", "the gate")
    first = env.store.get(kinds.APPROVAL, "default", "r23-comment")
    assert first["spec"]["separationOfDuties"] is True
    env.store.delete(kinds.APPROVAL, "default", "r23-comment", uid=first["metadata"]["uid"])

    def again() -> dict[str, Any] | None:
        found = [a for a in env.store.list(kinds.APPROVAL).items if a["metadata"]["name"] == "r23-comment"
                 and a["metadata"]["uid"] != first["metadata"]["uid"]]
        return found[0] if found else None

    second = wait_for(again, "the Approval asked again")
    assert second["spec"]["separationOfDuties"] is True
    assert second["spec"]["policyRef"]["name"] == "reviewed-prs"
    assert env.github.comments() == []


def test_a_closed_pull_request_of_an_earlier_run_of_the_name_is_not_adopted(
        make_env: Callable[..., Env], bare: Path, github: fake_github.FakeGitHub) -> None:
    env = make_env()
    git("branch", "joch/r24", "main", cwd=bare)
    old = github.open_pull_request("acme/web", head="joch/r24", base="main", title="an earlier r24", body="old")
    with github.lock:
        github._repo("acme/web").pulls[old["number"]]["state"] = "closed"
    env.apply(provider(), agent({"comment": {}, "pullRequest": {"branchPrefix": "joch"}}))
    env.create_run("r24", git_url=str(bare))
    run = wait_for(lambda: (r := env.run("r24")).get("status", {}).get("writeBack", {}).get("pullRequest") and r,
                   "the pull request in the run's status", timeout=60)
    ref = run["status"]["writeBack"]["pullRequest"]
    assert ref["number"] != old["number"]
    new = [p for p in env.github.pulls() if p["number"] == ref["number"]]
    assert new and new[0]["state"] == "open" and marker(run["metadata"]["uid"]) in new[0]["body"]
    assert git("show", f'{ref["commit"]}:README.md', cwd=bare) == "# web\nHello from Joch"
