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

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import jwt
from githubkit import GitHub, TokenAuthStrategy, UnauthAuthStrategy
from githubkit.exception import GitHubException, RequestError, RequestFailed, RequestTimeout
from githubkit.versions import LATEST_VERSION

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
    checked_api_url,
)

REFRESH_BEFORE = 300.0
"""An installation token is bought again this many seconds before it expires."""
PER_PAGE = 100
MAX_PAGES = 1000
"""A listing that has not ended after this many pages is refused (a ``Link`` loop never ends)."""
MAX_WAIT = 3600.0
"""A rate limit's reset is believed up to this far ahead (GitHub's windows are an hour)."""
TIMEOUT = 30.0
_JWT_LIFETIME = 540  # GitHub accepts at most 10 minutes; iat is backdated a minute for clock drift


_MALFORMED = (KeyError, TypeError, ValueError, AttributeError)
"""What reading a JSON object of the wrong shape raises (a missing key, a string where an object was)."""


def _malformed(what: str, exc: Exception) -> TrackerError:
    return TrackerError("Invalid", f"{what} is not shaped as GitHub sends it ({type(exc).__name__}: "
                        f"{str(exc)[:120]})")


def github_repository(obj: Mapping[str, Any]) -> Repository:
    """A repository object (``GET /repos/{o}/{r}``, a webhook's ``repository``) as a ``Repository``;
    ``TrackerError("Invalid")`` when it is not shaped like one."""
    try:
        return _github_repository(obj)
    except _MALFORMED as exc:
        raise _malformed("the repository object", exc) from None


def _github_repository(obj: Mapping[str, Any]) -> Repository:
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
    ``updated_at``, label names, open or closed, the author's login. ``TrackerError("Invalid")`` when
    it is not shaped like one."""
    try:
        return _github_issue(obj, repository)
    except _MALFORMED as exc:
        raise _malformed("the issue object", exc) from None


def _github_issue(obj: Mapping[str, Any], repository: Repository | None) -> Issue:
    number = obj["number"]
    if isinstance(number, bool) or not isinstance(number, int):
        raise ValueError(f"number is {number!r}, not a whole number")
    owner, repo = _owner_repo(obj, repository)
    labels = tuple(str(lb["name"]) if isinstance(lb, Mapping) else str(lb) for lb in obj.get("labels") or ())
    state: Literal["open", "closed"] = "closed" if obj.get("state") == "closed" else "open"
    user = obj.get("user") or {}
    updated = str(obj.get("updated_at") or "")
    if not isinstance(user, Mapping):
        raise TypeError("user is not an object")
    return Issue(provider="github", id=str(number), key=f"{owner}/{repo}#{number}", title=str(obj.get("title") or ""),
                 body=str(obj.get("body") or ""), url=str(obj.get("html_url") or ""), state=state, labels=labels,
                 updated_at=updated, number=number, author=_text(user.get("login")), repository=repository,
                 version=updated)


def _header_safe(token: str) -> bool:
    """Whether ``token`` is visible ASCII only, as every GitHub token is (and so safe in a header)."""
    return all("!" <= c <= "~" for c in token)


def _text(value: Any) -> str | None:
    return str(value) if value is not None else None


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(text: str) -> float | None:
    """A header's whole number of seconds, or None (not digits, or too long to be a time)."""
    text = text.strip()
    return float(text) if text.isascii() and text.isdigit() and len(text) <= 15 else None


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


class _Pages:
    """The URLs of a listing's further pages: ``Link: rel="next"`` while it stays under the API URL (the
    token goes with every request), never a page twice, at most ``MAX_PAGES``."""

    def __init__(self, api_url: str, what: str) -> None:
        base = urlsplit(api_url.rstrip("/") + "/")
        self._origin, self._path = (base.scheme, base.netloc.lower()), base.path
        self._api_url, self._what = api_url, what
        self._seen: set[str] = set()

    def next(self, link: str | None) -> str | None:
        url = _next_link(link)
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme or parts.netloc:
            if (parts.scheme, parts.netloc.lower()) != self._origin or not parts.path.startswith(self._path):
                raise TrackerError("Unavailable", f"GitHub's next page of {self._what} is not under {self._api_url} "
                                   "(its Link header points elsewhere): not sending the token there")
        if url in self._seen:
            raise TrackerError("Unavailable", f"GitHub's Link header for {self._what} points back to a page "
                               "already read: the listing would never end")
        self._seen.add(url)
        if len(self._seen) >= MAX_PAGES:
            raise TrackerError("Unavailable", f"GitHub's listing of {self._what} did not end within {MAX_PAGES} "
                               "pages")
        return url


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
        self._last_response: httpx.Response | None = None

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
            if not _header_safe(token):
                # an HTTP client refusing such a header quotes it in its error: never let it get that far
                raise TrackerError("BadCredentials", f"the key {auth.tokenSecretRef.key} of Secret "
                                   f"{auth.tokenSecretRef.name} holds characters no GitHub token has (a line break, "
                                   "a space, a control or non-ASCII character): put the token alone in it")
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
                                     http_cache=False, timeout=self._timeout, event_hooks={"response": [self._seen]})
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
        except GitHubException as exc:
            raise self._failure(exc, what) from exc
        except (ValueError, OverflowError) as exc:  # pydantic's ValidationError is a ValueError
            raise self._unreadable(exc, what) from exc
        self._installation_token = answer.token
        self.token_expires_at = expires

    # --- the client and errors -------------------------------------------------------------------

    def _base_url(self) -> str:
        return checked_api_url(self.source.apiUrl, "spec.github.apiUrl").rstrip("/") + "/"

    def _client(self) -> GitHub[Any]:
        token = self.token()
        client = self._clients.get(token)
        if client is None:
            self._clients.clear()  # an old installation token's client is of no more use
            client = GitHub(TokenAuthStrategy(token), base_url=self._base_url(), auto_retry=False,
                            http_cache=False, timeout=self._timeout, event_hooks={"response": [self._seen]})
            self._clients[token] = client
        return client

    def _failure(self, exc: GitHubException, what: str, *, missing: str | None = None) -> TrackerError:
        if isinstance(exc, RequestTimeout):
            return TrackerError("Unavailable", f"GitHub at {self.source.apiUrl} did not answer in time while "
                                f"asked for {what}; check spec.github.apiUrl, or try again later")
        if not isinstance(exc, RequestFailed):
            cause = exc.exc if isinstance(exc, RequestError) else exc
            return TrackerError("Unavailable", f"GitHub at {self.source.apiUrl} could not be reached while asked "
                                f"for {what}: {cause}; check spec.github.apiUrl and that the Joch server can "
                                "reach it (DNS, proxy, firewall)")
        response = exc.response.raw_response
        status = response.status_code
        message = _github_message(response)
        limited = self._rate_limited(response, message)
        if limited is not None:
            return limited
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

    def _rate_limited(self, response: httpx.Response, message: str | None = None) -> TrackerError | None:
        """``RateLimited`` for a 403/429 that says the rate limit is used up, else None."""
        status = response.status_code
        message = _github_message(response) if message is None else message
        headers = response.headers
        retry_after = headers.get("retry-after")
        limited = (retry_after is not None or headers.get("x-ratelimit-remaining") == "0"
                   or "rate limit" in message.lower())
        if status in (403, 429) and limited:
            now = self._clock()
            if retry_after is not None and (seconds := _seconds(retry_after)) is not None:
                at = now + min(seconds, MAX_WAIT)
            elif retry_after is not None and (when := _http_date(retry_after)) is not None:
                at = when
            elif (reset := _seconds(headers.get("x-ratelimit-reset", ""))) is not None:
                at = reset
            else:
                at = now + 60
            if not math.isfinite(at) or at <= now:
                at = now + 60  # a reset already past (the clocks disagree): wait a minute, as for no reset at all
            at = min(at, now + MAX_WAIT)  # a reset absurdly far ahead would stop the source for good
            return TrackerError("RateLimited", f"GitHub's rate limit for {self.full_name} is used up "
                                f"({message}); asking again after {_rfc3339(at)}", retry_at=at)
        return None

    def _seen(self, response: httpx.Response) -> None:
        """httpx's response hook: the last answer, for when githubkit fails reading it (githubkit's own
        rate-limit check raises ValueError or OverflowError on a reset header it cannot parse)."""
        self._last_response = response

    def _unreadable(self, exc: Exception, what: str) -> TrackerError:
        last = self._last_response
        limited = self._rate_limited(last) if last is not None else None
        if limited is not None:
            return limited
        return TrackerError("Unavailable", f"GitHub answered {what} in {self.full_name} in an unexpected shape: "
                            f"{type(exc).__name__}: {str(exc)[:200]}")

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
        except (ValueError, OverflowError, KeyError, TypeError, AttributeError) as exc:
            # pydantic's ValidationError is a ValueError; the others: a list where an object was, a key missing
            raise self._unreadable(exc, what) from exc

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
        # After the first sync an "open" source asks for closed issues too: an issue closed since the
        # cursor is how its spec learns it is Stale (a closed issue never makes a new spec).
        state = "all" if since and self.source.state == "open" else self.source.state
        params: dict[str, Any] = {"state": state, "sort": "updated", "direction": "asc", "per_page": PER_PAGE}
        if self.source.labels:
            params["labels"] = ",".join(self.source.labels)
        if since:
            params["since"] = since
        headers = {"If-None-Match": etag} if etag else {}
        items: list[dict[str, Any]] = []
        first_etag: str | None = None
        url: str | None = f"repos/{self.owner}/{self.repo}/issues"
        first = True
        pages = _Pages(self.source.apiUrl, f"the issues of {self.full_name}")
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
                if not isinstance(page, list) or not all(isinstance(item, dict) for item in page):
                    raise TrackerError("Unavailable", f"GitHub answered the issues of {self.full_name} with "
                                       "something other than a list of objects")
                items.extend(page)
                url = pages.next(raw.headers.get("link"))
                first = False
        cursor = since
        for item in items:
            updated = item.get("updated_at")
            try:
                if isinstance(updated, str) and (_epoch(updated) > (_epoch(cursor) if cursor else -math.inf)):
                    cursor = updated
            except ValueError:
                raise TrackerError("Unavailable", f"GitHub answered an issue of {self.full_name} updated at "
                                   f"{str(updated)[:40]!r} (or the cursor {since!r}), which is not a time") from None
        repository = self.repository() if items else self._repository
        issues = [github_issue(item, repository) for item in items if "pull_request" not in item]
        return SyncPage(issues=issues, cursor=cursor, etag=first_etag, not_modified=False)

    def get_issue(self, id: str) -> Issue | None:
        tail = id.rsplit("#", 1)[-1]
        if not (tail.isascii() and tail.isdigit() and len(tail) <= 18):
            raise TrackerError("Invalid", f'"{id[:80]}" is not a GitHub issue number (12, or acme/web#12)')
        number = int(tail)
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
        pages = _Pages(self.source.apiUrl, f"the comments of issue {owner}/{repo}#{number}")
        with self._asking(f"the comments of issue #{number}", missing=missing):
            while url is not None:
                response = client.request("GET", url, params={"per_page": PER_PAGE} if first else None)
                for obj in response.json():
                    if marker in str(obj.get("body") or ""):
                        return self._comment(obj)
                url = pages.next(response.headers.get("link"))
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
                                 state=str(obj.get("state") or ""), head=str((obj.get("head") or {}).get("ref") or ""),
                                 body=str(obj.get("body") or ""))

    def find_pull_request(self, branch: str, marker: str | None = None) -> RemotePullRequest | None:
        """The pull request (open or closed) from ``branch`` of this repository; with ``marker``, only
        one whose body carries it (a branch name is reused by a later run of the same name)."""
        with self._asking(f"the pull requests from {branch}"):
            response = self._client().rest.pulls.list(self.owner, self.repo, head=f"{self.owner}:{branch}",
                                                      state="all", per_page=PER_PAGE)
            found = [self._pull(obj) for obj in response.json()]
            if marker is not None:
                found = [p for p in found if marker in p.body]
            return found[0] if found else None

    def create_pull_request(self, *, head: str, base: str, title: str, body: str, draft: bool) -> RemotePullRequest:
        with self._asking(f"a pull request from {head} into {base}"):
            response = self._client().rest.pulls.create(self.owner, self.repo, head=head, base=base, title=title,
                                                        body=body, draft=draft)
            return self._pull(response.json())


__all__ = ["GitHubTracker", "github_issue", "github_repository"]
