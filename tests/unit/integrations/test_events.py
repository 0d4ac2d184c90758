"""Webhook deliveries normalised into ``TrackerEvent``: GitHub payloads as GitHub documents them, Linear
payloads as the fake Linear builds them (Linear's documented shape), and the payload round trip."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from joch.integrations.base import Issue, Repository
from joch.integrations.events import CommentEvent, TrackerEvent, generic, parse_github, parse_linear
from support.fake_linear import FakeLinear

SECRET = b"linear-secret"

OWNER = {"login": "acme", "id": 9919, "node_id": "O_kgDOAAAmvw", "type": "Organization", "site_admin": False,
         "html_url": "https://github.com/acme", "url": "https://api.github.com/users/acme"}
OCTOCAT = {"login": "octocat", "id": 583231, "node_id": "MDQ6VXNlcjU4MzIzMQ==", "type": "User", "site_admin": False,
           "html_url": "https://github.com/octocat"}
REPOSITORY = {
    "id": 1296269, "node_id": "MDEwOlJlcG9zaXRvcnkxMjk2MjY5", "name": "web", "full_name": "acme/web",
    "private": False, "owner": OWNER, "html_url": "https://github.com/acme/web", "description": None,
    "fork": False, "url": "https://api.github.com/repos/acme/web", "clone_url": "https://github.com/acme/web.git",
    "git_url": "git://github.com/acme/web.git", "ssh_url": "git@github.com:acme/web.git",
    "default_branch": "main", "visibility": "public", "created_at": "2026-01-01T10:00:00Z",
    "updated_at": "2026-11-01T10:00:00Z", "pushed_at": "2026-11-01T10:00:00Z",
}
LABEL = {"id": 208045946, "node_id": "MDU6TGFiZWwyMDgwNDU5NDY=", "url": "https://api.github.com/repos/acme/web/labels/joch:demo",
         "name": "joch:demo", "description": "Run the demo agent", "color": "f29513", "default": False}
ISSUE = {
    "url": "https://api.github.com/repos/acme/web/issues/12", "repository_url": "https://api.github.com/repos/acme/web",
    "labels_url": "https://api.github.com/repos/acme/web/issues/12/labels{/name}",
    "comments_url": "https://api.github.com/repos/acme/web/issues/12/comments",
    "html_url": "https://github.com/acme/web/issues/12", "id": 1, "node_id": "I_kwDOABCD", "number": 12,
    "title": "Login page rejects valid passwords", "user": OCTOCAT, "labels": [LABEL], "state": "open",
    "locked": False, "assignee": None, "assignees": [], "milestone": None, "comments": 0,
    "created_at": "2026-11-20T09:00:00Z", "updated_at": "2026-11-28T08:30:00Z", "closed_at": None,
    "author_association": "OWNER", "active_lock_reason": None, "state_reason": None,
    "body": "Steps:\n- [ ] reproduce\n- [x] write a test",
}


def issues_delivery(action: str, **extra: Any) -> dict[str, Any]:
    return {"action": action, "issue": copy.deepcopy(ISSUE), "repository": REPOSITORY, "sender": OCTOCAT, **extra}


def test_github_ping() -> None:
    event = parse_github("ping", "d-1", {"zen": "Keep it logically awesome.", "hook_id": 7,
                                         "hook": {"type": "Repository", "events": ["issues"]},
                                         "repository": REPOSITORY, "sender": OCTOCAT})
    assert (event.provider, event.kind, event.action, event.delivery_id) == ("github", "ping", None, "d-1")
    assert event.repository == Repository("acme", "web", "https://github.com/acme/web.git", "main",
                                          "https://github.com/acme/web")


def test_github_issue_opened() -> None:
    event = parse_github("issues", "d-2", issues_delivery("opened"))
    assert (event.kind, event.action, event.actor, event.label) == ("issue", "opened", "octocat", None)
    assert event.issue == Issue(
        provider="github", id="12", key="acme/web#12", title="Login page rejects valid passwords",
        body="Steps:\n- [ ] reproduce\n- [x] write a test", url="https://github.com/acme/web/issues/12",
        state="open", labels=("joch:demo",), updated_at="2026-11-28T08:30:00Z", number=12, author="octocat",
        repository=event.repository, version="2026-11-28T08:30:00Z")
    assert event.issue.item == "github:acme/web#12"


def test_github_labeled_and_unlabeled_name_the_label() -> None:
    labeled = parse_github("issues", "d-3", issues_delivery("labeled", label=LABEL))
    assert (labeled.action, labeled.label, labeled.added_labels) == ("labeled", "joch:demo", ("joch:demo",))
    unlabeled = parse_github("issues", "d-4", issues_delivery("unlabeled", label=LABEL))
    assert (unlabeled.action, unlabeled.label) == ("unlabeled", "joch:demo")
    edited = parse_github("issues", "d-5", issues_delivery("edited", changes={"title": {"from": "Login"}}))
    assert (edited.action, edited.label) == ("edited", None)


def test_github_closed_reopened_deleted_transferred() -> None:
    closed = issues_delivery("closed")
    closed["issue"].update(state="closed", state_reason="completed", closed_at="2026-11-28T09:00:00Z")
    assert parse_github("issues", "d", closed).issue.state == "closed"  # type: ignore[union-attr]
    assert parse_github("issues", "d", issues_delivery("reopened")).issue.state == "open"  # type: ignore[union-attr]
    deleted = parse_github("issues", "d", issues_delivery("deleted"))
    assert deleted.action == "deleted" and deleted.issue is not None and deleted.issue.deleted
    moved = parse_github("issues", "d", issues_delivery("transferred", changes={
        "new_issue": {**ISSUE, "number": 3}, "new_repository": {**REPOSITORY, "name": "api"}}))
    assert moved.action == "transferred" and moved.issue is not None and moved.issue.deleted
    assert moved.issue.key == "acme/web#12"


def test_github_issue_comment() -> None:
    comment = {"id": 1146825, "node_id": "IC_kwDO", "url": "https://api.github.com/repos/acme/web/issues/comments/1146825",
               "html_url": "https://github.com/acme/web/issues/12#issuecomment-1146825", "body": "/joch run agent=demo",
               "user": {**OCTOCAT, "login": "hubot"}, "created_at": "2026-11-28T09:00:00Z",
               "updated_at": "2026-11-28T09:00:00Z", "author_association": "COLLABORATOR"}
    body = {"action": "created", "issue": ISSUE, "comment": comment, "repository": REPOSITORY,
            "sender": comment["user"]}
    event = parse_github("issue_comment", "d-6", body)
    assert (event.kind, event.action, event.actor) == ("comment", "created", "hubot")
    assert event.comment == CommentEvent(id="1146825", body="/joch run agent=demo", author="hubot",
                                         association="COLLABORATOR")
    assert event.issue is not None and event.issue.key == "acme/web#12"
    assert event.pull_request is None
    on_pull = parse_github("issue_comment", "d-7", {**body, "issue": {**ISSUE, "pull_request": {
        "url": "https://api.github.com/repos/acme/web/pulls/12", "html_url": "https://github.com/acme/web/pull/12"}}})
    assert on_pull.pull_request == {"url": "https://api.github.com/repos/acme/web/pulls/12",
                                    "html_url": "https://github.com/acme/web/pull/12"}


def test_github_pull_request_and_unknown_events() -> None:
    pull = {"url": "https://api.github.com/repos/acme/web/pulls/13", "id": 1, "number": 13, "state": "closed",
            "merged": True, "title": "Fix login", "body": "Closes #12", "html_url": "https://github.com/acme/web/pull/13",
            "head": {"ref": "joch/run-1", "sha": "a" * 40, "repo": REPOSITORY},
            "base": {"ref": "main", "sha": "b" * 40, "repo": REPOSITORY}, "user": OCTOCAT, "draft": False}
    event = parse_github("pull_request", "d-8", {"action": "closed", "number": 13, "pull_request": pull,
                                                 "repository": REPOSITORY, "sender": OCTOCAT})
    assert (event.kind, event.action) == ("pull_request", "closed")
    assert event.pull_request == {"number": 13, "url": "https://github.com/acme/web/pull/13", "state": "closed",
                                  "merged": True, "title": "Fix login", "head": "joch/run-1", "base": "main",
                                  "body": "Closes #12"}
    other = parse_github("star", "d-9", {"action": "created", "repository": REPOSITORY, "sender": OCTOCAT})
    assert (other.kind, other.action) == ("other", "created")
    assert parse_github("push", "d-10", {"ref": "refs/heads/main"}).action == "push"


def test_linear_issue_create_update_remove() -> None:
    fake = FakeLinear()
    created = fake.create_issue("Fix login", "- [ ] reproduce", labels=["bug"])
    event = parse_linear("ld-1", fake.issue_webhook(created["id"], "create", secret=SECRET).payload)
    assert (event.provider, event.kind, event.action, event.team_key) == ("linear", "issue", "opened", "ENG")
    assert event.actor == "ada@example.com"
    assert event.issue is not None
    assert (event.issue.id, event.issue.key, event.issue.labels, event.issue.state) == (
        created["id"], "ENG-1", ("bug",), "open")
    assert event.issue.version == created["updatedAt"] and event.issue.url == created["url"]
    assert event.added_labels == ("bug",)

    _, changed = fake.update_issue("ENG-1", add_labels=["joch:demo"])
    labeled = parse_linear("ld-2", fake.issue_webhook("ENG-1", "update", secret=SECRET, updated_from=changed).payload)
    assert (labeled.action, labeled.label) == ("labeled", "joch:demo")
    assert labeled.issue is not None and labeled.issue.labels == ("bug", "joch:demo")

    _, changed = fake.update_issue("ENG-1", remove_labels=["bug"])
    unlabeled = parse_linear("ld-3", fake.issue_webhook("ENG-1", "update", secret=SECRET, updated_from=changed).payload)
    assert (unlabeled.action, unlabeled.label) == ("unlabeled", None)  # the removed label's name is not sent

    _, changed = fake.update_issue("ENG-1", title="Fix the login")
    edited = parse_linear("ld-4", fake.issue_webhook("ENG-1", "update", secret=SECRET, updated_from=changed).payload)
    assert (edited.action, edited.label) == ("edited", None)

    _, changed = fake.update_issue("ENG-1", state="In Progress")
    assert parse_linear("ld-5", fake.issue_webhook("ENG-1", "update", secret=SECRET,
                                                  updated_from=changed).payload).action == "edited"
    _, changed = fake.update_issue("ENG-1", state="Done")
    done = parse_linear("ld-6", fake.issue_webhook("ENG-1", "update", secret=SECRET, updated_from=changed).payload)
    assert done.action == "closed" and done.issue is not None and done.issue.state == "closed"
    _, changed = fake.update_issue("ENG-1", state="Canceled")
    assert parse_linear("ld-7", fake.issue_webhook("ENG-1", "update", secret=SECRET,
                                                  updated_from=changed).payload).action == "edited"  # closed→closed
    _, changed = fake.update_issue("ENG-1", state="Todo")
    assert parse_linear("ld-8", fake.issue_webhook("ENG-1", "update", secret=SECRET,
                                                  updated_from=changed).payload).action == "reopened"

    fake.delete_issue("ENG-1")
    removed = parse_linear("ld-9", fake.issue_webhook("ENG-1", "remove", secret=SECRET).payload)
    assert removed.action == "deleted" and removed.issue is not None and removed.issue.deleted
    assert removed.issue.state == "closed"  # trashed issues are archived


def test_linear_label_added_wins_over_other_changes() -> None:
    fake = FakeLinear()
    fake.create_issue("x")
    _, changed = fake.update_issue("ENG-1", title="y", add_labels=["a", "joch:demo"], state="Done")
    event = parse_linear("ld", fake.issue_webhook("ENG-1", "update", secret=SECRET, updated_from=changed).payload)
    assert (event.action, event.label, event.added_labels) == ("labeled", "a", ("a", "joch:demo"))


def test_linear_comment() -> None:
    fake = FakeLinear()
    fake.create_issue("Fix login")
    comment = fake.add_comment("ENG-1", "/joch run agent=demo", user={"id": "u-1", "name": "Grace",
                                                                     "email": "grace@example.com"})
    delivery = fake.comment_webhook(comment, secret=SECRET)
    assert delivery.headers["Linear-Event"] == "Comment"
    event = parse_linear(delivery.delivery_id, delivery.payload)
    assert (event.kind, event.action, event.team_key, event.actor) == ("comment", "created", "ENG",
                                                                      "grace@example.com")
    assert event.comment == CommentEvent(id=comment["id"], body="/joch run agent=demo", author="grace@example.com")
    assert event.issue is not None and (event.issue.key, event.issue.id) == ("ENG-1", fake.issue("ENG-1")["id"])
    assert event.issue.item == "linear:ENG-1"


def test_linear_comment_without_identifier_reads_it_from_the_url() -> None:
    fake = FakeLinear()
    fake.create_issue("Fix login")
    payload = fake.comment_webhook(fake.add_comment("ENG-1", "hi"), secret=SECRET).payload
    del payload["data"]["issue"]["identifier"]
    del payload["data"]["issue"]["team"]
    event = parse_linear("ld", payload)
    assert event.issue is not None and event.issue.key == "ENG-1" and event.team_key == "ENG"


def test_linear_other_types() -> None:
    event = parse_linear("ld", {"action": "create", "type": "Project", "data": {"id": "p"}, "actor": {"name": "Ada"}})
    assert (event.kind, event.action, event.actor) == ("other", "Project.create", "Ada")


def test_generic_keeps_body_and_headers_without_signatures() -> None:
    event = generic("g-1", {"ref": "main"}, {"X-Joch-Signature-256": "sha256=00", "X-Joch-Delivery": "g-1",
                                             "Authorization": "Bearer x", "Content-Type": "application/json"})
    assert (event.provider, event.kind, event.payload) == ("generic", "webhook", {"ref": "main"})
    assert event.headers == {"x-joch-delivery": "g-1", "content-type": "application/json"}


def round_trip(event: TrackerEvent) -> None:
    payload = event.to_payload()
    assert json.loads(json.dumps(payload)) == payload  # JSON-ready
    assert TrackerEvent.from_payload(json.loads(json.dumps(payload))) == event


def test_round_trip_of_parsed_events() -> None:
    round_trip(parse_github("issues", "d", issues_delivery("labeled", label=LABEL)))
    round_trip(parse_github("ping", "d", {"zen": "z"}))
    fake = FakeLinear()
    fake.create_issue("x", labels=["a"])
    round_trip(parse_linear("ld", fake.issue_webhook("ENG-1", "create", secret=SECRET).payload))
    round_trip(parse_linear("ld", fake.comment_webhook(fake.add_comment("ENG-1", "c"), secret=SECRET).payload))
    round_trip(generic("g", {"a": [1, {"b": None}]}, {"x-y": "z"}))


_text = st.text(max_size=20)
_opt = st.none() | _text
_repos = st.builds(Repository, owner=_text, name=_text, clone_url=_text, default_branch=_text, html_url=_text)
_issues = st.builds(Issue, provider=st.sampled_from(["github", "linear"]), id=_text, key=_text, title=_text,
                    body=_text, url=_text, state=st.sampled_from(["open", "closed"]),
                    labels=st.lists(_text, max_size=3).map(tuple), updated_at=_text,
                    number=st.none() | st.integers(0, 10**6), author=_opt, repository=st.none() | _repos,
                    team_key=_opt, deleted=st.booleans(), version=_text)
_json = st.recursive(st.none() | st.booleans() | st.integers() | _text,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                     max_leaves=8)


@given(st.builds(TrackerEvent, provider=st.sampled_from(["github", "linear", "generic"]),
                 kind=st.sampled_from(["issue", "comment", "pull_request", "ping", "webhook", "other"]),
                 action=_opt, delivery_id=_text, issue=st.none() | _issues, label=_opt,
                 comment=st.none() | st.builds(CommentEvent, id=_text, body=_text, author=_opt, association=_opt),
                 actor=_opt, repository=st.none() | _repos, team_key=_opt,
                 pull_request=st.none() | st.dictionaries(_text, _json, max_size=3),
                 payload=st.dictionaries(_text, _json, max_size=3), headers=st.dictionaries(_text, _text, max_size=3),
                 added_labels=st.lists(_text, max_size=3).map(tuple)))
def test_round_trip_of_any_event(event: TrackerEvent) -> None:
    round_trip(event)


def test_from_payload_tolerates_fields_it_does_not_know_or_miss() -> None:
    event = parse_github("issues", "d", issues_delivery("labeled", label=LABEL))
    stored = event.to_payload()
    stored["future"] = 1
    stored["issue"]["future"] = 2
    stored["repository"]["future"] = 3
    del stored["headers"]
    del stored["issue"]["version"]
    read = TrackerEvent.from_payload(stored)
    assert read.issue is not None and read.issue.version == "" and read.issue.key == "acme/web#12"
    assert read.repository == event.repository and read.headers == {}
