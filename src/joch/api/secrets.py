"""What a read shows of an object with sensitive fields (a Secret), and what it keeps back.

A Secret's values (``spec.data``, ``KindInfo.sensitive``) are never part of what the store hands to
a reader: every GET, LIST, WATCH event (ADDED, MODIFIED and DELETED alike), Table, SSE event,
DELETE answer and apply/patch/PUT answer (dry runs included) shows the *public view*:

* ``spec.data`` is left out; ``spec.type`` and the rest of the spec stay;
* ``status.keys`` lists every key with the size of its decoded value in bytes,
  ``[{name: token, size: 12}]``, sorted by name — enough to check that a key is there and not empty
  (``joch describe secret`` prints it, and the compiler checks ``secretEnv`` keys against it);
* a ``kubectl.kubernetes.io/last-applied-configuration`` annotation (written by client-side
  ``kubectl apply``, which copies the whole manifest into it) loses its ``data`` and ``stringData``.

The values themselves are sealed by the store (``joch.store.sealing``) and reach only internal
callers through ``Store.reveal``. A write that names neither ``data`` nor ``stringData`` keeps the
stored values, so applying ``joch get secret x -o yaml`` output again changes nothing; one that
names either replaces the whole set of values, as a Kubernetes PUT does.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from typing import Any

from joch.api.registry import KindInfo

Obj = dict[str, Any]
Values = dict[str, Any]
"""The sensitive fields of one object: dotted path → value (``{"spec.data": {"token": "czNj"}}``)."""

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_WRITE_ONLY = ("stringData",)  # spec fields admission folds into data; never in a body, but scrubbed anyway


def split(kind: KindInfo, obj: Obj) -> tuple[Obj, Values | None]:
    """``obj`` without its sensitive fields, and those fields (None when it names none of them:
    an update that keeps the stored values). ``obj`` itself is left alone."""
    out = copy.copy(obj)
    values: Values = {}
    for path in kind.sensitive:
        *parents, leaf = path.split(".")
        node: Any = out
        copied: Obj = out
        for part in parents:
            child = node.get(part) if isinstance(node, dict) else None
            if not isinstance(child, dict):
                node = None
                break
            child = dict(child)
            copied[part] = child
            node = copied = child
        if isinstance(node, dict) and leaf in node:
            values[path] = node.pop(leaf)
    return out, (values or None)


def public(kind: KindInfo, obj: Obj, values: Values | None) -> Obj:
    """The public view of ``obj`` (already without its sensitive fields) holding ``values``
    (None: the values did not change, and ``status.keys`` already lists them)."""
    out = dict(obj)
    if values is not None or "keys" not in (out.get("status") or {}):
        status = dict(out.get("status") or {})
        status["keys"] = keys(values or {})
        out["status"] = status
    metadata = out.get("metadata")
    if isinstance(metadata, dict):
        annotations = metadata.get("annotations")
        if isinstance(annotations, dict) and isinstance(annotations.get(LAST_APPLIED), str):
            scrubbed = _scrub_last_applied(kind, annotations[LAST_APPLIED])
            out["metadata"] = {**metadata, "annotations": {**annotations, LAST_APPLIED: scrubbed}}
    return out


def merged(obj: Obj, values: Values) -> Obj:
    """``obj`` with ``values`` put back at their paths (what ``Store.reveal`` returns)."""
    out = copy.deepcopy(obj)
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
    return out


def keys(values: Values) -> list[dict[str, Any]]:
    """``[{name, size}]`` of every map-valued sensitive field's keys, sorted by name: the size is of
    the decoded value (a Secret's data is base64)."""
    out: list[dict[str, Any]] = []
    for value in values.values():
        if isinstance(value, dict):
            out += [{"name": str(k), "size": _size(v)} for k, v in value.items()]
    return sorted(out, key=lambda item: item["name"])


def key_names(obj: Obj) -> list[str]:
    """The names of a Secret's keys, from the public view (``status.keys``) or, when an object
    still carries its values (``Store.reveal``), from ``spec.data``."""
    data = (obj.get("spec") or {}).get("data")
    if isinstance(data, dict):
        return sorted(data)
    listed = (obj.get("status") or {}).get("keys") or []
    return sorted(str(item["name"]) for item in listed if isinstance(item, dict) and "name" in item)


def _size(value: Any) -> int:
    if not isinstance(value, str):
        return len(json.dumps(value))
    try:
        return len(base64.b64decode(value.replace("\n", "").replace("\r", ""), validate=True))
    except (binascii.Error, ValueError):
        return len(value.encode())


def _scrub_last_applied(kind: KindInfo, text: str) -> str:
    """The annotation's manifest without sensitive values: a manifest kubectl can still diff
    against (it then sends ``data`` again on every apply, which keeps the stored values right)."""
    try:
        manifest = json.loads(text)
    except ValueError:
        return ""  # not JSON: it can hold anything, so it keeps nothing
    if not isinstance(manifest, dict):
        return ""
    manifest, _ = split(kind, manifest)
    for container in (manifest, manifest.get("spec")):
        if isinstance(container, dict):
            for field in (*_WRITE_ONLY, "data"):
                container.pop(field, None)
    return json.dumps(manifest, separators=(",", ":"), sort_keys=True)


__all__ = ["LAST_APPLIED", "Values", "key_names", "keys", "merged", "public", "split"]
