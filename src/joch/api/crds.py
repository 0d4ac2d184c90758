"""apiextensions.k8s.io/v1 CustomResourceDefinitions generated from the registry.

One CRD per group and kind, with a version per registered version of it (the first registered is
the storage version, as registration order is the preferred version in discovery). Everything in
it comes from the ``KindInfo`` and its models, so a CRD cannot say something the server does not:

* the schema is ``openapi.kind_schema`` (structural, with the list types, patterns and CEL rules of
  ``openapi.EXTENSIONS``);
* ``additionalPrinterColumns`` are the kind's ``columns`` (the Table ``joch get`` and ``kubectl get``
  show), their paths rewritten from the registry's column syntax to JSONPath;
* the ``status`` subresource exists when the kind has a status model, as on the server;
* names, short names, categories and scope are the registry's.

Kinds of the core group (``""``, e.g. Namespace) are Kubernetes' own and get no CRD.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

from joch.api import columns, selectors
from joch.api.openapi import kind_schema
from joch.api.registry import Column, KindInfo

_SEGMENT = re.compile(r"([^.\[\]]+)(?:\[([^\]]*)\])?")
PART_OF = {"app.kubernetes.io/part-of": "joch"}


def crds(kinds: Iterable[KindInfo]) -> list[dict[str, Any]]:
    """The CRDs of every kind outside the core group, ordered by name."""
    grouped: dict[tuple[str, str], list[KindInfo]] = {}
    for info in kinds:
        if info.group:
            grouped.setdefault((info.group, info.kind), []).append(info)
    return sorted((crd(versions) for versions in grouped.values()), key=lambda c: str(c["metadata"]["name"]))


def crd(versions: list[KindInfo]) -> dict[str, Any]:
    """The CRD of one group and kind, given each registered version of it (storage version first)."""
    first = versions[0]
    names: dict[str, Any] = {"kind": first.kind, "listKind": f"{first.kind}List", "plural": first.plural,
                             "singular": first.singular}
    if first.short_names:
        names["shortNames"] = list(first.short_names)
    if first.categories:
        names["categories"] = list(first.categories)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": first.resource, "labels": dict(PART_OF)},
        "spec": {
            "group": first.group,
            "names": names,
            "scope": "Namespaced" if first.namespaced else "Cluster",
            "versions": [_version(info, storage=info is first) for info in versions],
        },
    }


def file_name(definition: dict[str, Any]) -> str:
    """Where ``joch crds --output-dir`` writes a CRD: ``<plural>.<group>.yaml``."""
    return f"{definition['metadata']['name']}.yaml"


def json_path(path: str) -> str:
    """A registry column path as JSONPath: ``status.conditions[type=Ready].status`` →
    ``.status.conditions[?(@.type=="Ready")].status``."""
    out = []
    for match in _SEGMENT.finditer(path):
        name, index = match.group(1), match.group(2)
        out.append(f".{name}")
        if index is None:
            continue
        if "=" in index:
            key, value = index.split("=", 1)
            out.append(f'[?(@.{key}=="{value}")]')
        else:
            out.append(f"[{index}]")
    return "".join(out)


def _version(info: KindInfo, *, storage: bool) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": info.version,
        "served": True,
        "storage": storage,
        "schema": {"openAPIV3Schema": copy.deepcopy(kind_schema(info))},
    }
    if info.status_model is not None:
        version["subresources"] = {"status": {}}
    version["additionalPrinterColumns"] = [_printer_column(c) for c in info.columns or (columns.AGE,)]
    selectable = _selectable_fields(info, version["schema"]["openAPIV3Schema"])
    if selectable:
        version["selectableFields"] = selectable
    return version


def _selectable_fields(info: KindInfo, schema: dict[str, Any]) -> list[dict[str, str]]:
    """The field selectors Joch's server takes beyond name and namespace (``selectors.selectable``),
    declared so a cluster (Kubernetes 1.31+) filters on them too: scalar fields only, at most 8."""
    out = []
    for path in selectors.selectable(info):
        if path in selectors.FIELDS:
            continue
        node: dict[str, Any] | None = schema
        for part in path.split("."):
            node = (node or {}).get("properties", {}).get(part)
        if node and node.get("type") in ("string", "integer", "boolean"):
            out.append({"jsonPath": "." + path})
    return out[:8]


def _printer_column(column: Column) -> dict[str, Any]:
    out: dict[str, Any] = {"name": column.name, "type": columns.column_type(column), "jsonPath": json_path(column.path)}
    if column.description:
        out["description"] = column.description
    if column.wide:
        out["priority"] = 1
    return out
