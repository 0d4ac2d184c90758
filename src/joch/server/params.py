"""The query parameters Kubernetes clients send, declared once so OpenAPI documents them.

Values FastAPI cannot type-check (``dryRun`` must be ``All``, ``resourceVersion`` is a decimal
revision, ``limit`` is at most ``MAX_LIMIT``, a namespace is a DNS-1123 label) are checked by the
small parsers here, which raise ``BadRequest`` naming the parameter. ``limit`` is capped at
2^31 - 1 (Kubernetes declares it int64; the databases bind 64-bit integers, and a bigger value
would overflow there as a 500): no page is that large, so the cap only turns nonsense into a 400.
A namespace in the path or in ``?namespace=`` follows the rule admission applies to
``metadata.namespace``, so ``/namespaces/Bad_NS/...`` is a 400 naming the rule, not an empty list.
Parameters clients send that Joch has no use for (``fieldManager``, ``fieldValidation``, ``pretty``,
and ``resourceVersionMatch`` on a plain list) are accepted and ignored, as a lenient apiserver would.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Query

from joch.admission import metadata
from joch.api import errors
from joch.store.base import ListOptions, WatchOptions

MAX_LIMIT = 2**31 - 1

LabelSelector = Annotated[
    str | None,
    Query(alias="labelSelector", description="e.g. `app=x,tier!=db,env in (a,b),!legacy`"),
]
FieldSelector = Annotated[
    str | None,
    Query(alias="fieldSelector",
          description="`metadata.name`, `metadata.namespace` and the kind's column fields (an AgentRun's "
                      "`status.phase`, `spec.agentRef.name`, ...) with = or !=, comma-separated"),
]
Limit = Annotated[
    int | None, Query(alias="limit", description=f"page size, at most {MAX_LIMIT}; 0 or absent: no limit")
]
Continue = Annotated[str | None, Query(alias="continue", description="token from the previous page")]
ResourceVersion = Annotated[
    str | None,
    Query(alias="resourceVersion", description="watch: replay changes after this revision"),
]
WatchFlag = Annotated[bool, Query(alias="watch", description="stream changes instead of listing")]
TimeoutSeconds = Annotated[
    int | None, Query(alias="timeoutSeconds", ge=0, description="end a watch after this many seconds")
]
AllowBookmarks = Annotated[bool, Query(alias="allowWatchBookmarks")]
SendInitialEvents = Annotated[
    bool | None,
    Query(alias="sendInitialEvents",
          description="watch-list: the current objects as ADDED, then a BOOKMARK annotated "
                      "`k8s.io/initial-events-end`, then changes (needs `resourceVersionMatch=NotOlderThan`)"),
]
ResourceVersionMatch = Annotated[
    str | None, Query(alias="resourceVersionMatch", description="`NotOlderThan` (watch-list) or `Exact`"),
]
IncludeObject = Annotated[
    str | None,
    Query(alias="includeObject",
          description="with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`: what each row's "
                      "`object` holds: `Metadata` (default, a PartialObjectMetadata), `Object` or `None`"),
]
Accept = Annotated[str | None, Header(alias="accept", include_in_schema=False)]
DryRun = Annotated[str | None, Query(alias="dryRun", description="`All`: validate, write nothing")]
Kind = Annotated[str | None, Query(alias="kind", description="a kind, plural or short name")]
Namespace = Annotated[str | None, Query(alias="namespace")]


def dry_run(value: str | None) -> bool:
    if value is None or value == "":
        return False
    if value == "All":
        return True
    raise errors.BadRequest(f"invalid dryRun value {value!r}: the only supported value is 'All'")


def page_limit(value: int | None) -> int | None:
    if value is None or value == 0:
        return None
    if value < 0 or value > MAX_LIMIT:
        message = f"invalid limit {value}: it must be a page size from 1 to {MAX_LIMIT}, or 0 for no limit"
        raise errors.BadRequest(message, causes=[errors.Cause("limit", message, "FieldValueInvalid")])
    return value


def check_namespace(value: str | None, *, where: str = "the query parameter namespace") -> str | None:
    """A namespace from the URL (``""`` and None: none given), checked like ``metadata.namespace``."""
    if not value:
        return None
    problem = metadata.namespace_problem(value)
    if problem:
        message = f"{where}: {problem}"
        raise errors.BadRequest(message, causes=[errors.Cause("namespace", message, "FieldValueInvalid")])
    return value


def watch_revision(value: str | None) -> str | None:
    """The revision a watch resumes after; ``""`` and ``"0"`` mean "current state, then follow"."""
    if value is None or value in ("", "0"):
        return None
    if not value.isdigit():
        raise errors.BadRequest(f"invalid resourceVersion {value!r}: it must be a decimal revision")
    return value


def list_options(
    namespace: str | None, labels: str | None, fields: str | None, limit: int | None, token: str | None
) -> ListOptions:
    return ListOptions(
        namespace=namespace,
        label_selector=labels or None,
        field_selector=fields or None,
        limit=page_limit(limit),
        continue_token=token or None,
    )


def watch_options(
    namespace: str | None, labels: str | None, fields: str | None, resource_version: str | None,
    bookmarks: bool,
) -> WatchOptions:
    return WatchOptions(
        namespace=namespace,
        label_selector=labels or None,
        field_selector=fields or None,
        resource_version=watch_revision(resource_version),
        allow_bookmarks=bookmarks,
    )
