"""Writing through admission: atomic multi-document apply and create, and the single-object
writes (create, replace, merge-patch, status) the HTTP server needs.

Design decisions:

* **Validate everything, then write everything, in one transaction.** ``apply_documents`` admits
  every document first (references may point at other documents of the batch, in any order),
  and only when all are valid writes them inside the same ``store.transaction()``. Any error —
  admission, a store conflict, anything — rolls the whole batch back: nothing is half-written.
* **How a rejected batch reads.** One ``errors.Invalid`` with the message
  ``"N of M documents are invalid; nothing was applied"`` (``"1 of 1 document is invalid"``).
  N and M count documents the way ``documents[i]`` numbers them: per source, every ``---`` section
  up to the last one holding an object — empty sections included, because they take an index —
  and a ``kind: List`` is one document however many items it has. So the largest index named is
  always below M, and N counts the documents named, not the causes. Each cause's ``field`` starts
  with the document's label, then its own path::

      documents[3] (Agent/coder in quickstart.yaml:14).spec.providerRef.name

  (``documents[i]`` is the 0-based position in that file, ``:14`` the line the document starts on;
  see ``documents.Document.label``). ``extra["documents"]`` repeats this per document, for
  programs: ``index``, ``item``, ``source``, ``line``, ``kind``, ``name``, ``message`` (the
  object's own Kubernetes-style message) and ``causes`` with paths relative to the object.
* **Apply is declarative.** A document is the desired spec, labels and annotations. Finalizers and
  ownerReferences the document leaves out are kept, because controllers own them (a cleanup
  finalizer must survive a re-apply). If spec, labels, annotations and the admission-owned status
  are what the store already holds, the document is ``unchanged`` and nothing is written, so
  resourceVersions stay put. ``metadata.generateName`` is honoured only by create.
* **Preconditions, as kubectl apply has them.** A document without ``metadata.resourceVersion``
  and ``metadata.uid`` overwrites whatever is stored. One *with* them (``get -o yaml`` output,
  edited) was read at that version, so apply refuses to overwrite a change made since: a stale
  ``resourceVersion``, a ``uid`` of an object since deleted and re-created, or either on an object
  that no longer exists is ``errors.Conflict`` naming the document and the way out (get it again,
  or remove the field). A current one passes, so re-applying unchanged ``get -o yaml`` output is
  ``unchanged``. Preconditions are checked after every document was admitted (an invalid batch is
  reported as invalid first) and before anything is written, inside the batch's transaction.
* **Traced** (``joch.telemetry.tracing``, when on): a span per batch (``joch.apply``,
  ``joch.create``) or single write (``joch.create``, ``joch.update``, ``joch.patch``,
  ``joch.update_status``), around admission's (``joch.admission.validate``,
  ``joch.admission.policies``) and the store's (``joch.store.write``) spans of each object.
* **Dry run** runs the same code, store writes included, and then aborts the transaction with a
  private exception: what a dry run reports is exactly what a real run would have done.
* The single-object helpers (``create_object``, ``update_object``, ``patch_object``,
  ``update_status``) have Kubernetes semantics: PUT replaces user metadata and spec and honours a
  ``resourceVersion`` precondition; a merge patch is applied to the stored object and written with
  the read ``resourceVersion`` as precondition, retried on ``Conflict`` unless the patch itself
  carried a ``resourceVersion``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

from joch.admission import namespaces, policies, uniqueness
from joch.admission.documents import Document
from joch.admission.merge import merge_patch
from joch.admission.references import Pending
from joch.admission.validation import (
    DEFAULT_OPTIONS,
    AdmissionOptions,
    Admitted,
    Checked,
    admit,
    check,
    display_name,
    invalid,
    resolve_kind,
    validate_status,
)
from joch.api import errors
from joch.api.errors import Cause
from joch.api.meta import DEFAULT_NAMESPACE
from joch.api.registry import KindInfo
from joch.policy.decisions import StoreSource
from joch.store.base import Obj, Store, Writer
from joch.telemetry import tracing

Action = Literal["created", "configured", "unchanged"]
Mode = Literal["apply", "create"]
Identity = tuple[str, str | None, str]
PATCH_ATTEMPTS = 5
_CONTROLLER_METADATA = ("finalizers", "ownerReferences")
# (stored object or None, object as given, object as admitted) -> the object to write: how the
# server records metadata.managedFields (joch.server.apply) without admission knowing of it.
Tracker = Callable[[Obj | None, Obj, Obj], Obj]
_T = TypeVar("_T")


@dataclass(frozen=True)
class ApplyItem:
    index: int
    kind: KindInfo
    namespace: str | None
    name: str
    action: Action
    object: Obj
    warnings: list[str] = field(default_factory=list)
    source: str = "-"

    @property
    def ref(self) -> str:
        """``agent.joch.dev/coder`` (``namespace/team-a`` in the core group), as kubectl prints it."""
        group = f".{self.kind.group}" if self.kind.group else ""
        return f"{self.kind.singular}{group}/{self.name}"


@dataclass(frozen=True)
class ApplyResult:
    items: list[ApplyItem]
    dry_run: bool = False

    def lines(self) -> Iterator[str]:
        """``agent.joch.dev/coder created`` per item, ``(server dry run)`` appended on a dry run."""
        suffix = " (server dry run)" if self.dry_run else ""
        for item in self.items:
            yield f"{item.ref} {item.action}{suffix}"

    def warnings(self) -> list[str]:
        return [f"{item.ref}: {text}" for item in self.items for text in item.warnings]


@dataclass(frozen=True)
class _Plan:
    doc: Document
    admitted: Admitted
    old: Obj | None


class _DryRun(Exception):
    """Raised inside a transaction to roll back a dry run; carries the would-be result."""

    def __init__(self, result: object) -> None:
        super().__init__("dry run")
        self.result = result


# --- batches -------------------------------------------------------------------------------------

def apply_documents(
    store: Store, docs: list[Document], *, dry_run: bool = False,
    options: AdmissionOptions | None = None, field_manager: str = "joch", namespace: str | None = None,
) -> ApplyResult:
    """Create or update every document, atomically. ``namespace`` (``kubectl apply -n``) is given to
    namespaced documents that name none; a document naming another one is invalid. ``field_manager``
    is accepted for kubectl compatibility and not recorded yet (Joch keeps no managedFields)."""
    del field_manager
    docs = [_in_namespace(doc, namespace) for doc in docs]
    with _batch_span("joch.apply", docs, dry_run):
        items = _run(store, dry_run, lambda w: _batch(w, docs, options or DEFAULT_OPTIONS, "apply", namespace))
    return ApplyResult(items=items, dry_run=dry_run)


def create_documents(
    store: Store, docs: list[Document], *, dry_run: bool = False,
    options: AdmissionOptions | None = None, namespace: str | None = None,
) -> ApplyResult:
    """Create every document, atomically; ``generateName`` is honoured, an existing name is
    ``errors.AlreadyExists`` naming the document. ``namespace`` as for ``apply_documents``."""
    docs = [_in_namespace(doc, namespace) for doc in docs]
    with _batch_span("joch.create", docs, dry_run):
        items = _run(store, dry_run, lambda w: _batch(w, docs, options or DEFAULT_OPTIONS, "create", namespace))
    return ApplyResult(items=items, dry_run=dry_run)


def _batch_span(span_name: str, docs: list[Document], dry_run: bool) -> AbstractContextManager[object]:
    if not tracing.enabled():
        return tracing.span(span_name)
    return tracing.span(span_name, attributes={"joch.documents": len(docs), "joch.dry_run": dry_run})


def _run(store: Store, dry_run: bool, body: Callable[[Writer], _T]) -> _T:
    with policies.collecting(store):
        try:
            with store.transaction() as writer:
                result = body(writer)
                if dry_run:
                    raise _DryRun(result)
        except _DryRun as abort:
            return cast(_T, abort.result)
    return result


def _in_namespace(doc: Document, namespace: str | None) -> Document:
    """The document with ``namespace`` filled in, when its kind is namespaced and it names none."""
    metadata = doc.obj.get("metadata")
    if namespace is None or not isinstance(metadata, dict) or metadata.get("namespace"):
        return doc
    try:
        kind = resolve_kind(doc.obj)
    except errors.Invalid:
        return doc
    if not kind.namespaced:
        return doc
    return dataclasses.replace(doc, obj={**doc.obj, "metadata": {**metadata, "namespace": namespace}})


def _batch(
    writer: Writer, docs: list[Document], options: AdmissionOptions, mode: Mode, namespace: str | None = None,
) -> list[ApplyItem]:
    identities = [_identity(doc) for doc in docs]
    pending = frozenset(i for i in identities if i is not None)
    counts = Counter(i for i in identities if i is not None)
    plans: list[_Plan] = []
    failures: list[tuple[Document, errors.Invalid]] = []
    twins = _twins(docs, namespace)
    for doc, identity in zip(docs, identities, strict=True):
        duplicate = _first_with(docs, identities, identity) if identity and counts[identity] > 1 else None
        try:
            plans.append(_admit_document(writer, doc, options, mode, pending, identity, duplicate, namespace,
                                         twins.get(id(doc))))
        except errors.Invalid as exc:
            failures.append((doc, exc))
    if failures:
        raise _batch_invalid(failures, docs, mode=mode)
    stale = [(plan.doc, why) for plan in plans if mode == "apply" and (why := _stale(plan)) is not None]
    if stale:
        raise _conflict(stale)
    items = [_write(writer, plan) for plan in plans]
    return _enforce_policies(writer, plans, items, docs, mode)


def _enforce_policies(
    writer: Writer, plans: list[_Plan], items: list[ApplyItem], docs: list[Document], mode: Mode,
) -> list[ApplyItem]:
    """The admission rules on every object the batch wrote, with the batch's own Policies in force
    (see ``policies``); any denial rejects the batch like an invalid document."""
    source = StoreSource(writer)
    failures: list[tuple[Document, errors.Invalid]] = []
    out = []
    for plan, item in zip(plans, items, strict=True):
        if item.action == "unchanged":
            out.append(item)
            continue
        try:
            warned = policies.enforce(writer, source, item.kind, item.object, plan.old, name=item.name)
        except errors.Invalid as exc:
            failures.append((plan.doc, exc))
            continue
        out.append(dataclasses.replace(item, warnings=[*item.warnings, *warned]) if warned else item)
    if failures:
        raise _batch_invalid(failures, docs, mode=mode)
    return out


def _identity(doc: Document) -> Identity | None:
    """``(Kind, namespace, name)`` of a document, when it resolves; else None."""
    try:
        kind = resolve_kind(doc.obj)
    except errors.Invalid:
        return None
    metadata = doc.obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        return None
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    if not kind.namespaced:
        return kind.kind, None, name
    return kind.kind, namespace if isinstance(namespace, str) and namespace else DEFAULT_NAMESPACE, name


def _first_with(docs: list[Document], identities: list[Identity | None], identity: Identity) -> Document:
    return docs[identities.index(identity)]


def _twins(docs: list[Document], namespace: str | None) -> dict[int, tuple[Document, str]]:
    """For each document that repeats an earlier document's unique key (``uniqueness.batch_key``:
    an AgentRun's idempotency key, an Approval's run and action) in the same namespace, that
    earlier document and the field (the store-side check cannot see the batch's own objects)."""
    first: dict[tuple[str, str, str], Document] = {}
    twins: dict[int, tuple[Document, str]] = {}
    for doc in docs:
        metadata = doc.obj.get("metadata")
        ns = metadata.get("namespace") if isinstance(metadata, dict) else None
        ns = ns if isinstance(ns, str) and ns else None
        key = uniqueness.batch_key(doc.obj, ns or namespace or DEFAULT_NAMESPACE)
        if key is None:
            continue
        if key in first:
            twins[id(doc)] = (first[key], key[1])
        else:
            first[key] = doc
    return twins


def _admit_document(
    writer: Writer, doc: Document, options: AdmissionOptions, mode: Mode, pending: Pending,
    identity: Identity | None, duplicate: Document | None, namespace: str | None,
    twin: tuple[Document, str] | None = None,
) -> _Plan:
    old = _existing(writer, doc, identity) if mode == "apply" else None
    admitted = _admit_with(
        writer, _desired(doc.obj, old, mode), old=old, options=options, doc=doc,
        pending=pending - {identity} if identity else pending,
        extra=list(_batch_rules(doc, mode, duplicate, namespace, twin)),
    )
    return _Plan(doc=doc, admitted=admitted, old=old)


def _admit_with(
    writer: Writer, obj: Obj, *, old: Obj | None, options: AdmissionOptions, extra: list[Cause],
    doc: Document | None = None, pending: Pending = frozenset(), checked: Checked | None = None,
) -> Admitted:
    """``admit``, with the caller's own causes (batch rules) joined to admission's."""
    try:
        admitted = admit(writer, obj, old=old, options=options, pending=pending,
                         raw=doc.raw if doc else None, checked=checked)
    except errors.Invalid as exc:
        if not extra:
            raise
        raise errors.Invalid(exc.message, kind=exc.kind, name=exc.name,
                             causes=[*exc.causes, *extra]) from exc
    if extra:
        raise invalid(admitted.kind, display_name(obj), extra)
    return admitted


def _single(obj: Obj) -> Document:
    return Document(index=0, source="request", obj=obj)


def _batch_rules(
    doc: Document, mode: Mode, duplicate: Document | None, namespace: str | None,
    twin: tuple[Document, str] | None = None,
) -> Iterator[Cause]:
    metadata = doc.obj.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    named = metadata.get("namespace")
    if namespace is not None and isinstance(named, str) and named and named != namespace:
        yield Cause("metadata.namespace", f'the namespace from the provided object "{named}" does not match '
                    f'the namespace "{namespace}" of the request: pass --namespace={named} or remove '
                    "metadata.namespace", "FieldValueInvalid")
    if duplicate is not None and duplicate is not doc:
        yield Cause("metadata.name", f"{duplicate.label()} defines the same object; each object may "
                    "appear once in a batch", "FieldValueDuplicate")
    if twin is not None and twin[1] == "spec.idempotencyKey":
        yield Cause(twin[1], f"{twin[0].label()} has the same idempotency key; one run per key in a "
                    "namespace", "FieldValueDuplicate")
    elif twin is not None:
        yield Cause(twin[1], f"{twin[0].label()} asks for the same action on the same run; one Approval per run "
                    "and action", "FieldValueDuplicate")
    if mode == "apply" and not metadata.get("name") and metadata.get("generateName"):
        yield Cause("metadata.name", "required by apply: metadata.generateName is honoured only by "
                    "create (joch create -f)", "FieldValueRequired")
    if mode == "create" and metadata.get("resourceVersion"):
        yield Cause("metadata.resourceVersion", "must not be set on an object to be created",
                    "FieldValueForbidden")


def _existing(writer: Writer, doc: Document, identity: Identity | None) -> Obj | None:
    if identity is None:
        return None
    kind = resolve_kind(doc.obj)
    try:
        return writer.get(kind, identity[1], identity[2])
    except errors.NotFound:
        return None


def _desired(obj: Obj, old: Obj | None, mode: Mode) -> Obj:
    """What apply asks for: the document, with the controller metadata it leaves out kept."""
    if mode != "apply" or not isinstance(obj.get("metadata"), dict):
        return obj
    metadata = dict(obj["metadata"])
    old_metadata = (old or {}).get("metadata") or {}
    for key in _CONTROLLER_METADATA:
        if key not in metadata and key in old_metadata:
            metadata[key] = copy.deepcopy(old_metadata[key])
    return {**obj, "metadata": metadata}


def _write(writer: Writer, plan: _Plan) -> ApplyItem:
    kind, obj = plan.admitted.kind, plan.admitted.obj
    action: Action = "configured"
    if plan.old is None:
        stored, action = _create(writer, kind, obj, plan.doc), "created"
    elif _unchanged(kind, plan.old, obj):
        stored, action = plan.old, "unchanged"
    else:
        stored = _update(writer, kind, plan.old, obj, always=False)
        if stored["metadata"].get("resourceVersion") == plan.old["metadata"].get("resourceVersion"):
            # The store found nothing to write: e.g. a Secret's data equal to the sealed values,
            # which admission cannot compare, since reads never return them (joch.api.secrets).
            action = "unchanged"
    m = stored["metadata"]
    return ApplyItem(index=plan.doc.index, kind=kind, namespace=m.get("namespace"), name=m["name"],
                     action=action, object=stored, warnings=list(plan.admitted.warnings),
                     source=plan.doc.source)


def _create(writer: Writer, kind: KindInfo, obj: Obj, doc: Document | None) -> Obj:
    try:
        return writer.create(kind, obj)
    except errors.AlreadyExists as exc:
        if doc is None:
            raise
        raise errors.AlreadyExists(f"{doc.label()}: {exc.message}; nothing was written",
                                   kind=exc.kind, name=exc.name) from exc


def _update(writer: Writer, kind: KindInfo, old: Obj, obj: Obj, *, always: bool) -> Obj:
    """Write spec/metadata when they changed (or ``always``, for a precondition), then the
    admission-owned status when it changed."""
    stored = old
    if always or _user_part(kind, old) != _user_part(kind, obj):
        stored = writer.update(kind, obj)
    status = obj.get("status") or {}
    if status != (stored.get("status") or {}):
        stored = writer.update_status(kind, {**stored, "status": status})
    return stored


def _unchanged(kind: KindInfo, old: Obj, new: Obj) -> bool:
    return _user_part(kind, old) == _user_part(kind, new) and (old.get("status") or {}) == (new.get("status") or {})


def _user_part(kind: KindInfo, obj: Obj) -> tuple[Any, ...]:
    """What the user writes: the spec (``KindInfo.body_of``, the top-level fields of a RoleBinding)
    and the user metadata."""
    m = obj.get("metadata") or {}
    return (kind.body_of(obj), m.get("labels") or {}, m.get("annotations") or {},
            m.get("finalizers") or [], m.get("ownerReferences") or [])


def _stale(plan: _Plan) -> str | None:
    """Why the document's ``resourceVersion``/``uid`` precondition fails, or None when it holds."""
    given = plan.doc.obj.get("metadata")
    given = given if isinstance(given, dict) else {}
    version, uid = given.get("resourceVersion") or None, given.get("uid") or None
    if version is None and uid is None:
        return None
    label = plan.doc.label()
    field_name = "resourceVersion" if version is not None else "uid"
    if plan.old is None:
        return (f"{label}: the object no longer exists, but the document carries the metadata.{field_name} "
                f"of one that did; remove metadata.{field_name} to create it anew")
    stored = plan.old["metadata"]
    if uid is not None and uid != stored.get("uid"):
        return (f"{label}: metadata.uid {uid} is not the uid of the stored object ({stored.get('uid')}): "
                "it was deleted and created again since the document was read; get it again and "
                "re-apply your change, or remove metadata.uid (and metadata.resourceVersion)")
    if version is not None and version != stored.get("resourceVersion"):
        return (f"{label}: the object has been modified since resourceVersion {version} was read (it is "
                f"now at {stored.get('resourceVersion')}); get it again and re-apply your change, or "
                "remove metadata.resourceVersion to overwrite the current version")
    return None


def _conflict(stale: list[tuple[Document, str]]) -> errors.Conflict:
    more = f" (and {len(stale) - 1} more, see details.causes)" if len(stale) > 1 else ""
    # The field names the document; the message need not say it again.
    causes = [Cause(_prefixed(doc.label(), "metadata"), why.removeprefix(f"{doc.label()}: "), "FieldValueInvalid")
              for doc, why in stale]
    first = stale[0][0]
    return errors.Conflict(f"{stale[0][1]}{more}; nothing was applied", kind=first.obj.get("kind"),
                           name=display_name(first.obj), causes=causes)


def _batch_invalid(failures: list[tuple[Document, errors.Invalid]], docs: list[Document], *,
                   mode: Mode) -> errors.Invalid:
    done = "applied" if mode == "apply" else "created"
    causes: list[Cause] = []
    details: list[dict[str, Any]] = []
    for doc, exc in failures:
        own = exc.causes or [Cause("", exc.message)]
        causes += [Cause(_prefixed(doc.label(), c.field), c.message, c.reason) for c in own]
        details.append(_detail(doc, exc, own))
    invalid_docs = len({(doc.source, doc.index) for doc, _ in failures})
    total = _document_count(docs)
    noun = "document" if total == 1 else "documents"
    verb = "is" if invalid_docs == 1 else "are"
    return errors.Invalid(f"{invalid_docs} of {total} {noun} {verb} invalid; nothing was {done}",
                          causes=causes, extra={"documents": details})


def _document_count(docs: list[Document]) -> int:
    """Documents as ``documents[i]`` numbers them: per source, up to the last one with an object."""
    last: dict[str, int] = {}
    for doc in docs:
        last[doc.source] = max(last.get(doc.source, -1), doc.index)
    return sum(index + 1 for index in last.values())


def _prefixed(label: str, path: str) -> str:
    if not path:
        return label
    return f"{label}{path}" if path.startswith("[") else f"{label}.{path}"


def _detail(doc: Document, exc: errors.Invalid, causes: list[Cause]) -> dict[str, Any]:
    metadata = doc.obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    detail = {"index": doc.index, "item": doc.item, "source": doc.source, "line": doc.line,
              "kind": doc.obj.get("kind"), "name": name, "message": exc.message,
              "causes": [c.to_dict() for c in causes]}
    return {k: v for k, v in detail.items() if v is not None}


# --- single objects (the HTTP server) ------------------------------------------------------------

def create_object(
    store: Store, kind: KindInfo, obj: Obj, *, namespace: str | None, dry_run: bool = False,
    options: AdmissionOptions | None = None, track: Tracker | None = None,
) -> tuple[Obj, list[str]]:
    """POST: admit and create one object (``generateName`` honoured). Returns it and warnings.
    What admission checks without the store is checked before the write transaction opens
    (``validation.check``)."""
    obj = _identified(kind, obj, namespace=namespace, name=None)
    checked: Checked | None = None

    def body(writer: Writer) -> tuple[Obj, list[str]]:
        admitted = _admit_with(writer, obj, old=None, options=options or DEFAULT_OPTIONS,
                               extra=list(_batch_rules(_single(obj), "create", None, None)), checked=checked)
        created = _create(writer, kind, track(None, obj, admitted.obj) if track else admitted.obj, None)
        warned = policies.enforce(writer, StoreSource(writer), kind, created, None,
                                  name=created["metadata"]["name"])
        return created, [*admitted.warnings, *warned]

    with tracing.object_span("joch.create", obj):
        checked = check(obj, options=options or DEFAULT_OPTIONS)
        return _run(store, dry_run, body)


def update_object(
    store: Store, kind: KindInfo, obj: Obj, *, namespace: str | None, name: str,
    dry_run: bool = False, options: AdmissionOptions | None = None, track: Tracker | None = None,
) -> tuple[Obj, list[str]]:
    """PUT: replace user metadata and spec of an existing object; ``metadata.resourceVersion`` in
    the body is a precondition. Name and namespace in the body must match the URL's."""
    obj = _identified(kind, obj, namespace=namespace, name=name)
    with tracing.span("joch.update", kind=kind.kind, namespace=namespace, name=name):
        return _run(store, dry_run, lambda w: _replace(w, kind, obj, namespace, name, options, track))


def patch_object(
    store: Store, kind: KindInfo, namespace: str | None, name: str, patch: Obj, *,
    dry_run: bool = False, options: AdmissionOptions | None = None, attempts: int = PATCH_ATTEMPTS,
    track: Tracker | None = None,
) -> tuple[Obj, list[str]]:
    """PATCH (merge patch, RFC 7386) through admission; retried on ``Conflict`` unless the patch
    names a ``resourceVersion`` of its own."""
    if not isinstance(patch, dict):
        raise errors.BadRequest("a merge patch must be a JSON object")
    metadata = patch.get("metadata")
    pinned = isinstance(metadata, dict) and bool(metadata.get("resourceVersion"))
    return change_object(store, kind, namespace, name, lambda current: merge_patch(current, patch),
                         pinned=pinned, dry_run=dry_run, options=options, attempts=attempts, track=track)


def change_object(
    store: Store, kind: KindInfo, namespace: str | None, name: str, change: Callable[[Obj], Obj], *,
    pinned: bool, dry_run: bool = False, options: AdmissionOptions | None = None, attempts: int = PATCH_ATTEMPTS,
    track: Tracker | None = None,
) -> tuple[Obj, list[str]]:
    """Any patch (``change`` maps the stored object to the desired one) through admission, written
    over the version read; retried on ``Conflict`` unless the patch is ``pinned`` to a version."""
    attempt = 0
    with tracing.span("joch.patch", kind=kind.kind, namespace=namespace, name=name):
        while True:
            attempt += 1
            try:
                return _run(store, dry_run, lambda w: _patch(w, kind, namespace, name, change, options, track))
            except errors.Conflict:
                if pinned or attempt >= attempts:
                    raise


def update_status(
    store: Store, kind: KindInfo, obj: Obj, *, namespace: str | None, name: str, dry_run: bool = False,
    track: Tracker | None = None,
) -> Obj:
    """PUT on the status subresource: validate ``obj["status"]`` and write only the status;
    ``metadata.resourceVersion`` in the body is a precondition."""
    obj = _identified(kind, obj, namespace=namespace, name=name)
    status = validate_status(kind, obj)
    version = (obj.get("metadata") or {}).get("resourceVersion")
    if isinstance(version, str) and version and not (version.isascii() and version.isdigit()):
        raise invalid(kind, name, [Cause("metadata.resourceVersion", f'"{version}" is not a resourceVersion: '
                                         'it must be the decimal revision the server returned (e.g. "42")')])

    def body(writer: Writer) -> Obj:
        current = writer.get(kind, namespace, name)
        metadata = {**current["metadata"], "resourceVersion": version or current["metadata"]["resourceVersion"]}
        target = {**current, "metadata": metadata, "status": namespaces.check_phase(kind, current, status)}
        return writer.update_status(kind, track(current, obj, target) if track else target)

    with tracing.span("joch.update_status", kind=kind.kind, namespace=namespace, name=name):
        return _run(store, dry_run, body)


def _replace(
    writer: Writer, kind: KindInfo, obj: Obj, namespace: str | None, name: str,
    options: AdmissionOptions | None, track: Tracker | None = None,
) -> tuple[Obj, list[str]]:
    old = writer.get(kind, namespace, name)
    admitted = admit(writer, obj, old=old, options=options or DEFAULT_OPTIONS)
    updated = _update(writer, kind, old, track(old, obj, admitted.obj) if track else admitted.obj, always=True)
    warned = policies.enforce(writer, StoreSource(writer), kind, updated, old, name=name)
    return updated, [*admitted.warnings, *warned]


def _patch(
    writer: Writer, kind: KindInfo, namespace: str | None, name: str, change: Callable[[Obj], Obj],
    options: AdmissionOptions | None, track: Tracker | None = None,
) -> tuple[Obj, list[str]]:
    current = writer.get(kind, namespace, name)
    merged = _identified(kind, change(current), namespace=namespace, name=name)
    return _replace(writer, kind, merged, namespace, name, options, track)


def _identified(kind: KindInfo, obj: Obj, *, namespace: str | None, name: str | None) -> Obj:
    """A copy of ``obj`` that names what the URL names (filled in where the body is silent)."""
    if not isinstance(obj, dict):
        raise errors.BadRequest(f"the body must be a {kind.kind} object")
    out = dict(obj)
    for key, expected in (("apiVersion", kind.api_version), ("kind", kind.kind)):
        value = out.setdefault(key, expected)
        if value != expected:
            raise errors.BadRequest(f"the body's {key} {value!r} does not match the URL, which serves "
                                    f"{expected!r}", kind=kind.plural, name=name)
    given = out.get("metadata")
    metadata = dict(given) if isinstance(given, dict) else {}
    for key, wanted in (("namespace", namespace if kind.namespaced else None), ("name", name)):
        if wanted is None:
            continue
        if metadata.get(key) in (None, ""):  # absent or empty: the URL says it (as Kubernetes does)
            metadata[key] = wanted
        given_value = metadata[key]
        if given_value != wanted:
            raise errors.BadRequest(f"the {key} of the provided object ({given_value!r}) does not match "
                                    f"the {key} in the URL ({wanted!r})", kind=kind.plural, name=name)
    if isinstance(given, dict) or given is None:
        out["metadata"] = metadata
    return out
