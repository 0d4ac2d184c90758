"""A fake GitHub on 127.0.0.1 speaking the REST wire format, and webhook deliveries signed as GitHub
signs them.

The objects it answers with are complete, as GitHub's REST API gives them (every ``*_url``, full
``user`` objects, ``reactions``, labels with all their fields, ``author_association``, the
``pull_request`` key on pull requests listed as issues): githubkit validates answers against
GitHub's OpenAPI description, and tests check the fake's objects against githubkit's models. The
webhook payloads are built from the same object builders.

Served (``{o}/{r}`` is a repository added with ``add_repo``):

* ``GET /repos/{o}/{r}``; ``GET /repos/{o}/{r}/issues`` (``state``, ``labels``, ``since``, ``sort``,
  ``direction``, ``per_page``, ``page``; a ``Link`` header with ``next``/``last``/``first``/``prev``;
  an ``ETag``, and ``If-None-Match`` → 304); ``GET /repos/{o}/{r}/issues/{n}`` (410 once deleted);
* ``GET``/``POST /repos/{o}/{r}/issues/{n}/comments`` (paginated like issues),
  ``GET``/``PATCH /repos/{o}/{r}/issues/comments/{id}``;
* ``GET /repos/{o}/{r}/pulls`` (``head=owner:branch``, ``state``, ``base``), ``GET .../pulls/{n}``,
  ``POST /repos/{o}/{r}/pulls`` (422 when the head branch is missing from the repository's bare git
  directory, if it has one, or when an open pull request for the head exists);
* ``POST /app/installations/{id}/access_tokens`` with the App's RS256 JWT (``iss`` = app id, checked
  against ``clock``) → a token that expires ``token_lifetime`` seconds later.

Every other request needs ``Authorization: token <t>`` or ``Bearer <t>`` with a token from
``tokens`` or a live installation token, else 401 ``Bad credentials``. Every answer carries the
``x-ratelimit-*`` headers; ``exhaust_rate_limit()`` makes requests answer 403 (or 429) with
``x-ratelimit-remaining: 0`` until the reset, ``secondary_rate_limit()`` answers with ``Retry-After``,
``fail_next()`` answers a 5xx, ``hold_pull_requests()`` creates pull requests but keeps the answer
until ``release()`` (a client that died after GitHub did the work). All times come from ``clock``
(share a fake clock with the client).

Using it::

    with FakeGitHub(clock=clock) as gh:                 # or FakeGitHub().start() ... .stop()
        gh.add_repo("acme/web", git_dir=bare_repo)      # clone_url is then the bare repo's path
        gh.create_issue("acme/web", "Fix it", "- [ ] a", labels=["joch:demo"], user="mona")
        source = {"apiUrl": gh.api_url, "auth": {"tokenSecretRef": ...}}   # secret value: TOKEN
        gh.add_label("acme/web", 1, "joch:demo"); gh.comment("acme/web", 1, "/joch run", user="mona",
                                                              association="MEMBER")
        gh.deliver("issues", gh.issues_event("acme/web", 1, "labeled", label="joch:demo"), "secret").send(url)
        gh.comments("acme/web", 1); gh.pulls("acme/web"); gh.calls("POST", "/repos/acme/web/pulls")
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from support.fake_model import FakeHandler, FakeModel, Recorded

TOKEN = "ghp_fake_token"
"""The personal access token a new fake accepts."""
DOCS = "https://docs.github.com/rest"
ASSOCIATIONS = ("COLLABORATOR", "CONTRIBUTOR", "FIRST_TIMER", "FIRST_TIME_CONTRIBUTOR", "MANNEQUIN", "MEMBER",
                "NONE", "OWNER")


def iso(epoch: float) -> str:
    """GitHub's timestamps: ``2026-11-28T09:00:00Z`` (whole seconds, UTC)."""
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Delivery:
    """A webhook delivery as GitHub sends it: POST ``body`` with ``headers``."""

    event: str
    delivery_id: str
    headers: dict[str, str]
    body: bytes

    @property
    def payload(self) -> Any:
        return json.loads(self.body)

    def send(self, url: str, *, timeout: float = 10.0) -> httpx.Response:
        """POST it to ``url`` (Joch's ``/v1/webhooks/github``) as GitHub would."""
        return httpx.post(url, content=self.body, headers=self.headers, timeout=timeout)


@dataclass
class _Repo:
    owner: str
    name: str
    id: int
    default_branch: str
    private: bool
    git_dir: Path | None
    clone_url: str | None
    created: float
    owner_type: str = "Organization"
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)  # number → issue (pull requests too)
    deleted: set[int] = field(default_factory=set)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)  # comment id → comment
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)  # number → pull request
    labels: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


@dataclass
class FakeGitHub(FakeModel):
    """The fake. ``tokens``: the personal access tokens it accepts. ``app_id``/``installation_id``: the
    one App installation it knows (``app_private_key_pem`` signs its JWTs). ``html_base``: where
    ``html_url``s point. ``per_page_default``: GitHub's 30."""

    tokens: set[str] = field(default_factory=lambda: {TOKEN})
    app_id: int = 4242
    installation_id: int = 777
    token_lifetime: float = 3600.0
    clock: Callable[[], float] = time.time
    html_base: str = "https://github.com"
    rate_limit: int = 5000
    per_page_default: int = 30
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._setup(self.port)
        self.repos: dict[str, _Repo] = {}
        self.installation_tokens: dict[str, float] = {}  # token → expires (epoch)
        self.minted: list[dict[str, Any]] = []  # each installation token answer, in order
        self._ids = itertools.count(1001)
        self._users: dict[str, int] = {}
        self._remaining = self.rate_limit
        self._reset = int(self.clock() + 3600)
        self._limited_status: int | None = None
        self._retry_after: tuple[int, int, int] | None = None  # (seconds, status, how many answers)
        self._failures: list[int] = []
        self._last_time = 0
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.app_private_key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
        self.app_public_key_pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        self.lock = threading.RLock()
        self._hold_pulls = False
        self.held_pull_requests: list[int] = []  # numbers of pull requests created whose answer was held

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        return Handler

    @property
    def api_url(self) -> str:
        """The ``apiUrl`` to give a client (``http://127.0.0.1:<port>``): known (the port is bound) before
        ``start()``, so state can be set up first."""
        return f"http://127.0.0.1:{self.bound_port}"

    # --- clock and ids -----------------------------------------------------------------------

    def _now(self) -> str:
        """A timestamp for a change: the clock's, but never earlier than the last change's, so the
        order of changes is the order of ``updated_at``."""
        now = int(self.clock())
        self._last_time = max(now, self._last_time)
        return iso(self._last_time)

    def _user_id(self, login: str) -> int:
        if login not in self._users:
            self._users[login] = 5000 + len(self._users) + 1
        return self._users[login]

    # --- object builders (REST and webhooks) ---------------------------------------------------

    def user(self, login: str, *, type: str | None = None) -> dict[str, Any]:
        uid = self._user_id(login)
        kind = type or ("Bot" if login.endswith("[bot]") else "User")
        api = f"{self.api_url}/users/{quote(login)}"
        return {
            "login": login, "id": uid, "node_id": f"U_kgDO{uid:08d}",
            "avatar_url": f"https://avatars.githubusercontent.com/u/{uid}?v=4", "gravatar_id": "",
            "url": api, "html_url": f"{self.html_base}/{login}", "followers_url": f"{api}/followers",
            "following_url": f"{api}/following{{/other_user}}", "gists_url": f"{api}/gists{{/gist_id}}",
            "starred_url": f"{api}/starred{{/owner}}{{/repo}}", "subscriptions_url": f"{api}/subscriptions",
            "organizations_url": f"{api}/orgs", "repos_url": f"{api}/repos", "events_url": f"{api}/events{{/privacy}}",
            "received_events_url": f"{api}/received_events", "type": kind, "user_view_type": "public",
            "site_admin": False,
        }

    def repository(self, repo: str) -> dict[str, Any]:
        """The repository as ``GET /repos/{o}/{r}`` answers it (webhooks carry the same object)."""
        r = self._repo(repo)
        api = f"{self.api_url}/repos/{r.full_name}"
        html = f"{self.html_base}/{r.full_name}"
        open_issues = sum(1 for i in r.issues.values() if i["state"] == "open")
        pushed = iso(r.created)
        return {
            "id": r.id, "node_id": f"R_kgDO{r.id:08d}", "name": r.name, "full_name": r.full_name,
            "private": r.private, "owner": self.user(r.owner, type=r.owner_type), "html_url": html,
            "description": None, "fork": False, "url": api,
            "forks_url": f"{api}/forks", "keys_url": f"{api}/keys{{/key_id}}",
            "collaborators_url": f"{api}/collaborators{{/collaborator}}", "teams_url": f"{api}/teams",
            "hooks_url": f"{api}/hooks", "issue_events_url": f"{api}/issues/events{{/number}}",
            "events_url": f"{api}/events", "assignees_url": f"{api}/assignees{{/user}}",
            "branches_url": f"{api}/branches{{/branch}}", "tags_url": f"{api}/tags",
            "blobs_url": f"{api}/git/blobs{{/sha}}", "git_tags_url": f"{api}/git/tags{{/sha}}",
            "git_refs_url": f"{api}/git/refs{{/sha}}", "trees_url": f"{api}/git/trees{{/sha}}",
            "statuses_url": f"{api}/statuses/{{sha}}", "languages_url": f"{api}/languages",
            "stargazers_url": f"{api}/stargazers", "contributors_url": f"{api}/contributors",
            "subscribers_url": f"{api}/subscribers", "subscription_url": f"{api}/subscription",
            "commits_url": f"{api}/commits{{/sha}}", "git_commits_url": f"{api}/git/commits{{/sha}}",
            "comments_url": f"{api}/comments{{/number}}", "issue_comment_url": f"{api}/issues/comments{{/number}}",
            "contents_url": f"{api}/contents/{{+path}}", "compare_url": f"{api}/compare/{{base}}...{{head}}",
            "merges_url": f"{api}/merges", "archive_url": f"{api}/{{archive_format}}{{/ref}}",
            "downloads_url": f"{api}/downloads", "issues_url": f"{api}/issues{{/number}}",
            "pulls_url": f"{api}/pulls{{/number}}", "milestones_url": f"{api}/milestones{{/number}}",
            "notifications_url": f"{api}/notifications{{?since,all,participating}}",
            "labels_url": f"{api}/labels{{/name}}", "releases_url": f"{api}/releases{{/id}}",
            "deployments_url": f"{api}/deployments",
            "created_at": iso(r.created), "updated_at": iso(r.created), "pushed_at": pushed,
            "git_url": f"git://{urlsplit(self.html_base).netloc}/{r.full_name}.git",
            "ssh_url": f"git@{urlsplit(self.html_base).netloc}:{r.full_name}.git",
            "clone_url": r.clone_url or f"{html}.git", "svn_url": html, "homepage": None, "size": 0,
            "stargazers_count": 0, "watchers_count": 0, "language": "Python", "has_issues": True,
            "has_projects": True, "has_downloads": True, "has_wiki": True, "has_pages": False,
            "has_discussions": False, "forks_count": 0, "mirror_url": None, "archived": False, "disabled": False,
            "open_issues_count": open_issues, "license": None, "allow_forking": True, "is_template": False,
            "web_commit_signoff_required": False, "topics": [],
            "visibility": "private" if r.private else "public", "forks": 0, "open_issues": open_issues,
            "watchers": 0, "default_branch": r.default_branch,
            "permissions": {"admin": False, "maintain": False, "push": True, "triage": True, "pull": True},
            "network_count": 0, "subscribers_count": 0,
        }

    def label(self, repo: str, name: str) -> dict[str, Any]:
        r = self._repo(repo)
        if name not in r.labels:
            lid = next(self._ids)
            r.labels[name] = {
                "id": lid, "node_id": f"LA_kwDO{lid:08d}",
                "url": f"{self.api_url}/repos/{r.full_name}/labels/{quote(name)}", "name": name,
                "color": hashlib.sha256(name.encode()).hexdigest()[:6], "default": False, "description": None,
                "archived_at": None, "archived_by": None,
            }
        return dict(r.labels[name])

    @staticmethod
    def reactions(url: str) -> dict[str, Any]:
        return {"url": f"{url}/reactions", "total_count": 0, "+1": 0, "-1": 0, "laugh": 0, "hooray": 0,
                "confused": 0, "heart": 0, "rocket": 0, "eyes": 0}

    # --- repositories ----------------------------------------------------------------------------

    def add_repo(self, repo: str, *, default_branch: str = "main", private: bool = False,
                 git_dir: Path | None = None, clone_url: str | None = None,
                 owner_type: str = "Organization") -> dict[str, Any]:
        """Add ``owner/name``. ``git_dir``: a bare repository whose branches pull requests must name
        (``clone_url`` defaults to it when given, else ``<html_base>/<o>/<r>.git``)."""
        owner, name = repo.split("/", 1)
        with self.lock:
            self.repos[repo.lower()] = _Repo(
                owner=owner, name=name, id=next(self._ids), default_branch=default_branch, private=private,
                git_dir=git_dir, clone_url=clone_url or (str(git_dir) if git_dir else None),
                created=self.clock(), owner_type=owner_type)
            return self.repository(repo)

    def _repo(self, repo: str) -> _Repo:
        found = self.repos.get(repo.lower())
        if found is None:
            raise KeyError(f"the fake GitHub has no repository {repo}; add it with add_repo")
        return found

    # --- issues ------------------------------------------------------------------------------------

    def _issue_obj(self, r: _Repo, number: int) -> dict[str, Any]:
        return r.issues[number]

    def create_issue(self, repo: str, title: str, body: str | None = "", *, labels: tuple[str, ...] | list[str] = (),
                     user: str = "octocat", association: str = "OWNER") -> dict[str, Any]:
        """Open an issue as ``user`` (``author_association`` ``association``); its number is the next
        one of the repository (issues and pull requests share numbers)."""
        with self.lock:
            r = self._repo(repo)
            number = max([*r.issues, *r.deleted, 0]) + 1
            iid = next(self._ids)
            now = self._now()
            api = f"{self.api_url}/repos/{r.full_name}/issues/{number}"
            issue = {
                "url": api, "repository_url": f"{self.api_url}/repos/{r.full_name}",
                "labels_url": f"{api}/labels{{/name}}", "comments_url": f"{api}/comments",
                "events_url": f"{api}/events", "html_url": f"{self.html_base}/{r.full_name}/issues/{number}",
                "id": iid, "node_id": f"I_kwDO{iid:08d}", "number": number, "title": title,
                "user": self.user(user), "labels": [self.label(repo, n) for n in labels], "state": "open",
                "locked": False, "assignee": None, "assignees": [], "milestone": None, "comments": 0,
                "created_at": now, "updated_at": now, "closed_at": None, "author_association": association,
                "type": None, "active_lock_reason": None,
                "sub_issues_summary": {"total": 0, "completed": 0, "percent_completed": 0},
                "issue_dependencies_summary": {"blocked_by": 0, "total_blocked_by": 0, "blocking": 0,
                                               "total_blocking": 0},
                "body": body, "closed_by": None, "reactions": self.reactions(api),
                "timeline_url": f"{api}/timeline", "performed_via_github_app": None, "state_reason": None,
            }
            r.issues[number] = issue
            return copy.deepcopy(issue)

    def issue(self, repo: str, number: int) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self._repo(repo).issues[number])

    def _touch(self, repo: str, number: int) -> dict[str, Any]:
        issue = self._repo(repo).issues[number]
        issue["updated_at"] = self._now()
        return issue

    def edit_issue(self, repo: str, number: int, *, title: str | None = None,
                   body: str | None = None) -> dict[str, Any]:
        with self.lock:
            issue = self._touch(repo, number)
            if title is not None:
                issue["title"] = title
            if body is not None:
                issue["body"] = body
            return copy.deepcopy(issue)

    def add_label(self, repo: str, number: int, name: str) -> dict[str, Any]:
        with self.lock:
            issue = self._touch(repo, number)
            if name not in [lb["name"] for lb in issue["labels"]]:
                issue["labels"].append(self.label(repo, name))
            return copy.deepcopy(issue)

    def remove_label(self, repo: str, number: int, name: str) -> dict[str, Any]:
        with self.lock:
            issue = self._touch(repo, number)
            issue["labels"] = [lb for lb in issue["labels"] if lb["name"] != name]
            return copy.deepcopy(issue)

    def close_issue(self, repo: str, number: int, *, reason: str = "completed", by: str = "octocat") -> dict[str, Any]:
        with self.lock:
            issue = self._touch(repo, number)
            issue.update(state="closed", closed_at=issue["updated_at"], state_reason=reason, closed_by=self.user(by))
            return copy.deepcopy(issue)

    def reopen_issue(self, repo: str, number: int) -> dict[str, Any]:
        with self.lock:
            issue = self._touch(repo, number)
            issue.update(state="open", closed_at=None, state_reason="reopened", closed_by=None)
            return copy.deepcopy(issue)

    def delete_issue(self, repo: str, number: int) -> None:
        """Gone: ``GET`` answers 410 and lists leave it out."""
        with self.lock:
            r = self._repo(repo)
            r.issues.pop(number)
            r.deleted.add(number)

    # --- comments ----------------------------------------------------------------------------------

    def comment(self, repo: str, number: int, body: str, *, user: str = "octocat",
                association: str = "MEMBER") -> dict[str, Any]:
        """A comment on issue ``number`` by ``user`` with ``author_association`` ``association``."""
        if association not in ASSOCIATIONS:
            raise ValueError(f"author_association {association!r} is not one of GitHub's: {ASSOCIATIONS}")
        with self.lock:
            r = self._repo(repo)
            issue = self._touch(repo, number)
            cid = next(self._ids) + 2_000_000
            now = issue["updated_at"]
            api = f"{self.api_url}/repos/{r.full_name}/issues/comments/{cid}"
            comment = {
                "url": api, "html_url": f"{issue['html_url']}#issuecomment-{cid}", "issue_url": issue["url"],
                "id": cid, "node_id": f"IC_kwDO{cid:08d}", "user": self.user(user), "created_at": now,
                "updated_at": now, "author_association": association, "body": body,
                "reactions": self.reactions(api), "performed_via_github_app": None,
            }
            r.comments[cid] = comment
            issue["comments"] += 1
            return copy.deepcopy(comment)

    def comments(self, repo: str, number: int) -> list[dict[str, Any]]:
        """The comments on issue ``number``, oldest first."""
        with self.lock:
            r = self._repo(repo)
            url = r.issues[number]["url"] if number in r.issues else ""
            return copy.deepcopy([c for c in r.comments.values() if c["issue_url"] == url])

    def _edit_comment(self, repo: str, cid: int, body: str) -> dict[str, Any]:
        r = self._repo(repo)
        comment = r.comments[cid]
        comment["body"] = body
        comment["updated_at"] = self._now()
        return comment

    # --- pull requests -----------------------------------------------------------------------------

    def _branch_sha(self, r: _Repo, branch: str) -> str | None:
        if r.git_dir is None:
            return hashlib.sha1(f"{r.full_name}:{branch}".encode()).hexdigest()
        done = subprocess.run(["git", "--git-dir", str(r.git_dir), "rev-parse", "--verify", "-q",
                               f"refs/heads/{branch}^{{commit}}"], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    def _pr_side(self, r: _Repo, ref: str, sha: str) -> dict[str, Any]:
        return {"label": f"{r.owner}:{ref}", "ref": ref, "sha": sha, "user": self.user(r.owner, type=r.owner_type),
                "repo": self.repository(r.full_name)}

    def open_pull_request(self, repo: str, *, head: str, base: str, title: str, body: str | None = None,
                          draft: bool = False, user: str = "joch[bot]") -> dict[str, Any]:
        """Open a pull request from branch ``head`` (``owner:branch`` or ``branch``) as the API does;
        ``ValueError`` with GitHub's message when the API would answer 422."""
        with self.lock:
            r = self._repo(repo)
            branch = head.split(":", 1)[1] if ":" in head else head
            head_sha = self._branch_sha(r, branch)
            if head_sha is None:
                raise ValueError("Validation Failed: head")
            for pr in r.pulls.values():
                if pr["head"]["ref"] == branch and pr["base"]["ref"] == base and pr["state"] == "open":
                    raise ValueError(f"A pull request already exists for {r.owner}:{branch}.")
            base_sha = self._branch_sha(r, base) or "0" * 40
            issue = self.create_issue(repo, title, body, user=user, association="NONE")
            number = issue["number"]
            api = f"{self.api_url}/repos/{r.full_name}/pulls/{number}"
            html = f"{self.html_base}/{r.full_name}/pull/{number}"
            issue_api = issue["url"]
            pr_item = r.issues[number]
            pr_item["html_url"] = html
            pr_item["draft"] = draft
            pr_item["pull_request"] = {"url": api, "html_url": html, "diff_url": f"{html}.diff",
                                       "patch_url": f"{html}.patch", "merged_at": None}
            pid = next(self._ids)
            links = {"self": {"href": api}, "html": {"href": html}, "issue": {"href": issue_api},
                     "comments": {"href": f"{issue_api}/comments"}, "review_comments": {"href": f"{api}/comments"},
                     "review_comment": {"href": f"{self.api_url}/repos/{r.full_name}/pulls/comments{{/number}}"},
                     "commits": {"href": f"{api}/commits"},
                     "statuses": {"href": f"{self.api_url}/repos/{r.full_name}/statuses/{head_sha}"}}
            pr = {
                "url": api, "id": pid, "node_id": f"PR_kwDO{pid:08d}", "html_url": html, "diff_url": f"{html}.diff",
                "patch_url": f"{html}.patch", "issue_url": issue_api, "commits_url": f"{api}/commits",
                "review_comments_url": f"{api}/comments",
                "review_comment_url": f"{self.api_url}/repos/{r.full_name}/pulls/comments{{/number}}",
                "comments_url": f"{issue_api}/comments",
                "statuses_url": f"{self.api_url}/repos/{r.full_name}/statuses/{head_sha}", "number": number,
                "state": "open", "locked": False, "title": title, "user": self.user(user), "body": body,
                "labels": [], "milestone": None, "active_lock_reason": None, "created_at": issue["created_at"],
                "updated_at": issue["updated_at"], "closed_at": None, "merged_at": None, "merge_commit_sha": None,
                "assignee": None, "assignees": [], "requested_reviewers": [], "requested_teams": [],
                "head": self._pr_side(r, branch, head_sha), "base": self._pr_side(r, base, base_sha),
                "_links": links, "author_association": "NONE", "auto_merge": None, "draft": draft,
                "merged": False, "mergeable": None, "rebaseable": None, "mergeable_state": "unknown",
                "merged_by": None, "comments": 0, "review_comments": 0, "maintainer_can_modify": False,
                "commits": 1, "additions": 0, "deletions": 0, "changed_files": 0,
            }
            r.pulls[number] = pr
            return copy.deepcopy(pr)

    def pulls(self, repo: str) -> list[dict[str, Any]]:
        """Every pull request of the repository, oldest first."""
        with self.lock:
            return copy.deepcopy(list(self._repo(repo).pulls.values()))

    # --- rate limits and failures --------------------------------------------------------------------

    def exhaust_rate_limit(self, *, reset_in: float = 60.0, status: int = 403) -> float:
        """From now until the reset (``reset_in`` seconds by ``clock``), every authenticated request
        answers ``status`` with ``x-ratelimit-remaining: 0``. Returns the reset (epoch seconds)."""
        with self.lock:
            self._remaining = 0
            self._reset = int(self.clock() + reset_in)
            self._limited_status = status
            return self._reset

    def secondary_rate_limit(self, *, retry_after: int = 30, status: int = 429, times: int = 1) -> None:
        """The next ``times`` requests answer ``status`` with ``Retry-After: retry_after``."""
        with self.lock:
            self._retry_after = (retry_after, status, times)

    def hold_pull_requests(self) -> None:
        """From now on ``POST /repos/{o}/{r}/pulls`` creates the pull request and then holds its answer
        until ``release()`` (or ``stop()``), when the connection closes with no answer at all: a client
        killed (or timed out) after GitHub did the work, which must find the pull request rather than
        open a second one. ``held_pull_requests`` lists the numbers created so."""
        with self.lock:
            self._hold_pulls = True

    def fail_next(self, status: int = 502, times: int = 1) -> None:
        """The next ``times`` requests answer ``status`` (a 5xx: GitHub having a bad day)."""
        with self.lock:
            self._failures.extend([status] * times)

    def _rate_headers(self) -> dict[str, str]:
        if self.clock() >= self._reset:
            self._remaining = self.rate_limit
            self._reset = int(self.clock() + 3600)
            self._limited_status = None
        return {"x-ratelimit-limit": str(self.rate_limit), "x-ratelimit-remaining": str(self._remaining),
                "x-ratelimit-reset": str(int(self._reset)), "x-ratelimit-used": str(self.rate_limit - self._remaining),
                "x-ratelimit-resource": "core"}

    # --- request log -------------------------------------------------------------------------------

    def calls(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        """Recorded requests, filtered by ``method`` and by ``path`` (without the query) starting with it."""
        with self._lock:
            return [r for r in self.requests if (method is None or r.method == method)
                    and (path is None or urlsplit(r.path).path.startswith(path))]

    # --- webhooks ----------------------------------------------------------------------------------

    def deliver(self, event: str, payload: dict[str, Any], secret: str | bytes | None, *,
                delivery_id: str | None = None, hook_id: int = 4711) -> Delivery:
        """``payload`` as GitHub delivers it: compact JSON signed with ``secret`` (``X-Hub-Signature-256``
        and the older ``X-Hub-Signature``; none without a secret)."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        delivery = delivery_id or str(uuid.uuid4())
        headers = {"Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/5e8c1b2",
                   "X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "X-GitHub-Hook-ID": str(hook_id),
                   "X-GitHub-Hook-Installation-Target-Type": "repository"}
        repo = payload.get("repository")
        if isinstance(repo, dict):
            headers["X-GitHub-Hook-Installation-Target-ID"] = str(repo["id"])
        if secret is not None:
            key = secret.encode() if isinstance(secret, str) else secret
            headers["X-Hub-Signature"] = "sha1=" + hmac.new(key, body, hashlib.sha1).hexdigest()
            headers["X-Hub-Signature-256"] = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
        return Delivery(event=event, delivery_id=delivery, headers=headers, body=body)

    def issues_event(self, repo: str, number: int, action: str = "opened", *, label: str | None = None,
                     sender: str = "octocat", changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """An ``issues`` payload for the issue as it is now; ``labeled``/``unlabeled`` name ``label``."""
        with self.lock:
            payload: dict[str, Any] = {"action": action, "issue": self.issue(repo, number)}
            if label is not None:
                payload["label"] = self.label(repo, label)
            if changes is not None:
                payload["changes"] = changes
            payload["repository"] = self.repository(repo)
            payload["sender"] = self.user(sender)
            return payload

    def issue_comment_event(self, repo: str, number: int, comment_id: int, action: str = "created") -> dict[str, Any]:
        with self.lock:
            comment = copy.deepcopy(self._repo(repo).comments[comment_id])
            return {"action": action, "issue": self.issue(repo, number), "comment": comment,
                    "repository": self.repository(repo), "sender": comment["user"]}

    def pull_request_event(self, repo: str, number: int, action: str = "opened", *,
                           sender: str = "joch[bot]") -> dict[str, Any]:
        with self.lock:
            pr = copy.deepcopy(self._repo(repo).pulls[number])
            return {"action": action, "number": number, "pull_request": pr, "repository": self.repository(repo),
                    "sender": self.user(sender)}

    def ping_event(self, repo: str, *, hook_id: int = 4711, events: tuple[str, ...] = ("issues", "issue_comment"),
                   webhook_url: str = "https://joch.example/v1/webhooks/github") -> dict[str, Any]:
        with self.lock:
            r = self._repo(repo)
            api = f"{self.api_url}/repos/{r.full_name}/hooks/{hook_id}"
            now = self._now()
            hook = {"type": "Repository", "id": hook_id, "name": "web", "active": True, "events": list(events),
                    "config": {"content_type": "json", "insecure_ssl": "0", "url": webhook_url},
                    "updated_at": now, "created_at": now, "url": api, "test_url": f"{api}/test",
                    "ping_url": f"{api}/pings", "deliveries_url": f"{api}/deliveries",
                    "last_response": {"code": None, "status": "unused", "message": None}}
            return {"zen": "Keep it logically awesome.", "hook_id": hook_id, "hook": hook,
                    "repository": self.repository(repo), "sender": self.user(r.owner, type=r.owner_type)}

    # --- the server side -------------------------------------------------------------------------

    def _mint(self) -> dict[str, Any]:
        token = "ghs_" + uuid.uuid4().hex
        expires = self.clock() + self.token_lifetime
        self.installation_tokens[token] = expires
        answer = {"token": token, "expires_at": iso(expires),
                  "permissions": {"issues": "write", "contents": "write", "pull_requests": "write",
                                  "metadata": "read"},
                  "repository_selection": "all"}
        self.minted.append(answer)
        return answer

    def _jwt_problem(self, token: str) -> str | None:
        try:
            claims = jwt.decode(token, self.app_public_key_pem, algorithms=["RS256"],
                                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False})
        except jwt.PyJWTError as exc:
            return f"A JSON web token could not be decoded ({exc})"
        now = self.clock()
        if str(claims.get("iss")) != str(self.app_id):
            return "'Issuer' claim ('iss') must be an Integer"
        if "exp" not in claims or float(claims["exp"]) <= now:
            return ("'Expiration time' claim ('exp') must be a numeric value representing the future time at "
                    "which the assertion expires")
        if "iat" not in claims or float(claims["iat"]) > now + 60:
            return "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued"
        if float(claims["exp"]) - float(claims["iat"]) > 660:
            return "'Expiration time' claim ('exp') is too far in the future"
        return None

    def _authorized(self, header: str) -> bool:
        scheme, _, value = header.partition(" ")
        if scheme.lower() not in ("token", "bearer") or not value:
            return False
        if value in self.tokens:
            return True
        expires = self.installation_tokens.get(value)
        return expires is not None and self.clock() < expires


_NOT_FOUND = {"message": "Not Found", "documentation_url": DOCS, "status": "404"}


class _Handler(FakeHandler):
    server_fake: FakeGitHub
    _held = False
    json_type = "application/json; charset=utf-8"

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = b"" if status == 304 else json.dumps(payload).encode()
        self.send_response(status)
        if status != 304:
            self.send_header("Content-Type", self.json_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-GitHub-Media-Type", "github.v3; format=json")
        self.send_header("X-GitHub-Request-Id", uuid.uuid4().hex[:20].upper())
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _serve(self, method: str) -> None:
        fake = self.server_fake
        body = self._body(empty=None)
        fake.record(self._recorded(body))
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        with fake.lock:
            rate = fake._rate_headers()
            if fake._failures:
                status = fake._failures.pop(0)
                self._send(status, {"message": "Server Error", "documentation_url": DOCS, "status": str(status)}, rate)
                return
            m = re.fullmatch(r"/app/installations/(\d+)/access_tokens", split.path)
            if m and method == "POST":
                self._access_token(int(m.group(1)))
                return
            if not fake._authorized(self.headers.get("Authorization", "")):
                self._send(401, {"message": "Bad credentials", "documentation_url": DOCS, "status": "401"}, rate)
                return
            if fake._retry_after is not None:
                seconds, status, times = fake._retry_after
                fake._retry_after = (seconds, status, times - 1) if times > 1 else None
                self._send(status, {"message": "You have exceeded a secondary rate limit. Please wait a few "
                                    "minutes before you try again.", "documentation_url": DOCS, "status": str(status)},
                           {**rate, "Retry-After": str(seconds)})
                return
            if fake._remaining <= 0:
                status = fake._limited_status or 403
                self._send(status, {"message": "API rate limit exceeded for installation. If you reach out to "
                                    "GitHub Support for help, please include the request ID.",
                                    "documentation_url": DOCS, "status": str(status)}, rate)
                return
            fake._remaining -= 1
            rate = fake._rate_headers()
            self._route(method, split.path, query, body, rate)
        if self._held:
            fake._released.wait(120)  # outside the lock: the fake keeps answering everyone else
            self.close_connection = True

    def _access_token(self, installation: int) -> None:
        fake = self.server_fake
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            self._send(401, {"message": "A JSON web token could not be decoded", "documentation_url": DOCS,
                             "status": "401"})
            return
        problem = fake._jwt_problem(token)
        if problem is not None:
            self._send(401, {"message": problem, "documentation_url": DOCS, "status": "401"})
            return
        if installation != fake.installation_id:
            self._send(404, _NOT_FOUND)
            return
        self._send(201, fake._mint())

    def _route(self, method: str, path: str, query: dict[str, str], body: Any, rate: dict[str, str]) -> None:
        fake = self.server_fake
        m = re.fullmatch(r"/repos/([^/]+)/([^/]+)(/.*)?", path)
        repo = fake.repos.get(f"{m.group(1)}/{m.group(2)}".lower()) if m else None
        if m is None or repo is None:
            self._send(404, _NOT_FOUND, rate)
            return
        name, rest = repo.full_name, m.group(3) or ""
        if rest == "" and method == "GET":
            self._send(200, fake.repository(name), rate)
            return
        if rest == "/issues" and method == "GET":
            items = [i for i in repo.issues.values() if self._issue_matches(i, query)]
            key = {"created": "created_at", "updated": "updated_at", "comments": "comments"}.get(
                query.get("sort", "created"), "created_at")
            items.sort(key=lambda i: (i[key], i["number"]), reverse=query.get("direction", "desc") == "desc")
            self._page(items, query, path, rate)
            return
        if (im := re.fullmatch(r"/issues/(\d+)", rest)) and method == "GET":
            number = int(im.group(1))
            if number in repo.deleted:
                self._send(410, {"message": "This issue was deleted", "documentation_url": DOCS, "status": "410"}, rate)
            elif number in repo.issues:
                self._send(200, repo.issues[number], rate)
            else:
                self._send(404, _NOT_FOUND, rate)
            return
        if cm := re.fullmatch(r"/issues/(\d+)/comments", rest):
            number = int(cm.group(1))
            if number not in repo.issues:
                self._send(410 if number in repo.deleted else 404, _NOT_FOUND, rate)
            elif method == "GET":
                url = repo.issues[number]["url"]
                found = [c for c in repo.comments.values() if c["issue_url"] == url
                         and ("since" not in query or parse_time(c["updated_at"]) >= parse_time(query["since"]))]
                self._page(found, query, path, rate)
            elif method == "POST":
                if not isinstance(body, dict) or not isinstance(body.get("body"), str):
                    self._invalid("IssueComment", "body", rate)
                    return
                login = self._login()
                self._send(201, fake.comment(name, number, body["body"], user=login, association="NONE"),
                           {**rate, "Location": ""})
            else:
                self._send(404, _NOT_FOUND, rate)
            return
        if em := re.fullmatch(r"/issues/comments/(\d+)", rest):
            cid = int(em.group(1))
            if cid not in repo.comments:
                self._send(404, _NOT_FOUND, rate)
            elif method == "GET":
                self._send(200, repo.comments[cid], rate)
            elif method == "PATCH":
                if not isinstance(body, dict) or not isinstance(body.get("body"), str):
                    self._invalid("IssueComment", "body", rate)
                    return
                self._send(200, fake._edit_comment(name, cid, body["body"]), rate)
            else:
                self._send(404, _NOT_FOUND, rate)
            return
        if rest == "/pulls" and method == "GET":
            state = query.get("state", "open")
            head = query.get("head")
            found = [p for p in repo.pulls.values()
                     if (state == "all" or p["state"] == state)
                     and (head is None or p["head"]["label"] == head or p["head"]["ref"] == head)
                     and ("base" not in query or p["base"]["ref"] == query["base"])]
            found.sort(key=lambda p: p["number"], reverse=query.get("direction", "desc") == "desc")
            self._page([self._simple(p) for p in found], query, path, rate)
            return
        if rest == "/pulls" and method == "POST":
            if not isinstance(body, dict) or not body.get("head") or not body.get("base"):
                missing = "head" if not isinstance(body, dict) or not body.get("head") else "base"
                self._invalid("PullRequest", missing, rate)
                return
            try:
                pr = fake.open_pull_request(name, head=str(body["head"]), base=str(body["base"]),
                                            title=str(body.get("title") or ""), body=body.get("body"),
                                            draft=bool(body.get("draft", False)), user=self._login())
            except ValueError as exc:
                message = str(exc)
                errors = ([{"resource": "PullRequest", "code": "custom", "message": message}]
                          if "already exists" in message else [{"resource": "PullRequest", "field": "head",
                                                                "code": "invalid"}])
                self._send(422, {"message": "Validation Failed", "errors": errors, "documentation_url": DOCS,
                                 "status": "422"}, rate)
                return
            if fake._hold_pulls:
                fake.held_pull_requests.append(pr["number"])
                self._held = True
                return
            self._send(201, pr, {**rate, "Location": pr["url"]})
            return
        if (pm := re.fullmatch(r"/pulls/(\d+)", rest)) and method == "GET":
            pr_found = repo.pulls.get(int(pm.group(1)))
            self._send(200 if pr_found else 404, pr_found or _NOT_FOUND, rate)
            return
        self._send(404, _NOT_FOUND, rate)

    def _login(self) -> str:
        token = self.headers.get("Authorization", "").partition(" ")[2]
        return "joch-app[bot]" if token in self.server_fake.installation_tokens else "joch-bot"

    def _invalid(self, resource: str, field_name: str, rate: dict[str, str]) -> None:
        self._send(422, {"message": "Invalid request.", "errors": [{"resource": resource, "field": field_name,
                                                                    "code": "missing_field"}],
                         "documentation_url": DOCS, "status": "422"}, rate)

    @staticmethod
    def _simple(pr: dict[str, Any]) -> dict[str, Any]:
        """A pull request as lists give it (without the counts only a single pull request has)."""
        drop = ("merged", "mergeable", "rebaseable", "mergeable_state", "merged_by", "comments",
                "review_comments", "maintainer_can_modify", "commits", "additions", "deletions", "changed_files")
        return {k: v for k, v in pr.items() if k not in drop}

    @staticmethod
    def _issue_matches(issue: dict[str, Any], query: dict[str, str]) -> bool:
        state = query.get("state", "open")
        if state != "all" and issue["state"] != state:
            return False
        wanted = [w.strip() for w in query.get("labels", "").split(",") if w.strip()]
        names = {lb["name"].lower() for lb in issue["labels"]}
        if any(w.lower() not in names for w in wanted):
            return False
        return "since" not in query or parse_time(issue["updated_at"]) >= parse_time(query["since"])

    def _page(self, items: list[dict[str, Any]], query: dict[str, str], path: str, rate: dict[str, str]) -> None:
        fake = self.server_fake
        per_page = max(1, min(100, int(query.get("per_page", fake.per_page_default))))
        page = max(1, int(query.get("page", "1")))
        last = max(1, -(-len(items) // per_page))
        chunk = items[(page - 1) * per_page: page * per_page]
        headers = dict(rate)

        def link(n: int) -> str:
            return f"{fake.api_url}{path}?{urlencode({**query, 'page': str(n)})}"

        rels = []
        if page > 1:
            rels += [f'<{link(page - 1)}>; rel="prev"']
        if page < last:
            rels += [f'<{link(page + 1)}>; rel="next"', f'<{link(last)}>; rel="last"']
        if page > 1:
            rels += [f'<{link(1)}>; rel="first"']
        if rels:
            headers["Link"] = ", ".join(rels)
        etag = 'W/"' + hashlib.sha256(json.dumps(chunk, sort_keys=True).encode()).hexdigest()[:32] + '"'
        headers["ETag"] = etag
        headers["Cache-Control"] = "private, max-age=60, s-maxage=60"
        headers["Vary"] = "Accept, Authorization, Cookie, X-GitHub-OTP"
        if self.headers.get("If-None-Match") == etag:
            fake._remaining += 1  # a 304 does not count against the rate limit
            headers.update(fake._rate_headers())
            self._send(304, None, headers)
            return
        self._send(200, chunk, headers)


def installation_jwt(fake: FakeGitHub, *, now: float | None = None, iss: str | int | None = None) -> str:
    """A JWT for the fake's App as a client would make it (for tests of the fake itself)."""
    at = fake.clock() if now is None else now
    claims = {"iat": int(at - 60), "exp": int(at + 540), "iss": str(fake.app_id if iss is None else iss)}
    return jwt.encode(claims, fake.app_private_key_pem, algorithm="RS256")


@dataclass
class FakeClock:
    """A clock tests move by hand: ``clock()`` is the time, ``advance(seconds)`` moves it."""

    now: float = field(default_factory=lambda: float(int(time.time())))

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def started(**kwargs: Any) -> Iterator[FakeGitHub]:
    """For a pytest fixture: ``yield from started(clock=...)`` gives a started fake, stopped afterwards."""
    with FakeGitHub(**kwargs) as fake:
        yield fake


__all__ = ["TOKEN", "Delivery", "FakeClock", "FakeGitHub", "installation_jwt", "iso", "started"]
