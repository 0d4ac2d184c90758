"""Linear, through its GraphQL API: one POST to ``spec.linear.apiUrl`` per query, with the API key as
the ``Authorization`` header (Linear takes personal API keys bare, without ``Bearer``).

Polling reads ``issues`` of the source's team updated after the cursor (``updatedAt`` greater than
the newest ``updatedAt`` seen), archived ones included (they become closed), every page of 50 by
``pageInfo.endCursor``. Linear has no ETags: ``SyncPage.etag`` stays None. Label and state filters go
into the query's ``IssueFilter`` (every label must be present: one ``labels.some`` per label under
``and``).

Linear answers errors in the GraphQL body, usually with HTTP 400: ``extensions.code`` says which.
``RATELIMITED`` carries ``X-RateLimit-Requests-Reset`` (epoch milliseconds) → ``RateLimited`` until
then; ``AUTHENTICATION_ERROR`` → ``BadCredentials``; ``FORBIDDEN`` → ``Forbidden``; "Entity not
found" → None from ``get_issue``, ``NotFound`` elsewhere. The key never appears in a message.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

import httpx

from joch.api.integrations import LinearSource, WriteTarget
from joch.integrations.base import (
    Clock,
    Issue,
    RemoteComment,
    SecretLookup,
    SyncPage,
    TrackerError,
    checked_api_url,
)

PAGE_SIZE = 50
MAX_PAGES = 1000
"""A listing that has not ended after this many pages is refused (an ``endCursor`` loop never ends)."""
MAX_WAIT = 3600.0
"""A rate limit's reset is believed up to this far ahead (Linear's windows are an hour)."""
_CLOSED_STATE_TYPES = ("completed", "canceled")

ISSUE_FIELDS = """
  id identifier number title description url createdAt updatedAt archivedAt trashed
  state { id name type }
  team { id key name }
  labels { nodes { id name } }
  creator { id name email }
"""

CHECK = """query JochCheck($teamKey: String!) {
  viewer { id name }
  teams(filter: {key: {eq: $teamKey}}) { nodes { id key name } }
}"""

ISSUES = """query JochIssues($filter: IssueFilter, $first: Int, $after: String) {
  issues(filter: $filter, orderBy: updatedAt, first: $first, after: $after, includeArchived: true) {
    nodes {%s}
    pageInfo { hasNextPage endCursor }
  }
}""" % ISSUE_FIELDS  # noqa: UP031 (the braces of GraphQL would need doubling in an f-string)

ISSUE = """query JochIssue($id: String!) {
  issue(id: $id) {%s}
}""" % ISSUE_FIELDS  # noqa: UP031

COMMENTS = """query JochComments($id: String!, $first: Int, $after: String) {
  issue(id: $id) {
    id
    comments(first: $first, after: $after) {
      nodes { id body url }
      pageInfo { hasNextPage endCursor }
    }
  }
}"""

COMMENT_CREATE = """mutation JochCommentCreate($input: CommentCreateInput!) {
  commentCreate(input: $input) { success comment { id body url } }
}"""

COMMENT_UPDATE = """mutation JochCommentUpdate($id: String!, $input: CommentUpdateInput!) {
  commentUpdate(id: $id, input: $input) { success comment { id body url } }
}"""

ATTACHMENT_CREATE = """mutation JochAttachmentCreate($input: AttachmentCreateInput!) {
  attachmentCreate(input: $input) { success attachment { id url title } }
}"""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _shape_checked(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """An answer of the wrong shape (a list where an object was, a key missing) is ``TrackerError``
    ``Unavailable``, not a KeyError or AttributeError out of the client."""
    @functools.wraps(method)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TrackerError("Unavailable", f"Linear answered {method.__name__} in an unexpected shape "
                               f"({type(exc).__name__}: {str(exc)[:120]})") from None
    return checked


def linear_issue(node: Mapping[str, Any]) -> Issue:
    """An issue as the GraphQL API answers it (``labels.nodes``) or as a webhook carries it (``labels``
    a list, ``labelIds``), normalised. Completed and canceled states and archived issues are closed;
    a trashed issue is deleted. ``TrackerError("Invalid")`` when it is not shaped like one."""
    try:
        return _linear_issue(node)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TrackerError("Invalid", f"the Linear issue object is not shaped as Linear sends it "
                           f"({type(exc).__name__}: {str(exc)[:120]})") from None


def _linear_issue(node: Mapping[str, Any]) -> Issue:
    labels_field = node.get("labels")
    if isinstance(labels_field, Mapping):
        labels_field = labels_field.get("nodes")
    labels = tuple(str(label["name"]) for label in labels_field or () if isinstance(label, Mapping)
                   and label.get("name"))
    state = node.get("state") or {}
    identifier = str(node.get("identifier") or "")
    team = node.get("team") or {}
    team_key = team.get("key") or (identifier.rsplit("-", 1)[0] if "-" in identifier else None)
    closed = state.get("type") in _CLOSED_STATE_TYPES or bool(node.get("archivedAt"))
    creator = node.get("creator") or {}
    updated = str(node.get("updatedAt") or "")
    number = node.get("number")
    return Issue(
        provider="linear",
        id=str(node.get("id") or ""),
        key=identifier,
        title=str(node.get("title") or ""),
        body=str(node.get("description") or ""),
        url=str(node.get("url") or ""),
        state="closed" if closed else "open",
        labels=labels,
        updated_at=updated,
        number=int(number) if isinstance(number, int | float) and not isinstance(number, bool) else None,
        author=creator.get("email") or creator.get("name"),
        team_key=team_key,
        deleted=bool(node.get("trashed")),
        version=updated,
    )


class LinearTracker:
    """A ``Tracker`` for one Linear team (``source.teamKey``), plus ``attach_link``."""

    provider = "linear"

    def __init__(self, source: LinearSource, secrets: SecretLookup, *, clock: Clock = time.time,
                 timeout: float = 30.0) -> None:
        self.source = source
        self._secrets = secrets
        self._clock = clock
        self._timeout = timeout
        self._key: str | None = None
        self._http: httpx.Client | None = None

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    # --- Tracker ---------------------------------------------------------------------------------

    @_shape_checked
    def check(self) -> None:
        data = self._call("JochCheck", CHECK, {"teamKey": self.source.teamKey})
        if not ((data.get("teams") or {}).get("nodes") or []):
            raise TrackerError("NotFound", f'Linear team "{self.source.teamKey}" not found, or the API key '
                                           "cannot see it: check spec.linear.teamKey")

    @_shape_checked
    def list_issues(self, *, since: str | None, etag: str | None = None) -> SyncPage:
        issue_filter = self._filter(since)
        issues: list[Issue] = []
        after: str | None = None
        seen: set[str] = set()
        while True:
            data = self._call("JochIssues", ISSUES, {"filter": issue_filter, "first": PAGE_SIZE, "after": after})
            connection = data.get("issues") or {}
            issues.extend(linear_issue(node) for node in connection.get("nodes") or [])
            page = connection.get("pageInfo") or {}
            after = page.get("endCursor")
            if not page.get("hasNextPage") or not after:
                break
            _next_page(seen, after, f'the issues of team "{self.source.teamKey}"')
        issues.sort(key=lambda i: _instant(i.updated_at))  # oldest first, as GitHub's are
        if not issues:
            self.check()  # an empty answer for a team that does not exist is an error, not "no issues"
        cursor = since
        for issue in issues:
            if _instant(issue.updated_at) > _instant(cursor):
                cursor = issue.updated_at
        return SyncPage(issues=issues, cursor=cursor)

    @_shape_checked
    def get_issue(self, id: str) -> Issue | None:
        try:
            data = self._call("JochIssue", ISSUE, {"id": id})
        except TrackerError as exc:
            if exc.reason == "NotFound":
                return None
            raise
        node = data.get("issue")
        if not node:
            return None
        issue = linear_issue(node)
        return None if issue.deleted else issue

    @_shape_checked
    def find_comment(self, target: WriteTarget, marker: str) -> RemoteComment | None:
        issue = _issue_ref(target)
        after: str | None = None
        seen: set[str] = set()
        while True:
            data = self._call("JochComments", COMMENTS, {"id": issue, "first": PAGE_SIZE, "after": after})
            node = data.get("issue")
            if not node:
                raise TrackerError("NotFound", f"Linear issue {issue} not found, or the API key cannot see it")
            connection = node.get("comments") or {}
            for comment in connection.get("nodes") or []:
                if marker in (comment.get("body") or ""):
                    return _comment(comment)
            page = connection.get("pageInfo") or {}
            after = page.get("endCursor")
            if not page.get("hasNextPage") or not after:
                return None
            _next_page(seen, after, f"the comments of Linear issue {issue}")

    @_shape_checked
    def create_comment(self, target: WriteTarget, body: str) -> RemoteComment:
        data = self._call("JochCommentCreate", COMMENT_CREATE,
                          {"input": {"issueId": _issue_ref(target), "body": body}})
        return _comment(_succeeded(data, "commentCreate", "comment"))

    @_shape_checked
    def update_comment(self, target: WriteTarget, comment_id: str, body: str) -> RemoteComment:
        data = self._call("JochCommentUpdate", COMMENT_UPDATE, {"id": comment_id, "input": {"body": body}})
        return _comment(_succeeded(data, "commentUpdate", "comment"))

    # --- Linear only -----------------------------------------------------------------------------

    @_shape_checked
    def attach_link(self, target: WriteTarget, url: str, title: str) -> str:
        """Attach ``url`` to the issue; the attachment's id. Linear keeps one attachment per URL and
        issue, so attaching again updates it rather than adding a second."""
        data = self._call("JochAttachmentCreate", ATTACHMENT_CREATE,
                          {"input": {"issueId": _issue_ref(target), "url": url, "title": title}})
        return str(_succeeded(data, "attachmentCreate", "attachment")["id"])

    # --- wire ------------------------------------------------------------------------------------

    def _filter(self, since: str | None) -> dict[str, Any]:
        issue_filter: dict[str, Any] = {"team": {"key": {"eq": self.source.teamKey}}}
        if since:
            issue_filter["updatedAt"] = {"gt": since}
        if self.source.states:
            issue_filter["state"] = {"name": {"in": list(self.source.states)}}
        if self.source.labels:
            issue_filter["and"] = [{"labels": {"some": {"name": {"eq": label}}}} for label in self.source.labels]
        return issue_filter

    def _api_key(self) -> str:
        if self._key is None:
            ref = self.source.auth.apiKeySecretRef
            key = self._secrets(ref.name, ref.key).strip()
            if not key:
                raise TrackerError("MissingSecret", f"the key {ref.key} of Secret {ref.name} is empty: put a "
                                   "Linear API key in it")
            if not all("!" <= c <= "~" for c in key):
                # an HTTP client refusing such a header quotes it in its error: never let it get that far
                raise TrackerError("BadCredentials", f"the key {ref.key} of Secret {ref.name} holds characters no "
                                   "Linear API key has (a line break, a space, a control or non-ASCII character): "
                                   "put the key alone in it")
            self._key = key
        return self._key

    def _call(self, operation: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        url = checked_api_url(self.source.apiUrl, "spec.linear.apiUrl")
        headers = {"Authorization": self._api_key(), "Content-Type": "application/json",
                   "User-Agent": "joch-linear"}
        try:
            if self._http is None:  # one client per tracker: its connections are reused across pages
                self._http = httpx.Client(timeout=self._timeout, follow_redirects=False)
            response = self._http.post(url, json={"query": query, "variables": variables, "operationName": operation},
                                       headers=headers)
        except httpx.HTTPError as exc:
            raise TrackerError("Unavailable", f"Linear at {url} is unreachable: {type(exc).__name__}: {exc}; check "
                               "spec.linear.apiUrl and that the Joch server can reach it (DNS, proxy, "
                               "firewall)") from None
        try:
            answer = response.json()
        except ValueError:
            answer = None
        errors = answer.get("errors") if isinstance(answer, dict) else None
        if errors:
            raise self._error(errors if isinstance(errors, list) else [{"message": str(errors)}], response)
        if response.status_code == 429:
            raise TrackerError("RateLimited", f"Linear rate limit reached{self._until(response)}",
                               retry_at=self._reset(response))
        if response.status_code == 401:
            raise self._error([{"extensions": {"code": "AUTHENTICATION_ERROR"}, "message": "HTTP 401"}], response)
        if response.status_code >= 500 or not isinstance(answer, dict):
            raise TrackerError("Unavailable", f"Linear at {url} answered HTTP {response.status_code} to {operation}")
        if response.status_code >= 400:
            raise TrackerError("Invalid", f"Linear refused {operation} with HTTP {response.status_code}")
        data = answer.get("data")
        return data if isinstance(data, dict) else {}

    def _error(self, errors: list[Any], response: httpx.Response) -> TrackerError:
        first = errors[0] if isinstance(errors[0], dict) else {}
        extensions = first.get("extensions") or {}
        code = str(extensions.get("code") or "")
        message = str(extensions.get("userPresentableMessage") or first.get("message") or "an error")
        ref = self.source.auth.apiKeySecretRef
        if code == "RATELIMITED":
            return TrackerError("RateLimited", f"Linear rate limit reached{self._until(response)}",
                                retry_at=self._reset(response))
        if code == "AUTHENTICATION_ERROR":
            return TrackerError("BadCredentials", f"the API key in Secret {ref.name}/{ref.key} was refused by "
                                                  f"Linear: {message}; put a valid personal API key there")
        if code == "FORBIDDEN":
            return TrackerError("Forbidden", f"the API key in Secret {ref.name}/{ref.key} may not do this in "
                                             f"Linear: {message}")
        text = str(first.get("message") or "")
        if "not found" in text.lower() or "could not find" in message.lower():
            return TrackerError("NotFound", f"Linear: {message}")
        if response.status_code >= 500 or code == "INTERNAL_SERVER_ERROR":
            return TrackerError("Unavailable", f"Linear failed: {message}")
        return TrackerError("Invalid", f"Linear refused the request: {message}")

    def _reset(self, response: httpx.Response) -> float:
        raw = response.headers.get("x-ratelimit-requests-reset") or response.headers.get(
            "x-ratelimit-complexity-reset")
        now = self._clock()
        try:
            at = float(raw) / 1000.0 if raw else math.nan
        except ValueError:
            at = math.nan
        if not math.isfinite(at) or at <= now:
            return now + 60.0  # none, not a number ("nan", "inf"), or already past (seconds, or clock skew)
        return min(at, now + MAX_WAIT)

    def _until(self, response: httpx.Response) -> str:
        return f" until {datetime.fromtimestamp(self._reset(response), UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def _next_page(seen: set[str], cursor: str, what: str) -> None:
    """Refuses a cursor already followed (the listing would never end) and a listing past ``MAX_PAGES``."""
    if cursor in seen:
        raise TrackerError("Unavailable", f"Linear answered {what} with an endCursor already followed: the "
                                          "listing would never end")
    seen.add(cursor)
    if len(seen) >= MAX_PAGES:
        raise TrackerError("Unavailable", f"Linear's listing of {what} did not end within {MAX_PAGES} pages")


def _issue_ref(target: WriteTarget) -> str:
    ref = target.issueId or target.identifier
    if not ref:
        raise TrackerError("Invalid", "the write target names no Linear issue: set target.issueId or "
                                      "target.identifier")
    return ref


def _succeeded(data: Mapping[str, Any], field: str, entity: str) -> dict[str, Any]:
    payload = data.get(field) or {}
    value = payload.get(entity)
    if not payload.get("success") or not isinstance(value, dict):
        raise TrackerError("Invalid", f"Linear answered {field} without success")
    return value


def _comment(node: Mapping[str, Any]) -> RemoteComment:
    return RemoteComment(id=str(node["id"]), url=str(node.get("url") or ""), body=str(node.get("body") or ""))


def _instant(value: str | None) -> float:
    if not value:
        return float("-inf")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float("-inf")
