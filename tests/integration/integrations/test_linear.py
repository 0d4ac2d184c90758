"""``LinearTracker`` against the fake Linear on 127.0.0.1: GraphQL queries checked against Linear's
schema, pagination, cursors, filters, comments, attachments, and errors a person can act on."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from joch.api.integrations import LinearSource, WriteTarget
from joch.integrations import signatures
from joch.integrations.base import TrackerError
from joch.integrations.events import parse_linear
from joch.integrations.linear import PAGE_SIZE, LinearTracker
from support.fake_linear import FakeLinear


@pytest.fixture
def fake() -> Iterator[FakeLinear]:
    with FakeLinear() as server:
        yield server


def source(url: str, **linear: object) -> LinearSource:
    return LinearSource.model_validate({"teamKey": "ENG", "apiUrl": url,
                                        "auth": {"apiKeySecretRef": {"name": "linear", "key": "apiKey"}}, **linear})


def tracker(fake: FakeLinear, key: str | None = None, **linear: object) -> LinearTracker:
    asked: list[tuple[str, str]] = []

    def secrets(name: str, field: str) -> str:
        asked.append((name, field))
        return key if key is not None else fake.api_key

    made = LinearTracker(source(fake.url, **linear), secrets)
    made.asked = asked  # type: ignore[attr-defined]
    return made


def target(issue: dict[str, object]) -> WriteTarget:
    return WriteTarget.model_validate({"provider": "linear", "sourceRef": {"name": "linear"},
                                       "issueId": issue["id"], "identifier": issue["identifier"]})


def test_check_and_the_key_sent_bare(fake: FakeLinear) -> None:
    client = tracker(fake)
    client.check()
    assert client.asked == [("linear", "apiKey")]  # type: ignore[attr-defined]
    assert fake.requests[-1].operation == "JochCheck" and fake.requests[-1].authorized


def test_unknown_team_names_the_key_and_the_field(fake: FakeLinear) -> None:
    with pytest.raises(TrackerError) as caught:
        tracker(fake, teamKey="OPS").check()
    assert caught.value.reason == "NotFound"
    assert 'Linear team "OPS" not found' in caught.value.message and "spec.linear.teamKey" in caught.value.message
    with pytest.raises(TrackerError) as listing:
        tracker(fake, teamKey="OPS").list_issues(since=None, etag=None)
    assert listing.value.reason == "NotFound"


def test_a_refused_key_is_bad_credentials_without_the_key(fake: FakeLinear) -> None:
    with pytest.raises(TrackerError) as caught:
        tracker(fake, key="lin_api_wrong_one").list_issues(since=None, etag=None)
    error = caught.value
    assert (error.reason, error.retryable) == ("BadCredentials", False)
    assert "Secret linear/apiKey was refused by Linear" in error.message
    assert "lin_api_wrong_one" not in error.message
    assert not fake.requests[-1].authorized


def test_missing_secret_passes_through(fake: FakeLinear) -> None:
    def secrets(name: str, field: str) -> str:
        raise TrackerError("MissingSecret", f"Secret {name} has no key {field}")

    with pytest.raises(TrackerError) as caught:
        LinearTracker(source(fake.url), secrets).check()
    assert caught.value.reason == "MissingSecret"
    assert fake.requests == []


def test_list_issues_pages_through_and_moves_the_cursor(fake: FakeLinear) -> None:
    made = [fake.create_issue(f"Issue {n}", f"Body {n}") for n in range(PAGE_SIZE + 7)]
    client = tracker(fake)
    page = client.list_issues(since=None, etag=None)
    assert len(page.issues) == PAGE_SIZE + 7
    assert [r.operation for r in fake.requests].count("JochIssues") == 2
    assert page.etag is None and not page.not_modified
    assert page.cursor == made[-1]["updatedAt"]
    assert [i.key for i in page.issues] == [m["identifier"] for m in made]  # oldest first
    first = page.issues[0]
    assert (first.provider, first.id, first.title, first.body, first.state, first.team_key, first.number,
            first.author, first.version) == ("linear", made[0]["id"], "Issue 0", "Body 0", "open", "ENG", 1,
                                             "ada@example.com", made[0]["updatedAt"])
    assert first.url == f"https://linear.app/acme/issue/{made[0]['identifier']}/issue-0"

    quiet = client.list_issues(since=page.cursor, etag=None)
    assert quiet.issues == [] and quiet.cursor == page.cursor

    fake.update_issue("ENG-3", title="Renamed")
    again = client.list_issues(since=page.cursor, etag=None)
    assert [i.key for i in again.issues] == ["ENG-3"] and again.issues[0].title == "Renamed"
    assert again.cursor == fake.issue("ENG-3")["updatedAt"] and again.cursor != page.cursor
    sent = [r for r in fake.requests if r.operation == "JochIssues"][-1].variables
    assert sent["filter"] == {"team": {"key": {"eq": "ENG"}}, "updatedAt": {"gt": page.cursor}}
    assert sent["first"] == PAGE_SIZE


def test_label_and_state_filters(fake: FakeLinear) -> None:
    fake.create_issue("both", labels=["joch:demo", "backend"])
    fake.create_issue("one", labels=["joch:demo"])
    fake.create_issue("done", labels=["joch:demo", "backend"], state="Done")
    fake.create_issue("other team", labels=["joch:demo", "backend"], team=fake.add_team("OPS", "Ops")["key"])
    labelled = tracker(fake, labels=["joch:demo", "backend"]).list_issues(since=None, etag=None)
    assert sorted(i.title for i in labelled.issues) == ["both", "done"]
    todo = tracker(fake, labels=["joch:demo"], states=["Todo", "In Progress"]).list_issues(since=None, etag=None)
    assert sorted(i.title for i in todo.issues) == ["both", "one"]


def test_closed_archived_and_deleted_issues(fake: FakeLinear) -> None:
    fake.create_issue("done", state="Done")
    fake.create_issue("canceled", state="Canceled")
    fake.create_issue("archived")
    fake.update_issue("ENG-3", archived=True)
    fake.create_issue("deleted")
    fake.delete_issue("ENG-4")
    fake.create_issue("open", state="In Progress")
    client = tracker(fake)
    found = {i.key: i for i in client.list_issues(since=None, etag=None).issues}
    assert {k: (i.state, i.deleted) for k, i in found.items()} == {
        "ENG-1": ("closed", False), "ENG-2": ("closed", False), "ENG-3": ("closed", False),
        "ENG-4": ("closed", True), "ENG-5": ("open", False)}
    assert client.get_issue("ENG-4") is None  # deleted
    assert client.get_issue("ENG-3") is not None


def test_get_issue_by_identifier_or_id(fake: FakeLinear) -> None:
    made = fake.create_issue("Fix login", labels=["bug"])
    client = tracker(fake)
    by_key = client.get_issue("ENG-1")
    assert by_key is not None and by_key == client.get_issue(made["id"])
    assert by_key.labels == ("bug",) and by_key.key == "ENG-1"
    assert client.get_issue("ENG-404") is None
    assert client.get_issue("8d6e2c1a-0000-4000-8000-000000000000") is None


def test_comments_create_find_update(fake: FakeLinear) -> None:
    issue = fake.create_issue("Fix login")
    for n in range(PAGE_SIZE + 3):
        fake.add_comment("ENG-1", f"chatter {n}")
    client = tracker(fake)
    marker = "<!-- joch:run:uid-1 -->"
    assert client.find_comment(target(issue), marker) is None
    made = client.create_comment(target(issue), f"Run started\n\n{marker}")
    assert made.body.endswith(marker) and made.url.startswith(issue["url"] + "#comment-")
    assert client.find_comment(target(issue), marker) == made  # on the second page
    edited = client.update_comment(target(issue), made.id, f"Run Succeeded\n\n{marker}")
    assert edited.id == made.id and edited.body.startswith("Run Succeeded")
    mine = [c for c in fake.comments("ENG-1") if marker in c["body"]]
    assert len(mine) == 1 and mine[0]["body"] == edited.body and mine[0]["user"]["name"] == "Joch Bot"
    created = [r for r in fake.requests if r.operation == "JochCommentCreate"]
    assert created[0].variables == {"input": {"issueId": issue["id"], "body": f"Run started\n\n{marker}"}}


def test_comment_target_by_identifier_only(fake: FakeLinear) -> None:
    fake.create_issue("Fix login")
    only_key = WriteTarget.model_validate({"provider": "linear", "sourceRef": {"name": "l"}, "identifier": "ENG-1"})
    comment = tracker(fake).create_comment(only_key, "hello")
    assert [c["id"] for c in fake.comments("ENG-1")] == [comment.id]


def test_comments_on_a_missing_issue(fake: FakeLinear) -> None:
    gone = WriteTarget.model_validate({"provider": "linear", "sourceRef": {"name": "l"}, "identifier": "ENG-9"})
    client = tracker(fake)
    with pytest.raises(TrackerError) as finding:
        client.find_comment(gone, "m")
    assert finding.value.reason == "NotFound"
    with pytest.raises(TrackerError) as creating:
        client.create_comment(gone, "x")
    assert creating.value.reason == "NotFound" and "Could not find referenced Issue" in creating.value.message
    nowhere = WriteTarget.model_validate({"provider": "linear", "sourceRef": {"name": "l"}})
    with pytest.raises(TrackerError, match=r"set target\.issueId"):
        client.create_comment(nowhere, "x")


def test_attach_link_once_per_url(fake: FakeLinear) -> None:
    issue = fake.create_issue("Fix login")
    client = tracker(fake)
    first = client.attach_link(target(issue), "https://github.com/acme/web/pull/13", "Pull request #13")
    again = client.attach_link(target(issue), "https://github.com/acme/web/pull/13", "Pull request #13 (merged)")
    assert first == again
    assert [(a["url"], a["title"]) for a in fake.attachments("ENG-1")] == [
        ("https://github.com/acme/web/pull/13", "Pull request #13 (merged)")]


def test_rate_limited_until_the_announced_reset(fake: FakeLinear) -> None:
    fake.create_issue("x")
    reset_ms = fake.rate_limit(requests=1, reset_in=120)
    client = tracker(fake)
    with pytest.raises(TrackerError) as caught:
        client.list_issues(since=None, etag=None)
    error = caught.value
    assert (error.reason, error.retryable) == ("RateLimited", True)
    assert error.retry_at == reset_ms / 1000
    assert "Linear rate limit reached until 20" in error.message
    assert len(client.list_issues(since=None, etag=None).issues) == 1  # the limit has passed


def test_outages_and_bare_http_errors(fake: FakeLinear) -> None:
    client = tracker(fake)
    fake.fail(502)
    with pytest.raises(TrackerError) as outage:
        client.check()
    assert (outage.value.reason, outage.value.retryable) == ("Unavailable", True)
    assert "answered HTTP 502 to JochCheck" in outage.value.message
    fake.fail(429, headers={"X-RateLimit-Requests-Reset": "1900000000000"})
    with pytest.raises(TrackerError) as limited:
        client.check()
    assert (limited.value.reason, limited.value.retry_at) == ("RateLimited", 1_900_000_000.0)
    fake.fail(401, body="Unauthorized")
    with pytest.raises(TrackerError) as refused:
        client.check()
    assert refused.value.reason == "BadCredentials"
    client.check()  # and then it answers again


def test_unreachable_linear_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = LinearTracker(source(f"http://127.0.0.1:{port}/graphql"), lambda n, k: "key", timeout=5)
    with pytest.raises(TrackerError) as caught:
        client.check()
    assert (caught.value.reason, caught.value.retryable) == ("Unavailable", True)
    assert f"127.0.0.1:{port}" in caught.value.message


def test_signed_webhook_deliveries_verify_and_parse(fake: FakeLinear) -> None:
    secret = b"whsec"
    fake.create_issue("Fix login")
    _, changed = fake.update_issue("ENG-1", add_labels=["joch:demo"])
    delivery = fake.issue_webhook("ENG-1", "update", secret=secret, updated_from=changed)
    assert delivery.headers["Linear-Event"] == "Issue" and delivery.headers["User-Agent"] == "Linear-Webhook"
    assert signatures.verify_linear(secret, delivery.body, delivery.headers["Linear-Signature"])
    assert not signatures.verify_linear(b"other", delivery.body, delivery.headers["Linear-Signature"])
    payload = json.loads(delivery.body)
    assert payload == delivery.payload
    assert signatures.linear_fresh(payload, time.time())
    stale = fake.issue_webhook("ENG-1", "create", secret=secret, timestamp_ms=int((time.time() - 600) * 1000))
    assert not signatures.linear_fresh(stale.payload, time.time())
    event = parse_linear(delivery.delivery_id, payload)
    assert (event.action, event.label, event.delivery_id) == ("labeled", "joch:demo", delivery.delivery_id)
    polled = tracker(fake).get_issue("ENG-1")
    assert event.issue is not None and polled is not None
    assert (event.issue.id, event.issue.key, event.issue.version, event.issue.labels) == (
        polled.id, polled.key, polled.version, polled.labels)  # the webhook and a poll agree
