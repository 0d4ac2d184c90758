"""What every tracker client answers in: issues, comments and pull requests as plain values, and
``TrackerError`` with a reason a person can act on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from joch.api.integrations import WriteTarget, api_url_problem

SecretLookup = Callable[[str, str], str]
"""``(secret name, key) → value`` in the source's namespace; raises ``TrackerError("MissingSecret")``."""

Clock = Callable[[], float]


class TrackerError(Exception):
    """``reason``: BadCredentials, Forbidden, NotFound, RateLimited, Unavailable, Invalid, MissingSecret,
    Conflict. ``retry_at``: epoch seconds before which asking again is pointless (rate limits,
    ``Retry-After``). ``retryable``: whether the same request may succeed later."""

    def __init__(self, reason: str, message: str, *, retry_at: float | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_at = retry_at
        self.retryable = retryable or reason in ("RateLimited", "Unavailable")


def checked_api_url(url: str, field: str) -> str:
    """``url`` when a token may be sent to it (``joch.api.integrations.api_url_problem``: https, or http
    to this machine only, no user or password in it). ``TrackerError("Invalid")`` naming ``field``
    otherwise, before any request carries the token."""
    problem = api_url_problem(url)
    if problem is not None:
        raise TrackerError("Invalid", f"{field}: {problem}")
    return url


@dataclass(frozen=True)
class Repository:
    owner: str
    name: str
    clone_url: str
    default_branch: str
    html_url: str = ""


@dataclass(frozen=True)
class Issue:
    """One tracker issue, normalised. ``id``: GitHub's issue number as text, Linear's issue UUID.
    ``key``: ``acme/web#12`` or ``ENG-12``. ``state`` is open or closed (Linear: completed and
    canceled states, and archived issues, are closed)."""

    provider: Literal["github", "linear"]
    id: str
    key: str
    title: str
    body: str
    url: str
    state: Literal["open", "closed"]
    labels: tuple[str, ...]
    updated_at: str
    number: int | None = None
    author: str | None = None
    repository: Repository | None = None
    team_key: str | None = None
    deleted: bool = False
    version: str = ""  # sourceVersion: GitHub updated_at, Linear updatedAt (when empty: updated_at)

    @property
    def item(self) -> str:
        """``github:acme/web#12``, ``linear:ENG-12``: the source item in labels, keys and messages."""
        return f"{self.provider}:{self.key}"


@dataclass(frozen=True)
class SyncPage:
    """Every issue updated since the cursor (all pages), the new cursor (the newest ``updated_at``
    seen, else the old one), the ETag of the first page, and whether the tracker answered 304."""

    issues: list[Issue] = field(default_factory=list)
    cursor: str | None = None
    etag: str | None = None
    not_modified: bool = False


@dataclass(frozen=True)
class RemoteComment:
    id: str
    url: str
    body: str


@dataclass(frozen=True)
class RemotePullRequest:
    number: int
    url: str
    state: str
    head: str
    body: str = ""


class Tracker(Protocol):
    provider: str

    def check(self) -> None:
        """Credentials work and the repository (team) exists; ``TrackerError`` otherwise."""

    def list_issues(self, *, since: str | None, etag: str | None) -> SyncPage: ...

    def get_issue(self, id: str) -> Issue | None:
        """The issue by GitHub number or Linear id/identifier; None when it was deleted."""

    def find_comment(self, target: WriteTarget, marker: str) -> RemoteComment | None:
        """The comment on the target issue whose body contains ``marker`` (Joch's own, after a crash)."""

    def create_comment(self, target: WriteTarget, body: str) -> RemoteComment: ...

    def update_comment(self, target: WriteTarget, comment_id: str, body: str) -> RemoteComment: ...
