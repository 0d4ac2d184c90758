"""What is derived from a tracker issue: the synced ImplementationSpec's name and spec, and the
label value that stands for a source item (``github:acme/web#12``) on the runs triggered for it."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from joch.integrations.base import Issue

MAX_NAME = 63
_NOT_NAME = re.compile(r"[^a-z0-9-]+")
_TASK = re.compile(r"^\s*[-*+]\s+\[[ xX]\]\s+(.+?)\s*$")


def spec_name(issue: Issue) -> str:
    """``gh-<owner>-<repo>-<number>`` or ``lin-<identifier>``, as a DNS-1123 label."""
    if issue.provider == "github" and issue.repository is not None and issue.number is not None:
        raw = f"gh-{issue.repository.owner}-{issue.repository.name}-{issue.number}"
    elif issue.provider == "github":
        raw = "gh-" + issue.key.replace("/", "-").replace("#", "-")
    else:
        raw = f"lin-{issue.key}"
    return dns_name(raw)


def dns_name(raw: str) -> str:
    """``raw`` as a DNS-1123 label: lower case, ``[a-z0-9-]`` only, at most 63 characters (a longer
    one is cut and ends with a hash of the whole, so two long names never collide)."""
    name = _NOT_NAME.sub("-", raw.lower()).strip("-") or "issue"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
    return f"{name[:MAX_NAME - 11].rstrip('-')}-{digest}"


def item_hash(item: str) -> str:
    """A source item as a label value (``joch.dev/source-item-hash``)."""
    return hashlib.sha256(item.encode()).hexdigest()[:32]


def task_items(body: str) -> list[str]:
    """The task-list items of a Markdown body (``- [ ] x``, ``- [x] x``), in order."""
    return [m.group(1) for line in body.splitlines() if (m := _TASK.match(line))]


def spec_of(issue: Issue) -> dict[str, Any]:
    body = issue.body or ""
    spec: dict[str, Any] = {
        "text": f"# {issue.title}\n\n{body}".rstrip() + "\n",
        "summary": issue.title,
        "acceptanceCriteria": task_items(body),
        "labels": sorted(issue.labels),
        "source": {"provider": issue.provider, "externalId": issue.key, "url": issue.url},
    }
    if body.strip():
        spec["description"] = body
    return spec
