"""Webhook deliveries normalised into ``TrackerEvent``: what the DeliveryController and the trigger
rules read, whichever tracker sent it. A ``WebhookDelivery`` stores ``to_payload()`` in
``spec.payload``; ``TrackerEvent.from_payload`` reads it back unchanged.

``action`` uses GitHub's words for both trackers, so a rule reads the same for either:

* GitHub ``issues``: its own action (``opened``, ``edited``, ``labeled``, ``unlabeled``, ``closed``,
  ``reopened``, ``deleted``, ``transferred``); ``label`` is the label added or removed. The issue of
  a ``deleted`` or ``transferred`` delivery is marked deleted (it left the repository).
  ``issue_comment``: ``created``/``edited``/``deleted``, with ``comment``. ``pull_request`` keeps the
  pull request's main fields in ``pull_request``. ``ping`` is ``kind="ping"``.
* Linear ``Issue``: ``create`` → ``opened``, with ``added_labels`` = the labels it was created with
  (GitHub sends a ``labeled`` delivery for each of those; Linear does not). ``remove`` → ``deleted``
  (the issue marked deleted). ``update`` → ``labeled`` when ``data.labelIds`` gained a label over
  ``updatedFrom.labelIds`` (its name from ``data.labels``; ``added_labels`` names every label
  gained), else ``unlabeled`` when one was removed (its name is not in the payload: ``label`` None),
  else ``closed``/``reopened`` when the state moved between open and closed (completed, canceled)
  types, else ``edited``. ``Comment``: ``create`` → ``created``, ``update`` → ``edited``, ``remove`` →
  ``deleted``; its ``issue`` is partial (id, identifier, title, url, team), so ask the tracker for the
  rest.
* ``actor`` and a comment's ``author``: GitHub logins; Linear's user email when the payload has one,
  else the name (``actor``) or the user id (a comment's ``author``, which commands are authorized by:
  a display name is anyone's to choose). ``association`` is GitHub's ``author_association`` (None for Linear).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from joch.integrations.base import Issue, Repository, TrackerError
from joch.integrations.github import github_issue, github_repository
from joch.integrations.linear import linear_issue

_T = TypeVar("_T")
Provider = Literal["github", "linear", "generic"]
Kind = Literal["issue", "comment", "pull_request", "ping", "webhook", "other"]

_SIGNATURE_HEADERS = ("x-hub-signature", "x-hub-signature-256", "x-joch-signature-256", "linear-signature",
                      "authorization", "cookie")


@dataclass(frozen=True)
class CommentEvent:
    id: str
    body: str
    author: str | None = None
    association: str | None = None


@dataclass(frozen=True)
class TrackerEvent:
    provider: Provider
    kind: Kind
    action: str | None = None
    delivery_id: str = ""
    issue: Issue | None = None
    label: str | None = None
    comment: CommentEvent | None = None
    actor: str | None = None
    repository: Repository | None = None
    team_key: str | None = None
    pull_request: dict[str, Any] | None = None
    payload: dict[str, Any] = field(default_factory=dict)  # generic deliveries: the body as sent
    headers: dict[str, str] = field(default_factory=dict)  # generic deliveries: headers, signatures left out
    added_labels: tuple[str, ...] = ()  # every label this change added (``label`` is the first)

    def to_payload(self) -> dict[str, Any]:
        """JSON-ready; ``from_payload`` reads it back equal."""
        payload: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return payload

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> TrackerEvent:
        issue = data.get("issue")
        comment = data.get("comment")
        repository = data.get("repository")
        return cls(
            provider=data["provider"],
            kind=data["kind"],
            action=data.get("action"),
            delivery_id=data.get("delivery_id") or "",
            issue=_issue_from(issue) if isinstance(issue, Mapping) else None,
            label=data.get("label"),
            comment=_known(CommentEvent, comment) if isinstance(comment, Mapping) else None,
            actor=data.get("actor"),
            repository=_known(Repository, repository) if isinstance(repository, Mapping) else None,
            team_key=data.get("team_key"),
            pull_request=dict(data["pull_request"]) if isinstance(data.get("pull_request"), Mapping) else None,
            payload=dict(data.get("payload") or {}),
            headers=dict(data.get("headers") or {}),
            added_labels=tuple(data.get("added_labels") or ()),
        )


# --- GitHub --------------------------------------------------------------------------------------

_MALFORMED = (KeyError, TypeError, ValueError, AttributeError)
"""What reading a JSON object of the wrong shape raises (a missing key, a string where an object was)."""


def _malformed(provider: str, delivery_id: str, exc: Exception) -> TrackerError:
    if isinstance(exc, TrackerError):
        return TrackerError("Invalid", f"{provider} delivery {delivery_id[:80]}: {exc.message}")
    return TrackerError("Invalid", f"{provider} delivery {delivery_id[:80]} is not shaped as {provider} sends it "
                        f"({type(exc).__name__}: {str(exc)[:120]})")


def parse_github(event: str, delivery_id: str, body: Mapping[str, Any]) -> TrackerEvent:
    """``event``: the ``X-GitHub-Event`` header; ``body``: the delivery's JSON. A body that is not
    shaped as GitHub sends it (not an object, a key missing, a string where an object was) is
    ``TrackerError("Invalid")`` naming the delivery, never another exception."""
    try:
        return _parse_github(event, delivery_id, body)
    except (TrackerError, *_MALFORMED) as exc:
        raise _malformed("GitHub", delivery_id, exc) from None


def _parse_github(event: str, delivery_id: str, body: Mapping[str, Any]) -> TrackerEvent:
    raw_repository = body.get("repository")
    repository = github_repository(raw_repository) if isinstance(raw_repository, Mapping) else None
    actor = _login(body.get("sender"))
    action = body.get("action") if isinstance(body.get("action"), str) else None
    common: dict[str, Any] = {"provider": "github", "delivery_id": delivery_id, "actor": actor,
                              "repository": repository}
    if event == "ping":
        return TrackerEvent(kind="ping", action=None, **common)
    if event == "issues" and isinstance(body.get("issue"), Mapping):
        issue = github_issue(body["issue"], repository)
        if action in ("deleted", "transferred"):
            issue = dataclasses.replace(issue, deleted=True)
        label = (body.get("label") or {}).get("name") if action in ("labeled", "unlabeled") else None
        added = (label,) if action == "labeled" and label else ()
        return TrackerEvent(kind="issue", action=action, issue=issue, label=label, added_labels=added, **common)
    if event == "issue_comment" and isinstance(body.get("issue"), Mapping):
        raw = body.get("comment") or {}
        comment = CommentEvent(id=str(raw.get("id", "")), body=str(raw.get("body") or ""),
                               author=_login(raw.get("user")), association=raw.get("author_association"))
        pull = body["issue"].get("pull_request")
        return TrackerEvent(kind="comment", action=action, issue=github_issue(body["issue"], repository),
                            comment=comment, pull_request=dict(pull) if isinstance(pull, Mapping) else None,
                            **common)
    if event == "pull_request" and isinstance(body.get("pull_request"), Mapping):
        return TrackerEvent(kind="pull_request", action=action, pull_request=_pull_request(body["pull_request"]),
                            **common)
    return TrackerEvent(kind="other", action=action or event, **common)


def _pull_request(obj: Mapping[str, Any]) -> dict[str, Any]:
    head = obj.get("head") or {}
    base = obj.get("base") or {}
    return {"number": obj.get("number"), "url": obj.get("html_url"), "state": obj.get("state"),
            "merged": bool(obj.get("merged")), "title": obj.get("title"), "head": head.get("ref"),
            "base": base.get("ref"), "body": obj.get("body")}


def _login(obj: Any) -> str | None:
    return str(obj["login"]) if isinstance(obj, Mapping) and obj.get("login") else None


# --- Linear --------------------------------------------------------------------------------------

_LINEAR_ISSUE_ACTIONS = {"create": "opened", "remove": "deleted"}
_LINEAR_COMMENT_ACTIONS = {"create": "created", "update": "edited", "remove": "deleted"}
_IDENTIFIER_IN_URL = re.compile(r"/issue/([A-Za-z0-9_]+-\d+)")


def parse_linear(delivery_id: str, body: Mapping[str, Any]) -> TrackerEvent:
    """``body``: the delivery's JSON (``action``, ``type``, ``data``, ``updatedFrom``, ``url``,
    ``actor``, ``webhookTimestamp``...). One not shaped as Linear sends it is ``TrackerError("Invalid")``
    naming the delivery, never another exception."""
    try:
        return _parse_linear(delivery_id, body)
    except (TrackerError, *_MALFORMED) as exc:
        raise _malformed("Linear", delivery_id, exc) from None


def _parse_linear(delivery_id: str, body: Mapping[str, Any]) -> TrackerEvent:
    kind = body.get("type")
    raw_action = str(body.get("action") or "")
    data = body.get("data") if isinstance(body.get("data"), Mapping) else {}
    actor = _linear_user(body.get("actor"))
    common: dict[str, Any] = {"provider": "linear", "delivery_id": delivery_id, "actor": actor}
    if kind == "Issue" and data:
        node = dict(data)
        node.setdefault("url", body.get("url"))
        issue = linear_issue(node)
        if raw_action == "remove":
            issue = dataclasses.replace(issue, deleted=True)
        action, label, added = _linear_issue_action(raw_action, data, body.get("updatedFrom"))
        if action == "opened":
            added = issue.labels  # Linear sends no "labeled" for the labels an issue is created with
        return TrackerEvent(kind="issue", action=action, issue=issue, label=label, team_key=issue.team_key,
                            added_labels=added, **common)
    if kind == "Comment" and data:
        partial = _linear_comment_issue(data, body)
        comment = CommentEvent(id=str(data.get("id") or ""), body=str(data.get("body") or ""),
                               author=_linear_identity(data.get("user")) or _linear_identity(body.get("actor")))
        return TrackerEvent(kind="comment", action=_LINEAR_COMMENT_ACTIONS.get(raw_action, raw_action),
                            issue=partial, comment=comment, team_key=partial.team_key if partial else None,
                            **common)
    return TrackerEvent(kind="other", action=f"{kind}.{raw_action}" if kind else raw_action or None, **common)


def _linear_issue_action(action: str, data: Mapping[str, Any],
                         updated_from: Any) -> tuple[str, str | None, tuple[str, ...]]:
    """The action, the label added (else removed), and the names of every label added."""
    if action != "update":
        return _LINEAR_ISSUE_ACTIONS.get(action, action), None, ()
    before = updated_from if isinstance(updated_from, Mapping) else {}
    names = {str(label.get("id")): str(label.get("name")) for label in data.get("labels") or ()
             if isinstance(label, Mapping)}
    if "labelIds" in before:
        old = list(before.get("labelIds") or ())
        new = list(data.get("labelIds") or ())
        old_set, new_set = set(map(str, old)), set(map(str, new))  # lists of 10k ids: no list membership
        added = [i for i in new if str(i) not in old_set]
        if added:
            added_names = tuple(names[str(i)] for i in added if str(i) in names)
            return "labeled", names.get(str(added[0])), added_names
        removed = [i for i in old if str(i) not in new_set]
        if removed:
            return "unlabeled", names.get(str(removed[0])), ()
    if "stateId" in before or "completedAt" in before or "canceledAt" in before:
        # updatedFrom holds the old value of each field that changed; an absent one did not change
        was_closed = any(before[f] if f in before else data.get(f) for f in ("completedAt", "canceledAt"))
        state = data.get("state") or {}
        now_closed = state.get("type") in ("completed", "canceled") if state else bool(
            data.get("completedAt") or data.get("canceledAt"))
        if now_closed and not was_closed:
            return "closed", None, ()
        if was_closed and not now_closed:
            return "reopened", None, ()
    return "edited", None, ()


def _linear_comment_issue(data: Mapping[str, Any], body: Mapping[str, Any]) -> Issue | None:
    raw: Mapping[str, Any] = data["issue"] if isinstance(data.get("issue"), Mapping) else {}
    issue_id = raw.get("id") or data.get("issueId")
    if not issue_id:
        return None
    identifier = raw.get("identifier")
    if not identifier:
        found = _IDENTIFIER_IN_URL.search(str(raw.get("url") or body.get("url") or ""))
        identifier = found.group(1) if found else ""
    node = {"id": issue_id, "identifier": identifier, "title": raw.get("title"), "url": raw.get("url"),
            "team": raw.get("team"), "updatedAt": raw.get("updatedAt")}
    return linear_issue(node)


def _linear_identity(obj: Any) -> str | None:
    """Who wrote a comment, as ``allowedActors`` matches it: the email, else the user id; never the
    display name, which any workspace member may set to an allowed person's name or email."""
    if not isinstance(obj, Mapping):
        return None
    value = obj.get("email") or obj.get("id")
    return str(value) if value else None


def _linear_user(obj: Any) -> str | None:
    if not isinstance(obj, Mapping):
        return None
    value = obj.get("email") or obj.get("name")
    return str(value) if value else None


# --- generic -------------------------------------------------------------------------------------

def generic(delivery_id: str, body: Mapping[str, Any], headers: Mapping[str, str]) -> TrackerEvent:
    """A TriggerRule's own webhook: the body as sent and the headers (lower-cased names), without the
    signature and credential headers. A body that is not a JSON object is ``TrackerError("Invalid")``."""
    if not isinstance(body, Mapping):
        raise TrackerError("Invalid", f"webhook delivery {delivery_id[:80]}: the body is a JSON "
                           f"{type(body).__name__}, not an object")
    kept = {k.lower(): v for k, v in headers.items() if not _credential_header(k)}
    return TrackerEvent(provider="generic", kind="webhook", delivery_id=delivery_id, payload=dict(body),
                        headers=kept)


_CREDENTIAL_WORDS = ("auth", "token", "secret", "signature", "password", "key", "cookie", "session")


def _credential_header(name: str) -> bool:
    """Signature and credential headers, named as senders name them (``X-Gitlab-Token``, ``X-Api-Key``,
    ``Proxy-Authorization``...): never stored with a delivery, which people can read."""
    lowered = name.lower()
    return lowered in _SIGNATURE_HEADERS or any(word in lowered for word in _CREDENTIAL_WORDS)


# --- payload round trip --------------------------------------------------------------------------

def _issue_from(data: Mapping[str, Any]) -> Issue:
    values = dict(data)
    values["labels"] = tuple(values.get("labels") or ())
    repository = values.get("repository")
    values["repository"] = _known(Repository, repository) if isinstance(repository, Mapping) else None
    return _known(Issue, values)


def _known(cls: type[_T], data: Mapping[str, Any]) -> _T:
    """``cls`` from the fields it has (a payload stored by another version may carry more or fewer)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
