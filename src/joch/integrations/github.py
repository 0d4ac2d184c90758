"""The GitHub tracker: issues, comments and pull requests over GitHub's REST API, through githubkit.

* **Credentials.** A token Secret (a personal or fine-grained token), or a GitHub App installation:
  a JWT (RS256, ``iss`` = app id, signed with the private key Secret, times from ``clock``) buys an
  installation token, kept until five minutes before its ``expires_at`` and then bought again. We
  mint it ourselves rather than through githubkit's App strategy because that strategy hides the
  expiry, which the source's status shows and the refresh follows ``clock`` for.
* **No hidden retries, no hidden cache.** githubkit runs with ``auto_retry=False`` and
  ``http_cache=False``: the controllers own backoff (a rate limit comes back as
  ``TrackerError("RateLimited", retry_at=...)``) and the ETag (the source's status keeps it).
* **Polling.** ``list_issues`` asks for every issue updated since the cursor, oldest first, 100 a
  page, following ``Link: rel="next"``; pull requests (items with ``pull_request``) are left out.
  The first page carries ``If-None-Match``: 304 means nothing changed.
* **Errors** are ``TrackerError`` whose message names what a person fixes: the Secret and key of a
  refused token, the repository that cannot be seen, the time a rate limit resets.

Answers are read as JSON for the fields Joch uses (githubkit's models are not required to match
every field an Enterprise Server of another version sends); the tests check the fake GitHub's
objects against githubkit's models instead.

``github_issue`` and ``github_repository`` turn GitHub's objects (REST answers and webhook payloads
alike) into the tracker values of ``joch.integrations.base``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import httpx
import jwt
from githubkit import GitHub, TokenAuthStrategy, UnauthAuthStrategy
from githubkit.exception import GitHubException, RequestError, RequestFailed, RequestTimeout
from githubkit.versions import LATEST_VERSION
from pydantic import ValidationError

from joch.api.integrations import GitHubSource, WriteTarget
from joch.integrations.base import (
    Clock,
    Issue,
    RemoteComment,
    RemotePullRequest,
    Repository,
    SecretLookup,
    SyncPage,
    TrackerError,
)

REFRESH_BEFORE = 300.0
"""An installation token is bought again this many seconds before it expires."""
PER_PAGE = 100
TIMEOUT = 30.0
_JWT_LIFETIME = 540  # GitHub accepts at most 10 minutes; iat is backdated a minute for clock drift


def github_repository(obj: Mapping[str, Any]) -> Repository:
    """A repository object (``GET /repos/{o}/{r}``, a webhook's ``repository``) as a ``Repository``."""
    owner = obj.get("owner") or {}
    full_name = str(obj.get("full_name") or "")
    owner_login = str(owner.get("login") or full_name.partition("/")[0])
    return Repository(owner=owner_login, name=str(obj.get("name") or full_name.partition("/")[2]),
                      clone_url=str(obj.get("clone_url") or ""),
                      default_branch=str(obj.get("default_branch") or "main"), html_url=str(obj.get("html_url") or ""))


def _owner_repo(obj: Mapping[str, Any], repository: Repository | None) -> tuple[str, str]:
    if repository is not None:
        return repository.owner, repository.name
    # repository_url: <api>/repos/{owner}/{repo}
    parts = str(obj.get("repository_url") or "").rstrip("/").split("/")
    if len(parts) >= 3 and parts[-3] == "repos":
        return parts[-2], parts[-1]
    raise TrackerError("Invalid", f"GitHub issue #{obj.get('number')} names no repository (no repository_url)")


def github_issue(obj: Mapping[str, Any], repository: Repository | None) -> Issue:
    """A GitHub issue object (REST or webhook) as an ``Issue``: key ``owner/repo#N``, version
    ``updated_at``, label names, open or closed, the author's login."""
    number = int(obj["number"])
    owner, repo = _owner_repo(obj, repository)
    labels = tuple(str(lb["name"]) if isinstance(lb, Mapping) else str(lb) for lb in obj.get("labels") or ())
    state: Literal["open", "closed"] = "closed" if obj.get("state") == "closed" else "open"
    user = obj.get("user") or {}
    updated = str(obj.get("updated_at") or "")
    return Issue(provider="github", id=str(number), key=f"{owner}/{repo}#{number}", title=str(obj.get("title") or ""),
                 body=str(obj.get("body") or ""), url=str(obj.get("html_url") or ""), state=state, labels=labels,
                 updated_at=updated, number=number, author=user.get("login"), repository=repository,
                 version=updated)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _http_date(text: str) -> float | None:
    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError):
        return None


def _next_link(header: str | None) -> str | None:
    """The ``rel="next"`` URL of a ``Link`` header."""
    for part in (header or "").split(","):
        url, _, params = part.partition(";")
        if 'rel="next"' in params.replace(" ", ""):
            return url.strip().strip("<>")
    return None


def _github_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if not isinstance(body, dict):
        return response.reason_phrase
    message = str(body.get("message") or response.reason_phrase)
    errors = body.get("errors")
    if isinstance(errors, list) and errors:
        details = [str(e.get("message") or f"{e.get('field', '')} {e.get('code', '')}".strip())
                   if isinstance(e, dict) else str(e) for e in errors]
        message += " (" + "; ".join(details) + ")"
    return message


class GitHubTracker:
    """The ``Tracker`` of one ImplementationSource's repository."""

    provider = "github"

    def __init__(self, source: GitHubSource, secrets: SecretLookup, *, clock: Clock = time.time,
                 timeout: float = TIMEOUT) -> None:
        self.source = source
        self.owner, self.repo = source.owner, source.repo
        self._secrets = secrets
        self._clock = clock
        self._timeout = timeout
        self.token_expires_at: float | None = None
        self._installation_token: str | None = None
        self._clients: dict[str, GitHub[Any]] = {}
        self._repository: Repository | None = None

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.repo}"

    # --- credentials ---------------------------------------------------------------------------

    def token(self) -> str:
        """The token requests carry: the token Secret's, or a live installation token."""
        auth = self.source.auth
        if auth.tokenSecretRef is not None:
            token = self._secrets(auth.tokenSecretRef.name, auth.tokenSecretRef.key).strip()
            if not token:
                raise TrackerError("MissingSecret", f"the key {auth.tokenSecretRef.key} of Secret "
                                   f"{auth.tokenSecretRef.name} is empty: put a GitHub token in it")
            return token
        if (self._installation_token is None or self.token_expires_at is None
                or self._clock() >= self.token_expires_at - REFRESH_BEFORE):
            self._mint_installation_token()
        assert self._installation_token is not None  # set by _mint_installation_token
        return self._installation_token

    def _app_jwt(self) -> str:
        app = self.source.auth.app
        assert app is not None
        ref = app.privateKeySecretRef
        key = self._secrets(ref.name, ref.key)
        now = int(self._clock())
        try:
            return jwt.encode({"iat": now - 60, "exp": now + _JWT_LIFETIME, "iss": str(app.appId)}, key,
                              algorithm="RS256")
        except (ValueError, TypeError, jwt.PyJWTError) as exc:
            raise TrackerError("BadCredentials", f"the key {ref.key} of Secret {ref.name} is not the GitHub App's "
                               f"private key (a PEM RSA key, as GitHub downloads it): {exc}") from exc

    def _mint_installation_token(self) -> None:
        app = self.source.auth.app
        assert app is not None
        ref = app.privateKeySecretRef
        client: GitHub[Any] = GitHub(UnauthAuthStrategy(), base_url=self._base_url(), auto_retry=False,
                                     http_cache=False, timeout=self._timeout)
        what = f"an installation token for GitHub App {app.appId} (installation {app.installationId})"
        try:
            response = client.rest.apps.create_installation_access_token(
                int(app.installationId), headers={"Authorization": f"Bearer {self._app_jwt()}"})
            answer = response.parsed_data
            expires = _epoch(answer.expires_at)
        except RequestFailed as exc:
            status = exc.response.status_code
            message = _github_message(exc.response.raw_response)
            if status == 401:
                raise TrackerError("BadCredentials", f"GitHub refused the JWT signed with the key {ref.key} of "
                                   f"Secret {ref.name} when asked for {what}: {message}; check that the Secret "
                                   f"holds the private key of App {app.appId}") from exc
            if status == 404:
                raise TrackerError("NotFound", f"GitHub App {app.appId} has no installation {app.installationId}: "
                                   "check spec.github.auth.app.installationId (the number in the installation's "
                                   "settings URL)") from exc
            raise self._failure(exc, what) from exc
        except (ValidationError, ValueError) as exc:
            raise TrackerError("Unavailable", f"GitHub answered {what} in an unexpected shape: {exc}") from exc
        except GitHubException as exc:
            raise self._failure(exc, what) from exc
        self._installation_token = answer.token
        self.token_expires_at = expires

    # --- the client and errors -------------------------------------------------------------------

    def _base_url(self) -> str:
        return self.source.apiUrl.rstrip("/") + "/"

    def _client(self) -> GitHub[Any]:
        token = self.token()
        client = self._clients.get(token)
        if client is None:
            self._clients.clear()  # an old installation token's client is of no more use
            client = GitHub(TokenAuthStrategy(token), base_url=self._base_url(), auto_retry=False,
                            http_cache=False, timeout=self._timeout)
            self._clients[token] = client
        return client

    def _failure(self, exc: GitHubException, what: str, *, missing: str | None = None) -> TrackerError:
        if isinstance(exc, RequestTimeout):
            return TrackerError("Unavailable", f"GitHub at {self.source.apiUrl} did not answer in time while "
                                f"asked for {what}")
        if not isinstance(exc, RequestFailed):
            cause = exc.exc if isinstance(exc, RequestError) else exc
            return TrackerError("Unavailable", f"GitHub at {self.source.apiUrl} could not be reached while asked "
                                f"for {what}: {cause}")
        response = exc.response.raw_response
        status = response.status_code
        message = _github_message(response)
        headers = response.headers
        retry_after = headers.get("retry-after")
        limited = (retry_after is not None or headers.get("x-ratelimit-remaining") == "0"
                   or "rate limit" in message.lower())
        if status in (403, 429) and limited:
            now = self._clock()
            if retry_after is not None and retry_after.strip().isdigit():
                at = now + int(retry_after)
            elif retry_after is not None and (when := _http_date(retry_after)) is not None:
                at = when
            elif (reset := headers.get("x-ratelimit-reset", "")).strip().isdigit():
                at = float(reset)
            else:
                at = now + 60
            return TrackerError("RateLimited", f"GitHub's rate limit for {self.full_name} is used up "
                                f"({message}); asking again after {_rfc3339(at)}", retry_at=at)
        if status == 401:
            return TrackerError("BadCredentials", f"{self._credential()} was refused by GitHub "
                                f"({self.source.apiUrl}): {message}; put a valid token in it")
        if status == 403:
            return TrackerError("Forbidden", f"GitHub forbade {what} in {self.full_name}: {message}; give "
                                f"{self._credential()} the permission for it")
        if status in (404, 410):
            return TrackerError("NotFound", missing or f"repository {self.full_name} not found at "
                                f"{self.source.apiUrl}, or {self._credential()} cannot see it")
        if status == 422 and "already exists" in message:
            return TrackerError("Conflict", f"GitHub refused {what} in {self.full_name}: {message}")
        if status in (400, 409, 422):
            return TrackerError("Invalid", f"GitHub refused {what} in {self.full_name}: {message}")
        if status >= 500:
            return TrackerError("Unavailable", f"GitHub at {self.source.apiUrl} failed ({status}) while asked "
                                f"for {what}: {message}")
        return TrackerError("Invalid", f"GitHub answered {status} to {what} in {self.full_name}: {message}")

    def _credential(self) -> str:
        auth = self.source.auth
        if auth.tokenSecretRef is not None:
            return f"the token in Secret {auth.tokenSecretRef.name}/{auth.tokenSecretRef.key}"
        assert auth.app is not None
        return f"the installation token of GitHub App {auth.app.appId} (installation {auth.app.installationId})"

    @contextmanager
    def _asking(self, what: str, *, missing: str | None = None) -> Iterator[None]:
        try:
            yield
        except GitHubException as exc:
            raise self._failure(exc, what, missing=missing) from exc
        except ValidationError as exc:
            raise TrackerError("Unavailable", f"GitHub answered {what} in {self.full_name} in an unexpected "
                               f"shape: {exc}") from exc

    # --- Tracker ---------------------------------------------------------------------------------

    def check(self) -> None:
        self._repository = None  # asked again: a check is of the credentials as they are now
        self.repository()

    def repository(self) -> Repository:
        """The source's repository (asked once per tracker)."""
        if self._repository is None:
            with self._asking(f"the repository {self.full_name}"):
                response = self._client().rest.repos.get(self.owner, self.repo)
                self._repository = github_repository(response.json())
        return self._repository

    def list_issues(self, *, since: str | None, etag: str | None) -> SyncPage:
        client = self._client()
        params: dict[str, Any] = {"state": self.source.state, "sort": "updated", "direction": "asc",
                                  "per_page": PER_PAGE}
        if self.source.labels:
            params["labels"] = ",".join(self.source.labels)
        if since:
            params["since"] = since
        headers = {"If-None-Match": etag} if etag else {}
        items: list[dict[str, Any]] = []
        first_etag: str | None = None
        url: str | None = f"repos/{self.owner}/{self.repo}/issues"
        first = True
        with self._asking("the issues"):
            while url is not None:
                response = client.request("GET", url, params=params if first else None,
                                          headers={"X-GitHub-Api-Version": LATEST_VERSION,
                                                   **(headers if first else {})})
                raw = response.raw_response
                if first:
                    first_etag = raw.headers.get("etag")
                    if raw.status_code == 304:
                        return SyncPage(cursor=since, etag=etag, not_modified=True)
                page = raw.json()
                if not isinstance(page, list):
                    raise TrackerError("Unavailable", f"GitHub answered the issues of {self.full_name} with "
                                       "something other than a list")
                items.extend(page)
                url = _next_link(raw.headers.get("link"))
                first = False
        cursor = since
        for item in items:
            updated = item.get("updated_at")
            if isinstance(updated, str) and (cursor is None or _epoch(updated) > _epoch(cursor)):
                cursor = updated
        repository = self.repository() if items else self._repository
        issues = [github_issue(item, repository) for item in items if "pull_request" not in item]
        return SyncPage(issues=issues, cursor=cursor, etag=first_etag, not_modified=False)

    def get_issue(self, id: str) -> Issue | None:
        number = int(id.rsplit("#", 1)[-1])
        try:
            with self._asking(f"issue #{number}"):
                response = self._client().rest.issues.get(self.owner, self.repo, number)
                obj = response.json()
        except TrackerError as exc:
            if exc.reason == "NotFound":
                return None
            raise
        return github_issue(obj, self.repository())

    # --- comments --------------------------------------------------------------------------------

    def _target(self, target: WriteTarget) -> tuple[str, str, int]:
        if target.number is None:
            raise TrackerError("Invalid", f"the write target for {self.full_name} names no issue number "
                               "(spec.target.number)")
        return target.owner or self.owner, target.repo or self.repo, int(target.number)

    def _comment(self, obj: Mapping[str, Any]) -> RemoteComment:
        return RemoteComment(id=str(obj["id"]), url=str(obj.get("html_url") or ""), body=str(obj.get("body") or ""))

    def find_comment(self, target: WriteTarget, marker: str) -> RemoteComment | None:
        owner, repo, number = self._target(target)
        client = self._client()
        url: str | None = f"repos/{owner}/{repo}/issues/{number}/comments"
        first = True
        missing = f"issue {owner}/{repo}#{number} not found, or {self._credential()} cannot see it"
        with self._asking(f"the comments of issue #{number}", missing=missing):
            while url is not None:
                response = client.request("GET", url, params={"per_page": PER_PAGE} if first else None)
                for obj in response.json():
                    if marker in str(obj.get("body") or ""):
                        return self._comment(obj)
                url = _next_link(response.headers.get("link"))
                first = False
        return None

    def create_comment(self, target: WriteTarget, body: str) -> RemoteComment:
        owner, repo, number = self._target(target)
        missing = f"issue {owner}/{repo}#{number} not found, or {self._credential()} cannot see it"
        with self._asking(f"a comment on issue #{number}", missing=missing):
            response = self._client().rest.issues.create_comment(owner, repo, number, body=body)
            return self._comment(response.json())

    def update_comment(self, target: WriteTarget, comment_id: str, body: str) -> RemoteComment:
        owner, repo, number = self._target(target)
        missing = (f"comment {comment_id} on issue {owner}/{repo}#{number} not found (deleted?), or "
                   f"{self._credential()} cannot see it")
        with self._asking(f"an edit of comment {comment_id}", missing=missing):
            response = self._client().rest.issues.update_comment(owner, repo, int(comment_id), body=body)
            return self._comment(response.json())

    # --- pull requests ---------------------------------------------------------------------------

    @staticmethod
    def _pull(obj: Mapping[str, Any]) -> RemotePullRequest:
        return RemotePullRequest(number=int(obj["number"]), url=str(obj.get("html_url") or ""),
                                 state=str(obj.get("state") or ""), head=str((obj.get("head") or {}).get("ref") or ""))

    def find_pull_request(self, branch: str) -> RemotePullRequest | None:
        """The pull request (open or closed) from ``branch`` of this repository."""
        with self._asking(f"the pull requests from {branch}"):
            response = self._client().rest.pulls.list(self.owner, self.repo, head=f"{self.owner}:{branch}",
                                                      state="all", per_page=PER_PAGE)
            found = response.json()
        return self._pull(found[0]) if found else None

    def create_pull_request(self, *, head: str, base: str, title: str, body: str, draft: bool) -> RemotePullRequest:
        with self._asking(f"a pull request from {head} into {base}"):
            response = self._client().rest.pulls.create(self.owner, self.repo, head=head, base=base, title=title,
                                                        body=body, draft=draft)
            return self._pull(response.json())


__all__ = ["GitHubTracker", "github_issue", "github_repository"]
