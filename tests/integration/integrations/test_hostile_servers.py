"""The GitHub and Linear clients against servers that misbehave on purpose (a real HTTP server on
127.0.0.1 answering what each test scripts): pagination that never ends, a next page on another host,
rate-limit resets in the past or absurdly far ahead. Every one must end in a ``TrackerError``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from joch.api.integrations import GitHubSource, LinearSource, WriteTarget
from joch.integrations import github, linear
from joch.integrations.base import TrackerError
from joch.integrations.github import GitHubTracker
from joch.integrations.linear import LinearTracker

NOW = 1_790_000_000.0
Answer = tuple[int, dict[str, str], Any]


@dataclass
class Scripted:
    """A server whose every answer is ``answer(method, path, headers, body)``; it records requests."""

    answer: Callable[[str, str, dict[str, str], Any], Answer]
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[str, str, dict[str, str], Any], Answer]], Scripted]]:
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Callable[[str, str, dict[str, str], Any], Answer]) -> Scripted:
        scripted = Scripted(answer)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._reply("GET")

            def do_POST(self) -> None:
                self._reply("POST")

            def _reply(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                scripted.requests.append((method, self.path, headers))
                status, extra, payload = scripted.answer(method, self.path, headers, json.loads(raw) if raw else None)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        scripted.url = f"http://127.0.0.1:{server.server_address[1]}"
        return scripted

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def gh(url: str) -> GitHubTracker:
    spec = GitHubSource.model_validate({"owner": "acme", "repo": "web", "apiUrl": url,
                                        "auth": {"tokenSecretRef": {"name": "gh", "key": "token"}}})
    return GitHubTracker(spec, lambda name, key: "ghp_token", clock=lambda: NOW, timeout=5.0)


def lin(url: str) -> LinearTracker:
    spec = LinearSource.model_validate({"teamKey": "ENG", "apiUrl": url + "/graphql",
                                        "auth": {"apiKeySecretRef": {"name": "linear", "key": "apiKey"}}})
    return LinearTracker(spec, lambda name, key: "lin_api_key", clock=lambda: NOW, timeout=5.0)


GH_TARGET = WriteTarget.model_validate({"provider": "github", "sourceRef": {"name": "web"}, "owner": "acme",
                                        "repo": "web", "number": 1})
LIN_TARGET = WriteTarget.model_validate({"provider": "linear", "sourceRef": {"name": "linear"}, "issueId": "i-1"})
REPO = {"name": "web", "full_name": "acme/web", "owner": {"login": "acme"}, "default_branch": "main"}


# --- pagination that never ends -----------------------------------------------------------------

def test_a_github_link_to_the_same_page_forever_ends(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(github, "MAX_PAGES", 20)

    def answer(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
        if path.startswith("/repos/acme/web/issues"):
            link = f'<{server.url}/repos/acme/web/issues?page=2>; rel="next"'
            return 200, {"Link": link}, [{"number": 1, "title": "x", "updated_at": "2026-01-01T00:00:00Z",
                                          "comments_url": "", "body": "no marker"}]
        return 200, {}, REPO

    server = serve(answer)
    with pytest.raises(TrackerError) as caught:
        gh(server.url).list_issues(since=None, etag=None)
    assert caught.value.reason == "Unavailable" and "already read" in caught.value.message
    with pytest.raises(TrackerError):
        gh(server.url).find_comment(GH_TARGET, "<!-- joch -->")
    assert len(server.requests) < 10


def test_github_pages_that_never_end_stop_at_the_cap(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(github, "MAX_PAGES", 20)

    def answer(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
        page = int(path.rpartition("page=")[2]) if "page=" in path else 1
        return 200, {"Link": f'<{server.url}/repos/acme/web/issues?page={page + 1}>; rel="next"'}, []

    server = serve(answer)
    with pytest.raises(TrackerError) as caught:
        gh(server.url).list_issues(since=None, etag=None)
    assert caught.value.reason == "Unavailable" and "did not end within 20 pages" in caught.value.message
    assert len(server.requests) <= 20


def test_a_github_next_page_on_another_host_gets_no_token(serve: Any) -> None:
    elsewhere = serve(lambda method, path, headers, body: (200, {}, []))
    server = serve(lambda method, path, headers, body: (
        200, {"Link": f'<{elsewhere.url}/steal?page=2>; rel="next"'}, []))
    for call in (lambda: gh(server.url).list_issues(since=None, etag=None),
                 lambda: gh(server.url).find_comment(GH_TARGET, "<!-- joch -->")):
        with pytest.raises(TrackerError) as caught:
            call()
        assert caught.value.reason == "Unavailable" and "not sending the token there" in caught.value.message
    assert elsewhere.requests == []


def test_a_linear_end_cursor_that_never_moves_ends(serve: Any) -> None:
    def answer(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
        connection = {"nodes": [], "pageInfo": {"hasNextPage": True, "endCursor": "same"}}
        if body["operationName"] == "JochComments":
            return 200, {}, {"data": {"issue": {"id": "i-1", "comments": connection}}}
        return 200, {}, {"data": {"issues": connection}}

    server = serve(answer)
    for call in (lambda: lin(server.url).list_issues(since=None, etag=None),
                 lambda: lin(server.url).find_comment(LIN_TARGET, "<!-- joch -->")):
        with pytest.raises(TrackerError) as caught:
            call()
        assert caught.value.reason == "Unavailable" and "endCursor already followed" in caught.value.message
    assert len(server.requests) == 4


def test_linear_pages_that_never_end_stop_at_the_cap(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear, "MAX_PAGES", 20)

    def answer(method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
        cursor = f"c{len(server.requests)}"
        return 200, {}, {"data": {"issues": {"nodes": [], "pageInfo": {"hasNextPage": True, "endCursor": cursor}}}}

    server = serve(answer)
    with pytest.raises(TrackerError) as caught:
        lin(server.url).list_issues(since=None, etag=None)
    assert "did not end within 20 pages" in caught.value.message and len(server.requests) <= 20


# --- rate limits whose reset cannot be believed ---------------------------------------------------

@pytest.mark.parametrize(("headers", "expected"), [
    ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(NOW) - 3600)}, NOW + 60),  # past: skew
    ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "99999999999"}, NOW + 3600),  # the year 5138
    ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "9" * 30}, NOW + 60),  # beyond any clock
    ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "9" * 5000}, NOW + 60),  # not a time at all
    ({"Retry-After": "99999999"}, NOW + 3600),
    ({"Retry-After": "9" * 400}, NOW + 60),
    ({"Retry-After": "\u00b2"}, NOW + 60),  # a digit to str.isdigit, not to float
    ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, NOW + 3600),
])
def test_a_github_reset_past_or_absurd_is_bounded(serve: Any, headers: dict[str, str], expected: float) -> None:
    server = serve(lambda method, path, h, body: (403, headers, {"message": "API rate limit exceeded"}))
    with pytest.raises(TrackerError) as caught:
        gh(server.url).check()
    assert caught.value.reason == "RateLimited" and caught.value.retry_at == expected


@pytest.mark.parametrize(("reset", "expected"), [
    (str(int(NOW) * 1000 - 3_600_000), NOW + 60),  # past
    (str(int(NOW)), NOW + 60),  # seconds where milliseconds belong: 1970
    ("nan", NOW + 60), ("inf", NOW + 60), ("1e999", NOW + 60),
    (str(int(NOW) * 1000 * 1000), NOW + 3600),  # absurd future
])
def test_a_linear_reset_past_or_absurd_is_bounded(serve: Any, reset: str, expected: float) -> None:
    server = serve(lambda method, path, h, body: (
        400, {"X-RateLimit-Requests-Reset": reset},
        {"errors": [{"message": "Rate limit exceeded", "extensions": {"code": "RATELIMITED"}}]}))
    with pytest.raises(TrackerError) as caught:
        lin(server.url).check()
    assert caught.value.reason == "RateLimited" and caught.value.retry_at == expected


# --- answers of the wrong shape ------------------------------------------------------------------

@pytest.mark.parametrize("items", [["not an object"], [{"number": "12"}], [{"number": 1, "user": "mona"}],
                                   [{"number": 1, "updated_at": "yesterday"}], [{"number": 1, "labels": [{}]}]])
def test_github_issues_of_the_wrong_shape_are_a_tracker_error(serve: Any, items: list[Any]) -> None:
    server = serve(lambda method, path, h, body: (200, {}, items if "/issues" in path else REPO))
    with pytest.raises(TrackerError):
        gh(server.url).list_issues(since=None, etag=None)


@pytest.mark.parametrize("node", [{"id": "i-1", "state": "Todo"}, {"id": "i-1", "team": "ENG"},
                                  {"id": "i-1", "creator": "mona"}])
def test_linear_issues_of_the_wrong_shape_are_a_tracker_error(serve: Any, node: dict[str, Any]) -> None:
    server = serve(lambda method, path, h, body: (200, {}, {"data": {"issues": {
        "nodes": [node], "pageInfo": {"hasNextPage": False, "endCursor": None}}}}))
    with pytest.raises(TrackerError) as caught:
        lin(server.url).list_issues(since=None, etag=None)
    assert caught.value.reason == "Invalid"


def test_github_comments_and_pulls_of_the_wrong_shape_are_a_tracker_error(serve: Any) -> None:
    server = serve(lambda method, path, h, body: (200, {}, {"message": "an object where a list belongs"}))
    client = gh(server.url)
    for call in (lambda: client.find_comment(GH_TARGET, "<!-- joch -->"), lambda: client.find_pull_request("x")):
        with pytest.raises(TrackerError) as caught:
            call()
        assert caught.value.reason == "Unavailable" and "unexpected shape" in caught.value.message
    with pytest.raises(TrackerError) as caught:
        client.get_issue("acme/web#twelve")
    assert caught.value.reason == "Invalid" and "not a GitHub issue number" in caught.value.message


@pytest.mark.parametrize("data", [{"issues": ["a list"]}, {"issues": {"nodes": [], "pageInfo": "done"}},
                                  {"issues": {"nodes": [], "pageInfo": {"hasNextPage": True, "endCursor": [1]}}},
                                  {"issue": "text", "commentCreate": "text", "commentUpdate": {"success": "yes"}}])
def test_linear_answers_of_the_wrong_shape_are_a_tracker_error(serve: Any, data: dict[str, Any]) -> None:
    server = serve(lambda method, path, h, body: (200, {}, {"data": {**data, "teams": {"nodes": [{"id": "t"}]}}}))
    client = lin(server.url)
    calls = [lambda: client.list_issues(since=None, etag=None)] if "issues" in data else [
        lambda: client.find_comment(LIN_TARGET, "m"), lambda: client.create_comment(LIN_TARGET, "b"),
        lambda: client.update_comment(LIN_TARGET, "c-1", "b"), lambda: client.get_issue("ENG-1")]
    for call in calls:
        with pytest.raises(TrackerError):
            call()


# --- where the token may go ----------------------------------------------------------------------

@pytest.mark.parametrize(("url", "says"), [
    ("http://api.github.com", "unencrypted"), ("http://10.0.0.7:8080/api/v3", "unencrypted"),
    ("https://bot:ghp_INURL@ghe.example.com/api/v3", "user or password"), ("file:///etc/passwd", "https URL"),
    ("ghe.example.com", "https URL"),
])
def test_an_api_url_a_token_must_not_go_to_is_refused(url: str, says: str) -> None:
    for call in (lambda: gh(url).check(), lambda: lin(url).check()):
        with pytest.raises(TrackerError) as caught:
            call()
        assert caught.value.reason == "Invalid" and says in caught.value.message and "INURL" not in str(caught.value)
        assert "apiUrl" in caught.value.message


def test_http_to_this_machine_is_allowed(serve: Any) -> None:
    server = serve(lambda method, path, h, body: (200, {}, REPO))
    for local in (server.url, server.url.replace("127.0.0.1", "localhost")):
        assert gh(local).repository().name == "web"
