"""The GitHub tracker against the fake GitHub on 127.0.0.1: polling (pages, ``since``, ETags),
errors a person can act on, App installation tokens, comments and pull requests. The fake's own
objects and webhook payloads are checked against githubkit's models of GitHub's schema."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from githubkit import webhooks
from githubkit.compat import type_validate_python
from githubkit_schemas.latest import models

from joch.api.integrations import GitHubSource, WriteTarget
from joch.integrations.base import TrackerError
from joch.integrations.github import GitHubTracker, github_issue, github_repository
from joch.integrations.gitpush import push_patch
from support.fake_github import TOKEN, FakeClock, FakeGitHub

REPO = "acme/web"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake(clock: FakeClock) -> Iterator[FakeGitHub]:
    with FakeGitHub(clock=clock) as running:
        running.add_repo(REPO)
        yield running


def secrets_of(values: dict[tuple[str, str], str]) -> Any:
    def lookup(name: str, key: str) -> str:
        if (name, key) not in values:
            raise TrackerError("MissingSecret", f"Secret {name} has no key {key}")
        return values[(name, key)]
    return lookup


def source(fake: FakeGitHub, *, repo: str = REPO, **extra: Any) -> GitHubSource:
    owner, name = repo.split("/")
    return GitHubSource.model_validate({
        "owner": owner, "repo": name, "apiUrl": fake.api_url,
        "auth": {"tokenSecretRef": {"name": "gh", "key": "token"}}, **extra})


def tracker(fake: FakeGitHub, clock: FakeClock, *, token: str = TOKEN, **extra: Any) -> GitHubTracker:
    return GitHubTracker(source(fake, **extra), secrets_of({("gh", "token"): token}), clock=clock)


def app_tracker(fake: FakeGitHub, clock: FakeClock, *, key: str | None = None,
                installation: int | None = None) -> GitHubTracker:
    spec = GitHubSource.model_validate({
        "owner": "acme", "repo": "web", "apiUrl": fake.api_url,
        "auth": {"app": {"appId": fake.app_id, "installationId": installation or fake.installation_id,
                         "privateKeySecretRef": {"name": "gh-app", "key": "private-key.pem"}}}})
    return GitHubTracker(spec, secrets_of({("gh-app", "private-key.pem"): key or fake.app_private_key_pem}),
                         clock=clock)


def target(number: int) -> WriteTarget:
    return WriteTarget.model_validate({"provider": "github", "sourceRef": {"name": "web"}, "owner": "acme",
                                       "repo": "web", "number": number})


# --- the fake speaks GitHub's schema ------------------------------------------------------------

def test_the_fake_answers_with_objects_githubs_schema_accepts(fake: FakeGitHub) -> None:
    fake.create_issue(REPO, "One", "body", labels=["bug"])
    comment = fake.comment(REPO, 1, "hello", user="mona", association="CONTRIBUTOR")
    pr = fake.open_pull_request(REPO, head="feature", base="main", title="A change", body="Closes #1")
    type_validate_python(models.FullRepository, fake.repository(REPO))
    type_validate_python(models.Issue, fake.issue(REPO, 1))
    type_validate_python(models.Issue, fake.issue(REPO, pr["number"]))
    type_validate_python(models.IssueComment, comment)
    type_validate_python(models.PullRequest, pr)
    type_validate_python(models.PullRequestSimple, {k: v for k, v in pr.items() if k != "merged"})
    assert "pull_request" in fake.issue(REPO, pr["number"]) and "pull_request" not in fake.issue(REPO, 1)


def test_the_fakes_webhook_payloads_match_githubs_webhook_schema(fake: FakeGitHub) -> None:
    fake.create_issue(REPO, "One", "body")
    fake.add_label(REPO, 1, "joch:demo")
    comment = fake.comment(REPO, 1, "/joch run agent=demo", user="mona", association="MEMBER")
    pr = fake.open_pull_request(REPO, head="joch/run-1", base="main", title="Fix", body="Closes #1")
    cases: list[tuple[str, dict[str, Any]]] = [
        ("issues", fake.issues_event(REPO, 1, "opened")),
        ("issues", fake.issues_event(REPO, 1, "labeled", label="joch:demo")),
        ("issues", fake.issues_event(REPO, 1, "unlabeled", label="joch:demo")),
        ("issue_comment", fake.issue_comment_event(REPO, 1, comment["id"])),
        ("pull_request", fake.pull_request_event(REPO, pr["number"], "opened")),
        ("ping", fake.ping_event(REPO)),
    ]
    fake.close_issue(REPO, 1)
    cases.append(("issues", fake.issues_event(REPO, 1, "closed")))
    for event, payload in cases:
        webhooks.parse_obj(event, payload)  # raises on any missing or mistyped field


def test_a_delivery_is_signed_as_github_signs_it(fake: FakeGitHub) -> None:
    fake.create_issue(REPO, "One")
    delivery = fake.deliver("issues", fake.issues_event(REPO, 1, "opened"), "s3cret", delivery_id="d-1")
    assert delivery.headers["X-GitHub-Event"] == "issues" and delivery.headers["X-GitHub-Delivery"] == "d-1"
    assert webhooks.verify("s3cret", delivery.body, delivery.headers["X-Hub-Signature-256"])
    assert not webhooks.verify("other", delivery.body, delivery.headers["X-Hub-Signature-256"])
    assert json.loads(delivery.body)["issue"]["number"] == 1


def test_github_issue_reads_a_webhook_issue_as_polling_does(fake: FakeGitHub) -> None:
    fake.create_issue(REPO, "Fix the login", "- [ ] works", labels=["joch:demo"], user="mona")
    payload = fake.issues_event(REPO, 1, "opened")
    repository = github_repository(payload["repository"])
    issue = github_issue(payload["issue"], repository)
    assert (issue.key, issue.item, issue.number, issue.state, issue.labels, issue.author) == (
        "acme/web#1", "github:acme/web#1", 1, "open", ("joch:demo",), "mona")
    assert issue.version == issue.updated_at == payload["issue"]["updated_at"]
    assert repository.default_branch == "main" and repository.owner == "acme" and repository.name == "web"
    assert github_issue(payload["issue"], None).key == "acme/web#1"  # from repository_url


# --- polling ----------------------------------------------------------------------------------

def test_list_issues_follows_every_page_and_skips_pull_requests(fake: FakeGitHub, clock: FakeClock) -> None:
    for n in range(150):
        fake.create_issue(REPO, f"issue {n}")
        clock.advance(1)
    fake.open_pull_request(REPO, head="feature", base="main", title="a PR")
    page = tracker(fake, clock).list_issues(since=None, etag=None)
    assert [i.number for i in page.issues] == list(range(1, 151))
    assert page.cursor == fake.issue(REPO, 151)["updated_at"]  # the newest seen, the PR's included
    lists = fake.calls("GET", "/repos/acme/web/issues")
    assert len(lists) == 2 and "per_page=100" in lists[0].path and "sort=updated" in lists[0].path
    assert "direction=asc" in lists[0].path and "state=open" in lists[0].path
    assert all(i.repository is not None and i.repository.default_branch == "main" for i in page.issues)


def test_list_issues_since_the_cursor_returns_only_what_changed(fake: FakeGitHub, clock: FakeClock) -> None:
    for n in range(3):
        fake.create_issue(REPO, f"issue {n}")
        clock.advance(10)
    gh = tracker(fake, clock)
    first = gh.list_issues(since=None, etag=None)
    clock.advance(10)
    fake.edit_issue(REPO, 2, title="renamed")
    second = gh.list_issues(since=first.cursor, etag=first.etag)
    # ``since`` includes its own second (as GitHub's does): the issue at the cursor comes again
    assert [i.title for i in second.issues] == ["issue 2", "renamed"]
    assert second.cursor == fake.issue(REPO, 2)["updated_at"] and second.cursor != first.cursor


def test_an_unchanged_list_answers_304_and_keeps_the_cursor(fake: FakeGitHub, clock: FakeClock) -> None:
    fake.create_issue(REPO, "one")
    gh = tracker(fake, clock)
    first = gh.list_issues(since=None, etag=None)
    assert first.etag
    # the ETag is the answer's: the same issues since the cursor are the same answer
    again = gh.list_issues(since=first.cursor, etag=first.etag)
    assert again.not_modified and again.issues == [] and again.cursor == first.cursor and again.etag == first.etag
    assert fake.calls("GET", "/repos/acme/web/issues")[-1].headers["if-none-match"] == first.etag
    clock.advance(5)
    fake.add_label(REPO, 1, "bug")
    changed = gh.list_issues(since=again.cursor, etag=again.etag)
    assert not changed.not_modified and changed.issues[0].labels == ("bug",) and changed.cursor != first.cursor


def test_label_and_state_filters_are_githubs(fake: FakeGitHub, clock: FakeClock) -> None:
    fake.create_issue(REPO, "both", labels=["joch:demo", "bug"])
    fake.create_issue(REPO, "one", labels=["joch:demo"])
    fake.create_issue(REPO, "closed", labels=["joch:demo", "bug"])
    fake.close_issue(REPO, 3)
    gh = tracker(fake, clock, labels=["joch:demo", "bug"])
    assert [i.title for i in gh.list_issues(since=None, etag=None).issues] == ["both"]
    assert "labels=joch%3Ademo%2Cbug" in fake.calls("GET", "/repos/acme/web/issues")[-1].path
    every = tracker(fake, clock, labels=["joch:demo", "bug"], state="all").list_issues(since=None, etag=None)
    assert {(i.title, i.state) for i in every.issues} == {("both", "open"), ("closed", "closed")}


def test_get_issue_and_a_deleted_issue(fake: FakeGitHub, clock: FakeClock) -> None:
    fake.create_issue(REPO, "one", "text")
    gh = tracker(fake, clock)
    issue = gh.get_issue("1")
    assert issue is not None and issue.body == "text" and issue.url.endswith("/acme/web/issues/1")
    fake.delete_issue(REPO, 1)
    assert gh.get_issue("1") is None
    assert gh.get_issue("99") is None


# --- errors -----------------------------------------------------------------------------------

def test_a_refused_token_names_the_secret(fake: FakeGitHub, clock: FakeClock) -> None:
    with pytest.raises(TrackerError) as caught:
        tracker(fake, clock, token="ghp_wrong").check()
    assert caught.value.reason == "BadCredentials" and not caught.value.retryable
    assert "Secret gh/token" in caught.value.message and "Bad credentials" in caught.value.message
    assert "ghp_wrong" not in caught.value.message


def test_a_missing_repository_is_not_found(fake: FakeGitHub, clock: FakeClock) -> None:
    with pytest.raises(TrackerError) as caught:
        tracker(fake, clock, repo="acme/nope").list_issues(since=None, etag=None)
    assert caught.value.reason == "NotFound"
    assert "repository acme/nope not found" in caught.value.message and "cannot see it" in caught.value.message


def test_a_used_up_rate_limit_says_when_it_resets(fake: FakeGitHub, clock: FakeClock) -> None:
    reset = fake.exhaust_rate_limit(reset_in=600)
    with pytest.raises(TrackerError) as caught:
        tracker(fake, clock).list_issues(since=None, etag=None)
    assert caught.value.reason == "RateLimited" and caught.value.retryable
    assert caught.value.retry_at == reset
    assert "rate limit" in caught.value.message
    clock.advance(601)
    assert tracker(fake, clock).list_issues(since=None, etag=None).issues == []


def test_a_429_rate_limit_is_also_rate_limited(fake: FakeGitHub, clock: FakeClock) -> None:
    reset = fake.exhaust_rate_limit(reset_in=120, status=429)
    with pytest.raises(TrackerError) as caught:
        tracker(fake, clock).check()
    assert (caught.value.reason, caught.value.retry_at) == ("RateLimited", reset)


def test_retry_after_sets_retry_at_from_the_clock(fake: FakeGitHub, clock: FakeClock) -> None:
    fake.secondary_rate_limit(retry_after=45, status=403)
    with pytest.raises(TrackerError) as caught:
        tracker(fake, clock).check()
    assert caught.value.reason == "RateLimited" and caught.value.retry_at == clock() + 45


def test_server_errors_and_no_server_are_unavailable(fake: FakeGitHub, clock: FakeClock) -> None:
    fake.fail_next(502)
    with pytest.raises(TrackerError) as caught:
        tracker(fake, clock).check()
    assert caught.value.reason == "Unavailable" and caught.value.retryable
    gone = GitHubTracker(GitHubSource.model_validate({
        "owner": "acme", "repo": "web", "apiUrl": "http://127.0.0.1:9",
        "auth": {"tokenSecretRef": {"name": "gh", "key": "token"}}}), secrets_of({("gh", "token"): TOKEN}),
        clock=clock)
    with pytest.raises(TrackerError) as caught:
        gone.check()
    assert caught.value.reason == "Unavailable" and "http://127.0.0.1:9" in caught.value.message


def test_every_answer_carries_rate_limit_headers(fake: FakeGitHub, clock: FakeClock) -> None:
    import httpx

    answer = httpx.get(f"{fake.url}/repos/acme/web", headers={"Authorization": f"token {TOKEN}"})
    assert answer.headers["x-ratelimit-limit"] == "5000" and int(answer.headers["x-ratelimit-remaining"]) < 5000
    missing = httpx.get(f"{fake.url}/repos/acme/none", headers={"Authorization": f"Bearer {TOKEN}"})
    assert missing.status_code == 404 and missing.json()["message"] == "Not Found"
    refused = httpx.get(f"{fake.url}/repos/acme/web")
    assert refused.status_code == 401 and refused.json()["message"] == "Bad credentials"
    assert "documentation_url" in refused.json() and "x-ratelimit-reset" in refused.headers


# --- GitHub App installation tokens -------------------------------------------------------------

def test_an_app_installation_token_is_minted_and_refreshed_before_it_expires(
        fake: FakeGitHub, clock: FakeClock) -> None:
    gh = app_tracker(fake, clock)
    gh.check()
    assert len(fake.minted) == 1
    first = fake.minted[0]["token"]
    assert gh.token() == first and gh.token_expires_at == clock() + fake.token_lifetime // 1
    assert fake.calls("GET", "/repos/acme/web")[-1].headers["authorization"] == f"token {first}"
    clock.advance(fake.token_lifetime - 400)  # more than five minutes left: kept
    gh.check()
    assert len(fake.minted) == 1
    clock.advance(200)  # less than five minutes left: bought again before it expires
    fake.create_issue(REPO, "one")
    assert [i.title for i in gh.list_issues(since=None, etag=None).issues] == ["one"]
    assert len(fake.minted) == 2 and gh.token() == fake.minted[1]["token"] != first
    assert fake.calls("GET", "/repos/acme/web/issues")[-1].headers["authorization"] == f"token {gh.token()}"


def test_an_app_installation_token_past_expiry_is_refused_by_the_fake(fake: FakeGitHub, clock: FakeClock) -> None:
    gh = app_tracker(fake, clock)
    token = gh.token()
    clock.advance(fake.token_lifetime + 1)
    import httpx

    assert httpx.get(f"{fake.url}/repos/acme/web", headers={"Authorization": f"token {token}"}).status_code == 401


def test_a_wrong_app_key_or_installation_is_explained(fake: FakeGitHub, clock: FakeClock) -> None:
    other = FakeGitHub(clock=clock)  # another App's key: GitHub refuses its JWT
    with pytest.raises(TrackerError) as caught:
        app_tracker(fake, clock, key=other.app_private_key_pem).check()
    assert caught.value.reason == "BadCredentials" and "Secret gh-app" in caught.value.message
    with pytest.raises(TrackerError) as caught:
        app_tracker(fake, clock, key="not a key").check()
    assert caught.value.reason == "BadCredentials" and "private-key.pem" in caught.value.message
    with pytest.raises(TrackerError) as caught:
        app_tracker(fake, clock, installation=fake.installation_id + 1).check()
    assert caught.value.reason == "NotFound" and "installationId" in caught.value.message


# --- comments ---------------------------------------------------------------------------------

def test_a_comment_is_created_found_by_its_marker_and_edited_in_place(fake: FakeGitHub, clock: FakeClock) -> None:
    fake.create_issue(REPO, "one")
    for n in range(120):  # the marker's comment is on the second page
        fake.comment(REPO, 1, f"chatter {n}", user="mona")
    gh = tracker(fake, clock)
    marker = "<!-- joch:run:uid-1 -->"
    assert gh.find_comment(target(1), marker) is None
    created = gh.create_comment(target(1), f"Running\n\n{marker}")
    assert created.url.endswith(f"#issuecomment-{created.id}")
    found = gh.find_comment(target(1), marker)
    assert found == created
    updated = gh.update_comment(target(1), created.id, f"Succeeded\n\n{marker}")
    assert updated.id == created.id and updated.body.startswith("Succeeded")
    mine = [c for c in fake.comments(REPO, 1) if marker in c["body"]]
    assert len(mine) == 1 and mine[0]["body"].startswith("Succeeded")
    assert len(fake.calls("GET", "/repos/acme/web/issues/1/comments")) == 4  # two pages, twice


def test_a_comment_on_a_missing_issue_names_it(fake: FakeGitHub, clock: FakeClock) -> None:
    with pytest.raises(TrackerError) as caught:
        tracker(fake, clock).create_comment(target(41), "hi")
    assert caught.value.reason == "NotFound" and "acme/web#41" in caught.value.message


# --- pull requests ----------------------------------------------------------------------------

def test_a_pull_request_is_found_by_branch_and_created_once(fake: FakeGitHub, clock: FakeClock) -> None:
    fake.create_issue(REPO, "one")
    gh = tracker(fake, clock)
    assert gh.find_pull_request("joch/run-1") is None
    created = gh.create_pull_request(head="joch/run-1", base="main", title="Fix", body="Closes #1", draft=True)
    assert created.number == 2 and created.url.endswith("/acme/web/pull/2") and created.head == "joch/run-1"
    assert gh.find_pull_request("joch/run-1") == created
    assert "head=acme%3Ajoch%2Frun-1" in fake.calls("GET", "/repos/acme/web/pulls")[-1].path
    assert "state=all" in fake.calls("GET", "/repos/acme/web/pulls")[-1].path
    (pr,) = fake.pulls(REPO)
    assert (pr["body"], pr["draft"], pr["base"]["ref"]) == ("Closes #1", True, "main")
    with pytest.raises(TrackerError) as caught:
        gh.create_pull_request(head="joch/run-1", base="main", title="Fix", body="", draft=False)
    assert caught.value.reason == "Conflict" and "already exists" in caught.value.message
    assert gh.find_pull_request("joch/other") is None


def test_a_pull_request_needs_its_branch_pushed_first(fake: FakeGitHub, clock: FakeClock, tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    seed.mkdir()
    for args in (["init", "-q", "-b", "main"], ["-c", "user.name=S", "-c", "user.email=s@example.com", "commit",
                                                "-q", "--allow-empty", "-m", "initial"]):
        subprocess.run(["git", *args], cwd=seed, check=True, capture_output=True)
    bare = tmp_path / "web.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(seed), str(bare)], check=True, capture_output=True)
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=seed, check=True, capture_output=True,
                          text=True).stdout.strip()
    fake.add_repo("acme/app", git_dir=bare)
    assert fake.repository("acme/app")["clone_url"] == str(bare)
    gh = tracker(fake, clock, repo="acme/app")
    with pytest.raises(TrackerError) as caught:
        gh.create_pull_request(head="joch/run-1", base="main", title="Fix", body="", draft=False)
    assert caught.value.reason == "Invalid" and "head" in caught.value.message
    patch = (b"diff --git a/hello.txt b/hello.txt\nnew file mode 100644\n--- /dev/null\n+++ b/hello.txt\n"
             b"@@ -0,0 +1 @@\n+hello\n")
    sha = push_patch(git_url=gh.repository().clone_url, base_commit=base, fetch_ref="main", patch=patch,
                     branch="joch/run-1", message="Fix", author_name="Joch", author_email="joch@example.com",
                     date="2026-11-28T09:00:00Z", token=None, workdir=tmp_path / "cache")
    pr = gh.create_pull_request(head="joch/run-1", base="main", title="Fix", body="Closes #1", draft=False)
    assert fake.pulls("acme/app")[0]["head"]["sha"] == sha and pr.head == "joch/run-1"


def test_a_delivery_is_sent_as_github_sends_it(fake: FakeGitHub) -> None:
    received: list[tuple[dict[str, str], bytes]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        fake.create_issue(REPO, "One")
        delivery = fake.deliver("ping", fake.ping_event(REPO), b"hook-secret")
        answer = delivery.send(f"http://127.0.0.1:{server.server_address[1]}/v1/webhooks/github")
    finally:
        server.shutdown()
        server.server_close()
    assert answer.status_code == 202
    ((headers, body),) = received
    assert body == delivery.body and headers["x-github-event"] == "ping"
    assert headers["x-github-delivery"] == delivery.delivery_id and headers["content-type"] == "application/json"
    assert webhooks.verify("hook-secret", body, headers["x-hub-signature-256"])
