"""ImplementationSources: tracker issues kept as ImplementationSpecs, by polling and by webhooks.

``apply_issue`` is the one place an issue becomes a spec; the ``SourceController`` (polling) and the
delivery controller (webhooks, ``joch.controllers.deliveries``) both call it, so a webhook and a poll
of the same change write the same spec and report the same change.

* **Names.** ``gh-<owner>-<repo>-<number>`` and ``lin-<identifier>``, lower-cased, every character
  outside ``[a-z0-9-]`` turned into ``-``; a name longer than 63 characters is cut and ends with a
  hash of the whole, so two long names never collide. Every synced spec is labelled
  ``joch.dev/source: <source>``; a spec of that name that another source (or a person) wrote is
  never touched.
* **What the source writes.** ``text`` (``# <title>``, a blank line, the body), ``summary`` (the
  title), ``description`` (the body), ``acceptanceCriteria`` (the body's task-list items, checked or
  not), ``labels`` and ``source{provider, externalId, url}``; ``status.sourceVersion`` is the
  issue's version and ``status.syncedAt`` the time of the sync that changed it.
* **Manual edits.** The annotation ``joch.dev/synced-spec-hash`` holds the hash of the spec the
  source last wrote. A spec whose spec no longer hashes to it was edited by hand: with the source's
  ``onManualEdit: Keep`` (the default) the edit wins, the spec is left alone and its condition
  ``Diverged`` says so and how to get the upstream text back; ``Overwrite`` replaces it.
* **Closed and deleted issues** are not deleted: the spec gets ``Stale=True`` (runs may still
  refer to it). An issue opened again clears it.
* **Polling** (``SourceController``): every ``pollIntervalSeconds`` and at once when the spec changes
  (0: neither; webhooks only), and whenever ``joch sync source`` sets ``joch.dev/sync-requested-at``, the
  source asks its tracker for the issues updated since ``status.cursor`` (with the ETag of the last
  answer), applies each, and hands what changed to the trigger rules that follow the source
  (``triggers.issue_events``): an issue new to Joch is ``opened``, a label the spec did not hold is
  ``labeled`` — the dedupe keys a webhook of the same change gets, so the two make one run.
  A tracker error sets ``Ready=False`` and ``Error=True`` with the tracker's reason and message
  (``BadCredentials``: which Secret's token was refused); a rate limit waits until the reset
  the tracker named (``status.rateLimitedUntil``) before asking again.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from joch.admission.apply import apply_documents
from joch.admission.documents import Document
from joch.api import errors, kinds
from joch.api.integrations import (
    IMPLEMENTATION_SOURCE,
    SOURCE_LABEL,
    SYNC_REQUESTED,
    SYNCED_HASH,
    TRIGGER_RULE,
    ImplementationSourceSpec,
)
from joch.api.meta import epoch, set_condition
from joch.api.registry import KindInfo
from joch.controllers import triggers
from joch.controllers.base import Context, Controller, Key, Mapper, Result
from joch.controllers.issues import spec_name, spec_of
from joch.integrations.base import Issue, SecretLookup, TrackerError
from joch.integrations.trackers import open_tracker
from joch.store.base import ListOptions, Obj, Writer

log = logging.getLogger("joch.controllers.sources")

Change = Literal["created", "updated", "unchanged", "stale", "diverged"]
ERROR_RETRY_SECONDS = 60.0


@dataclass(frozen=True)
class SpecChange:
    """What ``apply_issue`` did to the issue's spec; ``added_labels``: labels the spec did not hold
    before (all of them for a new spec); ``opened``: the spec is new and the issue open."""

    name: str
    change: Change
    added_labels: tuple[str, ...] = ()
    opened: bool = False


# --- names and content -----------------------------------------------------------------------------

def spec_hash(spec: Any) -> str:
    """The hash of a spec as the source compares it: defaults and empty fields do not count."""
    try:
        model = kinds.ImplementationSpecSpec.model_validate(spec)
        canonical: Any = model.model_dump(mode="json", exclude_defaults=True)
    except ValueError:
        canonical = spec
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def source_spec(source: Obj) -> ImplementationSourceSpec:
    return ImplementationSourceSpec.model_validate(source.get("spec") or {})


def wanted(spec: ImplementationSourceSpec, issue: Issue) -> bool:
    """Whether the source's filters select ``issue`` (its labels; Linear's workflow states are the
    tracker's to filter, a closed issue is always looked at so its spec can go Stale)."""
    filters = spec.github.labels if spec.github is not None else spec.linear.labels if spec.linear else []
    return all(label in issue.labels for label in filters)


def stamp(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- applying one issue ----------------------------------------------------------------------------

def apply_issue(store: Any, source: Obj, issue: Issue, now: float) -> SpecChange:
    """Create, update or mark the spec of ``issue`` for ``source`` (see the module docstring)."""
    m = source["metadata"]
    namespace, source_name = m.get("namespace") or "", m["name"]
    spec = source_spec(source)
    name = spec_name(issue)
    existing = _get(store, kinds.IMPLEMENTATION_SPEC, namespace, name)
    closed = issue.state == "closed" or issue.deleted
    if existing is not None and ((existing["metadata"].get("labels") or {}).get(SOURCE_LABEL) != source_name):
        log.info("ImplementationSpec %s/%s exists and was not written by source %s: left alone", namespace, name,
                 source_name)
        return SpecChange(name, "unchanged")
    if existing is None:
        if closed or not wanted(spec, issue):
            return SpecChange(name, "unchanged")
        _write(store, namespace, name, source_name, issue, None)
        _status(store, namespace, name, issue, now, stale=False, diverged=None)
        return SpecChange(name, "created", tuple(sorted(issue.labels)), opened=True)
    held = tuple((existing.get("spec") or {}).get("labels") or ())
    added = tuple(sorted(set(issue.labels) - set(held)))
    edited = spec_hash(existing.get("spec")) != (existing["metadata"].get("annotations") or {}).get(SYNCED_HASH)
    if edited and spec.onManualEdit == "Keep":
        message = (f"edited by hand since ImplementationSource {source_name} wrote it; the edit is kept and "
                   f"{issue.item} is no longer synced into it (set spec.onManualEdit: Overwrite on the source, or "
                   "delete this spec, to take the issue's text again)")
        changed = _status(store, namespace, name, issue, now, stale=closed, diverged=message, keep_version=True)
        return SpecChange(name, "diverged" if changed else "unchanged", added)
    was_stale = _condition(existing, "Stale") == "True"
    if closed:
        _status(store, namespace, name, issue, now, stale=True, diverged=None)
        return SpecChange(name, "unchanged" if was_stale else "stale")
    written = _write(store, namespace, name, source_name, issue, existing)
    _status(store, namespace, name, issue, now, stale=False, diverged=None)
    return SpecChange(name, "updated" if written or was_stale else "unchanged", added)


def _get(store: Any, kind: KindInfo, namespace: str, name: str) -> Obj | None:
    try:
        found: Obj = store.get(kind, namespace, name)
        return found
    except errors.NotFound:
        return None


def _write(store: Any, namespace: str, name: str, source_name: str, issue: Issue, existing: Obj | None) -> bool:
    """Apply the spec of ``issue`` (through admission); whether anything changed."""
    spec = spec_of(issue)
    metadata: dict[str, Any] = (existing or {}).get("metadata") or {}
    labels = {**(metadata.get("labels") or {}), SOURCE_LABEL: source_name}
    annotations = {**(metadata.get("annotations") or {}), SYNCED_HASH: spec_hash(spec)}
    doc = {"apiVersion": kinds.IMPLEMENTATION_SPEC.api_version, "kind": kinds.IMPLEMENTATION_SPEC.kind,
           "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
           "spec": spec}
    result = apply_documents(store, [Document(index=0, source=f"ImplementationSource/{source_name}", obj=doc)])
    return any(item.action != "unchanged" for item in result.items)


def _condition(obj: Obj, type_: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return str(c.get("status"))
    return None


def _status(store: Any, namespace: str, name: str, issue: Issue, now: float, *, stale: bool,
            diverged: str | None, keep_version: bool = False) -> bool:
    """Write the spec's sync status; whether it changed."""
    for _ in range(5):
        current = store.get(kinds.IMPLEMENTATION_SPEC, namespace, name)
        status: dict[str, Any] = dict(current.get("status") or {})
        conditions = list(status.get("conditions") or [])
        version = issue.version or issue.updated_at
        if not keep_version:
            if status.get("sourceVersion") != version:
                status["syncedAt"] = stamp(now)
            status["sourceVersion"] = version
        conditions = set_condition(conditions, {
            "type": "Ready", "status": "True", "reason": "Synced", "message": f"synced from {issue.item}"})
        conditions = set_condition(conditions, {
            "type": "Stale", "status": "True" if stale else "False",
            "reason": ("Deleted" if issue.deleted else "Closed") if stale else "Open",
            "message": (f"{issue.item} was deleted" if issue.deleted else f"{issue.item} is closed") if stale
            else f"{issue.item} is open"})
        conditions = set_condition(conditions, {
            "type": "Diverged", "status": "True" if diverged else "False",
            "reason": "ManualEdit" if diverged else "InSync",
            "message": diverged or "the spec is what the source wrote"})
        status["conditions"] = conditions
        if status == (current.get("status") or {}):
            return False
        try:
            store.update_status(kinds.IMPLEMENTATION_SPEC, {**current, "status": status})
            return True
        except errors.Conflict:
            continue
    raise errors.Conflict(f'ImplementationSpec "{name}" kept changing while its sync status was written',
                          kind=kinds.IMPLEMENTATION_SPEC.kind, name=name)


# --- secrets -----------------------------------------------------------------------------------------

def secret_lookup(store: Any, namespace: str, owner: str) -> SecretLookup:
    """``(secret, key) → value`` from the store's sealed Secrets of ``namespace``, for ``owner`` (the
    object whose spec names them, for messages)."""

    def lookup(name: str, key: str) -> str:
        try:
            secret = store.reveal(kinds.SECRET, namespace, name)
        except errors.NotFound:
            raise TrackerError("MissingSecret", f'{owner}: Secret "{name}" does not exist in namespace '
                                                f'"{namespace}": create it with the key "{key}"') from None
        data = (secret.get("spec") or {}).get("data") or {}
        if key not in data:
            raise TrackerError("MissingSecret", f'{owner}: Secret "{name}" in namespace "{namespace}" has no key '
                                                f'"{key}" (it has: {", ".join(sorted(data)) or "none"})')
        try:
            return base64.b64decode(str(data[key]), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise TrackerError("MissingSecret", f'{owner}: the key "{key}" of Secret "{name}" is not UTF-8 text') \
                from None

    return lookup


# --- the controller ----------------------------------------------------------------------------------

@dataclass
class _Counts:
    created: int = 0
    updated: int = 0
    stale: int = 0
    diverged: int = 0
    seen: list[str] = field(default_factory=list)

    def add(self, change: SpecChange) -> None:
        if change.change in ("created", "updated", "stale", "diverged"):
            setattr(self, change.change, getattr(self, change.change) + 1)


class SourceController(Controller):
    """Polls every ImplementationSource (see the module docstring)."""

    name = "sources"
    kind = IMPLEMENTATION_SOURCE

    def __init__(self) -> None:
        self._ctx: Context | None = None

    @property
    def ctx(self) -> Context:
        if self._ctx is None:
            raise RuntimeError("SourceController used before setup()")
        return self._ctx

    def setup(self, ctx: Context) -> None:
        self._ctx = ctx
        ctx.cache(TRIGGER_RULE)

    def secondary(self) -> Sequence[tuple[KindInfo, Mapper]]:
        return ()

    def reconcile(self, key: Key) -> Result | None:
        if self.ctx.cache(IMPLEMENTATION_SOURCE).get(key.namespace, key.name) is None:
            return None
        try:  # the cache may not show this controller's last status yet: never poll twice for it
            source = self.ctx.store.get(IMPLEMENTATION_SOURCE, key.namespace, key.name)
        except errors.NotFound:
            return None
        if source["metadata"].get("deletionTimestamp"):
            return None
        spec = source_spec(source)
        status: dict[str, Any] = dict(source.get("status") or {})
        now = self.ctx.clock.time()
        requested = (source["metadata"].get("annotations") or {}).get(SYNC_REQUESTED)
        asked = bool(requested) and requested != status.get("observedSyncRequest")
        # A changed spec (filters, credentials) is synced at once, from the start; unless polling is off,
        # which means webhooks and joch sync source only.
        changed = status.get("observedGeneration") != source["metadata"].get("generation") \
            and spec.pollIntervalSeconds > 0
        if spec.suspend and not asked:
            self._write_status(source, _ready(status, "False", "Suspended", "spec.suspend is true: not syncing"))
            return None
        wait = self._wait(spec, status, now)
        if not asked and not changed and wait is not None:
            return Result(requeue_after=wait) if wait > 0 else None
        reset = status.get("observedGeneration") != source["metadata"].get("generation")
        return self.sync(source, requested=requested if asked else None, reset=reset)

    def _wait(self, spec: ImplementationSourceSpec, status: dict[str, Any], now: float) -> float | None:
        """Seconds until the next poll is due (0 or less: now); None: no polling."""
        limited = epoch(status.get("rateLimitedUntil"))
        if limited is not None and limited > now:
            return limited - now
        if spec.pollIntervalSeconds == 0:
            return 0.0
        last = epoch(status.get("lastSyncedAt"))
        if last is None:
            return None
        left = last + spec.pollIntervalSeconds - now
        return left if left > 0 else None

    def sync(self, source: Obj, *, requested: str | None = None, reset: bool = False) -> Result | None:
        m = source["metadata"]
        namespace = m.get("namespace") or ""
        spec = source_spec(source)
        status: dict[str, Any] = dict(source.get("status") or {})
        now = self.ctx.clock.time()
        owner = f'ImplementationSource "{m["name"]}" in namespace "{namespace}"'
        counts = _Counts()
        try:
            tracker = open_tracker(source, secret_lookup(self.ctx.store, namespace, owner), self.ctx.clock.time)
            cursor = None if reset else status.get("cursor")
            page = tracker.list_issues(since=cursor, etag=None if reset else status.get("etag"))
            rules = self._rules(namespace, m["name"])
            for issue in page.issues:
                change = apply_issue(self.ctx.store, source, issue, now)
                counts.add(change)
                if change.opened or change.added_labels:
                    triggers.issue_changed(self.ctx.store, rules, issue, change.opened, change.added_labels, now)
        except TrackerError as exc:
            return self._failed(source, exc, now, requested)
        status.update(lastSyncedAt=stamp(now), cursor=page.cursor or cursor, etag=page.etag or status.get("etag"),
                      rateLimitedUntil=None, lastError=None, observedGeneration=m.get("generation"))
        expires = getattr(tracker, "token_expires_at", None)
        status["tokenExpiresAt"] = stamp(expires) if isinstance(expires, int | float) else None
        if requested:
            status["observedSyncRequest"] = requested
        held = len(self.ctx.store.list(kinds.IMPLEMENTATION_SPEC, ListOptions(
            namespace=namespace, label_selector=f"{SOURCE_LABEL}={m['name']}")).items)
        status["counts"] = {"issues": held, "created": counts.created, "updated": counts.updated,
                            "stale": counts.stale, "diverged": counts.diverged}
        said = "not modified since the last sync" if page.not_modified else f"{len(page.issues)} issue(s) read"
        status = _ready(status, "True", "Synced", f"synced at {stamp(now)}: {said}")
        status["conditions"] = set_condition(status["conditions"], {
            "type": "Error", "status": "False", "reason": "NoError", "message": "the last sync succeeded"})
        status["conditions"] = set_condition(status["conditions"], {
            "type": "Syncing", "status": "False", "reason": "Idle",
            "message": f"next sync in {spec.pollIntervalSeconds}s" if spec.pollIntervalSeconds else
            "polling is off (pollIntervalSeconds: 0): webhooks and joch sync source only"})
        self._write_status(source, status)
        return Result(requeue_after=float(spec.pollIntervalSeconds)) if spec.pollIntervalSeconds else None

    def _failed(self, source: Obj, exc: TrackerError, now: float, requested: str | None) -> Result:
        spec = source_spec(source)
        status: dict[str, Any] = dict(source.get("status") or {})
        message = exc.message
        if exc.retry_at is not None and exc.retry_at > now:
            status["rateLimitedUntil"] = stamp(exc.retry_at)
            message = f"{message} (next attempt after {stamp(exc.retry_at)})"
        status["lastError"] = message
        status["observedGeneration"] = source["metadata"].get("generation")
        if requested:
            status["observedSyncRequest"] = requested
        status = _ready(status, "False", exc.reason, message)
        status["conditions"] = set_condition(status["conditions"], {
            "type": "Error", "status": "True", "reason": exc.reason, "message": message})
        self._write_status(source, status)
        if exc.retry_at is not None and exc.retry_at > now:
            return Result(requeue_after=exc.retry_at - now)
        interval = float(spec.pollIntervalSeconds) or ERROR_RETRY_SECONDS
        return Result(requeue_after=min(interval, ERROR_RETRY_SECONDS) if exc.retryable else interval)

    def _rules(self, namespace: str, source: str) -> list[Obj]:
        return triggers.rules_for_source(self.ctx.cache(TRIGGER_RULE).list(namespace), source)

    def _write_status(self, source: Obj, status: dict[str, Any]) -> None:
        if status != (source.get("status") or {}):
            self.ctx.store.update_status(IMPLEMENTATION_SOURCE, {**source, "status": status})


def _ready(status: dict[str, Any], value: str, reason: str, message: str) -> dict[str, Any]:
    out = dict(status)
    out["conditions"] = set_condition(list(status.get("conditions") or []), {
        "type": "Ready", "status": value, "reason": reason, "message": message})
    return out


def sources_of_repository(reader: Writer, owner: str, repo: str) -> list[Obj]:
    """Every GitHub ImplementationSource (any namespace) following ``owner/repo``."""
    found = []
    for source in reader.list(IMPLEMENTATION_SOURCE, ListOptions()).items:
        github = (source.get("spec") or {}).get("github") or {}
        if (source.get("spec") or {}).get("provider") == "github" and \
                str(github.get("owner", "")).lower() == owner.lower() and \
                str(github.get("repo", "")).lower() == repo.lower():
            found.append(source)
    return found


def sources_of_team(reader: Writer, team_key: str | None) -> list[Obj]:
    """Every Linear ImplementationSource (any namespace) of ``team_key`` (every one when None)."""
    found = []
    for source in reader.list(IMPLEMENTATION_SOURCE, ListOptions()).items:
        spec = source.get("spec") or {}
        if spec.get("provider") != "linear":
            continue
        key = str((spec.get("linear") or {}).get("teamKey", ""))
        if team_key is None or key.upper() == team_key.upper():
            found.append(source)
    return found


def specs_of(items: Iterable[Obj], source: str) -> list[Obj]:
    return [o for o in items if ((o.get("metadata") or {}).get("labels") or {}).get(SOURCE_LABEL) == source]
