"""Issues in, runs out: webhooks (the real server), polling (the source controller over the fake
Linear), comment commands, schedules on a fake clock, manual fires, manual edits and closed issues —
over a real SQLite store with the source, trigger and delivery controllers running (the run
controller does not: runs are created and admitted, not executed)."""

from __future__ import annotations

import base64
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from joch.admission.apply import apply_documents
from joch.admission.documents import Document
from joch.api import kinds
from joch.api.audit import AuditQuery
from joch.api.integrations import (
    EXECUTION_ANNOTATION,
    IMPLEMENTATION_SOURCE,
    RULE_LABEL,
    SOURCE_ITEM,
    SOURCE_ITEM_HASH,
    SOURCE_LABEL,
    SYNC_REQUESTED,
    TRIGGER_EXECUTION,
    TRIGGER_RULE,
    WEBHOOK_DELIVERY,
)
from joch.cli.main import app
from joch.controllers.deliveries import DeliveryController
from joch.controllers.manager import Manager
from joch.controllers.options import ControllerOptions
from joch.controllers.sources import SourceController, apply_issue
from joch.controllers.triggers import TriggerController, TriggerEvent, evaluate
from joch.integrations.base import Issue, Repository
from joch.integrations.signatures import sign
from joch.server.testing import LiveServer, live_server
from joch.store import Store, open_store
from support import FakeClock, provider
from support.fake_github import FakeGitHub
from support.fake_linear import FakeLinear

NS = "default"
SECRET = b"whsec-test-0123"
REPO = "acme/web"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'joch.db'}")
    yield s
    s.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(float(int(time.time())))


@pytest.fixture
def controllers(store: Store, clock: FakeClock) -> Iterator[Manager]:
    manager = Manager(store, [SourceController(), TriggerController(), DeliveryController()],
                      ControllerOptions(leader_election=False, resync_period=0.0), clock=clock)
    manager.start()
    assert manager.wait_started(10)
    yield manager
    manager.stop()


@pytest.fixture
def server(store: Store) -> Iterator[LiveServer]:
    with live_server(store) as running:
        yield running


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub() as fake:
        fake.add_repo(REPO)
        yield fake


def apply(store: Store, *objects: dict[str, Any]) -> None:
    apply_documents(store, [Document(index=i, source="test", obj=o) for i, o in enumerate(objects)], namespace=NS)


def secret(name: str, **values: str) -> dict[str, Any]:
    return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": name},
            "spec": {"data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}}}


def agent(name: str = "demo") -> list[dict[str, Any]]:
    return [provider("demo-provider"),
            {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
             "spec": {"providerRef": {"name": "demo-provider"}}}]


def github_source(fake: FakeGitHub, name: str = "web", **extra: Any) -> dict[str, Any]:
    owner, repo = REPO.split("/")
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": name},
            "spec": {"provider": "github", "pollIntervalSeconds": 0, "webhook": {"secretRef": {"name": "hook",
                                                                                              "key": "secret"}},
                     "github": {"owner": owner, "repo": repo, "apiUrl": fake.api_url,
                                "auth": {"tokenSecretRef": {"name": "gh", "key": "token"}}}, **extra}}


def rule(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"run": {"agentRef": {"name": "demo"}}, **spec}
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": name}, "spec": body}


def setup_github(store: Store, fake: FakeGitHub, *rules: dict[str, Any]) -> None:
    apply(store, secret("hook", secret=SECRET.decode()), secret("gh", token="ghp_fake_token"), *agent(),
          github_source(fake), *rules)


def post(server: LiveServer, delivery: Any, path: str = "/v1/webhooks/github") -> httpx.Response:
    return server.http.post(path, content=delivery.body, headers=delivery.headers)


def wait_for(check: Callable[[], Any], what: str, seconds: float = 10) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def advance_until(clock: FakeClock, seconds: float, check: Callable[[], Any], what: str) -> Any:
    """Move the clock by ``seconds`` until ``check`` holds (a poll due just as the clock moved is
    scheduled from the moved clock, so one step can be too few)."""
    for _ in range(5):
        clock.advance(seconds)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if found := check():
                return found
            time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def items(store: Store, kind: Any) -> list[dict[str, Any]]:
    return list(store.list(kind).items)


def processed(store: Store, count: int) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        found = items(store, WEBHOOK_DELIVERY)
        ok = len(found) == count and all((d.get("status") or {}).get("phase") == "Processed" for d in found)
        return found if ok else None

    result: list[dict[str, Any]] = wait_for(done, f"{count} processed deliveries")
    return result


def decisions(store: Store) -> list[tuple[str, str | None]]:
    return sorted((e["spec"]["decision"], e["spec"].get("reason")) for e in items(store, TRIGGER_EXECUTION))


LABELED = {"issue": {"label": "joch:demo"}}


# --- webhooks ------------------------------------------------------------------------------------------

def test_a_bad_or_missing_signature_is_401_and_nothing_is_stored(
    store: Store, server: LiveServer, github: FakeGitHub, controllers: Manager,
) -> None:
    setup_github(store, github, rule("fix", sourceRef={"name": "web"}, **LABELED))
    github.create_issue(REPO, "Fix the bug", labels=["joch:demo"])
    for key in (b"wrong-secret", None):
        answer = post(server, github.deliver("issues", github.issues_event(REPO, 1, "labeled", label="joch:demo"),
                                             key))
        assert answer.status_code == 401, answer.text
        assert answer.json()["reason"] == "Unauthorized"
        assert "X-Hub-Signature-256" in answer.json()["message"]
    time.sleep(0.3)
    assert items(store, WEBHOOK_DELIVERY) == []
    assert items(store, kinds.IMPLEMENTATION_SPEC) == []
    assert items(store, kinds.AGENT_RUN) == []
    denied = [e for e in store.audit_events(AuditQuery()).items if e.decision == "denied"]
    assert len(denied) == 2 and all(e.kind == "WebhookDelivery" for e in denied)


def test_a_labelled_issue_becomes_a_spec_and_one_run_however_often_it_is_delivered(
    store: Store, server: LiveServer, github: FakeGitHub, controllers: Manager,
) -> None:
    setup_github(store, github, rule("fix", sourceRef={"name": "web"}, **LABELED))
    github.create_issue(REPO, "Fix the bug", "It breaks.\n\n- [ ] a test\n- [x] a fix\n", labels=["joch:demo"])
    delivery = github.deliver("issues", github.issues_event(REPO, 1, "labeled", label="joch:demo"), SECRET)
    first, again = post(server, delivery), post(server, delivery)
    assert first.status_code == 200 and first.json()["duplicate"] is False, first.text
    assert again.status_code == 200 and again.json()["duplicate"] is True
    [recorded] = processed(store, 1)
    spec = store.get(kinds.IMPLEMENTATION_SPEC, NS, "gh-acme-web-1")
    assert spec["metadata"]["labels"][SOURCE_LABEL] == "web"
    assert spec["spec"]["text"].startswith("# Fix the bug\n\nIt breaks.")
    assert spec["spec"]["acceptanceCriteria"] == ["a test", "a fix"]
    assert spec["spec"]["source"]["externalId"] == "acme/web#1"
    [execution] = items(store, TRIGGER_EXECUTION)
    assert execution["spec"]["decision"] == "Dispatched"
    assert execution["spec"]["dedupeKey"] == "issue:github:acme/web#1:labeled:joch:demo"
    [run] = items(store, kinds.AGENT_RUN)
    assert run["metadata"]["name"] == execution["metadata"]["name"] == execution["spec"]["runRef"]["name"]
    assert run["metadata"]["labels"][RULE_LABEL] == "fix"
    assert SOURCE_ITEM_HASH in run["metadata"]["labels"]
    annotations = run["metadata"]["annotations"]
    assert annotations[EXECUTION_ANNOTATION] == execution["metadata"]["name"]
    assert annotations[SOURCE_ITEM] == "github:acme/web#1"
    assert annotations[kinds.CREATED_BY] == "system:joch:trigger:default:fix"
    assert run["spec"]["implementationRef"] == {"name": "gh-acme-web-1"}
    assert any(c.startswith("TriggerExecution/") for c in recorded["status"]["caused"])


def test_label_removed_and_added_again_under_forbid_starts_one_run(
    store: Store, server: LiveServer, github: FakeGitHub, controllers: Manager,
) -> None:
    setup_github(store, github, rule("fix", sourceRef={"name": "web"}, concurrencyPolicy="Forbid", **LABELED))
    github.create_issue(REPO, "Fix the bug", labels=["joch:demo"])
    assert post(server, github.deliver("issues", github.issues_event(REPO, 1, "labeled", label="joch:demo"),
                                       SECRET)).status_code == 200
    processed(store, 1)
    github.remove_label(REPO, 1, "joch:demo")
    assert post(server, github.deliver("issues", github.issues_event(REPO, 1, "unlabeled", label="joch:demo"),
                                       SECRET)).status_code == 200
    processed(store, 2)
    github.add_label(REPO, 1, "joch:demo")
    assert post(server, github.deliver("issues", github.issues_event(REPO, 1, "labeled", label="joch:demo"),
                                       SECRET)).status_code == 200
    processed(store, 3)
    assert len(items(store, kinds.AGENT_RUN)) == 1
    assert decisions(store) == [("Deduplicated", "Duplicate"), ("Dispatched", None)]


def test_an_issue_opened_with_the_label_starts_one_run_under_allow(
    store: Store, server: LiveServer, github: FakeGitHub, controllers: Manager,
) -> None:
    """GitHub sends ``opened`` and then ``labeled`` for an issue opened with a label: a rule on that
    label that also fires on ``opened`` must see one labelling, not two events."""
    setup_github(store, github, rule("fix", sourceRef={"name": "web"}, concurrencyPolicy="Allow",
                                     issue={"label": "joch:demo", "actions": ["opened", "labeled"]}))
    github.create_issue(REPO, "Fix the bug", labels=["joch:demo"])
    for action, label in (("opened", None), ("labeled", "joch:demo")):
        assert post(server, github.deliver("issues", github.issues_event(REPO, 1, action, label=label),
                                           SECRET)).status_code == 200
    processed(store, 2)
    assert len(items(store, kinds.AGENT_RUN)) == 1
    assert [d for d, _ in decisions(store)].count("Dispatched") == 1


def test_comment_commands_run_only_for_allowed_commenters(
    store: Store, server: LiveServer, github: FakeGitHub, controllers: Manager,
) -> None:
    setup_github(store, github, rule("cmd", sourceRef={"name": "web"}, comment={}))
    github.create_issue(REPO, "Fix the bug")
    stranger = github.comment(REPO, 1, "/joch run agent=demo", user="mallory", association="NONE")
    assert post(server, github.deliver("issue_comment", github.issue_comment_event(REPO, 1, stranger["id"]),
                                       SECRET)).status_code == 200
    processed(store, 1)
    [rejected] = items(store, TRIGGER_EXECUTION)
    assert rejected["spec"]["decision"] == "Rejected"
    assert rejected["spec"]["reason"] == "ActorNotAllowed"
    assert "mallory (author association NONE)" in rejected["spec"]["message"]
    assert items(store, kinds.AGENT_RUN) == []
    warned = [e["spec"] for e in items(store, kinds.EVENT) if e["spec"]["involvedObject"]["name"] == "cmd"]
    assert [(e["type"], e["reason"]) for e in warned] == [("Warning", "ActorNotAllowed")]
    owner = github.comment(REPO, 1, "Please.\n/joch run agent=demo effort=high", user="octocat", association="OWNER")
    assert post(server, github.deliver("issue_comment", github.issue_comment_event(REPO, 1, owner["id"]),
                                       SECRET)).status_code == 200
    processed(store, 2)
    [run] = items(store, kinds.AGENT_RUN)
    assert run["spec"]["parameters"] == {"effort": "high"}
    assert decisions(store) == [("Dispatched", None), ("Rejected", "ActorNotAllowed")]



def test_a_deleted_issue_delivered_marks_its_spec_stale_deleted(
    store: Store, server: LiveServer, github: FakeGitHub, controllers: Manager,
) -> None:
    setup_github(store, github)
    github.create_issue(REPO, "Fix the bug")
    assert post(server, github.deliver("issues", github.issues_event(REPO, 1, "opened"), SECRET)).status_code == 200
    processed(store, 1)
    stale = condition(store.get(kinds.IMPLEMENTATION_SPEC, NS, "gh-acme-web-1"), "Stale")
    assert stale["status"] == "False", stale
    deleted = github.issues_event(REPO, 1, "deleted")  # GitHub's payload carries the issue as it was
    github.delete_issue(REPO, 1)
    assert post(server, github.deliver("issues", deleted, SECRET)).status_code == 200
    processed(store, 2)
    spec = store.get(kinds.IMPLEMENTATION_SPEC, NS, "gh-acme-web-1")
    stale = condition(spec, "Stale")
    assert (stale["status"], stale["reason"]) == ("True", "Deleted"), stale
    assert "acme/web#1 was deleted" in stale["message"]

def test_a_ping_is_recorded_and_causes_nothing(
    store: Store, server: LiveServer, github: FakeGitHub, controllers: Manager,
) -> None:
    setup_github(store, github)
    answer = post(server, github.deliver("ping", github.ping_event(REPO), SECRET))
    assert answer.status_code == 200, answer.text
    [delivery] = processed(store, 1)
    assert delivery["status"]["caused"] == [] and delivery["spec"]["event"] == "ping"


def test_a_generic_webhook_fires_its_rule_once_per_delivery(
    store: Store, server: LiveServer, controllers: Manager,
) -> None:
    apply(store, secret("hook", secret=SECRET.decode()), *agent(),
          rule("deploy", webhook={"secretRef": {"name": "hook", "key": "secret"}, "dedupeKey": "{{ payload.id }}"},
               run={"agentRef": {"name": "demo"},
                    "implementation": {"inline": {"text": "Deploy {{ event.payload.ref }}"}}}))
    body = b'{"id": "evt-1", "ref": "v1.2"}'
    headers = {"Content-Type": "application/json", "X-Joch-Signature-256": "sha256=" + sign(SECRET, body)}
    unsigned = server.http.post("/v1/webhooks/default/deploy", content=body,
                                headers={"Content-Type": "application/json"})
    assert unsigned.status_code == 401
    assert server.http.post("/v1/webhooks/default/deploy", content=body, headers=headers).json()["duplicate"] is False
    assert server.http.post("/v1/webhooks/default/deploy", content=body, headers=headers).json()["duplicate"] is True
    processed(store, 1)
    [run] = items(store, kinds.AGENT_RUN)
    assert run["spec"]["implementation"]["inline"]["text"] == "Deploy v1.2"


# --- manual fire, schedules --------------------------------------------------------------------------

def test_fire_dispatches_and_a_repeated_key_is_deduplicated(store: Store, server: LiveServer) -> None:
    apply(store, *agent(), rule("manual"))
    path = "/v1/namespaces/default/triggerrules/manual/fire"
    first = server.http.post(path, json={"key": "k1", "text": "Do it", "parameters": {"a": "b"}})
    assert first.status_code == 201, first.text
    assert first.json()["spec"]["decision"] == "Dispatched"
    assert first.json()["spec"]["event"]["actor"] == "system:anonymous"
    again = server.http.post(path, json={"key": "k1", "text": "Do it"})
    assert again.status_code == 200 and again.json()["spec"]["decision"] == "Deduplicated"
    [run] = items(store, kinds.AGENT_RUN)
    assert run["spec"]["implementation"]["inline"]["text"] == "Do it" and run["spec"]["parameters"] == {"a": "b"}
    nothing = server.http.post(path, json={})
    assert nothing.json()["spec"]["decision"] == "Rejected" and nothing.json()["spec"]["reason"] == "NoImplementation"
    missing = server.http.post("/v1/namespaces/default/triggerrules/nope/fire", json={})
    assert missing.status_code == 404


def test_a_cron_rule_fires_on_schedule(store: Store, clock: FakeClock, controllers: Manager) -> None:
    apply(store, *agent(), rule("nightly", schedule={"cron": "*/5 * * * *"},
                                run={"agentRef": {"name": "demo"},
                                     "implementation": {"inline": {"text": "Run at {{ event.scheduledTime }}"}}}))
    wait_for(lambda: (store.get(TRIGGER_RULE, NS,
                                "nightly").get("status") or {}).get("nextScheduleTime"), "the next schedule time")
    time.sleep(0.6)
    assert items(store, kinds.AGENT_RUN) == []
    [run] = advance_until(clock, 300, lambda: items(store, kinds.AGENT_RUN), "the scheduled run")
    [execution] = items(store, TRIGGER_EXECUTION)
    assert execution["spec"]["event"]["kind"] == "schedule"
    assert execution["spec"]["dedupeKey"] == f"schedule:{execution['spec']['event']['scheduledTime']}"
    assert run["spec"]["implementation"]["inline"]["text"].startswith("Run at ")
    time.sleep(0.6)
    assert len(items(store, kinds.AGENT_RUN)) == 1



def test_a_cron_rule_fires_at_its_time_zones_hour(store: Store, clock: FakeClock, controllers: Manager) -> None:
    """``0 9 * * *`` in Asia/Kolkata (UTC+05:30, no daylight saving) is 03:30 UTC: not a second
    earlier, and once."""
    apply(store, *agent(), rule("morning", schedule={"cron": "0 9 * * *", "timeZone": "Asia/Kolkata"},
                                run={"agentRef": {"name": "demo"},
                                     "implementation": {"inline": {"text": "Run at {{ event.scheduledTime }}"}}}))
    now = dt.datetime.fromtimestamp(clock.time(), dt.UTC)
    due = now.replace(hour=3, minute=30, second=0, microsecond=0)
    if due <= now:
        due += dt.timedelta(days=1)
    expected = due.strftime("%Y-%m-%dT%H:%M:%SZ")
    shown = wait_for(lambda: (store.get(TRIGGER_RULE, NS, "morning").get("status") or {}).get("nextScheduleTime"),
                     "the next schedule time")
    assert shown == expected
    clock.advance(due.timestamp() - clock.time() - 1)
    time.sleep(0.6)
    assert items(store, kinds.AGENT_RUN) == []
    [run] = advance_until(clock, 1, lambda: items(store, kinds.AGENT_RUN), "the scheduled run")
    [execution] = items(store, TRIGGER_EXECUTION)
    assert execution["spec"]["event"]["scheduledTime"] == expected
    assert run["spec"]["implementation"]["inline"]["text"] == f"Run at {expected}"
    time.sleep(0.6)
    assert len(items(store, kinds.AGENT_RUN)) == 1
    assert (store.get(TRIGGER_RULE, NS, "morning")["status"]["nextScheduleTime"]
            == (due + dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ"))

# --- apply_issue: manual edits, closed issues ----------------------------------------------------------

def issue(number: int = 7, *, title: str = "Title", body: str = "Body", state: str = "open",
          labels: tuple[str, ...] = ("bug",), version: str = "v1") -> Issue:
    repository = Repository(owner="acme", name="web", clone_url="https://github.com/acme/web.git",
                            default_branch="main")
    return Issue(provider="github", id=str(number), key=f"acme/web#{number}", title=title, body=body,
                 url=f"https://github.com/acme/web/issues/{number}", state=state,
                 labels=labels, updated_at=version, number=number, repository=repository, version=version)


def source_obj(store: Store, **extra: Any) -> dict[str, Any]:
    apply(store, {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": "web"},
                  "spec": {"provider": "github", "pollIntervalSeconds": 0,
                           "github": {"owner": "acme", "repo": "web",
                                      "auth": {"tokenSecretRef": {"name": "gh", "key": "token"}}}, **extra}})
    found: dict[str, Any] = store.get(IMPLEMENTATION_SOURCE, NS, "web")
    return found


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def test_a_manual_edit_is_kept_and_shows_diverged(store: Store) -> None:
    source = source_obj(store)
    assert apply_issue(store, source, issue(), 1.0).change == "created"
    assert apply_issue(store, source, issue(), 2.0).change == "unchanged"
    edited = store.get(kinds.IMPLEMENTATION_SPEC, NS, "gh-acme-web-7")
    apply(store, {**edited, "metadata": {k: v for k, v in edited["metadata"].items() if k in ("name", "labels",
                                                                                           "annotations")},
                  "spec": {**edited["spec"], "text": "# My own words\n"}})
    change = apply_issue(store, source, issue(title="Upstream edit", version="v2"), 3.0)
    assert change.change == "diverged"
    spec = store.get(kinds.IMPLEMENTATION_SPEC, NS, "gh-acme-web-7")
    assert spec["spec"]["text"] == "# My own words\n"
    diverged = condition(spec, "Diverged")
    assert diverged["status"] == "True" and "onManualEdit: Overwrite" in diverged["message"]
    overwrite = source_obj(store, onManualEdit="Overwrite")
    assert apply_issue(store, overwrite, issue(title="Upstream edit", version="v2"), 4.0).change == "updated"
    spec = store.get(kinds.IMPLEMENTATION_SPEC, NS, "gh-acme-web-7")
    assert spec["spec"]["text"].startswith("# Upstream edit") and condition(spec, "Diverged")["status"] == "False"


def test_a_closed_issue_marks_its_spec_stale_and_reopening_clears_it(store: Store) -> None:
    source = source_obj(store)
    apply_issue(store, source, issue(), 1.0)
    assert apply_issue(store, source, issue(state="closed", version="v2"), 2.0).change == "stale"
    spec = store.get(kinds.IMPLEMENTATION_SPEC, NS, "gh-acme-web-7")
    assert condition(spec, "Stale")["status"] == "True" and condition(spec, "Stale")["reason"] == "Closed"
    assert apply_issue(store, source, issue(state="closed", version="v2"), 3.0).change == "unchanged"
    assert apply_issue(store, source, issue(version="v3"), 4.0).change == "updated"
    assert condition(store.get(kinds.IMPLEMENTATION_SPEC, NS, "gh-acme-web-7"), "Stale")["status"] == "False"
    closed_new = apply_issue(store, source, issue(8, state="closed"), 5.0)
    assert closed_new.change == "unchanged"
    assert [s["metadata"]["name"] for s in items(store, kinds.IMPLEMENTATION_SPEC)] == ["gh-acme-web-7"]


# --- polling (Linear) ----------------------------------------------------------------------------------

@pytest.fixture
def linear() -> Iterator[FakeLinear]:
    with FakeLinear() as fake:
        yield fake


def linear_source(fake: FakeLinear, key: str, *, interval: int = 30) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": "eng"},
            "spec": {"provider": "linear", "pollIntervalSeconds": interval,
                     "linear": {"teamKey": "ENG", "apiUrl": fake.url,
                                "auth": {"apiKeySecretRef": {"name": "lin", "key": "key"}}}}}


def test_polling_alone_makes_the_spec_and_one_run(
    store: Store, linear: FakeLinear, clock: FakeClock, controllers: Manager,
) -> None:
    linear.create_issue("Fix the login", "Steps:\n- [ ] reproduce", labels=["joch:demo"])
    apply(store, secret("lin", key=linear.api_key), *agent(),
          rule("fix", sourceRef={"name": "eng"}, concurrencyPolicy="Forbid",
               run={"agentRef": {"name": "demo"},
                    "execution": {"coordinates": {"git": {"url": "https://example.com/acme/web.git"}}}}, **LABELED),
          linear_source(linear, linear.api_key))
    [spec] = wait_for(lambda: items(store, kinds.IMPLEMENTATION_SPEC), "the synced spec")
    assert spec["metadata"]["name"] == "lin-eng-1"
    [run] = wait_for(lambda: items(store, kinds.AGENT_RUN), "the run")
    assert run["metadata"]["annotations"][SOURCE_ITEM] == "linear:ENG-1"
    source = wait_for(lambda: (s := store.get(IMPLEMENTATION_SOURCE, NS, "eng")).get("status", {}).get("counts")
                      and s, "the source status")
    assert source["status"]["counts"]["issues"] == 1 and condition(source, "Ready")["status"] == "True"
    linear.update_issue("ENG-1", remove_labels=["joch:demo"])
    advance_until(clock, 31, lambda: store.get(kinds.IMPLEMENTATION_SPEC, NS, "lin-eng-1")["spec"]["labels"] == [],
                  "the label gone")
    linear.update_issue("ENG-1", add_labels=["joch:demo"])
    advance_until(clock, 31, lambda: len(items(store, TRIGGER_EXECUTION)) == 2, "the second evaluation")
    assert len(items(store, kinds.AGENT_RUN)) == 1
    assert decisions(store) == [("Deduplicated", "Duplicate"), ("Dispatched", None)]


def test_bad_credentials_set_the_source_error_condition(
    store: Store, linear: FakeLinear, controllers: Manager,
) -> None:
    apply(store, secret("lin", key="lin_api_wrong"), linear_source(linear, "lin_api_wrong"))
    source = wait_for(lambda: (s := store.get(IMPLEMENTATION_SOURCE, NS, "eng")).get("status", {}).get("lastError")
                      and s, "the error")
    error = condition(source, "Error")
    assert error["status"] == "True" and error["reason"] == "BadCredentials"
    assert condition(source, "Ready")["status"] == "False"
    assert "lin" in error["message"] and "lin_api_wrong" not in error["message"]
    current = store.get(IMPLEMENTATION_SOURCE, NS, "eng")
    store.update(IMPLEMENTATION_SOURCE, {**current, "metadata": {**current["metadata"], "annotations": {
        SYNC_REQUESTED: "2026-01-01T00:00:00Z"}}})
    wait_for(lambda: store.get(IMPLEMENTATION_SOURCE, NS, "eng")["status"].get("observedSyncRequest")
             == "2026-01-01T00:00:00Z", "the requested sync")


# --- Linear webhooks -----------------------------------------------------------------------------------

def test_a_linear_delivery_is_verified_fresh_and_takes_the_same_path(
    store: Store, server: LiveServer, linear: FakeLinear, controllers: Manager,
) -> None:
    source = linear_source(linear, linear.api_key, interval=0)
    source["spec"]["webhook"] = {"secretRef": {"name": "hook", "key": "secret"}}
    apply(store, secret("hook", secret=SECRET.decode()), secret("lin", key=linear.api_key), *agent(),
          rule("fix", sourceRef={"name": "eng"},
               run={"agentRef": {"name": "demo"},
                    "execution": {"coordinates": {"git": {"url": "https://example.com/acme/web.git"}}}}, **LABELED),
          source)
    linear.create_issue("Fix the login", labels=["joch:demo"])
    forged = linear.issue_webhook("ENG-1", "create", secret=b"not-the-secret")
    assert post(server, forged, "/v1/webhooks/linear").status_code == 401
    stale = linear.issue_webhook("ENG-1", "create", secret=SECRET, timestamp_ms=int((time.time() - 600) * 1000))
    answer = post(server, stale, "/v1/webhooks/linear")
    assert answer.status_code == 401 and "webhookTimestamp" in answer.json()["message"]
    assert items(store, WEBHOOK_DELIVERY) == []
    delivery = linear.issue_webhook("ENG-1", "create", secret=SECRET)
    assert post(server, delivery, "/v1/webhooks/linear").json()["duplicate"] is False
    assert post(server, delivery, "/v1/webhooks/linear").json()["duplicate"] is True
    processed(store, 1)
    [run] = items(store, kinds.AGENT_RUN)
    assert run["spec"]["implementationRef"] == {"name": "lin-eng-1"}
    assert run["metadata"]["annotations"][SOURCE_ITEM] == "linear:ENG-1"


# --- the CLI -------------------------------------------------------------------------------------------

def cli(server: LiveServer, *args: str) -> Any:
    return CliRunner().invoke(app, ["--server", server.url, *args])


def test_the_cli_fires_rules_syncs_and_describes_sources(
    store: Store, server: LiveServer, linear: FakeLinear, controllers: Manager,
) -> None:
    linear.create_issue("Fix the login", labels=["bug"])
    apply(store, secret("lin", key=linear.api_key), *agent(), rule("manual"), linear_source(linear, linear.api_key,
                                                                                             interval=0))
    synced = cli(server, "sync", "source", "eng", "--timeout", "20")
    assert synced.exit_code == 0, synced.output
    assert "1 issue(s) held; 1 created" in synced.output  # polling is off: this is its first sync
    page = cli(server, "describe", "source", "eng")
    assert page.exit_code == 0, page.output
    assert "Sync:\n" in page.output and "  Issues:        1 (last sync: " in page.output
    fired = cli(server, "trigger", "fire", "manual", "--key", "k1", "--text", "Do it", "-p", "a=b")
    assert fired.exit_code == 0, fired.output
    assert ": Dispatched" in fired.output and "agentrun.runtime.joch.dev/manual-" in fired.output
    again = cli(server, "trigger", "fire", "manual", "--key", "k1", "--text", "Do it")
    assert again.exit_code == 0 and ": Deduplicated" in again.output and "Duplicate: " in again.output
    rejected = cli(server, "trigger", "fire", "manual")
    assert rejected.exit_code == 1 and "NoImplementation: " in rejected.output
    assert len(items(store, kinds.AGENT_RUN)) == 1


# --- concurrencyPolicy ---------------------------------------------------------------------------------

def issue_event(action: str) -> TriggerEvent:
    return TriggerEvent(kind="issue", provider="github", action=action, issue=issue())


@pytest.mark.parametrize("policy", ["Forbid", "Replace", "Allow"])
def test_concurrency_policy_per_source_item(store: Store, policy: str) -> None:
    apply(store, *agent(), rule("fix", concurrencyPolicy=policy, sourceRef={"name": "web"},
                                issue={"actions": ["opened", "reopened"]},
                                run={"agentRef": {"name": "demo"},
                                     "implementation": {"inline": {"text": "Fix {{ event.item }}"}}}))
    fix = store.get(TRIGGER_RULE, NS, "fix")
    first = evaluate(store, fix, issue_event("opened"), kind="issue", now=1.0)
    assert first["spec"]["decision"] == "Dispatched"
    second = evaluate(store, fix, issue_event("reopened"), kind="issue", now=2.0)
    old = store.get(kinds.AGENT_RUN, NS, first["spec"]["runRef"]["name"])
    if policy == "Forbid":
        assert (second["spec"]["decision"], second["spec"]["reason"]) == ("Rejected", "ConcurrencyForbidden")
        assert old["metadata"]["name"] in second["spec"]["message"] and "Forbid" in second["spec"]["message"]
        store.update_status(kinds.AGENT_RUN, {**old, "status": {**(old.get("status") or {}), "phase": "Succeeded"}})
        third = evaluate(store, fix, issue_event("reopened"), kind="issue", now=3.0)
        assert third["spec"]["decision"] == "Dispatched"
    else:
        assert second["spec"]["decision"] == "Dispatched"
        assert old["spec"]["cancel"] is (policy == "Replace")
    assert store.get(TRIGGER_RULE, NS, "fix")["status"]["executions"] == (3 if policy == "Forbid" else 2)



def test_one_event_evaluated_at_once_by_two_replicas_starts_one_run(store_url: str) -> None:
    """Two stores on one database stand for two replicas; each evaluates the same event from three
    threads at once: one Dispatched execution and one run, the other five Deduplicated."""
    replicas = [open_store(store_url), open_store(store_url)]
    try:
        apply(replicas[0], *agent(), rule("fix", sourceRef={"name": "web"}, issue={"actions": ["opened"]},
                                          run={"agentRef": {"name": "demo"},
                                               "implementation": {"inline": {"text": "Fix {{ event.item }}"}}}))
        fix = replicas[0].get(TRIGGER_RULE, NS, "fix")
        start = threading.Barrier(6)

        def evaluate_once(replica: Store) -> str:
            start.wait(10)
            decided: str = evaluate(replica, fix, issue_event("opened"), kind="issue", now=time.time())["spec"][
                "decision"]
            return decided

        with ThreadPoolExecutor(6) as pool:
            decided = sorted(pool.map(evaluate_once, replicas * 3))
        assert decided == ["Deduplicated"] * 5 + ["Dispatched"], decided
        assert len(items(replicas[1], kinds.AGENT_RUN)) == 1
        assert sorted(e["spec"]["decision"] for e in items(replicas[1], TRIGGER_EXECUTION)) == decided
    finally:
        for replica in replicas:
            replica.close()

# --- polling (GitHub) ----------------------------------------------------------------------------------

def test_polling_github_alone_makes_the_spec_and_one_run(
    store: Store, github: FakeGitHub, clock: FakeClock, controllers: Manager,
) -> None:
    github.create_issue(REPO, "Fix the bug", "- [ ] a test", labels=["joch:demo"])
    github.create_issue(REPO, "Not for Joch")
    source = github_source(github)
    source["spec"]["pollIntervalSeconds"] = 60
    apply(store, secret("gh", token="ghp_fake_token"), *agent(), rule("fix", sourceRef={"name": "web"}, **LABELED),
          source)
    wait_for(lambda: (store.get(IMPLEMENTATION_SOURCE, NS, "web").get("status") or {}).get("counts"), "the sync")
    [run] = items(store, kinds.AGENT_RUN)
    assert run["spec"]["implementationRef"] == {"name": "gh-acme-web-1"}
    assert run["spec"]["execution"]["coordinates"]["git"]["ref"] == "main"
    assert run["metadata"]["annotations"][SOURCE_ITEM] == "github:acme/web#1"
    assert sorted(s["metadata"]["name"] for s in items(store, kinds.IMPLEMENTATION_SPEC)) == [
        "gh-acme-web-1", "gh-acme-web-2"]
    github.edit_issue(REPO, 1, title="Fix the bug, really")
    advance_until(clock, 61, lambda: store.get(kinds.IMPLEMENTATION_SPEC, NS, "gh-acme-web-1")["spec"]["summary"]
                  == "Fix the bug, really", "the upstream edit")
    assert len(items(store, kinds.AGENT_RUN)) == 1
    github.close_issue(REPO, 1)
    advance_until(clock, 61, lambda: condition(store.get(kinds.IMPLEMENTATION_SPEC, NS, "gh-acme-web-1"), "Stale")
                  ["status"] == "True", "the closed issue's spec Stale, by polling alone")


def test_bad_github_credentials_and_a_missing_repository_say_what_to_fix(
    store: Store, github: FakeGitHub, controllers: Manager,
) -> None:
    apply(store, secret("gh", token="ghp_revoked"), github_source(github, pollIntervalSeconds=60))
    source = wait_for(lambda: (s := store.get(IMPLEMENTATION_SOURCE, NS, "web")).get("status", {}).get("lastError")
                      and s, "the error")
    error = condition(source, "Error")
    assert (error["status"], error["reason"]) == ("True", "BadCredentials")
    assert "gh" in error["message"] and "ghp_revoked" not in error["message"]
    polling = github_source(github, pollIntervalSeconds=60)
    polling["spec"]["github"]["repo"] = "gone"
    apply(store, secret("gh", token="ghp_fake_token"), polling)
    wait_for(lambda: condition(store.get(IMPLEMENTATION_SOURCE, NS, "web"), "Error")["reason"] == "NotFound",
             "the NotFound error")
    assert "acme/gone" in store.get(IMPLEMENTATION_SOURCE, NS, "web")["status"]["lastError"]


def test_a_rate_limit_is_waited_out_until_its_reset(store: Store, clock: FakeClock, controllers: Manager) -> None:
    with FakeGitHub(clock=clock.time) as github:
        github.add_repo(REPO)
        rate_limited(store, clock, github)


def rate_limited(store: Store, clock: FakeClock, github: FakeGitHub) -> None:
    reset = github.exhaust_rate_limit(reset_in=120)
    source = github_source(github)
    source["spec"]["pollIntervalSeconds"] = 10
    apply(store, secret("gh", token="ghp_fake_token"), source)
    limited = wait_for(lambda: (s := store.get(IMPLEMENTATION_SOURCE, NS, "web")).get("status", {})
                       .get("rateLimitedUntil") and s, "the rate limit")
    assert condition(limited, "Error")["reason"] == "RateLimited"
    asked = len(github.calls("GET"))
    clock.advance(30)  # past the poll interval, not past the reset: nothing is asked
    time.sleep(1.2)
    assert len(github.calls("GET")) == asked
    advance_until(clock, max(0.0, reset - clock.time()) + 1,
                  lambda: condition(store.get(IMPLEMENTATION_SOURCE, NS, "web"), "Ready")["status"] == "True",
                  "a sync after the reset")


def test_a_command_on_an_issue_the_source_does_not_sync_runs_the_issue_inline(
    store: Store, server: LiveServer, github: FakeGitHub, controllers: Manager,
) -> None:
    source = github_source(github)
    source["spec"]["github"]["labels"] = ["joch"]
    apply(store, secret("hook", secret=SECRET.decode()), secret("gh", token="ghp_fake_token"), *agent(), source,
          rule("cmd", sourceRef={"name": "web"}, comment={}))
    github.create_issue(REPO, "Unlabelled", "Do the thing")
    owner = github.comment(REPO, 1, "/joch run", user="octocat", association="OWNER")
    assert post(server, github.deliver("issue_comment", github.issue_comment_event(REPO, 1, owner["id"]),
                                       SECRET)).status_code == 200
    processed(store, 1)
    assert items(store, kinds.IMPLEMENTATION_SPEC) == []
    [run] = items(store, kinds.AGENT_RUN)
    assert run["spec"]["implementation"]["inline"]["text"] == "# Unlabelled\n\nDo the thing\n"
