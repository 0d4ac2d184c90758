"""Hostile cases of the inbound side: names that collide after normalisation, webhook dedupe keys
that would copy credentials, rule names too long for a label value."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from joch.admission.apply import apply_documents
from joch.admission.documents import Document
from joch.api import errors, kinds
from joch.api.audit import AuditQuery
from joch.api.integrations import IMPLEMENTATION_SOURCE, TRIGGER_RULE, WEBHOOK_DELIVERY
from joch.controllers.sources import apply_issue
from joch.controllers.triggers import TriggerEvent, evaluate, fire, rules_for_source
from joch.integrations.base import Issue, Repository
from joch.integrations.events import parse_linear
from joch.integrations.signatures import sign
from joch.server.testing import live_server
from joch.store import ListOptions, Store, open_store
from support import provider

NS = "default"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'joch.db'}")
    yield s
    s.close()


def apply(store: Store, *objects: dict[str, Any]) -> None:
    apply_documents(store, [Document(index=i, source="test", obj=o) for i, o in enumerate(objects)], namespace=NS)


def agent() -> list[dict[str, Any]]:
    return [provider("demo-provider"),
            {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "demo"},
             "spec": {"providerRef": {"name": "demo-provider"}}}]


def source(name: str, owner: str, repo: str) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": name},
            "spec": {"provider": "github", "pollIntervalSeconds": 0,
                     "github": {"owner": owner, "repo": repo,
                                "auth": {"tokenSecretRef": {"name": "gh", "key": "token"}}}}}


def gh_issue(owner: str, repo: str, number: int, title: str) -> Issue:
    repository = Repository(owner=owner, name=repo, clone_url=f"https://github.com/{owner}/{repo}.git",
                            default_branch="main")
    return Issue(provider="github", id=f"{owner}/{repo}/{number}", key=f"{owner}/{repo}#{number}", title=title,
                 body="", url=f"https://github.com/{owner}/{repo}/issues/{number}", state="open", labels=(),
                 updated_at="v1", number=number, repository=repository, version="v1")


def test_a_run_never_implements_the_spec_of_another_repository_whose_name_normalises_alike(store: Store) -> None:
    # acme-x/web#1 and acme/x-web#1 are both "gh-acme-x-web-1": the second is not synced into the first's spec,
    # and its run must carry its own issue, not point at the other repository's spec.
    apply(store, *agent(), source("first", "acme-x", "web"), source("second", "acme", "x-web"),
          {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": "fix"},
           "spec": {"sourceRef": {"name": "second"}, "issue": {"actions": ["opened"]},
                    "run": {"agentRef": {"name": "demo"}}}})
    first = store.get(IMPLEMENTATION_SOURCE, NS, "first")
    assert apply_issue(store, first, gh_issue("acme-x", "web", 1, "Theirs"), 1.0).change == "created"
    mine = gh_issue("acme", "x-web", 1, "Mine")
    assert apply_issue(store, store.get(IMPLEMENTATION_SOURCE, NS, "second"), mine, 2.0).change == "unchanged"
    execution = evaluate(store, store.get(TRIGGER_RULE, NS, "fix"),
                         TriggerEvent(kind="issue", provider="github", action="opened", issue=mine),
                         kind="issue", now=3.0)
    assert execution["spec"]["decision"] == "Dispatched"
    run = store.get(kinds.AGENT_RUN, NS, execution["spec"]["runRef"]["name"])
    assert "implementationRef" not in run["spec"]
    assert run["spec"]["implementation"]["inline"]["source"]["externalId"] == "acme/x-web#1"
    assert run["spec"]["implementation"]["inline"]["text"].startswith("# Mine")


def test_a_generic_dedupe_key_template_never_sees_the_signature_or_credential_headers(store: Store) -> None:
    secret = b"whsec-generic-0123"
    apply(store, *agent(),
          {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "hook"},
           "spec": {"data": {"secret": base64.b64encode(secret).decode()}}},
          {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": "deploy"},
           "spec": {"webhook": {"secretRef": {"name": "hook", "key": "secret"},
                                "dedupeKey": "{{ headers.get('x-joch-signature-256', '-') }}"
                                             "/{{ headers.get('x-api-key', '-') }}/{{ headers['x-request-id'] }}"},
                    "run": {"agentRef": {"name": "demo"}, "implementation": {"inline": {"text": "Deploy"}}}}})
    body = json.dumps({"ref": "v1"}).encode()
    signature = "sha256=" + sign(secret, body)
    with live_server(store) as server:
        answer = server.http.post("/v1/webhooks/default/deploy", content=body, headers={
            "Content-Type": "application/json", "X-Joch-Signature-256": signature, "X-Api-Key": "key-value-1",
            "X-Request-Id": "req-7"})
    assert answer.status_code == 200, answer.text
    [delivery] = store.list(WEBHOOK_DELIVERY, ListOptions(namespace=NS)).items
    stored = json.dumps(delivery)
    assert signature.removeprefix("sha256=") not in stored and "key-value-1" not in stored
    assert delivery["spec"]["deliveryId"] == "-/-/req-7"


def test_a_rule_whose_name_cannot_be_a_label_value_is_refused_with_the_fix_not_crashed(store: Store) -> None:
    # 64..253 characters is a valid name, but not a valid value of the joch.dev/trigger-rule label that its
    # executions and runs carry: evaluating it used to raise admission's "1 of 1 document is invalid".
    name = "r" * 70
    apply(store, *agent(), {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": name},
                            "spec": {"sourceRef": {"name": "web"}, "issue": {"actions": ["opened"]},
                                     "run": {"agentRef": {"name": "demo"}}}})
    rule = store.get(TRIGGER_RULE, NS, name)
    with pytest.raises(errors.Invalid) as raised:
        fire(store, rule, actor="someone", now=1.0, text="Do it")
    assert "metadata.name" in raised.value.message and "shorter name" in raised.value.message
    assert rules_for_source([rule], "web") == []
    assert store.list(kinds.AGENT_RUN, ListOptions(namespace=NS)).items == []


@pytest.mark.parametrize(("schedule", "field", "said"), [
    ({"cron": "61 * * * *"}, "spec.schedule.cron", "write five fields"),
    ({"cron": "@daily"}, "spec.schedule.cron", "macro"),
    ({"cron": "0 9 * * *", "timeZone": "Mars/Olympus"}, "spec.schedule.timeZone", "IANA name"),
])
def test_a_schedule_no_cron_can_use_is_refused_when_applied(store: Store, schedule: dict[str, Any], field: str,
                                                            said: str) -> None:
    with pytest.raises(errors.Invalid) as raised:
        apply(store, {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": "nightly"},
                      "spec": {"schedule": schedule, "run": {"agentRef": {"name": "demo"}}}})
    causes = [c for c in raised.value.causes if c.field.endswith(field)]
    assert causes and said in causes[0].message, raised.value.causes
    assert store.list(TRIGGER_RULE, ListOptions(namespace=NS)).items == []


def test_a_delivery_not_shaped_as_github_or_linear_sends_it_is_401_unsigned_and_400_signed_never_500(
    store: Store,
) -> None:
    secret = b"whsec-shape-0123"
    github = source("web", "acme", "web")
    github["spec"]["webhook"] = {"secretRef": {"name": "hook", "key": "secret"}}
    linear = {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": "eng"},
              "spec": {"provider": "linear", "pollIntervalSeconds": 0,
                       "webhook": {"secretRef": {"name": "hook", "key": "secret"}},
                       "linear": {"teamKey": "ENG", "auth": {"apiKeySecretRef": {"name": "lin", "key": "key"}}}}}
    apply(store, {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "hook"},
                  "spec": {"data": {"secret": base64.b64encode(secret).decode()}}}, github, linear)
    bad_github = json.dumps({"action": "opened", "issue": {}, "repository": {"name": "web",
                                                                          "owner": {"login": "acme"}}}).encode()
    bad_linear = json.dumps({"type": "Issue", "action": "create", "data": {"labels": 5},
                             "webhookTimestamp": 0}).encode()
    gh = {"Content-Type": "application/json", "X-GitHub-Event": "issues", "X-GitHub-Delivery": "d-1"}
    lin = {"Content-Type": "application/json; charset=utf-8", "Linear-Delivery": "d-2"}
    with live_server(store) as server:
        assert server.http.post("/v1/webhooks/linear", content=bad_linear, headers=lin).status_code == 401
        signed = server.http.post("/v1/webhooks/linear", content=bad_linear,
                                  headers={**lin, "Linear-Signature": sign(secret, bad_linear)})
        assert signed.status_code == 400 and "not shaped as Linear sends it" in signed.json()["message"]
        assert server.http.post("/v1/webhooks/github", content=bad_github, headers=gh).status_code == 401
        signed = server.http.post("/v1/webhooks/github", content=bad_github,
                                  headers={**gh, "X-Hub-Signature-256": "sha256=" + sign(secret, bad_github)})
        assert signed.status_code == 400 and "not shaped as GitHub sends it" in signed.json()["message"]
    assert store.list(WEBHOOK_DELIVERY, ListOptions()).items == []


def test_a_refused_delivery_writes_a_bounded_audit_reason_whatever_its_headers(store: Store) -> None:
    body = json.dumps({"repository": {"name": "w" * 5000, "owner": {"login": "acme"}}}).encode()
    with live_server(store) as server:
        answer = server.http.post("/v1/webhooks/github", content=body, headers={
            "Content-Type": "application/json", "X-GitHub-Event": "e" * 5000, "X-GitHub-Delivery": "d" * 5000})
        assert answer.status_code == 401 and len(answer.json()["message"]) < 1200
        assert server.http.post("/v1/webhooks/default/" + "r" * 5000, content=b"{}",
                                headers={"Content-Type": "application/json"}).status_code == 401
    denied = [e for e in store.audit_events(AuditQuery()).items if e.decision == "denied"]
    assert len(denied) == 2 and all(len(e.reason or "") < 1000 for e in denied)


def test_a_linear_comment_author_is_never_its_display_name() -> None:
    # A workspace member may name themselves "grace@example.com"; allowedActors must not match that.
    body = {"action": "create", "type": "Comment", "webhookTimestamp": 0,
            "data": {"id": "c-1", "body": "/joch run", "issueId": "i-1",
                     "issue": {"id": "i-1", "identifier": "ENG-1", "title": "T", "team": {"key": "ENG"}},
                     "user": {"id": "u-9", "name": "grace@example.com"}},
            "actor": {"id": "u-9", "type": "user", "name": "grace@example.com"}}
    event = parse_linear("ld", body)
    assert event.comment is not None and event.comment.author == "u-9"


class _ControllerWritesFirst:
    """The store as the webhook route sees it when the deliveries controller, watching, writes a new
    delivery's status between the route's create and its own status write (CI saw this as a 409)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.raced = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def update_status(self, kind: Any, obj: dict[str, Any]) -> dict[str, Any]:
        if kind is WEBHOOK_DELIVERY and not (obj.get("status") or {}).get("phase") == "Processed":
            self.raced += 1
            self._store.update_status(kind, {**obj, "status": {"phase": "Processed"}})
        return self._store.update_status(kind, obj)


def test_a_delivery_the_controller_took_up_first_is_accepted_not_a_409(store: Store) -> None:
    secret = b"whsec-generic-0123"
    apply(store, *agent(),
          {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "hook"},
           "spec": {"data": {"secret": base64.b64encode(secret).decode()}}},
          {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": "deploy"},
           "spec": {"webhook": {"secretRef": {"name": "hook", "key": "secret"}},
                    "run": {"agentRef": {"name": "demo"}, "implementation": {"inline": {"text": "Deploy"}}}}})
    body = json.dumps({"ref": "v2"}).encode()
    racing = _ControllerWritesFirst(store)
    with live_server(racing) as server:  # type: ignore[arg-type]
        answer = server.http.post("/v1/webhooks/default/deploy", content=body, headers={
            "Content-Type": "application/json", "X-Joch-Signature-256": "sha256=" + sign(secret, body)})
    assert answer.status_code == 200, answer.text
    assert racing.raced == 1 and answer.json()["duplicate"] is False
    [delivery] = store.list(WEBHOOK_DELIVERY, ListOptions(namespace=NS)).items
    assert delivery["status"]["phase"] == "Processed"  # the controller's word stands
