"""JSON patch (RFC 6902, ``application/json-patch+json``) as the apiserver applies it.

The operations are checked up front — a body that is not a list of objects each with a known
``op`` and a string ``path`` is a 400 naming the operation, as the apiserver's decoder has it —
then applied by the ``jsonpatch`` library to the stored object. An operation that cannot apply
(a ``test`` whose value differs, a ``remove`` of a missing path) is a 422 naming it, which is the
apiserver's answer too. The patched object then goes through admission like any other write
(``admission.apply.change_object``), so a patch cannot produce what a PUT could not.

A patch that ``test``s or replaces ``/metadata/resourceVersion`` is pinned to that version: it is
not retried on a conflict, since the caller asked for exactly that version.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import jsonpointer

from joch.admission import documents
from joch.api import errors

OPS = ("add", "remove", "replace", "move", "copy", "test")
MAX_OPERATIONS = 10000  # the apiserver's cap on a JSON patch's operations
MAX_COPIED_NODES = 500_000
"""How many values (mappings, lists, scalars) a patch's ``copy`` operations may duplicate in all:
each copy can double the object, so 30 of them in a 1 KB body once asked for gigabytes."""
BODY = "request body"


def decode(text: str) -> list[dict[str, Any]]:
    """The operations of a JSON patch body, checked for shape (400 naming the operation)."""
    documents.check_nesting(text, BODY)
    try:
        ops = json.loads(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as exc:
        raise errors.BadRequest(f"the JSON patch is not valid JSON: {exc.msg} at line {exc.lineno} "
                                f"column {exc.colno}") from None
    if not isinstance(ops, list):
        raise errors.BadRequest("a JSON patch must be a list of operations "
                                '([{"op": "replace", "path": "/spec/x", "value": 1}])')
    if len(ops) > MAX_OPERATIONS:
        raise errors.RequestEntityTooLarge(f"the JSON patch has {len(ops)} operations: the allowed count of JSON "
                                           f"patch operations is {MAX_OPERATIONS}; split it into several patches")
    for i, op in enumerate(ops):
        if not isinstance(op, dict):
            raise errors.BadRequest(f"JSON patch operation {i} must be an object with op and path")
        if op.get("op") not in OPS:
            raise errors.BadRequest(f"JSON patch operation {i}: unknown op {op.get('op')!r} "
                                    f"(expected one of {', '.join(OPS)})")
        if not isinstance(op.get("path"), str):
            raise errors.BadRequest(f"JSON patch operation {i} ({op['op']}): path must be a string "
                                    "JSON pointer such as /spec/description")
        if op["op"] in ("add", "replace", "test") and "value" not in op:
            raise errors.BadRequest(f"JSON patch operation {i} ({op['op']} {op['path']}): value is required")
        if op["op"] in ("move", "copy") and not isinstance(op.get("from"), str):
            raise errors.BadRequest(f"JSON patch operation {i} ({op['op']} {op['path']}): from must be a "
                                    "string JSON pointer")
    return ops


def pinned(ops: list[dict[str, Any]]) -> bool:
    return any(op.get("path") == "/metadata/resourceVersion" and op["op"] in ("test", "replace", "add")
               for op in ops)


def apply(current: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``current`` with ``ops`` applied (``current`` itself is left alone); a 422 naming the operation
    that failed. The object is copied once, not once per operation: a patch of many operations on a
    large object would otherwise take minutes of the server's time."""
    current = copy.deepcopy(current)
    copied = 0
    for i, op in enumerate(ops):
        if op["op"] == "copy":
            source = jsonpointer.resolve_pointer(current, op["from"], None)
            copied += _nodes(source, MAX_COPIED_NODES - copied + 1)
            if copied > MAX_COPIED_NODES:
                raise errors.RequestEntityTooLarge(
                    f"JSON patch operation {i} (copy {op['from']} to {op['path']}): the patch's copy operations "
                    f"duplicate more than {MAX_COPIED_NODES} values; nothing was changed")
        try:
            # the op is copied too: a later op must not change the value an earlier one inserted, which
            # a retry on a conflict applies again
            current = jsonpatch.JsonPatch([copy.deepcopy(op)]).apply(current, in_place=True)
        except jsonpatch.JsonPatchTestFailed:
            actual = jsonpointer.resolve_pointer(current, op["path"], None)
            why = (f"{json.dumps(actual)}, not {json.dumps(op['value'])} as the patch's test operation expects"
                   if actual is not None else "absent, so the patch's test operation fails")
            raise errors.Invalid(f"JSON patch operation {i} (test {op['path']}) failed: {_field(op['path'])} is "
                                 f"{why}; nothing was changed",
                                 causes=[errors.Cause(_field(op["path"]), why, "FieldValueInvalid")]) from None
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise errors.Invalid(f"JSON patch operation {i} ({op['op']} {op['path']}) cannot be applied: "
                                 f"{exc}; nothing was changed",
                                 causes=[errors.Cause(_field(op["path"]), str(exc), "FieldValueInvalid")]
                                 ) from None
    if not isinstance(current, dict):
        raise errors.Invalid("the JSON patch replaced the whole object with something that is not an object")
    return current


def _nodes(value: Any, budget: int) -> int:
    """How many values ``value`` holds (itself included), counting no further than ``budget``."""
    count, stack = 0, [value]
    while stack and count < budget:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _field(pointer: str) -> str:
    return ".".join(part.replace("~1", "/").replace("~0", "~") for part in pointer.split("/")[1:])
