"""A fake Linear on 127.0.0.1: its GraphQL API (a subset of Linear's schema, executed by graphql-core,
so a query naming a field or argument Linear does not have fails here as it would there) and signed
webhook deliveries of its changes.

The API (``POST /graphql``, ``url``):

* ``Authorization`` must be the API key, bare (as Linear takes personal keys); otherwise HTTP 400 with
  ``errors[0].extensions.code`` ``AUTHENTICATION_ERROR``, as Linear answers.
* ``rate_limit(requests, reset_in)`` makes the next requests answer HTTP 400 ``RATELIMITED`` with
  ``X-RateLimit-Requests-Remaining: 0`` and ``X-RateLimit-Requests-Reset`` (epoch ms); every answer
  carries the ``X-RateLimit-Requests-*`` headers.
* Queries: ``viewer``, ``teams(filter)``, ``issues(filter, orderBy, first, after, includeArchived)``
  (newest update first, ``pageInfo { hasNextPage endCursor }``), ``issue(id)`` by UUID or identifier
  ("Entity not found: Issue" otherwise, with ``INPUT_ERROR``), ``Issue.comments``.
  Mutations: ``commentCreate``, ``commentUpdate``, ``attachmentCreate`` (one attachment per URL and
  issue: creating it again updates it, as Linear does).
* Invalid GraphQL → HTTP 400 with ``GRAPHQL_VALIDATION_FAILED``. ``fail(status)`` makes the next
  requests answer a plain HTTP error (an outage, a proxy).

The test's side: ``create_issue``, ``update_issue`` (returns Linear's ``updatedFrom``), ``delete_issue``,
``add_comment``, ``label``, ``issue``, ``comments``, ``attachments``; ``requests`` (operation name,
variables, whether the key was right). Webhooks: ``issue_webhook`` / ``comment_webhook`` / ``webhook``
build a ``Delivery`` (raw ``body``, ``headers`` with ``Linear-Signature``, ``Linear-Delivery``,
``Linear-Event``; ``payload`` with ``webhookTimestamp`` in ms) for the test to POST.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import graphql
import httpx

SCHEMA_SDL = """
scalar DateTime
scalar DateTimeOrDuration
scalar JSONObject

enum PaginationOrderBy { createdAt updatedAt }

type Query {
  viewer: User!
  teams(filter: TeamFilter, first: Int, after: String): TeamConnection!
  issues(filter: IssueFilter, orderBy: PaginationOrderBy, first: Int, after: String,
         includeArchived: Boolean): IssueConnection!
  issue(id: String!): Issue!
}

type Mutation {
  commentCreate(input: CommentCreateInput!): CommentPayload!
  commentUpdate(id: String!, input: CommentUpdateInput!): CommentPayload!
  attachmentCreate(input: AttachmentCreateInput!): AttachmentPayload!
}

type PageInfo { hasNextPage: Boolean! hasPreviousPage: Boolean! startCursor: String endCursor: String }
type User { id: ID! name: String! displayName: String! email: String! url: String! }
type Team { id: ID! key: String! name: String! }
type TeamConnection { nodes: [Team!]! pageInfo: PageInfo! }
type WorkflowState { id: ID! name: String! type: String! color: String! }
type IssueLabel { id: ID! name: String! color: String! }
type IssueLabelConnection { nodes: [IssueLabel!]! pageInfo: PageInfo! }
type Comment {
  id: ID! body: String! url: String! createdAt: DateTime! updatedAt: DateTime! user: User issue: Issue
}
type CommentConnection { nodes: [Comment!]! pageInfo: PageInfo! }
type Attachment { id: ID! url: String! title: String! subtitle: String createdAt: DateTime! }
type AttachmentConnection { nodes: [Attachment!]! pageInfo: PageInfo! }
type Issue {
  id: ID! identifier: String! number: Float! title: String! description: String priority: Float!
  url: String! createdAt: DateTime! updatedAt: DateTime! archivedAt: DateTime completedAt: DateTime
  canceledAt: DateTime trashed: Boolean
  state: WorkflowState! team: Team! creator: User
  labels(first: Int, after: String): IssueLabelConnection!
  comments(first: Int, after: String): CommentConnection!
  attachments(first: Int, after: String): AttachmentConnection!
}
type IssueConnection { nodes: [Issue!]! pageInfo: PageInfo! }
type CommentPayload { lastSyncId: Float! success: Boolean! comment: Comment! }
type AttachmentPayload { lastSyncId: Float! success: Boolean! attachment: Attachment! }

input StringComparator { eq: String neq: String in: [String!] nin: [String!] }
input IDComparator { eq: ID neq: ID in: [ID!] nin: [ID!] }
input DateComparator {
  eq: DateTimeOrDuration gt: DateTimeOrDuration gte: DateTimeOrDuration lt: DateTimeOrDuration
  lte: DateTimeOrDuration
}
input TeamFilter { id: IDComparator key: StringComparator name: StringComparator }
input WorkflowStateFilter { id: IDComparator name: StringComparator type: StringComparator }
input IssueLabelFilter { id: IDComparator name: StringComparator }
input IssueLabelCollectionFilter { some: IssueLabelFilter every: IssueLabelFilter }
input IssueFilter {
  id: IDComparator team: TeamFilter updatedAt: DateComparator state: WorkflowStateFilter
  labels: IssueLabelCollectionFilter and: [IssueFilter!] or: [IssueFilter!]
}
input CommentCreateInput { id: String issueId: String body: String parentId: String }
input CommentUpdateInput { body: String }
input AttachmentCreateInput {
  id: String issueId: String! url: String! title: String! subtitle: String iconUrl: String metadata: JSONObject
}
"""

SCHEMA = graphql.build_schema(SCHEMA_SDL)

STATES = (("Backlog", "backlog", "#bec2c8"), ("Todo", "unstarted", "#e2e2e2"),
          ("In Progress", "started", "#f2c94c"), ("Done", "completed", "#5e6ad2"),
          ("Canceled", "canceled", "#95a2b3"))
"""Every team's workflow states: (name, type, colour), as a new Linear team has them."""

VIEWER = {"id": "2d1c9a7e-0000-4000-8000-00000000b07", "name": "Joch Bot", "displayName": "joch",
          "email": "joch-bot@example.com"}


@dataclass
class Delivery:
    """A signed webhook delivery, as Linear would POST it."""

    body: bytes
    headers: dict[str, str]
    payload: dict[str, Any]

    @property
    def delivery_id(self) -> str:
        return self.headers["Linear-Delivery"]

    def post(self, url: str, *, headers: Mapping[str, str] | None = None, timeout: float = 30.0) -> httpx.Response:
        """Deliver it (``headers`` override or add some: a bad signature, say)."""
        return httpx.post(url, content=self.body, headers={**self.headers, **(headers or {})}, timeout=timeout)


@dataclass
class Request:
    operation: str | None
    variables: dict[str, Any]
    authorized: bool


@dataclass
class FakeLinear:
    api_key: str = "lin_api_fake_0123456789"
    team_key: str = "ENG"
    team_name: str = "Engineering"
    workspace: str = "acme"
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._server: _Server | None = None
        self._ticks = itertools.count(1)
        self._last_ms = 0
        self._limited = 0
        self._reset_ms = 0
        self._failing: tuple[int, int, str, dict[str, str]] = (0, 0, "", {})
        self.teams: dict[str, dict[str, Any]] = {}
        self.labels: dict[str, dict[str, Any]] = {}
        self.issues: dict[str, dict[str, Any]] = {}
        self._comments: dict[str, dict[str, Any]] = {}
        self._attachments: dict[str, dict[str, Any]] = {}
        self.add_team(self.team_key, self.team_name)

    # --- server ----------------------------------------------------------------------------------

    def start(self) -> Self:
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-linear", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The GraphQL endpoint (``spec.linear.apiUrl``)."""
        assert self._server is not None, "the fake is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}/graphql"

    def fail(self, status: int, *, requests: int = 1, body: str = "<html>502 Bad Gateway</html>",
             headers: Mapping[str, str] | None = None) -> None:
        """The next ``requests`` requests answer ``status`` with a plain body (a proxy in the way, an outage,
        a bare 429 with ``Retry-After``)."""
        with self._lock:
            self._failing = (requests, status, body, dict(headers or {}))

    def rate_limit(self, requests: int = 1, reset_in: float = 30.0) -> int:
        """The next ``requests`` requests answer RATELIMITED; the reset time (epoch ms) they announce."""
        with self._lock:
            self._limited = requests
            self._reset_ms = int((time.time() + reset_in) * 1000)
            return self._reset_ms

    # --- the test's side: data -------------------------------------------------------------------

    def add_team(self, key: str, name: str) -> dict[str, Any]:
        with self._lock:
            team = {"id": str(uuid.uuid4()), "key": key, "name": name, "count": 0,
                    "states": {n: {"id": str(uuid.uuid4()), "name": n, "type": t, "color": c} for n, t, c in STATES}}
            self.teams[key] = team
            return team

    def label(self, name: str, color: str = "#bec2c8") -> dict[str, Any]:
        """The workspace label ``name``, created when missing."""
        with self._lock:
            for label in self.labels.values():
                if label["name"] == name:
                    return label
            label = {"id": str(uuid.uuid4()), "name": name, "color": color, "parentId": None}
            self.labels[label["id"]] = label
            return label

    def create_issue(self, title: str, description: str = "", *, team: str | None = None,
                     labels: Iterable[str] = (), state: str = "Todo", creator: Mapping[str, str] | None = None
                     ) -> dict[str, Any]:
        with self._lock:
            owner = self.teams[team or self.team_key]
            owner["count"] += 1
            number = owner["count"]
            identifier = f"{owner['key']}-{number}"
            now = self._now()
            issue = {
                "id": str(uuid.uuid4()), "identifier": identifier, "number": number, "title": title,
                "description": description, "priority": 0, "createdAt": now, "updatedAt": now,
                "archivedAt": None, "completedAt": None, "canceledAt": None, "trashed": None,
                "teamKey": owner["key"], "stateName": state, "labelIds": [self.label(n)["id"] for n in labels],
                "creator": dict(creator or {"id": str(uuid.uuid4()), "name": "Ada Lovelace",
                                            "email": "ada@example.com"}),
                "url": f"https://linear.app/{self.workspace}/issue/{identifier}/{_slug(title)}",
            }
            self._set_state_times(issue, state, now)
            self.issues[issue["id"]] = issue
            return issue

    def update_issue(self, ref: str, *, title: str | None = None, description: str | None = None,
                     add_labels: Iterable[str] = (), remove_labels: Iterable[str] = (), state: str | None = None,
                     archived: bool | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Change the issue; it and Linear's ``updatedFrom`` (the old value of each field changed)."""
        with self._lock:
            issue = self.issue(ref)
            before = json.loads(json.dumps(issue))
            now = self._now()
            if title is not None:
                issue["title"] = title
            if description is not None:
                issue["description"] = description
            label_ids = list(issue["labelIds"])
            label_ids += [self.label(n)["id"] for n in add_labels if self.label(n)["id"] not in label_ids]
            removed = {self.label(n)["id"] for n in remove_labels}
            issue["labelIds"] = [i for i in label_ids if i not in removed]
            if state is not None:
                issue["stateName"] = state
                self._set_state_times(issue, state, now)
            if archived is not None:
                issue["archivedAt"] = now if archived else None
            updated_from: dict[str, Any] = {}
            for key, wire in (("title", "title"), ("description", "description"), ("labelIds", "labelIds"),
                              ("archivedAt", "archivedAt"), ("completedAt", "completedAt"),
                              ("canceledAt", "canceledAt")):
                if before[key] != issue[key]:
                    updated_from[wire] = before[key]
            if before["stateName"] != issue["stateName"]:
                updated_from["stateId"] = self._state(before)["id"]
            issue["updatedAt"] = now
            updated_from["updatedAt"] = before["updatedAt"]
            return issue, updated_from

    def delete_issue(self, ref: str) -> dict[str, Any]:
        """Move the issue to the trash (what a webhook's ``remove`` reports)."""
        with self._lock:
            issue = self.issue(ref)
            now = self._now()
            issue["trashed"] = True
            issue["archivedAt"] = now
            issue["updatedAt"] = now
            return issue

    def issue(self, ref: str) -> dict[str, Any]:
        """The stored issue by UUID or identifier (``KeyError`` when there is none)."""
        with self._lock:
            if ref in self.issues:
                return self.issues[ref]
            for issue in self.issues.values():
                if issue["identifier"] == ref:
                    return issue
            raise KeyError(ref)

    def add_comment(self, ref: str, body: str, *, user: Mapping[str, str] | None = None) -> dict[str, Any]:
        """A comment by a person (``user``: id, name, email), as if written in Linear."""
        with self._lock:
            return self._add_comment(self.issue(ref), body, dict(user or {
                "id": str(uuid.uuid4()), "name": "Grace Hopper", "email": "grace@example.com"}))

    def comments(self, ref: str) -> list[dict[str, Any]]:
        with self._lock:
            issue_id = self.issue(ref)["id"]
            return [dict(c) for c in self._comments.values() if c["issueId"] == issue_id]

    def attachments(self, ref: str) -> list[dict[str, Any]]:
        with self._lock:
            issue_id = self.issue(ref)["id"]
            return [dict(a) for a in self._attachments.values() if a["issueId"] == issue_id]

    # --- the test's side: webhooks ---------------------------------------------------------------

    def issue_data(self, ref: str) -> dict[str, Any]:
        """The issue as a webhook's ``data`` carries it."""
        with self._lock:
            issue = self.issue(ref)
            team = self.teams[issue["teamKey"]]
            state = self._state(issue)
            return {
                "id": issue["id"], "createdAt": issue["createdAt"], "updatedAt": issue["updatedAt"],
                "archivedAt": issue["archivedAt"], "number": issue["number"], "title": issue["title"],
                "priority": issue["priority"], "priorityLabel": "No priority", "boardOrder": 0,
                "sortOrder": -issue["number"], "labelIds": list(issue["labelIds"]), "teamId": team["id"],
                "cycleId": None, "projectId": None, "previousIdentifiers": [], "creatorId": issue["creator"]["id"],
                "assigneeId": None, "stateId": state["id"], "completedAt": issue["completedAt"],
                "canceledAt": issue["canceledAt"], "identifier": issue["identifier"], "url": issue["url"],
                "subscriberIds": [issue["creator"]["id"]], "description": issue["description"], "trashed":
                issue["trashed"], "state": {k: state[k] for k in ("id", "color", "name", "type")},
                "team": {"id": team["id"], "key": team["key"], "name": team["name"]},
                "labels": [dict(self.labels[i]) for i in issue["labelIds"]],
            }

    def issue_webhook(self, ref: str, action: str, *, secret: bytes, updated_from: Mapping[str, Any] | None = None,
                      actor: Mapping[str, Any] | None = None, timestamp_ms: int | None = None) -> Delivery:
        """``action``: create, update (pass ``update_issue``'s ``updatedFrom``) or remove."""
        data = self.issue_data(ref)
        return self.webhook("Issue", action, data, url=data["url"], secret=secret, updated_from=updated_from,
                            actor=actor, timestamp_ms=timestamp_ms)

    def comment_webhook(self, comment: Mapping[str, Any], *, secret: bytes, action: str = "create",
                        timestamp_ms: int | None = None) -> Delivery:
        with self._lock:
            issue = self.issue(comment["issueId"])
            team = self.teams[issue["teamKey"]]
            user = comment["user"]
            data = {
                "id": comment["id"], "createdAt": comment["createdAt"], "updatedAt": comment["updatedAt"],
                "body": comment["body"], "issueId": issue["id"], "parentId": None, "userId": user["id"],
                "reactionData": [], "user": {"id": user["id"], "name": user["name"], "email": user.get("email"),
                                             "url": f"https://linear.app/{self.workspace}/profiles/{user['name']}"},
                "issue": {"id": issue["id"], "title": issue["title"], "teamId": team["id"],
                          "team": {"id": team["id"], "key": team["key"], "name": team["name"]},
                          "identifier": issue["identifier"], "url": issue["url"]},
            }
        actor = {"id": user["id"], "type": "user", "name": user["name"], "email": user.get("email")}
        return self.webhook("Comment", action, data, url=comment["url"], secret=secret, actor=actor,
                            timestamp_ms=timestamp_ms)

    def webhook(self, type: str, action: str, data: Mapping[str, Any], *, secret: bytes, url: str | None = None,
                updated_from: Mapping[str, Any] | None = None, actor: Mapping[str, Any] | None = None,
                timestamp_ms: int | None = None, delivery_id: str | None = None) -> Delivery:
        """Any data-change delivery, shaped and signed as Linear sends it."""
        payload: dict[str, Any] = {
            "action": action,
            "actor": dict(actor or {"id": "7f0c1c1e-0000-4000-8000-0000000000a1", "type": "user",
                                    "name": "Ada Lovelace", "email": "ada@example.com",
                                    "url": f"https://linear.app/{self.workspace}/profiles/ada"}),
            "createdAt": _iso(time.time()),
            "data": dict(data),
            "url": url or data.get("url"),
            "type": type,
            "organizationId": "0f6d7b32-0000-4000-8000-00000000f00d",
            "webhookTimestamp": timestamp_ms if timestamp_ms is not None else int(time.time() * 1000),
            "webhookId": "4a9d3f68-0000-4000-8000-0000000000aa",
        }
        if updated_from is not None:
            payload["updatedFrom"] = dict(updated_from)
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": "Linear-Webhook",
                   "Linear-Delivery": delivery_id or str(uuid.uuid4()), "Linear-Event": type,
                   "Linear-Signature": hmac.new(secret, body, hashlib.sha256).hexdigest()}
        return Delivery(body=body, headers=headers, payload=payload)

    # --- GraphQL resolvers -----------------------------------------------------------------------

    def _root(self) -> dict[str, Any]:
        return {
            "viewer": lambda info: self._user(VIEWER),
            "teams": self._q_teams,
            "issues": self._q_issues,
            "issue": lambda info, id: self._node(self._find(id, include_trashed=True)),
            "commentCreate": self._m_comment_create,
            "commentUpdate": self._m_comment_update,
            "attachmentCreate": self._m_attachment_create,
        }

    def _q_teams(self, info: Any, filter: Mapping[str, Any] | None = None, first: int | None = None,
                 after: str | None = None) -> dict[str, Any]:
        teams = [t for t in self.teams.values() if _team_match(t, filter)]
        return _page([{"id": t["id"], "key": t["key"], "name": t["name"]} for t in teams], first, after)

    def _q_issues(self, info: Any, filter: Mapping[str, Any] | None = None, orderBy: str | None = None,
                  first: int | None = None, after: str | None = None,
                  includeArchived: bool | None = None) -> dict[str, Any]:
        issues = [i for i in self.issues.values()
                  if (includeArchived or not i["archivedAt"]) and self._issue_match(i, filter or {})]
        issues.sort(key=lambda i: (i["updatedAt" if orderBy != "createdAt" else "createdAt"], i["id"]), reverse=True)
        return _page([self._node(i) for i in issues], first, after)

    def _m_comment_create(self, info: Any, input: Mapping[str, Any]) -> dict[str, Any]:
        issue = self._find(str(input.get("issueId") or ""))
        comment = self._add_comment(issue, str(input.get("body") or ""), VIEWER, comment_id=input.get("id"))
        return {"lastSyncId": next(self._ticks), "success": True, "comment": self._comment_node(comment)}

    def _m_comment_update(self, info: Any, id: str, input: Mapping[str, Any]) -> dict[str, Any]:
        comment = self._comments.get(id)
        if comment is None:
            raise _not_found("Comment")
        if "body" in input:
            comment["body"] = input["body"]
            comment["updatedAt"] = self._now()
        return {"lastSyncId": next(self._ticks), "success": True, "comment": self._comment_node(comment)}

    def _m_attachment_create(self, info: Any, input: Mapping[str, Any]) -> dict[str, Any]:
        issue = self._find(str(input["issueId"]))
        found = next((a for a in self._attachments.values()
                      if a["issueId"] == issue["id"] and a["url"] == input["url"]), None)
        if found is None:
            found = {"id": input.get("id") or str(uuid.uuid4()), "issueId": issue["id"], "url": input["url"],
                     "createdAt": self._now()}
            self._attachments[found["id"]] = found
        found["title"] = input["title"]
        found["subtitle"] = input.get("subtitle")
        return {"lastSyncId": next(self._ticks), "success": True,
                "attachment": {k: found[k] for k in ("id", "url", "title", "subtitle", "createdAt")}}

    def _node(self, issue: dict[str, Any]) -> dict[str, Any]:
        team = self.teams[issue["teamKey"]]
        state = self._state(issue)
        node = {k: issue[k] for k in ("id", "identifier", "number", "title", "description", "priority", "url",
                                      "createdAt", "updatedAt", "archivedAt", "completedAt", "canceledAt",
                                      "trashed")}
        labels = [dict(self.labels[i]) for i in issue["labelIds"]]
        comments = [self._comment_node(c) for c in self._comments.values() if c["issueId"] == issue["id"]]
        attachments = [dict(a) for a in self._attachments.values() if a["issueId"] == issue["id"]]
        node.update({
            "state": dict(state),
            "team": {"id": team["id"], "key": team["key"], "name": team["name"]},
            "creator": self._user(issue["creator"]),
            "labels": lambda info, first=None, after=None: _page(labels, first, after),
            "comments": lambda info, first=None, after=None: _page(comments, first, after),
            "attachments": lambda info, first=None, after=None: _page(attachments, first, after),
        })
        return node

    def _comment_node(self, comment: Mapping[str, Any]) -> dict[str, Any]:
        return {"id": comment["id"], "body": comment["body"], "url": comment["url"],
                "createdAt": comment["createdAt"], "updatedAt": comment["updatedAt"],
                "user": self._user(comment["user"])}

    def _user(self, user: Mapping[str, Any]) -> dict[str, Any]:
        return {"id": user["id"], "name": user["name"], "displayName": user.get("displayName") or user["name"],
                "email": user.get("email") or "", "url": f"https://linear.app/{self.workspace}/profiles/x"}

    # --- internals -------------------------------------------------------------------------------

    def _find(self, ref: str, *, include_trashed: bool = False) -> dict[str, Any]:
        try:
            issue = self.issue(ref)
        except KeyError:
            raise _not_found("Issue") from None
        if issue["trashed"] and not include_trashed:
            raise _not_found("Issue")
        return issue

    def _add_comment(self, issue: dict[str, Any], body: str, user: dict[str, Any],
                     comment_id: Any = None) -> dict[str, Any]:
        now = self._now()
        cid = str(comment_id or uuid.uuid4())
        comment = {"id": cid, "body": body, "issueId": issue["id"], "user": dict(user), "createdAt": now,
                   "updatedAt": now, "url": f"{issue['url']}#comment-{cid[:8]}"}
        self._comments[cid] = comment
        return comment

    def _state(self, issue: Mapping[str, Any]) -> dict[str, Any]:
        state: dict[str, Any] = self.teams[issue["teamKey"]]["states"][issue["stateName"]]
        return state

    def _set_state_times(self, issue: dict[str, Any], state: str, now: str) -> None:
        kind = self.teams[issue["teamKey"]]["states"][state]["type"]
        issue["completedAt"] = (issue["completedAt"] or now) if kind == "completed" else None
        issue["canceledAt"] = (issue["canceledAt"] or now) if kind == "canceled" else None

    def _issue_match(self, issue: Mapping[str, Any], flt: Mapping[str, Any]) -> bool:
        for key, value in flt.items():
            if value is None:
                continue
            if key == "and" and not all(self._issue_match(issue, f) for f in value):
                return False
            if key == "or" and not any(self._issue_match(issue, f) for f in value):
                return False
            if key == "id" and not _compare(issue["id"], value):
                return False
            if key == "team" and not _team_match(self.teams[issue["teamKey"]], value):
                return False
            if key == "updatedAt" and not _compare_time(issue["updatedAt"], value):
                return False
            if key == "state" and not all(_compare(self._state(issue)[f], c) for f, c in value.items() if c):
                return False
            if key == "labels":
                labels = [self.labels[i] for i in issue["labelIds"]]
                some, every = value.get("some"), value.get("every")
                if some and not any(all(_compare(lab[f], c) for f, c in some.items() if c) for lab in labels):
                    return False
                if every and not all(all(_compare(lab[f], c) for f, c in every.items() if c) for lab in labels):
                    return False
        return True

    def _now(self) -> str:
        """Now, ISO with milliseconds as Linear writes it; strictly later than the previous answer."""
        with self._lock:
            ms = max(int(time.time() * 1000), self._last_ms + 1)
            self._last_ms = ms
            return _iso(ms / 1000)  # _iso rounds back to the same millisecond

    def _failure(self) -> tuple[int, dict[str, str], str] | None:
        with self._lock:
            left, status, body, headers = self._failing
            if left <= 0:
                return None
            self._failing = (left - 1, status, body, headers)
            return status, headers, body

    def _answer(self, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
        limit = {"X-RateLimit-Requests-Limit": "5000"}
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            return 400, limit, _errors("Unexpected token in JSON", "BAD_USER_INPUT")
        operation = request.get("operationName")
        variables = request.get("variables") or {}
        authorized = headers.get("authorization", "") == self.api_key
        with self._lock:
            self.requests.append(Request(operation, dict(variables), authorized))
            if self._limited > 0:
                self._limited -= 1
                return 400, {**limit, "X-RateLimit-Requests-Remaining": "0",
                             "X-RateLimit-Requests-Reset": str(self._reset_ms)}, _errors(
                    "Rate limit exceeded", "RATELIMITED", "Too many requests. Please try again later.")
        reset = {**limit, "X-RateLimit-Requests-Remaining": "4999",
                 "X-RateLimit-Requests-Reset": str(int(time.time() * 1000) + 3_600_000)}
        if not authorized:
            return 400, reset, _errors("Authentication required, not authenticated", "AUTHENTICATION_ERROR",
                                       "You need to authenticate to access this operation.")
        try:
            document = graphql.parse(str(request.get("query") or ""))
        except graphql.GraphQLError as exc:
            return 400, reset, _errors(exc.message, "GRAPHQL_PARSE_FAILED")
        problems = graphql.validate(SCHEMA, document)
        if problems:
            return 400, reset, _errors(problems[0].message, "GRAPHQL_VALIDATION_FAILED")
        with self._lock:
            result = graphql.execute_sync(SCHEMA, document, root_value=self._root(), variable_values=variables,
                                          operation_name=operation)
        answer: dict[str, Any] = {"data": result.data}
        if result.errors:
            answer["errors"] = [e.formatted for e in result.errors]
        return 200, reset, answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    owner: FakeLinear

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/graphql":
            self._send(404, {}, {"errors": [{"message": "Not found"}]})
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        failure = self.owner._failure()
        if failure is not None:
            status, headers, text = failure
            self._send(status, headers, text.encode(), "text/html")
            return
        status, headers, answer = self.owner._answer({k.lower(): v for k, v in self.headers.items()}, body)
        self._send(status, headers, answer)

    def _send(self, status: int, headers: Mapping[str, str], answer: Mapping[str, Any] | bytes,
              content_type: str = "application/json; charset=utf-8") -> None:
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def _errors(message: str, code: str, presentable: str | None = None) -> dict[str, Any]:
    extensions: dict[str, Any] = {"type": code.lower().replace("_", " "), "code": code}
    if presentable:
        extensions["userPresentableMessage"] = presentable
    return {"errors": [{"message": message, "extensions": extensions}]}


def _not_found(entity: str) -> graphql.GraphQLError:
    return graphql.GraphQLError(f"Entity not found: {entity}", extensions={
        "type": "invalid input", "code": "INPUT_ERROR",
        "userPresentableMessage": f"Could not find referenced {entity}."})


def _page(nodes: list[dict[str, Any]], first: int | None, after: str | None) -> dict[str, Any]:
    start = 0
    if after:
        ids = [n["id"] for n in nodes]
        start = ids.index(after) + 1 if after in ids else len(nodes)
    size = first if first is not None else 50
    chunk = nodes[start:start + size]
    more = start + size < len(nodes)
    return {"nodes": chunk, "pageInfo": {"hasNextPage": more, "hasPreviousPage": start > 0,
                                         "startCursor": chunk[0]["id"] if chunk else None,
                                         "endCursor": chunk[-1]["id"] if chunk else None}}


def _team_match(team: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    return all(_compare(team[f], c) for f, c in (flt or {}).items() if c)


def _compare(value: Any, comparator: Mapping[str, Any]) -> bool:
    checks = {"eq": lambda c: value == c, "neq": lambda c: value != c, "in": lambda c: value in c,
              "nin": lambda c: value not in c}
    return all(checks[op](c) for op, c in comparator.items() if c is not None)


def _compare_time(value: str, comparator: Mapping[str, Any]) -> bool:
    mine = _instant(value)
    checks = {"eq": lambda c: mine == c, "gt": lambda c: mine > c, "gte": lambda c: mine >= c,
              "lt": lambda c: mine < c, "lte": lambda c: mine <= c}
    return all(checks[op](_instant(c)) for op, c in comparator.items() if c is not None)


def _instant(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _iso(seconds: float) -> str:
    ms = round(seconds * 1000)
    return datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _slug(title: str) -> str:
    return "-".join("".join(ch if ch.isalnum() else " " for ch in title.lower()).split())[:60]
