"""Server-side apply: field sets, ``metadata.managedFields`` and the apply and update algorithms,
as kube-apiserver's field manager (structured-merge-diff) has them. Pure: no store, no clock.

Field sets. A field set is a set of paths into an object; a path is a tuple of elements, each
``("f", name)`` (a map field), ``("k", '{"name":"a"}')`` (an item of a list keyed by fields),
``("v", '"x"')`` (an item of a set list) — the ``f:`` / ``k:`` / ``v:`` notation of ``FieldsV1``,
payloads kept as canonical JSON so paths hash. What a value contributes (``field_set``), as
structured-merge-diff's ``ToFieldSet``: every scalar leaf and every atomic list; maps only through
their fields (an empty map owns nothing); every item of a keyed or set list, plus the fields of a
keyed item. Lists are atomic (one leaf, replaced whole) except where ``ListTypes`` says otherwise:
``metadata.finalizers`` is a set and ``metadata.ownerReferences`` is keyed by ``uid``, as in
Kubernetes' own schema, and a spec list of objects with a required ``name`` is keyed by it
(``kind_lists``, read off the kind's pydantic model). A list whose items lack the key or repeat one
is treated as atomic rather than losing an item. The fields every object has and no manager owns
(``apiVersion``, ``kind``, ``metadata.name``, ``.namespace``, ``.uid``, ``.resourceVersion``, ``.generation``,
``.creationTimestamp``, ``.managedFields``…) are stripped first (the apiserver's strip-meta
manager), and so is ``status`` of a kind with a status subresource, which the main resource never
writes.

Apply (``apply``), in structured-merge-diff's order: merge the configuration into the live object
(maps recursively, keyed and set lists item by item, everything else replaced); record the
configuration's field set as the applier's ``Apply`` entry; prune what the applier owned before,
left out now and nobody else owns; then compare live with the result: a changed or added field
that another manager owns is a conflict (``ApplyConflict``), unless ``force`` moves it to the
applier. A field set to the value it already has is shared, not a conflict. An object that exists
but has no managedFields (written before tracking, or by ``joch apply``) is first attributed whole
to ``before-first-apply``, as the apiserver does. Moving from client-side ``kubectl apply`` to
``kubectl apply --server-side`` (manager ``kubectl``) conflicts with nobody on the fields of the
``kubectl.kubernetes.io/last-applied-configuration`` annotation, and that annotation is kept up to
date with each such apply, as the apiserver's last-applied manager and updater do.

Update (``update``): the fields a non-apply write changed or added move to its manager's
``Update`` entry, and the fields it removed leave every entry. Creation is tracked; an update of an
object that has no managedFields is not (the apiserver's skip-non-applied manager), so objects
written before tracking stay untracked until someone applies.

Entries are keyed by manager, operation and subresource; an entry's ``time`` changes only when
its fields do, so re-applying the same configuration writes nothing.
"""

from __future__ import annotations

import copy
import functools
import json
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel

from joch.api.registry import KindInfo

Element = tuple[str, str]
Path = tuple[Element, ...]
FieldSet = frozenset[Path]
Obj = dict[str, Any]
ListKind = Literal["atomic", "set", "map"]

APPLY = "Apply"
UPDATE = "Update"
BEFORE_FIRST_APPLY = "before-first-apply"
KUBECTL = "kubectl"  # the manager of `kubectl apply --server-side`, which takes over client-side apply
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
MAX_MANAGER_LENGTH = 128
MAX_UPDATE_MANAGERS = 10
ANCIENT_CHANGES = "ancient-changes"
STRIPPED_METADATA = frozenset({
    "name", "namespace", "generateName", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields",
})
_ITEM = "\0item"  # the value of a list item's own path in ``values``: present, nothing to compare


@dataclass(frozen=True)
class ListType:
    kind: ListKind = "atomic"
    keys: tuple[str, ...] = ()


ListTypes = Callable[[Path], ListType]
_METADATA_LISTS: dict[Path, ListType] = {
    (("f", "metadata"), ("f", "finalizers")): ListType("set"),
    (("f", "metadata"), ("f", "ownerReferences")): ListType("map", ("uid",)),
    (("f", "status"), ("f", "conditions")): ListType("map", ("type",)),
}


def default_lists(path: Path) -> ListType:
    return _METADATA_LISTS.get(path, ListType())


def kind_lists(kind: KindInfo) -> ListTypes:
    """The list types of ``kind``'s objects: the metadata lists, and under ``spec`` every list of
    objects with a required ``name`` (an Agent's ``env``, a provider's ``parameters``…) keyed by
    it, as ``x-kubernetes-list-type: map`` would declare it. A kind whose fields are top-level (a
    RoleBinding) keeps Kubernetes' atomic lists (``subjects``)."""
    keyed = _keyed_lists(kind.spec_model) if kind.body == "spec" else {}

    def lists(path: Path) -> ListType:
        if path[:1] == (("f", "spec"),):
            general = tuple(("*", "") if k in ("k", "v") else (k, p) for k, p in path[1:])
            found = keyed.get(general)
            if found is not None:
                return found
        return default_lists(path)

    return lists


@functools.cache
def _keyed_lists(model: type[BaseModel]) -> dict[Path, ListType]:
    out: dict[Path, ListType] = {}
    _collect(model, (), out, depth=0)
    return out


def _collect(model: type[BaseModel], path: Path, out: dict[Path, ListType], depth: int) -> None:
    if depth > 8:  # recursive models: deep enough for any manifest
        return
    for name, info in model.model_fields.items():
        here = (*path, ("f", info.alias or name))
        annotation = _unwrap(info.annotation)
        if typing.get_origin(annotation) is list:
            (item,) = typing.get_args(annotation) or (Any,)
            item = _unwrap(item)
            if isinstance(item, type) and issubclass(item, BaseModel):
                named = item.model_fields.get("name")
                if named is not None and named.is_required():
                    out[here] = ListType("map", ("name",))
                    _collect(item, (*here, ("*", "")), out, depth + 1)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            _collect(annotation, here, out, depth + 1)


def _unwrap(annotation: Any) -> Any:
    """``X`` from ``Annotated[X, ...]`` and ``X | None``."""
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(rest) == 1:
                annotation = rest[0]
                continue
        return annotation


@dataclass(frozen=True)
class Entry:
    """One ``managedFields`` entry: who owns which fields, by which operation."""

    manager: str
    operation: str
    api_version: str
    fields: FieldSet
    time: str | None = None
    subresource: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.manager, self.operation, self.subresource)


@dataclass(frozen=True)
class Conflict:
    entry: Entry
    path: Path

    @property
    def owner(self) -> str:
        """The manager as the apiserver prints it: ``"m"``, or ``"m" using v1`` for an Update."""
        shown = json.dumps(self.entry.manager)
        if self.entry.subresource:
            shown += f" with subresource {json.dumps(self.entry.subresource)}"
        if self.entry.operation == UPDATE:
            shown += f" using {self.entry.api_version}"
        return shown


class ApplyConflict(Exception):
    """Fields the applier would change that other managers own."""

    def __init__(self, conflicts: list[Conflict]) -> None:
        self.conflicts = conflicts
        super().__init__(self.message)

    @property
    def message(self) -> str:
        if len(self.conflicts) == 1:
            c = self.conflicts[0]
            return f"Apply failed with 1 conflict: conflict with {c.owner}: {path_string(c.path)}"
        by_owner: dict[str, list[Path]] = {}
        for c in self.conflicts:
            by_owner.setdefault(c.owner, []).append(c.path)
        lines: list[str] = []
        for owner in sorted(by_owner):
            lines.append(f"conflicts with {owner}:")
            lines.extend(f"- {path_string(p)}" for p in by_owner[owner])
        return f"Apply failed with {len(self.conflicts)} conflicts: " + "\n".join(lines)


class ManagedFieldsError(ValueError):
    """``metadata.managedFields`` that cannot be read; ``field`` names the place."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


# --- paths ---------------------------------------------------------------------------------------

def canonical(value: Any) -> str:
    """``value`` as compact JSON with sorted keys. What YAML reads that JSON has no type for (a
    date, a mapping with both number and text keys) still gets a text, for admission to refuse
    with a message, after ownership was computed."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def path_string(path: Path) -> str:
    """``.spec.items[name="a"].image``, ``.metadata.finalizers[="x"]`` — structured-merge-diff's
    ``Path.String()``."""
    out: list[str] = []
    for kind, payload in path:
        if kind == "f":
            out.append(f".{payload}")
        elif kind == "k":
            keys = json.loads(payload)
            out.append("[" + ",".join(f"{k}={canonical(keys[k])}" for k in sorted(keys)) + "]")
        elif kind == "v":
            out.append(f"[={payload}]")
        else:
            out.append(f"[{payload}]")
    return "".join(out)


def _item_key(item: Any, keys: tuple[str, ...]) -> str | None:
    if not isinstance(item, dict) or not keys or any(k not in item for k in keys):
        return None
    return canonical({k: item[k] for k in keys})


def _keyed(items: list[Any], keys: tuple[str, ...]) -> list[str] | None:
    """The key of every item, or None when an item has no key or two share one (then the list is
    treated as atomic, rather than losing an item)."""
    found = [_item_key(item, keys) for item in items]
    if any(k is None for k in found) or len(set(found)) != len(found):
        return None
    return [k for k in found if k is not None]


def _list_type(lists: ListTypes, path: Path, items: list[Any]) -> ListType:
    lt = lists(path)
    if lt.kind == "map" and _keyed(items, lt.keys) is None:
        return ListType()
    if lt.kind == "set" and any(isinstance(i, dict | list) for i in items):
        return ListType()
    return lt


# --- field sets and values -----------------------------------------------------------------------

def tracked(obj: Obj | None, *, ignore: Iterable[str] = ()) -> Obj:
    """The part of ``obj`` whose fields have managers (module docstring)."""
    if not obj:
        return {}
    skipped = {"apiVersion", "kind", *ignore}
    out = {k: v for k, v in obj.items() if k not in skipped}
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        kept = {k: v for k, v in metadata.items() if k not in STRIPPED_METADATA}
        if kept:
            out["metadata"] = kept
        else:
            out.pop("metadata", None)
    return out


def without_nulls(value: Any) -> Any:
    """An apply configuration without ``null`` fields: leaving a field out and setting it to null
    both say "no opinion"."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def values(obj: Obj, lists: ListTypes = default_lists) -> dict[Path, str]:
    """Every owned path of ``obj`` with its value (canonical JSON; ``_ITEM`` for a list item)."""
    out: dict[Path, str] = {}
    _walk(obj, (), lists, out)
    return out


def field_set(obj: Obj, lists: ListTypes = default_lists) -> FieldSet:
    """The paths of ``values`` without encoding the leaves' values, which only comparisons need."""
    out: dict[Path, str] = {}
    _walk(obj, (), lists, out, leaves=False)
    return frozenset(out)


def _walk(value: Any, path: Path, lists: ListTypes, out: dict[Path, str], leaves: bool = True) -> None:
    if isinstance(value, dict):
        for key, child in value.items():
            _walk(child, (*path, ("f", str(key))), lists, out, leaves)
        return
    if isinstance(value, list) and path:
        lt = _list_type(lists, path, value)
        if lt.kind == "set":
            for item in value:
                out[(*path, ("v", canonical(item)))] = _ITEM
            return
        if lt.kind == "map":
            for item in value:
                item_path = (*path, ("k", _item_key(item, lt.keys) or ""))
                out[item_path] = _ITEM
                _walk(item, item_path, lists, out, leaves)
            return
    if path:
        out[path] = canonical(value) if leaves else _ITEM


def changes(old: Obj, new: Obj, lists: ListTypes = default_lists) -> tuple[set[Path], set[Path]]:
    """(changed or added, removed) paths from ``old`` to ``new``."""
    before, after = values(old, lists), values(new, lists)
    changed = {p for p, v in after.items() if before.get(p) != v}
    return changed, set(before) - set(after)


# --- merging and removing ------------------------------------------------------------------------

def merge(live: Any, config: Any, lists: ListTypes = default_lists, path: Path = ()) -> Any:
    """``config`` merged into ``live`` (neither is modified)."""
    if isinstance(live, dict) and isinstance(config, dict):
        out = copy.deepcopy(live)
        for key, value in config.items():
            child = (*path, ("f", str(key)))
            out[key] = merge(live[key], value, lists, child) if key in live else copy.deepcopy(value)
        return out
    if isinstance(live, list) and isinstance(config, list) and path:
        lt = _list_type(lists, path, [*live, *config])
        if lt.kind == "set":
            seen = {canonical(i) for i in live}
            return copy.deepcopy(live) + [copy.deepcopy(i) for i in config if canonical(i) not in seen]
        if lt.kind == "map":
            wanted = {_item_key(i, lt.keys): i for i in config}
            merged = []
            for item in live:
                key = _item_key(item, lt.keys)
                if key in wanted:
                    merged.append(merge(item, wanted.pop(key), lists, (*path, ("k", key or ""))))
                else:
                    merged.append(copy.deepcopy(item))
            return merged + [copy.deepcopy(i) for i in wanted.values()]
    return copy.deepcopy(config)


def remove(obj: Obj, paths: Iterable[Path]) -> Obj:
    """``obj`` without ``paths``; a map left empty by a removal goes too (below the top level)."""
    out = copy.deepcopy(obj)
    wanted = set(paths)
    # a removed item takes its fields along: removing those first would unmake its key
    outermost = [p for p in wanted if not any(p[:i] in wanted for i in range(1, len(p)))]
    for path in sorted(outermost, key=len, reverse=True):
        _remove(out, path, top=True)
    return out


def _remove(node: Any, path: Path, *, top: bool = False) -> bool:
    """Removes ``path`` under ``node``; True when ``node`` is a map the removal left empty."""
    (kind, payload), rest = path[0], path[1:]
    if kind == "f" and isinstance(node, dict) and payload in node:
        if not rest:
            del node[payload]
        elif _remove(node[payload], rest) and not top:
            del node[payload]
        return not node
    if kind in ("k", "v") and isinstance(node, list):
        for index, item in enumerate(node):
            match = canonical(item) == payload if kind == "v" else _matches(item, payload)
            if match:
                if not rest:
                    del node[index]
                else:
                    _remove(item, rest)
                break
    return False


def _matches(item: Any, payload: str) -> bool:
    keys = json.loads(payload)
    return isinstance(item, dict) and all(k in item and item[k] == v for k, v in keys.items())


# --- FieldsV1 --------------------------------------------------------------------------------------

def encode_fields(fields: FieldSet) -> dict[str, Any]:
    """A field set as ``fieldsV1``: ``{"f:spec": {"f:x": {}}}``; ``".": {}`` marks a member that
    also has members below it (a keyed list item)."""
    root: dict[str, Any] = {}
    members = []
    for path in fields:  # in any order: _sorted orders every level
        node = root
        for kind, payload in path:
            node = node.setdefault(f"{kind}:{payload}", {})
        members.append(node)
    for node in members:
        if node:
            node["."] = {}
    return _sorted(root)


def _sorted(node: dict[str, Any]) -> dict[str, Any]:
    return {k: _sorted(node[k]) for k in sorted(node)}


def decode_fields(value: Any, where: str = "fieldsV1") -> FieldSet:
    if not isinstance(value, dict):
        raise ManagedFieldsError(where, "must be an object of f:/k:/v:/i: keys")
    out: set[Path] = set()
    _decode(value, (), out, where)
    return frozenset(out)


def _decode(node: dict[str, Any], path: Path, out: set[Path], where: str) -> None:
    if not node and path:
        out.add(path)
    for key, child in node.items():
        if key == ".":
            if path:
                out.add(path)
            continue
        kind, sep, payload = str(key).partition(":")
        if not sep or kind not in ("f", "k", "v", "i") or not isinstance(child, dict):
            raise ManagedFieldsError(where, f"{key!r} is not a field set key (f:name, k:{{...}}, v:value, i:n)")
        if kind in ("k", "v"):
            try:
                parsed = json.loads(payload)
            except ValueError:
                raise ManagedFieldsError(where, f"{key!r} does not hold JSON after {kind}:") from None
            payload = canonical(parsed)
        _decode(child, (*path, (kind, payload)), out, where)


def decode_managed(value: Any) -> list[Entry]:
    """``metadata.managedFields`` as entries; an entry without fields (``[{}]``, the apiserver's way
    to reset ownership) is dropped."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ManagedFieldsError("metadata.managedFields", "must be a list of entries")
    entries: list[Entry] = []
    for index, item in enumerate(value):
        where = f"metadata.managedFields[{index}]"
        if not isinstance(item, dict):
            raise ManagedFieldsError(where, "must be an object")
        fields = item.get("fieldsV1")
        if not fields:
            continue
        fields_type = item.get("fieldsType", "FieldsV1")
        if fields_type != "FieldsV1":
            raise ManagedFieldsError(f"{where}.fieldsType", f'must be "FieldsV1", not {fields_type!r}')
        operation = item.get("operation")
        if operation not in (APPLY, UPDATE):
            raise ManagedFieldsError(f"{where}.operation", f'must be "Apply" or "Update", not {operation!r}')
        texts = {k: item.get(k) for k in ("manager", "apiVersion", "time", "subresource")}
        for key, text in texts.items():
            if text is not None and not isinstance(text, str):
                raise ManagedFieldsError(f"{where}.{key}", "must be a string")
        problem = manager_problem(texts["manager"] or "")
        if problem:  # a PUT's own managedFields: held to the fieldManager parameter's rule
            raise ManagedFieldsError(f"{where}.manager", problem)
        entries.append(Entry(
            manager=texts["manager"] or "", operation=operation, api_version=texts["apiVersion"] or "",
            fields=decode_fields(fields, f"{where}.fieldsV1"), time=texts["time"],
            subresource=texts["subresource"] or "",
        ))
    return entries


def encode_managed(entries: Iterable[Entry]) -> list[dict[str, Any]]:
    """Entries as ``metadata.managedFields``, oldest first (Apply before Update at the same time)."""
    ordered = sorted((e for e in entries if e.fields),
                     key=lambda e: (e.time or "", e.operation != APPLY, e.manager))
    out: list[dict[str, Any]] = []
    for e in ordered:
        item: dict[str, Any] = {"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version}
        if e.time:
            item["time"] = e.time
        item.update(fieldsType="FieldsV1", fieldsV1=encode_fields(e.fields))
        if e.subresource:
            item["subresource"] = e.subresource
        out.append(item)
    return out


# --- the operations ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Applied:
    """What an apply produces: the tracked part of the new object and the new entries."""

    tracked: Obj
    entries: list[Entry]


def apply(
    live: Obj | None, config: Obj, entries: list[Entry], *, manager: str, api_version: str, force: bool,
    now: str, ignore: Iterable[str] = (), lists: ListTypes = default_lists, subresource: str = "",
) -> Applied:
    """Server-side apply of ``config`` by ``manager`` onto ``live`` (None: create). Raises
    ``ApplyConflict`` unless ``force``. For the status subresource, ``live`` and ``config`` hold
    only ``status``."""
    ignore = tuple(ignore)
    live_part = tracked(live, ignore=ignore)
    config_part = tracked(without_nulls(config), ignore=ignore)
    managers = {e.key: e for e in entries}
    if live is not None and not managers:
        owned = field_set(live_part, lists)
        if owned:
            first = Entry(BEFORE_FIRST_APPLY, UPDATE, api_version, owned, now)
            managers[first.key] = first
    me = (manager, APPLY, subresource)
    last = managers.get(me)
    applied_set = field_set(config_part, lists)
    result = merge(live_part, config_part, lists)
    managers[me] = Entry(manager, APPLY, api_version, applied_set, now, subresource)
    if last is not None:
        held: set[Path] = set().union(*(e.fields for e in managers.values()))
        stale = {p for p in last.fields - held if not any(o[:len(p)] == p for o in held)}
        result = remove(result, stale)
    changed, removed = changes(live_part, result, lists)
    conflicts = [Conflict(e, p) for key, e in managers.items() if key != me
                 for p in sorted(e.fields & changed)]
    if conflicts and not force:
        allowed = _last_applied_fields(live_part, lists) if manager == KUBECTL else frozenset()
        conflicts = [c for c in conflicts if c.path not in allowed]
        if conflicts:
            raise ApplyConflict(conflicts)
    mine = managers.pop(me)
    if (last is not None and last.fields == mine.fields and last.api_version == api_version
            and not changed and not removed):
        mine = replace(mine, time=last.time)
    others = [replace(e, fields=e.fields - changed - removed) for e in managers.values()]
    if manager == KUBECTL and _annotations(live_part).get(LAST_APPLIED):
        result = _with_last_applied(result, config)
    return Applied(result, [e for e in [*others, mine] if e.fields])


def _annotations(part: Obj) -> dict[str, Any]:
    annotations = (part.get("metadata") or {}).get("annotations")
    return annotations if isinstance(annotations, dict) else {}


def _last_applied_fields(live_part: Obj, lists: ListTypes) -> FieldSet:
    """The fields of the client-side apply annotation: kubectl's server-side apply takes them
    over without conflicts (the apiserver's last-applied manager)."""
    try:
        last = json.loads(_annotations(live_part).get(LAST_APPLIED) or "")
    except (ValueError, TypeError):
        return frozenset()
    return field_set(tracked(last), lists) if isinstance(last, dict) else frozenset()


def _with_last_applied(part: Obj, config: Obj) -> Obj:
    """``part`` with the client-side apply annotation set to ``config``, so a later client-side
    ``kubectl apply`` diffs against what was applied last (the apiserver's last-applied updater)."""
    shown = copy.deepcopy(config)
    metadata = shown.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("annotations"), dict):
        metadata["annotations"].pop(LAST_APPLIED, None)
        if not metadata["annotations"]:
            del metadata["annotations"]
    out = copy.deepcopy(part)
    out.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED] = canonical(shown)
    return out


def update(
    old: Obj | None, new: Obj, entries: list[Entry], *, manager: str, api_version: str, now: str,
    ignore: Iterable[str] = (), lists: ListTypes = default_lists, subresource: str = "",
) -> list[Entry]:
    """The entries after a non-apply write of ``new`` over ``old`` (None: create) by ``manager``."""
    if old is not None and not entries:
        return []
    ignore = tuple(ignore)
    changed: set[Path]
    removed: set[Path] = set()
    if old is None:  # a create: every field is new, no value needs comparing
        changed = set(field_set(tracked(new, ignore=ignore), lists))
    else:
        changed, removed = changes(tracked(old, ignore=ignore), tracked(new, ignore=ignore), lists)
    if not changed and not removed:
        return list(entries)
    me = (manager, UPDATE, subresource)
    out: list[Entry] = []
    mine = Entry(manager, UPDATE, api_version, frozenset(changed), now, subresource)
    for e in entries:
        if e.key == me:
            mine = replace(mine, fields=frozenset((e.fields - removed) | changed))
        else:
            out.append(replace(e, fields=e.fields - changed - removed))
    return _capped([e for e in [*out, mine] if e.fields])


def created(
    new: Obj, *, manager: str, api_version: str, now: str, ignore: Iterable[str] = (),
    lists: ListTypes = default_lists,
) -> list[dict[str, Any]]:
    """A create's ``managedFields`` when the request brought none: ``encode_managed(update(None,
    new, [], ...))``, built in one walk of the object instead of a field set encoded afterwards."""
    try:
        fields = _created_node(tracked(new, ignore=tuple(ignore)), (), lists)
    except _SamePath:  # two keys that read alike ({1: …, "1": …}): the general way merges them
        return encode_managed(update(None, new, [], manager=manager, api_version=api_version, now=now,
                                     ignore=ignore, lists=lists))
    if not fields:
        return []
    item: dict[str, Any] = {"manager": manager, "operation": UPDATE, "apiVersion": api_version}
    if now:
        item["time"] = now
    item.update(fieldsType="FieldsV1", fieldsV1=fields)
    return [item]


class _SamePath(Exception):
    pass


def _created_node(value: Any, path: Path, lists: ListTypes) -> dict[str, Any] | None:
    """The ``fieldsV1`` node of ``value`` at ``path`` (keys sorted, as ``encode_fields`` has them):
    None when neither ``path`` nor anything below it is a field ``_walk`` records."""
    if isinstance(value, dict):
        node: dict[str, Any] = {}
        for key, child in value.items():
            payload = str(key)
            # a scalar below is a field of its own: no call for it
            sub = _created_node(child, (*path, ("f", payload)), lists) if isinstance(child, dict | list) else {}
            if sub is not None:
                name = f"f:{payload}"
                if name in node:
                    raise _SamePath
                node[name] = sub
        return {k: node[k] for k in sorted(node)} if node else None
    if isinstance(value, list) and path:
        lt = _list_type(lists, path, value)
        if lt.kind == "set":
            return {k: {} for k in sorted({f"v:{canonical(item)}" for item in value})} or None
        if lt.kind == "map":
            node = {}
            for item in value:
                payload = _item_key(item, lt.keys) or ""
                below = _created_node(item, (*path, ("k", payload)), lists)
                node[f"k:{payload}"] = dict(sorted({**below, ".": {}}.items())) if below else {}
            return {k: node[k] for k in sorted(node)} if node else None
    return {} if path else None


def _capped(entries: list[Entry]) -> list[Entry]:
    """At most ``MAX_UPDATE_MANAGERS`` Update entries: the oldest are merged into one
    ``ancient-changes`` entry, as the apiserver does, so a stream of writers with new names (a
    User-Agent each) cannot grow ``managedFields`` without bound."""
    updates = sorted((e for e in entries if e.operation == UPDATE and e.manager != ANCIENT_CHANGES),
                     key=lambda e: e.time or "")
    bucket = next((e for e in entries if e.key == (ANCIENT_CHANGES, UPDATE, "")), None)
    excess = len(updates) + (bucket is not None) - MAX_UPDATE_MANAGERS
    if excess <= 0:
        return entries
    merged = updates[:excess + (bucket is None)]
    fields = frozenset().union(*(e.fields for e in merged), bucket.fields if bucket else frozenset())
    ancient = Entry(ANCIENT_CHANGES, UPDATE, merged[-1].api_version, fields, merged[-1].time)
    gone = {e.key for e in merged} | {ancient.key}
    return [*(e for e in entries if e.key not in gone), ancient]


def rebuild(base: Obj, part: Obj, *, ignore: Iterable[str] = ()) -> Obj:
    """``part`` (a ``tracked`` object) with what ``tracked`` left out taken back from ``base``."""
    ignore = tuple(ignore)
    out = copy.deepcopy(part)
    for key in ("apiVersion", "kind", *ignore):
        if key in base:
            out[key] = copy.deepcopy(base[key])
    metadata = dict(out.get("metadata") or {})
    for key, value in (base.get("metadata") or {}).items():
        if key in STRIPPED_METADATA and key != "managedFields":
            metadata[key] = copy.deepcopy(value)
    out["metadata"] = metadata
    return out


def manager_problem(manager: str) -> str | None:
    """Why ``manager`` cannot name a field manager (the apiserver's rule), or None."""
    if len(manager) > MAX_MANAGER_LENGTH:
        return f"must be at most {MAX_MANAGER_LENGTH} characters, not {len(manager)}"
    if not manager.isprintable():
        return "must contain printable characters only"
    return None


def manager_from_user_agent(user_agent: str | None) -> str:
    """The default manager of a non-apply write: the User-Agent up to its first ``/``, as the
    apiserver has it (``kubectl/v1.37.0 (linux/amd64)`` → ``kubectl``)."""
    prefix = (user_agent or "").split("/", 1)[0].strip()
    prefix = "".join(ch for ch in prefix if ch.isprintable())
    return prefix[:MAX_MANAGER_LENGTH] or "unknown"
