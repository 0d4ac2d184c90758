"""The query parameters Kubernetes clients send, declared once so OpenAPI documents them.

Values FastAPI cannot type-check (``dryRun`` must be ``All``, ``resourceVersion`` is a decimal
revision) are checked by the small parsers here, which raise ``BadRequest`` naming the parameter.
Parameters clients send that Joch has no use for (``fieldManager``, ``fieldValidation``, ``pretty``,
``resourceVersionMatch``) are accepted and ignored, as a lenient apiserver would.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Query

from joch.api import errors
from joch.store.base import ListOptions, WatchOptions

LabelSelector = Annotated[
    str | None,
    Query(alias="labelSelector", description="e.g. `app=x,tier!=db,env in (a,b),!legacy`"),
]
FieldSelector = Annotated[
    str | None,
    Query(alias="fieldSelector", description="`metadata.name` / `metadata.namespace` with = or !="),
]
Limit = Annotated[int | None, Query(alias="limit", description="page size; 0 or absent: no limit")]
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
        limit=limit if limit is not None and limit > 0 else None,
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
