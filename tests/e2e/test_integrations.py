"""Issue 10's "Done when", end to end: a real ``joch server`` process (SQLite in its data dir, auth
off), the quickstart's demo agent, a real bare git repository the runs clone and the write-back
pushes to, and the fake GitHub (``support.fake_github``: a local HTTP server speaking GitHub's REST
wire format and signing webhook deliveries as GitHub does).

Each test starts its own server and fakes, so every count it asserts on the fakes (pull requests,
comments) and on the server (runs, executions, deliveries) is that test's alone:

1. an issue labelled ``joch:demo`` delivered by a signed webhook → an ImplementationSpec, a
   Dispatched TriggerExecution, one Succeeded run, the branch ``joch/<run>`` in the bare repository,
   exactly one pull request with ``Closes #N`` and exactly one comment showing Succeeded, the pull
   request and the cost; the delivery replayed, and the label removed and added again under
   ``Forbid``, change nothing;
2. the same by polling alone; and a webhook plus a poll of the same label: one run;
3. ``kill -9`` of the server while the fake holds the pull-request creation it has already done
   (created, never answered), then a restart on the same data dir: still one run, one pull request
   (adopted, not opened again), one comment, and the delivery redelivered is still a duplicate;
4. a bad or missing signature → 401 and nothing stored or started;
5. ``/joch run agent=demo`` from a commenter GitHub calls NONE → Rejected naming why; from the OWNER
   → a run, and the OWNER again while it is on → Rejected ``ConcurrencyForbidden`` (``Forbid``);
6. (tests/e2e/test_integrations_linear.py) a Linear issue → a run and exactly one comment in the
   fake Linear;
7. a Policy requiring approval for pull-request write-backs: no pull request until the Approval is
   approved (one run reports $0.42, which the comment shows); denied → the intent Rejected and the
   comment says so, with the reason.

The webhook tests sync the source once by hand (``joch sync source --wait``, ``Stack.apply_synced``)
before the issue exists, polling off: what follows comes from the webhook alone. The cron
trigger with a fake clock is tests/integration/controllers/test_triggers.py's, not here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
import pytest

from e2e.test_server_crash import free_port
from support import stop_server, wait_ready
from support.fake_github import Delivery as GitHubDelivery
from support.fake_github import FakeGitHub

JOCH = Path(sys.executable).parent / "joch"
QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
CORE = "/apis/joch.dev/v1alpha1/namespaces/default"
RUNTIME = "/apis/runtime.joch.dev/v1alpha1/namespaces/default"
SECRET_VALUES = {"github-token": "ghp_e2eTestToken0000000000000000000000", "webhook": "whsec-e2e-7f3a91",
                 "linear-key": "lin_api_e2eTestKey00000000000000000000", "linear-webhook": "lin-wh-e2e-22c4"}
OWNER, REPO = "acme", "web"
FULL = f"{OWNER}/{REPO}"
LABEL = "joch:demo"
T = TypeVar("T")


class Signed(Protocol):
    """A webhook delivery as a fake builds it: the raw body and the headers it is sent with."""

    body: bytes
    headers: dict[str, str]


# --- the bare repository --------------------------------------------------------------------------


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          capture_output=True, text=True, check=True, timeout=30)
    return done.stdout


def bare_repository(tmp: Path) -> Path:
    """``tmp/web.git``: a bare repository whose ``main`` holds one commit with a README.md."""
    seed = tmp / "seed"
    seed.mkdir()
    git(seed, "init", "--quiet", "--initial-branch", "main")
    (seed / "README.md").write_text("# web\n")
    git(seed, "add", "README.md")
    git(seed, "commit", "--quiet", "-m", "first")
    bare = tmp / "web.git"
    git(tmp, "clone", "--quiet", "--bare", str(seed), str(bare))
    return bare


def branches(bare: Path) -> dict[str, str]:
    """The bare repository's branches and the commits they point at."""
    out = git(bare, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads/")
    return dict(line.split(" ", 1) for line in out.splitlines())


# --- the server -----------------------------------------------------------------------------------


@dataclass
class Stack:
    """One ``joch server`` on ``data_dir`` (restartable) plus the fakes and the bare repository."""

    tmp: Path
    bare: Path
    github: FakeGitHub
    port: int = field(default_factory=free_port)
    server: subprocess.Popen[str] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.tmp / "server.log"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
        env["PATH"] = f"{JOCH.parent}{os.pathsep}{env.get('PATH', '')}"  # joch-demo-agent
        self.server = subprocess.Popen(
            [str(JOCH), "server", "--data-dir", str(self.tmp / "data"), "--port", str(self.port), "--sandbox", "none"],
            stdout=self.log.open("a"), stderr=subprocess.STDOUT, text=True, env=env, cwd=self.tmp)
        wait_ready(self.base, self.server)

    def kill_9(self) -> None:
        assert self.server is not None
        os.kill(self.server.pid, signal.SIGKILL)
        self.server.wait(10)
        self.server = None

    def stop(self) -> None:
        if self.server is not None:
            stop_server(self.server)
            self.server = None

    # HTTP
    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.base}{path}", timeout=10)

    def obj(self, path: str) -> dict[str, Any]:
        r = self.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text)
        found: dict[str, Any] = r.json()
        return found

    def items(self, path: str) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = self.obj(path)["items"]
        return listed

    def apply(self, *manifests: dict[str, Any]) -> None:
        body = "\n---\n".join(json.dumps(m) for m in manifests)
        r = httpx.post(f"{self.base}/v1/resources/apply", content=body, headers={"content-type": "application/yaml"},
                       timeout=30)
        assert r.status_code == 200, r.text

    def joch(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
        env.update(JOCH_SERVER=self.base, JOCH_CONFIG=str(self.tmp / "joch-config.yaml"))
        done = subprocess.run([str(JOCH), *args], capture_output=True, text=True, env=env, timeout=60, check=False)
        assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
        return done

    # What the server holds
    def runs(self) -> list[dict[str, Any]]:
        return self.items(f"{RUNTIME}/agentruns")

    def executions(self) -> list[dict[str, Any]]:
        return self.items(f"{RUNTIME}/triggerexecutions")

    def deliveries(self) -> list[dict[str, Any]]:
        return self.items(f"{RUNTIME}/webhookdeliveries")

    def intents(self) -> list[dict[str, Any]]:
        return self.items(f"{RUNTIME}/writeintents")

    def specs(self) -> list[dict[str, Any]]:
        return self.items(f"{CORE}/implementationspecs")

    def run(self, name: str) -> dict[str, Any]:
        return self.obj(f"{RUNTIME}/agentruns/{name}")

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""

    def wait(self, what: str, probe: Callable[[], T | None], seconds: float = 45) -> T:
        """Poll ``probe`` until it answers something truthy; fail naming ``what`` and the server's log."""
        deadline = time.monotonic() + seconds
        while True:
            got = probe()
            if got:
                return got
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n--- server log ---\n{self.tail()}"
            time.sleep(0.2)

    def apply_synced(self, *manifests: dict[str, Any], source: str = "web") -> dict[str, Any]:
        """Apply ``manifests`` and sync the source once, now (``joch sync source --wait``), so that what
        happens next comes from the webhook or the poll the test means, never from a first sync."""
        self.apply(*manifests)
        self.joch("sync", "source", source, "--wait", "--timeout", "30")
        status: dict[str, Any] = self.obj(f"{CORE}/implementationsources/{source}").get("status") or {}
        assert status.get("lastSyncedAt") and status.get("observedSyncRequest"), status
        return status

    def wait_run_ended(self, name: str, seconds: float = 45) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            status: dict[str, Any] = self.run(name).get("status") or {}
            return status if status.get("phase") in ("Succeeded", "Failed", "Cancelled") else None

        return self.wait(f"run {name} to end", ended, seconds)

    def the_one_run(self) -> str:
        """The name of the one run the server holds (waiting for it)."""
        runs = self.wait("a run", self.runs)
        assert len(runs) == 1, [r["metadata"]["name"] for r in runs]
        name: str = runs[0]["metadata"]["name"]
        return name

    # Webhooks
    def post(self, path: str, delivery: Signed,
             headers: dict[str, str] | None = None) -> httpx.Response:
        """POST a delivery (its raw body and headers; ``headers`` replace some) to the server."""
        sent = {**delivery.headers, **(headers or {})}
        return httpx.post(f"{self.base}{path}", content=delivery.body,
                          headers={k: v for k, v in sent.items() if v}, timeout=10)

    def deliver(self, delivery: GitHubDelivery, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.post("/v1/webhooks/github", delivery, headers)


@contextmanager
def stack(tmp: Path) -> Iterator[Stack]:
    bare = bare_repository(tmp)
    with ExitStack() as later:
        s = Stack(tmp, bare, later.enter_context(github_fake(bare)))
        try:
            s.start()
            s.apply(*quickstart(), secret())
            yield s
        finally:
            s.stop()
    assert "Traceback" not in s.log.read_text(), s.log.read_text()


@pytest.fixture
def s(tmp_path: Path) -> Iterator[Stack]:
    with stack(tmp_path) as running:
        yield running


# --- manifests ------------------------------------------------------------------------------------


def quickstart() -> list[dict[str, Any]]:
    """The quickstart's provider and agent (``demo``), read from examples/quickstart."""
    import yaml

    return [yaml.safe_load((QUICKSTART / name).read_text()) for name in ("provider.yaml", "agent.yaml")]


# The demo agent after reporting $0.42 through the run callback: a run whose comment has a cost to show.
METERED = """
import json, os, sys, urllib.request
request = urllib.request.Request(os.environ['JOCH_CALLBACK_URL'], method='POST', data=json.dumps(
    {'events': [{'id': 'turn-1', 'costUsd': 0.42}]}).encode(),
    headers={'Content-Type': 'application/json', 'Authorization': 'Bearer ' + os.environ['JOCH_RUN_TOKEN']})
urllib.request.urlopen(request, timeout=10).read()
os.execvp('joch-demo-agent', ['joch-demo-agent', *sys.argv[1:]])
"""


def metered_demo() -> list[dict[str, Any]]:
    """The agent ``demo-metered``: the quickstart's demo agent behind a usage report of $0.42."""
    provider, agent = quickstart()
    provider["metadata"] = {"name": "demo-metered"}
    provider["spec"]["binary"] = sys.executable
    provider["spec"]["argsTemplate"] = ["-c", METERED, *provider["spec"]["argsTemplate"]]
    agent["metadata"] = {"name": "demo-metered"}
    agent["spec"]["providerRef"] = {"name": "demo-metered"}
    return [provider, agent]


def secret() -> dict[str, Any]:
    return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "trackers"},
            "spec": {"stringData": SECRET_VALUES}}


def github_source(s: Stack, *, poll: int = 0, webhook: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "provider": "github", "pollIntervalSeconds": poll,
        "github": {"owner": OWNER, "repo": REPO, "apiUrl": s.github.url,
                   "auth": {"tokenSecretRef": {"name": "trackers", "key": "github-token"}}}}
    if webhook:
        spec["webhook"] = {"secretRef": {"name": "trackers", "key": "webhook"}}
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": "web"},
            "spec": spec}


def label_rule(name: str = "demo-on-label", *, source: str = "web", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": name},
            "spec": {"sourceRef": {"name": source}, "issue": {"label": LABEL}, "concurrencyPolicy": "Forbid",
                     "run": {"agentRef": {"name": "demo"}},
                     "writeBack": {"comment": {}, "pullRequest": {}}, **spec}}


# --- the fakes ------------------------------------------------------------------------------------


@contextmanager
def github_fake(bare: Path) -> Iterator[FakeGitHub]:
    with FakeGitHub(tokens={SECRET_VALUES["github-token"]}) as fake:
        fake.add_repo(FULL, git_dir=bare, default_branch="main")
        yield fake


def issue_body(n: int) -> str:
    return f'Add the line "Hello from issue {n}" to README.md.\n\n- [ ] README.md ends with the greeting\n'


def new_issue(s: Stack, n: int, title: str, *, labelled: bool) -> int:
    number: int = s.github.create_issue(FULL, title, issue_body(n), labels=[LABEL] if labelled else [])["number"]
    return number


def labelled(s: Stack, number: int, action: str = "labeled", **kwargs: Any) -> GitHubDelivery:
    """The ``issues`` delivery GitHub sends for ``action`` on the issue as it is now."""
    return s.github.deliver("issues", s.github.issues_event(FULL, number, action, label=LABEL),
                            SECRET_VALUES["webhook"], **kwargs)


def pulls(s: Stack) -> list[dict[str, Any]]:
    return s.github.pulls(FULL)


def comments(s: Stack, number: int) -> list[dict[str, Any]]:
    return s.github.comments(FULL, number)


# --- the checks every path ends with ----------------------------------------------------------------


def assert_pull_request_and_comment(s: Stack, number: int, run: str) -> dict[str, Any]:
    """The run Succeeded; ``joch/<run>`` in the bare repository holds the demo agent's change on
    main; exactly one pull request (``Closes #number``) and exactly one comment, which ends up showing
    Succeeded, the pull request's URL and the cost; the run's status.writeBack names the pull request."""
    status = s.wait_run_ended(run)
    assert status["phase"] == "Succeeded", (status, s.tail())
    branch = f"joch/{run}"
    heads = s.wait(f"branch {branch} in the bare repository", lambda: branch in branches(s.bare) and branches(s.bare))
    main = heads["main"]
    assert git(s.bare, "rev-parse", f"{branch}^").strip() == main  # one commit on main
    greeting = s.github.issue(FULL, number)["body"].split('"')[1]  # what the demo agent appends
    assert git(s.bare, "show", f"{branch}:README.md") == f"# web\n{greeting}\n"
    assert git(s.bare, "show", "main:README.md") == "# web\n"  # main untouched

    prs = s.wait("the pull request", lambda: pulls(s))
    assert len(prs) == 1, prs
    pr = prs[0]
    assert (pr["head"]["ref"], pr["base"]["ref"], pr["state"]) == (branch, "main", "open"), pr
    assert f"Closes #{number}" in (pr["body"] or ""), pr["body"]

    def final_comment() -> dict[str, Any] | None:
        shown = comments(s, number)
        assert len(shown) <= 1, shown
        return shown[0] if shown and "Succeeded" in shown[0]["body"] and pr["html_url"] in shown[0]["body"] else None

    comment = s.wait("the comment to show Succeeded and the pull request", final_comment)
    assert_shows_cost(s, run, comment["body"])
    assert len(comments(s, number)) == 1
    # Created once, then edited in place as the run went on.
    assert len(s.github.calls("POST", f"/repos/{FULL}/issues/{number}/comments")) == 1
    assert s.github.calls("PATCH", f"/repos/{FULL}/issues/comments/{comment['id']}")

    write_back = s.wait("status.writeBack.pullRequest", lambda: (s.run(run).get("status") or {}).get("writeBack"))
    assert write_back["pullRequest"]["url"] == pr["html_url"], write_back
    assert write_back.get("commentUrl") == comment["html_url"], write_back
    return pr


def assert_shows_cost(s: Stack, run: str, body: str) -> None:
    """The comment shows the run's cost (what it reported, $0 for the demo agent, which reports none)."""
    cost = (s.run(run).get("status") or {}).get("costUsd") or 0
    assert "cost" in body.lower() and any(f"${cost:.{n}f}" in body for n in (2, 4)), (cost, body)


def dispatched(s: Stack) -> list[dict[str, Any]]:
    return [e for e in s.executions() if e["spec"]["decision"] == "Dispatched"]


def assert_nothing_more(s: Stack, number: int) -> None:
    """Still one run, one pull request, one comment, one Dispatched execution."""
    assert len(s.runs()) == 1, [r["metadata"]["name"] for r in s.runs()]
    assert len(pulls(s)) == 1
    assert len(comments(s, number)) == 1
    assert len(dispatched(s)) == 1, s.executions()


def settle(s: Stack, seconds: float = 2.0) -> None:
    """Give the controllers time to do what they should not (a second run, PR, comment): the
    assertions after this are about nothing happening, which no wait can observe."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)


# --- 1. by webhook ---------------------------------------------------------------------------------


def test_an_issue_labelled_by_webhook_becomes_a_run_a_pull_request_and_one_comment(s: Stack) -> None:
    synced = s.apply_synced(github_source(s), label_rule())  # polling off: from now on, webhooks only
    number = new_issue(s, 1, "Greet from the README", labelled=True)
    delivery = labelled(s, number)
    first = s.deliver(delivery)
    assert first.status_code in (200, 202), first.text

    spec_name = f"gh-{OWNER}-{REPO}-{number}"
    spec = s.wait("the synced spec", lambda: next((x for x in s.specs() if x["metadata"]["name"] == spec_name), None))
    assert spec["spec"]["source"]["provider"] == "github" and spec["spec"]["summary"] == "Greet from the README"
    assert spec["spec"]["acceptanceCriteria"] == ["README.md ends with the greeting"]
    assert spec["metadata"]["labels"]["joch.dev/source"] == "web"
    run = s.the_one_run()
    [execution] = s.wait("the execution", lambda: dispatched(s))
    assert execution["spec"]["runRef"]["name"] == run and execution["spec"]["event"]["kind"] == "issue"
    assert execution["spec"]["event"]["item"] == f"github:{FULL}#{number}"
    assert s.run(run)["spec"]["implementationRef"]["name"] == spec_name
    assert_pull_request_and_comment(s, number, run)
    [recorded] = s.deliveries()
    assert execution["spec"]["event"]["deliveryRef"] in (delivery.delivery_id, recorded["metadata"]["name"])
    source = s.obj(f"{CORE}/implementationsources/web")["status"]
    assert source["lastSyncedAt"] == synced["lastSyncedAt"], source  # no poll since: the webhook did it all
    listed = s.joch("get", "webhookdeliveries").stdout
    assert recorded["metadata"]["name"] in listed and "Processed" in listed, listed
    listed = s.joch("get", "triggerexecutions").stdout
    assert run in listed and "Dispatched" in listed, listed
    listed = s.joch("get", "writeintents").stdout
    assert f"{run}-comment" in listed and f"{run}-pr" in listed and "Succeeded" in listed, listed
    assert recorded["spec"]["deliveryId"] == delivery.delivery_id, recorded
    assert recorded["status"]["phase"] == "Processed", recorded

    # The same delivery again: 200, recognised, nothing new.
    again = s.deliver(delivery)
    assert again.status_code == 200 and again.json().get("duplicate") is True, again.text
    assert len(s.deliveries()) == 1

    # The label removed and added again (new deliveries): the rule Forbids a second run of the item.
    s.github.remove_label(FULL, number, LABEL)
    assert s.deliver(labelled(s, number, "unlabeled")).status_code in (200, 202)
    s.github.add_label(FULL, number, LABEL)
    assert s.deliver(labelled(s, number)).status_code in (200, 202)
    s.wait("the three deliveries processed", lambda: len(d := s.deliveries()) == 3
           and all((x.get("status") or {}).get("phase") == "Processed" for x in d))
    settle(s)
    assert_nothing_more(s, number)
    others = [e["spec"]["decision"] for e in s.executions() if e["spec"]["decision"] != "Dispatched"]
    assert others and set(others) <= {"Deduplicated", "Rejected"}, s.executions()
    assert_no_secret_shown(s)


def assert_no_secret_shown(s: Stack) -> None:
    """No credential in the server's log or in anything it shows of the integration objects."""
    shown = s.log.read_text() + json.dumps([s.items(f"{CORE}/implementationsources"), s.deliveries(), s.intents(),
                                             s.executions(), s.runs()])
    assert [k for k, v in SECRET_VALUES.items() if v in shown] == []


# --- 2. by polling alone ---------------------------------------------------------------------------


def test_an_issue_labelled_is_found_by_polling_alone(s: Stack) -> None:
    number = new_issue(s, 2, "Greet by poll", labelled=False)
    s.apply(github_source(s, poll=1, webhook=False), label_rule())
    spec_name = f"gh-{OWNER}-{REPO}-{number}"
    s.wait("the first sync", lambda: any(x["metadata"]["name"] == spec_name for x in s.specs()))
    assert s.runs() == []  # not labelled yet
    s.github.add_label(FULL, number, LABEL)
    run = s.the_one_run()
    assert_pull_request_and_comment(s, number, run)
    assert s.deliveries() == []
    settle(s, 2.5)  # two more polls
    assert_nothing_more(s, number)


def test_a_webhook_and_a_poll_of_the_same_label_make_one_run(s: Stack) -> None:
    s.apply_synced(github_source(s, poll=1), label_rule())
    number = new_issue(s, 11, "Greet once, told twice", labelled=False)
    s.github.add_label(FULL, number, LABEL)
    assert s.deliver(labelled(s, number)).status_code in (200, 202)
    run = s.the_one_run()
    assert_pull_request_and_comment(s, number, run)
    s.wait("a poll after the label", lambda: len(s.github.calls("GET", f"/repos/{FULL}/issues")) >= 3)
    settle(s, 2.5)
    assert_nothing_more(s, number)
    keys = {e["spec"]["dedupeKey"] for e in s.executions()}
    assert keys == {f"issue:github:{FULL}#{number}:labeled:{LABEL}"}, s.executions()


# --- 3. kill -9 between the push and the pull request ------------------------------------------------


def test_kill_9_while_the_pull_request_is_being_opened_then_restart_adopts_it(s: Stack) -> None:
    s.apply_synced(github_source(s), label_rule())
    number = new_issue(s, 3, "Greet despite a crash", labelled=True)
    # The fake creates the pull request, then keeps the answer: the server dies not knowing it exists.
    s.github.hold_pull_requests()
    delivery = labelled(s, number)
    assert s.deliver(delivery).status_code in (200, 202)
    run = s.the_one_run()
    assert s.wait_run_ended(run)["phase"] == "Succeeded", s.tail()
    s.wait("the pull request created, its answer held", lambda: s.github.held_pull_requests)
    assert f"joch/{run}" in branches(s.bare)  # pushed before the pull request was asked for
    assert len(pulls(s)) == 1
    s.kill_9()
    s.github.release()  # the held answer is never given: its connection just closes
    s.start()
    assert_pull_request_and_comment(s, number, run)
    settle(s)
    assert_nothing_more(s, number)
    assert len(s.github.calls("POST", f"/repos/{FULL}/pulls")) == 1  # adopted, not asked for again
    again = s.deliver(delivery)  # GitHub redelivering what the dead server got: still known
    assert again.status_code == 200 and again.json().get("duplicate") is True, again.text
    [pr_intent] = [i for i in s.intents() if i["spec"]["type"] == "pullRequest"]
    assert pr_intent["status"]["phase"] == "Succeeded", pr_intent
    assert_no_secret_shown(s)


# --- 4. a bad signature ----------------------------------------------------------------------------


def test_a_delivery_with_a_bad_or_missing_signature_is_a_401_and_nothing_is_created(s: Stack) -> None:
    s.apply_synced(github_source(s), label_rule())
    number = new_issue(s, 4, "Forged", labelled=True)
    payload = s.github.issues_event(FULL, number, "labeled", label=LABEL)
    forged = s.github.deliver("issues", payload, "not-the-secret")
    unsigned = s.github.deliver("issues", payload, None)
    zeros = s.github.deliver("issues", payload, SECRET_VALUES["webhook"])
    answers = [s.deliver(forged), s.deliver(unsigned), s.deliver(zeros, {"X-Hub-Signature-256": "sha256=" + "0" * 64}),
               # signed right, but the body changed after signing
               s.post("/v1/webhooks/github", GitHubDelivery("issues", zeros.delivery_id, zeros.headers,
                                                            zeros.body.replace(b"Forged", b"Forget")))]
    for r in answers:
        assert r.status_code == 401, r.text
        assert r.json()["kind"] == "Status" and r.json()["reason"] == "Unauthorized", r.text
        assert SECRET_VALUES["webhook"] not in r.text
    settle(s)
    assert (s.deliveries(), s.specs(), s.executions(), s.runs()) == ([], [], [], [])
    assert pulls(s) == [] and comments(s, number) == []
    assert SECRET_VALUES["webhook"] not in s.log.read_text()


# --- 5. /joch run from a comment --------------------------------------------------------------------


def test_a_comment_command_from_a_stranger_is_rejected_naming_why_and_from_the_owner_runs(s: Stack) -> None:
    number = new_issue(s, 5, "Run me by comment", labelled=False)
    s.apply_synced(github_source(s), {
        "apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": "demo-on-comment"},
        "spec": {"sourceRef": {"name": "web"}, "comment": {"allowedAgents": ["demo"]}, "concurrencyPolicy": "Forbid",
                 "run": {"agentRef": {"name": "demo"}}, "writeBack": {"comment": {}}}})

    def command_from(login: str, association: str) -> httpx.Response:
        comment = s.github.comment(FULL, number, "/joch run agent=demo", user=login, association=association)
        payload = s.github.issue_comment_event(FULL, number, comment["id"])
        return s.deliver(s.github.deliver("issue_comment", payload, SECRET_VALUES["webhook"]))

    assert command_from("drive-by", "NONE").status_code in (200, 202)
    [rejected] = s.wait("the rejected execution", s.executions)
    assert rejected["spec"]["decision"] == "Rejected", rejected
    message = rejected["spec"]["message"] or ""
    assert "drive-by" in message and "NONE" in message, rejected
    assert rejected["spec"]["event"]["actor"] == "drive-by" and rejected["spec"].get("runRef") is None, rejected
    settle(s, 1)
    assert s.runs() == []

    # The owner's command runs; the owner asking again at once, while that run is on, is Forbidden.
    assert command_from(OWNER, "OWNER").status_code in (200, 202)
    assert command_from(OWNER, "OWNER").status_code in (200, 202)
    run = s.the_one_run()
    assert s.wait_run_ended(run)["phase"] == "Succeeded", s.tail()
    [ran] = dispatched(s)
    assert ran["spec"]["runRef"]["name"] == run and ran["spec"]["event"]["kind"] == "comment", ran
    assert ran["spec"]["event"]["actor"] == OWNER
    executions = s.wait("the three executions", lambda: len(e := s.executions()) == 3 and e)
    assert sorted((e["spec"]["decision"], e["spec"].get("reason")) for e in executions) == [
        ("Dispatched", None), ("Rejected", "ActorNotAllowed"), ("Rejected", "ConcurrencyForbidden")], executions
    assert len(s.runs()) == 1
    # The run's own comment (write-back) is the one comment besides the three commands.
    s.wait("the run's comment", lambda: any("Succeeded" in c["body"] for c in comments(s, number)))
    assert len(comments(s, number)) == 4


# --- 7. write-back behind an approval --------------------------------------------------------------


def approval_policy() -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "reviewed-writes"},
            "spec": {"selector": {"kinds": ["WriteIntent"]}, "rules": [
                {"name": "prs-need-approval", "phase": "writeBack", "action": "requireApproval",
                 "expression": 'object.spec.type == "pullRequest"',
                 "message": "a person looks at a pull request before it is opened"}]}}


def held_for_approval(s: Stack, run: str) -> dict[str, Any]:
    """The run Succeeded, its pull-request intent waits for the write-back Approval; no pull request."""
    assert s.wait_run_ended(run)["phase"] == "Succeeded", s.tail()

    def pending() -> dict[str, Any] | None:
        return next((i for i in s.intents() if i["spec"]["type"] == "pullRequest"
                     and (i.get("status") or {}).get("phase") == "PendingApproval"), None)

    intent = s.wait("the pull-request intent to wait for approval", pending)
    approval = s.obj(f"{RUNTIME}/approvals/{intent['metadata']['name']}")
    assert approval["spec"]["action"] == "write-back" and approval["spec"]["runRef"]["name"] == run, approval
    assert (approval["spec"].get("policyRef") or {}).get("rule") == "prs-need-approval", approval
    settle(s, 1.5)
    assert pulls(s) == []
    assert f"joch/{run}" not in branches(s.bare)
    return approval


def test_with_a_write_back_policy_no_pull_request_is_opened_until_approved(s: Stack) -> None:
    s.apply_synced(*metered_demo(), approval_policy(), github_source(s),
            label_rule(run={"agentRef": {"name": "demo-metered"}}))
    number = new_issue(s, 7, "Greet after review", labelled=True)
    assert s.deliver(labelled(s, number)).status_code in (200, 202)
    run = s.the_one_run()
    held_for_approval(s, run)
    s.joch("approve", "run", run, "--reason", "reviewed the patch")
    assert_pull_request_and_comment(s, number, run)
    assert (s.run(run).get("status") or {}).get("costUsd") == 0.42
    settle(s)
    assert_nothing_more(s, number)


def test_with_a_write_back_policy_a_denied_pull_request_is_rejected_and_the_comment_says_so(s: Stack) -> None:
    s.apply_synced(approval_policy(), github_source(s), label_rule())
    number = new_issue(s, 8, "Greet, after a no", labelled=True)
    assert s.deliver(labelled(s, number)).status_code in (200, 202)
    run = s.the_one_run()
    approval = held_for_approval(s, run)
    r = httpx.post(f"{s.base}/v1/namespaces/default/approvals/{approval['metadata']['name']}/decide",
                   json={"decision": "deny", "reason": "not this sprint"}, timeout=10)
    assert r.status_code == 200, r.text

    def rejected() -> dict[str, Any] | None:
        intent = s.obj(f"{RUNTIME}/writeintents/{approval['metadata']['name']}")
        return intent if (intent.get("status") or {}).get("phase") == "Rejected" else None

    s.wait("the pull-request intent Rejected", rejected)

    def says_so() -> dict[str, Any] | None:
        shown = comments(s, number)
        assert len(shown) <= 1, shown
        body = shown[0]["body"].lower() if shown else ""
        return shown[0] if "denied" in body or "rejected" in body else None

    comment = s.wait("the comment to say the pull request was denied", says_so)
    assert "not this sprint" in comment["body"], comment["body"]
    settle(s)
    assert pulls(s) == [] and f"joch/{run}" not in branches(s.bare)
    assert len(comments(s, number)) == 1 and len(s.runs()) == 1
