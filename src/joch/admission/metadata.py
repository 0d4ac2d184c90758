"""Validation and normalization of ``metadata``, with Kubernetes' own rules.

Names are DNS-1123 subdomains (at most 253 characters), namespaces DNS-1123 labels; label and
annotation keys are qualified names (``prefix/name``), label values at most 63 characters of the
same alphabet, and annotations together at most 256 KiB — the limits ``kubectl`` users already know.

``normalize_metadata`` keeps only the fields a user owns (name, generateName, namespace, labels,
annotations, finalizers, ownerReferences). Server-owned fields (uid, resourceVersion, generation,
timestamps, managedFields) in the input are not kept here: the store sets them, and the callers
use a ``resourceVersion`` or ``uid`` the input carries as a precondition. A ``resourceVersion``
must therefore look like one (a decimal revision): anything else is a mistake to report, not a
precondition that fails with a 409.

``envelope_causes`` is the part of this a request body must pass before anything reads it: the
identity fields (``apiVersion``, ``kind``, and the strings of ``metadata`` that name the object and
its version) have their types, and ``metadata`` is a mapping. The server checks it where it parses
every object body, so a handler never indexes into a list where a mapping belongs; everything
else is left to admission, which reports every problem at once.

An invalid name gets a suggestion only when one can be made that is itself valid (``a..b`` →
``a-b``, ``Ünïcode`` → ``unicode``); otherwise the rule alone is stated. A namespaced object without a namespace
gets ``default``; a cluster-scoped object must not name one. Empty maps and lists are dropped so an
object with ``labels: {}`` and one without labels are the same object.
"""

from __future__ import annotations

import copy
import re
import unicodedata
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from joch.admission.diagnostics import causes_from_validation, clip, format_path
from joch.admission.documents import RawScalars
from joch.api.errors import Cause
from joch.api.meta import DEFAULT_NAMESPACE, DNS1123_LABEL, DNS1123_SUBDOMAIN, ObjectMeta, Str
from joch.api.registry import KindInfo

USER_FIELDS = ("name", "generateName", "namespace", "labels", "annotations", "finalizers",
               "ownerReferences")
MAX_ANNOTATIONS_BYTES = 256 * 1024

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SUBDOMAIN_RULE = ("a lowercase RFC 1123 subdomain: lowercase letters, digits, '-' and '.', "
                   "starting and ending with a letter or digit, at most 253 characters")
_LABEL_RULE = ("a lowercase RFC 1123 label: lowercase letters, digits and '-', "
               "starting and ending with a letter or digit, at most 63 characters")
_QUALIFIED_RULE = ("a qualified name: an optional DNS subdomain prefix and '/', then at most 63 "
                   "letters, digits, '-', '_' or '.', starting and ending with a letter or digit")


class _Identity(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: Str | None = None
    generateName: Str | None = None
    namespace: Str | None = None
    uid: Str | None = None
    resourceVersion: Str | None = None


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="ignore")

    apiVersion: Str | None = None
    kind: Str | None = None
    metadata: _Identity | None = None


def envelope_causes(obj: dict[str, Any], *, raw: RawScalars | None = None) -> list[Cause]:
    """Problems with the types of ``obj``'s identity fields (module docstring); [] when usable."""
    try:
        _Envelope.model_validate(obj)
    except ValidationError as exc:
        return causes_from_validation(exc, model=_Envelope, prefix=(), raw=raw or RawScalars(), given=obj)
    return []


def normalize_metadata(
    kind: KindInfo, value: Any, *, raw: RawScalars
) -> tuple[dict[str, Any], list[Cause]]:
    """The user-owned metadata, defaulted, and every problem with it."""
    causes: list[Cause] = []
    try:
        ObjectMeta.model_validate({} if value is None else value)
    except ValidationError as exc:
        causes.extend(causes_from_validation(exc, model=ObjectMeta, prefix=("metadata",), raw=raw,
                                             given=value))
    m: dict[str, Any] = value if isinstance(value, dict) else {}
    causes.extend(_rules(kind, m))
    out = {k: _copied(m[k]) for k in USER_FIELDS if m.get(k) not in (None, "", [], {})}
    if kind.namespaced:
        out["namespace"] = out.get("namespace") or DEFAULT_NAMESPACE
    else:
        out.pop("namespace", None)
    return out, causes


def _copied(value: Any) -> Any:
    """``copy.deepcopy`` of ``value``, quicker for what metadata holds: plain strings, maps and
    lists (anything else is deep-copied)."""
    kind = type(value)
    if kind is str or value is None or kind is int or kind is bool or kind is float:
        return value
    if kind is dict:
        return {k: _copied(v) for k, v in value.items()}
    if kind is list:
        return [_copied(v) for v in value]
    return copy.deepcopy(value)


def _rules(kind: KindInfo, m: dict[str, Any]) -> Iterator[Cause]:
    name, generate = m.get("name"), m.get("generateName")
    if not name and not generate:
        yield Cause("metadata.name", "required field is missing; set metadata.name "
                    "(or metadata.generateName to have a name generated)", "FieldValueRequired")
    if isinstance(name, str) and name and (kind.group, kind.plural) == ("", "namespaces"):
        # A Namespace's name is what objects put in metadata.namespace (and its kubernetes.io/
        # metadata.name label): a DNS-1123 label, as the apiserver has it, not a subdomain.
        problem = namespace_problem(name)
        if problem:
            yield Cause("metadata.name", problem.replace("is not a valid namespace", "is not a valid Namespace name"))
    elif isinstance(name, str) and name:
        yield from _subdomain("metadata.name", name, name)
    if isinstance(generate, str) and generate:
        # the generated suffix follows the prefix, so a trailing '-' is fine
        masked = generate[:-1] + "a" if generate.endswith("-") else generate
        yield from _subdomain("metadata.generateName", masked, generate)
    yield from _namespace(kind, m.get("namespace"))
    yield from _resource_version(m.get("resourceVersion"))
    yield from _labels(m.get("labels"))
    yield from _annotations(m.get("annotations"))
    yield from _finalizers(m.get("finalizers"))


def namespace_problem(value: str) -> str | None:
    """Why ``value`` is not a valid namespace, or None when it is."""
    if len(value) <= 63 and DNS1123_LABEL.match(value):
        return None
    suggestion = _suggest(value, label=True)
    example = f' (e.g. "{suggestion}")' if suggestion else ""
    return f'"{clip(value)}" is not a valid namespace: it must be {_LABEL_RULE}{example}'


def _subdomain(field: str, value: str, shown: str) -> Iterator[Cause]:
    if len(value) > 253 or not DNS1123_SUBDOMAIN.match(value):
        suggestion = _suggest(shown)
        if suggestion and shown.endswith("-") and value != shown:  # a generateName prefix
            suggestion += "-"
        example = f' (e.g. "{suggestion}")' if suggestion else ""
        yield Cause(field, f'"{clip(shown)}" is not a valid name: it must be {_SUBDOMAIN_RULE}{example}')


def _namespace(kind: KindInfo, value: Any) -> Iterator[Cause]:
    if not isinstance(value, str) or not value:
        return
    if not kind.namespaced:
        yield Cause("metadata.namespace",
                    f"{kind.kind} is cluster-scoped; remove metadata.namespace (got \"{clip(value)}\")",
                    "FieldValueForbidden")
        return
    problem = namespace_problem(value)
    if problem:
        yield Cause("metadata.namespace", problem)


def _resource_version(value: Any) -> Iterator[Cause]:
    if isinstance(value, str) and value and not (value.isascii() and value.isdigit()):
        yield Cause("metadata.resourceVersion",
                    f'"{clip(value)}" is not a resourceVersion: it must be the decimal revision the server '
                    'returned (e.g. "42"); remove it to write without a precondition')


def _labels(labels: Any) -> Iterator[Cause]:
    if not isinstance(labels, dict):
        return
    for key, value in labels.items():
        if not isinstance(key, str):
            continue  # reported by the scan for YAML traps
        path = format_path(("metadata", "labels", key))
        yield from _qualified(path, key)
        if isinstance(value, str) and value and (len(value) > 63 or not _QUALIFIED_NAME.match(value)):
            yield Cause(path, f'"{clip(value)}" is not a valid label value: it must be empty or at most 63 '
                        "letters, digits, '-', '_' or '.', starting and ending with a letter or digit")


def _annotations(annotations: Any) -> Iterator[Cause]:
    if not isinstance(annotations, dict):
        return
    size = 0
    for key, value in annotations.items():
        if isinstance(key, str):
            yield from _qualified(format_path(("metadata", "annotations", key)), key)
            size += len(key.encode())
        if isinstance(value, str):
            size += len(value.encode())
    if size > MAX_ANNOTATIONS_BYTES:
        yield Cause("metadata.annotations", f"annotations take {size} bytes; the limit is "
                    f"{MAX_ANNOTATIONS_BYTES} bytes (256 KiB)", "FieldValueTooLong")


def _finalizers(finalizers: Any) -> Iterator[Cause]:
    if not isinstance(finalizers, list):
        return
    for i, value in enumerate(finalizers):
        if isinstance(value, str):
            yield from _qualified(format_path(("metadata", "finalizers", i)), value)


def _qualified(field: str, key: str) -> Iterator[Cause]:
    prefix, slash, name = key.rpartition("/")
    bad_prefix = slash and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix))
    if bad_prefix or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        yield Cause(field, f'"{clip(key)}" is not valid: it must be {_QUALIFIED_RULE}')


def _suggest(value: str, *, label: bool = False) -> str | None:
    """A valid name (or namespace, with ``label``) close to ``value``, or None when there is none."""
    ascii_text = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode().lower()
    limit = 63 if label else 253
    if label:
        ascii_text = ascii_text.replace(".", "-")
    parts = [re.sub(r"[^a-z0-9]+", "-", part).strip("-") for part in ascii_text.split(".")]
    candidate = ".".join(p for p in parts if p)[:limit]
    candidate = re.sub(r"[-.]+$", "", candidate)
    pattern = DNS1123_LABEL if label else DNS1123_SUBDOMAIN
    if not candidate or candidate == value or not pattern.match(candidate):
        return None
    return candidate
