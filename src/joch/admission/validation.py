"""Admission of one object: schema, defaults, limits and references, every problem at once.

``admit`` turns what a user sent into what the store keeps, or raises one ``errors.Invalid`` whose
causes list *every* problem, each at a dotted field path (``spec.agentRef.name``,
``spec.argsTemplate[2]``, ``metadata.name``). The message is Kubernetes-shaped:
``AgentRun.runtime.joch.dev "fix-1" is invalid: spec.agentRef.name: ...``.

Design decisions:

* Never coerce. The pydantic models use strict scalars, and ``diagnostics`` explains the YAML 1.1
  traps (``on``, ``yes``, ``1.10``, unquoted dates, non-string keys) instead of fixing them.
* The stored spec is ``model_dump(mode="json", exclude_none=True)`` of the validated model with
  the empty list/map defaults the user did not write pruned, so ``get -o yaml`` shows what the user
  wrote plus the scalar defaults that matter (``defaults.timeoutSeconds: 3600``,
  ``runtime.type: local``). The result is a pure function of the input: same input, same dict.
* ``status`` in the input is ignored (it is written through the status subresource) and the old
  status is kept as it is: status belongs to controllers (see ``references`` for why admission
  does not write ``ReferencesResolved`` either). The one exception is a new object's
  ``KindInfo.initial_phase`` (an AgentRun starts ``Pending``), defaulted like the apiserver
  defaults a new Pod's phase, so no reader ever sees a run without a phase.
* Size limits are part of validation and reported as causes with the limit and the size:
  implementation text (UTF-8 bytes) and the whole object (compact JSON bytes).
* A ``metadata.resourceVersion`` or ``metadata.uid`` in the input is passed through on the admitted
  object so callers use it as an update precondition (the store checks both); other server-owned
  metadata is taken from ``old``.
* Rules beyond a spec's schema (``kinds.CheckedSpec.problems``: unique Policy rule names, selector
  kinds the registry knows) run once the schema passes, and report at their own paths; so does
  the compilation of a Policy's CEL expressions (``policies.rule_causes``).
* A kind registered with ``body="top"`` (``KindInfo.body``; a RoleBinding) has its spec model's
  fields as top-level keys, as in Kubernetes: its causes are at ``roleRef.name``, not
  ``spec.roleRef.name``, a ``spec`` key is refused with the fix (move the fields up), and it has no
  ``status`` unless the kind declares one. Every other kind takes the plain ``spec`` path.
* ``apiVersion: joch.dev/v2`` with a kind that exists in another version is a problem with the
  ``apiVersion`` and is reported there; a kind unknown in a known apiVersion is reported at ``kind``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from joch.admission import diagnostics, namespaces, policies
from joch.admission.documents import RawScalars
from joch.admission.metadata import normalize_metadata
from joch.admission.provenance import stamp
from joch.admission.references import Pending, check_references
from joch.admission.uniqueness import check_idempotency, check_one_approval
from joch.api import errors
from joch.api.errors import Cause
from joch.api.kinds import CheckedSpec
from joch.api.meta import dig
from joch.api.registry import REGISTRY, KindInfo
from joch.store.base import Writer
from joch.telemetry import tracing

TOP_LEVEL = ("apiVersion", "kind", "metadata", "spec", "status")
SERVER_OWNED = ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                "deletionGracePeriodSeconds")
_TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "joch.dev/ImplementationSpec": ("spec.text",),
    "runtime.joch.dev/AgentRun": ("spec.implementation.inline.text",),
}
_MISSING = object()


@dataclass(frozen=True)
class AdmissionOptions:
    max_implementation_text_bytes: int = 256 * 1024
    max_object_bytes: int = 1_500_000


DEFAULT_OPTIONS = AdmissionOptions()


@dataclass
class Admitted:
    kind: KindInfo
    obj: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str | None:
        name = self.obj["metadata"].get("name")
        return name if isinstance(name, str) else None

    @property
    def namespace(self) -> str | None:
        namespace = self.obj["metadata"].get("namespace")
        return namespace if isinstance(namespace, str) else None


@dataclass
class Checked:
    """What admission finds in an object without reading the store: its kind, its normalized
    metadata and spec, and their problems. ``check`` makes it before a write transaction opens, so
    that the pydantic validation, defaulting and metadata rules of a create (about half of its
    admission) do not hold the store's write lock, which another server process may be waiting for
    (``joch server --workers``). ``admit`` uses it once, for the very object it was made from."""

    source: dict[str, Any]
    kind: KindInfo
    metadata: dict[str, Any]
    spec: dict[str, Any]
    causes: list[Cause]
    scanned: diagnostics.Scan


def check(obj: dict[str, Any], *, options: AdmissionOptions = DEFAULT_OPTIONS,
          raw: RawScalars | None = None) -> Checked:
    """The store-free part of ``admit`` (see ``Checked``); ``errors.Invalid`` for an unknown kind."""
    raw = raw or RawScalars()
    kind = resolve_kind(obj)
    metadata, causes = normalize_metadata(kind, obj.get("metadata"), raw=raw)
    spec, spec_causes = _spec(kind, obj, raw)
    return Checked(source=obj, kind=kind, metadata=metadata, spec=spec,
                   causes=[*_top_level(kind, obj), *causes, *spec_causes, *_sizes(kind, obj, options)],
                   scanned=diagnostics.scan(obj, raw=raw))


def admit(
    reader: Writer, obj: dict[str, Any], *, old: dict[str, Any] | None,
    options: AdmissionOptions = DEFAULT_OPTIONS, pending: Pending = frozenset(),
    raw: RawScalars | None = None, checked: Checked | None = None,
) -> Admitted:
    """Validate and default ``obj`` (``old`` is the stored object on update, None on create).

    ``reader`` resolves references (a store, or the writer of an open transaction); ``pending``
    names objects written in the same batch; ``raw`` is the YAML source text of typed scalars
    (``Document.raw``) so messages quote what the user wrote; ``checked`` is ``check(obj)`` made
    beforehand, outside the transaction.
    """
    with tracing.object_span("joch.admission.validate", obj):
        return _admit(reader, obj, old=old, options=options, pending=pending, raw=raw, checked=checked)


def _admit(
    reader: Writer, obj: dict[str, Any], *, old: dict[str, Any] | None, options: AdmissionOptions,
    pending: Pending, raw: RawScalars | None, checked: Checked | None,
) -> Admitted:
    if checked is None or checked.source is not obj:
        checked = check(obj, options=options, raw=raw)
    kind, metadata, spec = checked.kind, checked.metadata, checked.spec
    refs = check_references(reader, kind, obj, namespace=metadata.get("namespace"), old=old,
                            pending=pending)
    causes = [*checked.causes, *refs.causes]
    if not causes:
        causes = stamp(kind, metadata, spec, old)
    if not causes:
        causes = [*check_idempotency(reader, kind, obj, metadata, old),
                  *check_one_approval(reader, kind, spec, metadata, old)]
    causes = _merge(checked.scanned, causes)
    if causes:
        raise invalid(kind, display_name(obj), _without_values(kind, causes))
    if old is None:
        namespaces.check_exists(reader, kind, metadata.get("namespace"), pending)
    metadata = namespaces.with_name_label(kind, metadata)
    out = kind.with_body({"apiVersion": kind.api_version, "kind": kind.kind,
                          "metadata": _with_server_fields(metadata, obj, old)}, spec)
    status = _status(old) if old is not None else _initial_status(kind)
    if status and kind.status_model is not None:
        out["status"] = status
    return Admitted(kind=kind, obj=out, warnings=refs.warnings)


def validate_status(kind: KindInfo, obj: dict[str, Any]) -> dict[str, Any]:
    """The normalized ``status`` of ``obj`` (for the status subresource), or ``errors.Invalid``."""
    if kind.status_model is None:
        raise invalid(kind, display_name(obj), [Cause("status", f"a {kind.kind} has no status",
                                                      "FieldValueForbidden")])
    given = obj.get("status")
    given = {} if given is None else given
    causes: list[Cause] = []
    status: dict[str, Any] = {}
    try:
        model = kind.status_model.model_validate(given)
        status = prune_defaults(_dump(model), given)
    except ValidationError as exc:
        causes = diagnostics.causes_from_validation(
            exc, model=kind.status_model, prefix=("status",), raw=RawScalars(), given=given)
    causes = _merge(diagnostics.scan({"status": given}, raw=RawScalars()), causes)
    if causes:
        raise invalid(kind, display_name(obj), causes)
    return status


def resolve_kind(obj: Any) -> KindInfo:
    """The registered kind of ``obj``, or ``errors.Invalid`` at ``apiVersion``/``kind``."""
    if not isinstance(obj, dict):
        raise errors.Invalid(f"an object must be a mapping, got {diagnostics.show(obj)}",
                             causes=[Cause("", "expected a mapping with apiVersion and kind")])
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str) or not api_version or not kind:
        causes = [*_required_string("apiVersion", api_version), *_required_string("kind", kind)]
        raise errors.Invalid("the object has no usable apiVersion and kind", causes=causes)
    try:
        return REGISTRY.for_object(api_version, kind)
    except errors.NotFound as exc:
        message = exc.message if "did you mean" in exc.message else exc.message + _kind_hint(
            api_version, kind)
        known_version = any(i.api_version == api_version for i in REGISTRY)
        known_kind = any(i.kind == kind for i in REGISTRY)
        field_name = "apiVersion" if known_kind or not known_version else "kind"
        raise errors.Invalid(message, kind=kind,
                             causes=[Cause(field_name, message, "FieldValueNotSupported")]) from exc


def invalid(kind: KindInfo, name: str, causes: list[Cause]) -> errors.Invalid:
    shown = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    summary = shown[0] if len(shown) == 1 else "[" + ", ".join(shown) + "]"
    qualified = f"{kind.kind}.{kind.group}" if kind.group else kind.kind  # the core group: Namespace "x"
    return errors.Invalid(f'{qualified} "{name}" is invalid: {summary}',
                          kind=kind.kind, name=name, causes=causes)


def display_name(obj: dict[str, Any]) -> str:
    """The name messages use: ``name``, ``generateName*``, or ``<unnamed>``."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        if isinstance(metadata.get("name"), str) and metadata["name"]:
            return str(metadata["name"])
        if isinstance(metadata.get("generateName"), str) and metadata["generateName"]:
            return f"{metadata['generateName']}*"
    return "<unnamed>"


def prune_defaults(dumped: Any, given: Any) -> Any:
    """``dumped`` without the empty lists and maps that are not in ``given`` (the user's input)."""
    if isinstance(dumped, dict):
        return _prune_map(dumped, given)
    if isinstance(dumped, list):
        return _prune_list(dumped, given)
    return dumped


def _prune_map(dumped: dict[str, Any], given: Any) -> dict[str, Any]:
    # prune_defaults unrolled for the scalars that make up most of a spec: a call per container, not
    # per value (this runs on every write).
    written_map = given if isinstance(given, dict) else None
    out: dict[str, Any] = {}
    for key, value in dumped.items():
        written = _MISSING if written_map is None else written_map.get(key, _MISSING)
        if isinstance(value, dict):
            value = _prune_map(value, written)
            if not value and written is _MISSING:
                continue
        elif isinstance(value, list):
            value = _prune_list(value, written)
            if not value and written is _MISSING:
                continue
        out[key] = value
    return out


def _prune_list(dumped: list[Any], given: Any) -> list[Any]:
    items = given if isinstance(given, list) else []
    return [prune_defaults(v, items[i] if i < len(items) else _MISSING) for i, v in enumerate(dumped)]


# --- pieces --------------------------------------------------------------------------------------

def _spec(kind: KindInfo, obj: dict[str, Any], raw: RawScalars) -> tuple[dict[str, Any], list[Cause]]:
    if kind.body == "spec":
        given = obj.get("spec")
        if given is None:
            if kind.spec_required:
                return {}, [Cause("spec", "required field is missing", "FieldValueRequired")]
            given = {}
    else:  # the fields are top-level keys; unknown ones are _top_level's
        given = {k: obj[k] for k in kind.body_fields if k in obj}
        if not given and "spec" in obj:  # written under spec: _top_level's one cause says to move them
            return {}, []
    prefix = kind.body_prefix
    try:
        model = kind.spec_model.model_validate(given)
    except ValidationError as exc:
        return {}, diagnostics.causes_from_validation(exc, model=kind.spec_model, prefix=prefix,
                                                      raw=raw, given=given)
    if isinstance(model, CheckedSpec):
        problems = [Cause(diagnostics.format_path((*prefix, *path)), message, reason)
                    for path, message, reason in model.problems()]
        problems += policies.rule_causes(kind, given)
        if problems:
            return {}, problems
    spec: dict[str, Any] = prune_defaults(_dump(model), given)
    return spec, []


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True, by_alias=True)


def _top_level(kind: KindInfo, obj: dict[str, Any]) -> Iterator[Cause]:
    """Unknown top-level keys. A field of the kind's spec written at the top (a Kubernetes
    Secret's ``stringData`` and ``data`` are top-level there) is pointed to its place in ``spec``;
    for a ``body="top"`` kind, a ``spec`` is pointed to the top level."""
    if kind.body == "top":
        yield from _top_level_flat(kind, obj)
        return
    for key in obj:
        if isinstance(key, str) and key not in TOP_LEVEL:
            match = _top_level_match(key, diagnostics.fields_of(kind.spec_model))
            hint = f'; did you mean "{match}"?' if match else ""
            yield Cause(diagnostics.format_path((key,)), f'unknown field "{key}"{hint}')


def _top_level_flat(kind: KindInfo, obj: dict[str, Any]) -> Iterator[Cause]:
    allowed = kind.top_level
    fields = ", ".join(kind.body_fields)
    for key in obj:
        if not isinstance(key, str) or key in allowed:
            continue
        if key == "spec":
            yield Cause("spec", f'unknown field "spec"; a {kind.kind} has no spec: write {fields} at the top '
                        f"level of the object, as in Kubernetes (move them out of spec)", "FieldValueForbidden")
        elif key == "status":
            yield Cause("status", f'unknown field "status"; a {kind.kind} has no status', "FieldValueForbidden")
        else:
            match = diagnostics.closest(key, allowed)
            hint = f'; did you mean "{match}"?' if match else f"; a {kind.kind} has {', '.join(allowed)}"
            yield Cause(diagnostics.format_path((key,)), f'unknown field "{key}"{hint}')


def _top_level_match(key: str, spec_fields: list[str]) -> str | None:
    """A spec field of that name, else the closest top-level field, else the closest spec field."""
    exact = next((f for f in spec_fields if f.lower() == key.lower()), None)
    if exact:
        return f"spec.{exact}"
    near = diagnostics.closest(key, TOP_LEVEL) or diagnostics.closest(key, spec_fields)
    return near if near in TOP_LEVEL or near is None else f"spec.{near}"


def _sizes(kind: KindInfo, obj: dict[str, Any], options: AdmissionOptions) -> Iterator[Cause]:
    limit = options.max_implementation_text_bytes
    for path in _TEXT_FIELDS.get(kind.key, ()):
        text = dig(obj, path)
        size = len(text.encode()) if isinstance(text, str) else 0
        if size > limit:
            yield Cause(path, f"is {size} bytes of UTF-8; the limit is {limit} bytes ({_kib(limit)}) — "
                        "keep long material in the repository and point to it", "FieldValueTooLong")
    body = {k: v for k, v in obj.items() if k != "status"}
    size = len(json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=str,
                          skipkeys=True).encode())
    if size > options.max_object_bytes:
        yield Cause("", f"the object is {size} bytes as JSON; the limit is {options.max_object_bytes} "
                    "bytes", "RequestEntityTooLarge")


def _kib(n: int) -> str:
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} bytes"


def _with_server_fields(
    metadata: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None
) -> dict[str, Any]:
    given = obj.get("metadata")
    given = given if isinstance(given, dict) else {}
    out = dict(metadata)
    if old is not None:
        out.update({k: v for k, v in old.get("metadata", {}).items() if k in SERVER_OWNED})
    for precondition in ("resourceVersion", "uid"):
        value = given.get(precondition)
        if isinstance(value, str) and value:
            out[precondition] = value
    return out


def _without_values(kind: KindInfo, causes: list[Cause]) -> list[Cause]:
    """A kind with sensitive fields (a Secret) gets no value quoted back: a cause about a value's
    type there (which would say ``got number 98765432``) says what to do without it. Errors are
    answered, logged and audited, and a Secret value must be in none of them."""
    if not kind.sensitive:
        return causes
    roots = tuple(path.rsplit(".", 1)[0] + "." + leaf for path in kind.sensitive
                  for leaf in (path.rsplit(".", 1)[-1], "stringData"))
    out = []
    for cause in causes:
        if cause.field.startswith(roots) and cause.reason != "FieldValueInvalid":
            cause = Cause(cause.field, "must be a string: quote the value in YAML (it is not shown here, since it "
                          "is secret)", cause.reason)
        elif cause.field.startswith(roots) and diagnostics.NUL_PROBLEM in cause.message:  # it quotes the value
            cause = Cause(cause.field, f"the value {diagnostics.NUL_PROBLEM} (it is not shown here, since it is "
                          "secret)", cause.reason)
        out.append(cause)
    return out


def _status(old: dict[str, Any] | None) -> dict[str, Any]:
    status: dict[str, Any] = copy.deepcopy((old or {}).get("status") or {})
    return status


def _initial_status(kind: KindInfo) -> dict[str, Any]:
    return {"phase": kind.initial_phase} if kind.initial_phase else {}


def _required_string(field_name: str, value: Any) -> list[Cause]:
    if value is None or value == "":
        return [Cause(field_name, "required field is missing", "FieldValueRequired")]
    if not isinstance(value, str):
        return [Cause(field_name, f"expected a string, got {diagnostics.show(value)}",
                      "FieldValueTypeInvalid")]
    return []


def _kind_hint(api_version: str, kind: str) -> str:
    known = [i.kind for i in REGISTRY if i.api_version == api_version]
    match = diagnostics.closest(kind, known)
    if match:
        return f'; did you mean kind: {match}?'
    if known:
        return f"; {api_version} has: {', '.join(sorted(known))}"
    groups = sorted({i.api_version for i in REGISTRY})
    return f"; known apiVersions: {', '.join(groups)}"


def _merge(scanned: diagnostics.Scan, causes: list[Cause]) -> list[Cause]:
    """``scan``'s causes first; other causes at a value it reported, and repeats, dropped."""
    out = list(scanned.causes)
    for cause in causes:
        if cause.field not in scanned.value_fields and cause not in out:
            out.append(cause)
    return out
