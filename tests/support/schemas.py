"""Checks of OpenAPI schemas as Kubernetes reads them, for the tests of ``joch.api.openapi`` and the CRDs.

``structural_problems`` applies apiextensions.k8s.io/v1's rules for a structural schema (every
node typed, no junctors, no ``additionalProperties`` beside ``properties``, list-map keys required
or defaulted, ``metadata`` plain). ``violations`` is what the kube-apiserver would say about a value:
the schema (via ``jsonschema``, with OpenAPI's ``nullable`` spelled as JSON Schema's null type), the
uniqueness of ``x-kubernetes-list-type`` lists and each ``x-kubernetes-validations`` CEL rule,
evaluated with the ``cel`` library Joch's policies use.
"""

from __future__ import annotations

from typing import Any

import cel
import jsonschema

PRESERVE = "x-kubernetes-preserve-unknown-fields"
JUNCTORS = ("anyOf", "oneOf", "allOf", "not")
REASONS = ("FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate")
_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool}


def structural_problems(node: dict[str, Any], path: str = "", *, root: bool = True) -> list[str]:
    out: list[str] = []
    where = path or "<root>"
    if "type" not in node and not node.get(PRESERVE) and not node.get("x-kubernetes-int-or-string"):
        out.append(f"{where}: no type")
    for key in (*JUNCTORS, "$ref", "uniqueItems", "title", "discriminator", "const"):
        if key in node:
            out.append(f"{where}: has {key}")
    if "properties" in node and "additionalProperties" in node:
        out.append(f"{where}: properties and additionalProperties")
    if node.get("type") == "object" and node.get("additionalProperties") is False:
        out.append(f"{where}: additionalProperties false")
    for value in node.get("enum", []):
        wanted = _TYPES.get(node.get("type", ""))
        if wanted is not None and (not isinstance(value, wanted) or (isinstance(value, bool) and wanted is not bool)):
            out.append(f"{where}: enum value {value!r} is not a {node['type']}")
    if node.get("x-kubernetes-list-type") == "map":
        item = node.get("items", {})
        for key in node.get("x-kubernetes-list-map-keys", []):
            sub = item.get("properties", {}).get(key, {})
            if key not in item.get("required", []) and "default" not in sub:
                out.append(f"{where}: list map key {key} is neither required nor defaulted")
    for rule in node.get("x-kubernetes-validations", []):
        if rule.get("reason", "FieldValueInvalid") not in REASONS:
            out.append(f"{where}: rule reason {rule['reason']} is not one a CRD may give")
        field_path = rule.get("fieldPath", "")
        if field_path and field_path.lstrip(".") not in node.get("properties", {}):
            out.append(f"{where}: rule fieldPath {field_path} names no field")
    for name, sub in node.get("properties", {}).items():
        if root and name == "metadata":
            if sub != {"type": "object"}:
                out.append(f"{where}.metadata: says more than its type")
            continue
        out += structural_problems(sub, f"{path}.{name}", root=False)
    if isinstance(node.get("items"), dict):
        out += structural_problems(node["items"], f"{path}[]", root=False)
    if isinstance(node.get("additionalProperties"), dict):
        out += structural_problems(node["additionalProperties"], f"{path}{{}}", root=False)
    return out


def json_schema(node: Any) -> Any:
    """An OpenAPI 3.0 schema as draft-4 JSON Schema (``nullable`` → the null type; extensions dropped)."""
    if isinstance(node, list):
        return [json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: json_schema(v) for k, v in node.items()
           if not k.startswith("x-") and k not in ("nullable", "default")}
    if node.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def violations(schema: dict[str, Any], value: Any) -> list[str]:
    validator = jsonschema.Draft4Validator(json_schema(schema))
    out = [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(value)]
    return out + _rules(schema, value, "")


def _rules(node: dict[str, Any], value: Any, path: str) -> list[str]:
    if value is None:
        return []
    out: list[str] = []
    for rule in node.get("x-kubernetes-validations", []):
        if not cel.evaluate(rule["rule"], {"self": value}):
            out.append(f"{path}: {rule['message']}")
    list_type = node.get("x-kubernetes-list-type")
    if isinstance(value, list) and list_type in ("set", "map"):
        keys = node.get("x-kubernetes-list-map-keys", [])
        seen = [repr(v) if list_type == "set" else repr([v.get(k) for k in keys]) for v in value]
        if len(seen) != len(set(seen)):
            out.append(f"{path}: duplicate items in a {list_type} list")
    if isinstance(value, dict):
        for name, sub in node.get("properties", {}).items():
            out += _rules(sub, value.get(name), f"{path}.{name}")
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            out += _rules(node["items"], item, f"{path}[{i}]")
    return out
