"""Structural OpenAPI v3 schemas of whole objects, derived from the registry's pydantic models.

One schema per kind serves three readers: the server's ``/openapi/v3`` documents (what ``kubectl
explain`` reads), the generated CustomResourceDefinitions (``joch.api.crds``) and ``joch explain``.
Each is *structural* in Kubernetes' sense (apiextensions.k8s.io/v1), because a CRD must be and
because one shape for all three keeps them from drifting apart:

* every node states its ``type``; ``$ref``s are inlined (no reference leaves this module);
* ``Optional[X]`` is ``X`` with ``nullable: true``; a union of ``number`` and ``integer`` is a
  ``number``; any other union (a string *or* an object, as an ``argsTemplate`` item) has no type a
  structural schema can state, so it is ``x-kubernetes-preserve-unknown-fields: true`` and its
  description says what it may be — as is a free-form field (``dict[str, Any]``, ``Any``);
* ``additionalProperties: false`` (pydantic's ``extra="forbid"``) is left out: a structural schema
  cannot combine it with ``properties``, and unknown fields are what Kubernetes prunes and
  ``fieldValidation=Strict`` reports;
* only scalar defaults are kept (``default: null`` says nothing, and an object default would be
  applied by the apiserver where pydantic leaves the field absent);
* ``metadata`` is a plain ``object`` (a CRD may say nothing else about it, not even a description);
  ``object_meta_schema`` is its full shape for documents that may.

Some rules admission checks in code (``CheckedSpec.problems``) a schema can state too: unique names
of a list (``x-kubernetes-list-type: map``), a pattern, a CEL rule
(``x-kubernetes-validations``). ``EXTENSIONS`` adds them per kind and path; admission still checks
every one of them itself, so the schema only has to be no stricter than admission is.

Everything here is pure and cached: the registry does not change while a process runs.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel

from joch.api.meta import ObjectMeta
from joch.api.registry import KindInfo

Schema = dict[str, Any]

PRESERVE = "x-kubernetes-preserve-unknown-fields"
API_VERSION_DOC = ("APIVersion defines the versioned schema of this representation of an object. Servers "
                   "should convert recognized schemas to the latest internal value, and may reject unrecognized "
                   "values.")
KIND_DOC = ("Kind is a string value representing the REST resource this object represents. In CamelCase.")
METADATA_DOC = "Standard object's metadata: name, namespace, labels, annotations, ..."
SPEC_DOC = "The desired state of the {kind}, as its author wrote it."
STATUS_DOC = "The observed state of the {kind}, written by Joch's controllers."

# Keys a structural schema may carry, as this module writes them (everything else pydantic emits,
# such as ``title`` or ``discriminator``, is dropped).
_KEPT = ("description", "format", "pattern", "minLength", "maxLength", "minimum", "maximum",
         "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "minProperties", "maxProperties")
_BOUNDS = {"ge": ("minimum", False), "gt": ("minimum", True), "le": ("maximum", False), "lt": ("maximum", True)}
_FORMATS = frozenset({"date-time", "date", "byte", "int32", "int64", "double", "float", "uri"})

ENV_NAME_PATTERN = r"^[\x20-\x3c\x3e-\x7e]+$"  # kinds.ENV_NAME: printable ASCII but "="
EXTENSIONS: dict[str, dict[str, Schema]] = {
    # KindInfo.key → dotted path from the object root ("[]" steps into a list's items) → keys to add.
    "joch.dev/Agent": {
        "spec.env[].name": {"pattern": ENV_NAME_PATTERN},
        "spec.security.network": {"x-kubernetes-validations": [{
            "rule": "!has(self.allow) || size(self.allow) == 0 || (has(self.mode) && self.mode == 'limited')",
            "message": 'allow only applies to mode "limited": set mode: limited, or remove allow',
            "fieldPath": ".allow", "reason": "FieldValueInvalid"}]},
    },
    "joch.dev/AgentProvider": {
        "spec.parameters": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        # maxLength says what the pattern does, for the apiserver's estimate of what CEL rules cost
        "spec.parameters[].name": {"pattern": r"^[A-Za-z_][A-Za-z0-9_]{0,62}$", "maxLength": 63},
        "spec.outputArtifacts": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        "spec.outputArtifacts[].name": {"pattern": r"^[A-Za-z0-9._-]{1,128}$", "maxLength": 128,
                                        "x-kubernetes-validations": [{
            "rule": "self != 'changes.patch' && self != '.' && self != '..'",
            "message": '"changes.patch" is the workspace diff every run collects, and "." and ".." name no file: '
                       "give this output another name"}]},
        "spec.secretEnv[].name": {"pattern": ENV_NAME_PATTERN},
    },
    "joch.dev/ImplementationSource": {
        "spec": {"x-kubernetes-validations": [
            *({"rule": f"self.provider != '{p}' || has(self.{p})", "message": f'provider is "{p}": set spec.{p}',
               "fieldPath": f".{p}", "reason": "FieldValueRequired"} for p in ("github", "linear")),
            *({"rule": f"self.provider == '{p}' || !has(self.{p})",
               "message": f'spec.{p} is only for provider "{p}": remove it, or set provider: {p}',
               "fieldPath": f".{p}", "reason": "FieldValueForbidden"} for p in ("github", "linear")),
        ]},
    },
    "joch.dev/TriggerRule": {
        "spec": {"x-kubernetes-validations": [
            {"rule": "(has(self.issue) ? 1 : 0) + (has(self.comment) ? 1 : 0) + (has(self.schedule) ? 1 : 0) + "
                     "(has(self.webhook) ? 1 : 0) <= 1",
             "message": "a rule has one trigger (issue, comment, schedule or webhook): split it into one "
                        "TriggerRule per trigger", "reason": "FieldValueForbidden"},
            {"rule": "!(has(self.issue) || has(self.comment)) || has(self.sourceRef)",
             "message": "issue and comment triggers need the ImplementationSource whose events they follow: set "
                        "spec.sourceRef.name", "fieldPath": ".sourceRef", "reason": "FieldValueRequired"},
        ]},
    },
    "joch.dev/Policy": {
        "spec.rules": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        "spec.rules[]": {"x-kubernetes-validations": [{
            "rule": "!has(self.action) || self.action != 'requireApproval' || "
                    "(has(self.phase) && self.phase != 'admission')",
            "message": "requireApproval only applies when a run is dispatched or writes back: set phase: dispatch "
                       "or writeBack, or use action deny or warn at admission",
            "fieldPath": ".action", "reason": "FieldValueInvalid"}]},
    },
    "ops.joch.dev/Environment": {
        "spec.namespaces": {"x-kubernetes-list-type": "set"},
    },
    "ops.joch.dev/RoleBinding": {
        "subjects": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["kind", "name"]},
    },
}


@functools.cache
def kind_schema(kind: KindInfo) -> Schema:
    """The structural schema of a whole ``kind`` object: apiVersion, kind, metadata, and its spec and
    status (or, for a ``body="top"`` kind, its spec model's fields at the top level)."""
    properties: Schema = {
        "apiVersion": {"type": "string", "description": API_VERSION_DOC},
        "kind": {"type": "string", "description": KIND_DOC},
        "metadata": {"type": "object"},  # a CRD may state nothing else about it
    }
    body = copy.deepcopy(model_schema(kind.spec_model))  # the cached one stays as pydantic says
    required: list[str] = []
    if kind.body == "spec":
        properties["spec"] = {**body, "description": body.get("description") or SPEC_DOC.format(kind=kind.kind)}
        if kind.spec_required:
            required.append("spec")
    else:
        properties.update(body.get("properties", {}))
        required.extend(body.get("required", []))
    if kind.status_model is not None:
        status = copy.deepcopy(model_schema(kind.status_model))
        properties["status"] = {**status, "description": status.get("description")
                                or STATUS_DOC.format(kind=kind.kind)}
    schema: Schema = {"type": "object", "description": _kind_description(kind), "properties": properties}
    if required:
        schema["required"] = required
    for path, extra in EXTENSIONS.get(kind.key, {}).items():
        _at(schema, path, kind).update(copy.deepcopy(extra))
    for ref in kind.references:  # spec.providerRef.name: say what providerRef refers to
        steps = ref.path.split(".")
        target = field(schema, steps[:-1] if steps[-1] == "name" else steps)
        if target is not None and "description" not in target:
            target["description"] = (f"The {ref.kind} (by name, in the same namespace) this object uses; "
                                     + ("it is an error when it does not exist." if ref.missing == "reject"
                                        else "accepted with a warning while it does not exist."))
    return schema


@functools.cache
def model_schema(model: type[BaseModel]) -> Schema:
    """The structural schema of one pydantic model, ``$ref``s inlined."""
    raw = model.model_json_schema(mode="validation", by_alias=True)
    return _convert(raw, raw.get("$defs", {}), ())


METADATA_FIELDS = {
    "name": "Unique within a namespace (within the kind, for a cluster-scoped kind). A DNS-1123 subdomain.",
    "generateName": "A prefix the server completes with random characters when name is empty (create only).",
    "namespace": "The namespace of the object; empty for a cluster-scoped kind.",
    "uid": "Unique in time and space; set by the server.",
    "resourceVersion": "The store revision of the object's last change; an update that carries it applies only "
                       "over that version. Set by the server.",
    "generation": "Incremented by the server on every change of the spec. Read-only.",
    "creationTimestamp": "When the object was created (RFC 3339). Set by the server.",
    "deletionTimestamp": "When deletion was requested; the object remains until its finalizers are removed.",
    "labels": "Key-value pairs that selectors (-l) match.",
    "annotations": "Key-value pairs for tools and people; not matched by selectors.",
    "finalizers": "What must happen before the object is removed; each is removed by whoever handles it.",
    "ownerReferences": "The objects this one belongs to; deleting the owner deletes it too.",
    "managedFields": "Which manager (field owner) set which fields, as server-side apply records it.",
}


@functools.cache
def object_meta_schema() -> Schema:
    """``metadata`` with its fields, for documents that describe it (not for CRDs)."""
    schema = copy.deepcopy(model_schema(ObjectMeta))
    for name, doc in METADATA_FIELDS.items():
        if name in schema.get("properties", {}):
            schema["properties"][name].setdefault("description", doc)
    return {**schema, "description": METADATA_DOC}


def field(schema: Schema, path: list[str]) -> Schema | None:
    """The schema at ``path`` (field names; a list is stepped through to its items), or None."""
    node = schema
    for name in path:
        while node.get("type") == "array":
            node = node.get("items", {})
        child = node.get("properties", {}).get(name)
        if child is None:
            return None
        node = child
    return node


def type_name(schema: Schema) -> str:
    """How kubectl explain names a schema's type: ``<string>``, ``<[]Object>``, ``<map[string]string>``."""
    kind = schema.get("type")
    if kind == "array":
        return "[]" + type_name(schema.get("items", {}))
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and "properties" not in schema:
            return f"map[string]{type_name(extra)}"
        return "Object"
    if kind is None:
        return "Object" if schema.get(PRESERVE) else "any"
    return str(kind)


def _kind_description(kind: KindInfo) -> str:
    doc = kind.spec_model.__doc__ if kind.body == "top" else None
    first = f"{kind.kind} ({kind.api_version})"
    return f"{first}: {' '.join(doc.split())}" if doc else first


def _at(schema: Schema, path: str, kind: KindInfo) -> Schema:
    node = schema
    for step in path.split("."):
        items = step.endswith("[]")
        name = step.removesuffix("[]")
        child = node.get("properties", {}).get(name)
        if child is None:
            raise ValueError(f"EXTENSIONS names {path!r} for kind {kind.kind}, which has no field {name!r} there")
        node = child
        if items:
            if node.get("type") != "array":
                raise ValueError(f"EXTENSIONS names {path!r} for kind {kind.kind}, but {name!r} is not a list")
            node = node["items"]
    return node


def _convert(node: Schema, defs: dict[str, Schema], seen: tuple[str, ...]) -> Schema:
    ref = node.get("$ref")
    if ref is not None:
        name = ref.rsplit("/", 1)[-1]
        if name in seen:  # a structural schema cannot recurse
            raise ValueError(f"model {name} refers to itself ({' → '.join((*seen, name))}); a structural "
                             "schema cannot describe it")
        return {**_convert(defs[name], defs, (*seen, name)), **_own_keys(node)}
    union = node.get("anyOf") or node.get("oneOf")
    if union is not None:
        options = [o for o in union if o != {"type": "null"}]
        return {**_union(options, defs, seen, nullable=len(options) < len(union)), **_own_keys(node)}
    if "allOf" in node and len(node["allOf"]) == 1:
        return {**_convert(node["allOf"][0], defs, seen), **_own_keys(node)}
    kind = node.get("type")
    out: Schema = {}
    if kind == "object" or "properties" in node:
        out["type"] = "object"
        properties = node.get("properties", {})
        if properties:
            out["properties"] = {name: _convert(sub, defs, seen) for name, sub in properties.items()}
            if node.get("required"):
                out["required"] = list(node["required"])
        else:
            extra = node.get("additionalProperties", True)
            if extra is True or extra == {}:
                out[PRESERVE] = True
            elif isinstance(extra, dict):
                out["additionalProperties"] = _convert(extra, defs, seen)
    elif kind == "array":
        out["type"] = "array"
        out["items"] = _convert(node.get("items", {}), defs, seen)
    elif kind in ("string", "integer", "number", "boolean"):
        out["type"] = kind
    elif kind is None and "const" not in node and "enum" not in node:
        out[PRESERVE] = True  # Any
    elif kind is None:
        values = node.get("enum", [node.get("const")])
        out["type"] = _json_type(values[0])
    out.update(_own_keys(node))
    return out


def _union(options: list[Schema], defs: dict[str, Schema], seen: tuple[str, ...], *, nullable: bool) -> Schema:
    converted = [_convert(o, defs, seen) for o in options]
    types = {c.get("type") for c in converted}
    if len(converted) == 1:
        out = converted[0]
    elif types <= {"number", "integer"}:
        out = {"type": "number"}
    else:
        names = {type_name(c).lower() if c.get("type") else "any value" for c in converted}
        if "number" in names:
            names.discard("integer")
        out = {PRESERVE: True, "description": f"One of: {', '.join(sorted(names))}."}
    return {**out, "nullable": True} if nullable else out


def _own_keys(node: Schema) -> Schema:
    """The validations and documentation a node states next to its type (or its ``$ref``)."""
    out: Schema = {}
    for key in _KEPT:
        if key in node:
            out[key] = node[key]
    for key, (bound, exclusive) in _BOUNDS.items():  # constraints pydantic could not apply to a union
        if key in node:
            out[bound] = node[key]
            if exclusive:
                out[f"exclusive{bound.capitalize()}"] = True
    for key in ("exclusiveMinimum", "exclusiveMaximum"):  # JSON Schema's number → OpenAPI 3.0's flag
        if isinstance(out.get(key), (int, float)) and not isinstance(out[key], bool):
            out[key.replace("exclusive", "").lower()] = out[key]
            out[key] = True
    if out.get("format") not in _FORMATS:
        out.pop("format", None)
    if "const" in node:
        out["enum"] = [node["const"]]
    elif "enum" in node:
        out["enum"] = list(node["enum"])
    default = node.get("default")
    if isinstance(default, (str, int, float, bool)):
        out["default"] = default
    if "description" in out:
        out["description"] = " ".join(str(out["description"]).split())
    return out


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"
