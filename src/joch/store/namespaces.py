"""Every store holds the Namespaces its objects live in (see ``joch.api.namespaces``).

Run when a SQL store is opened: ``default`` and ``joch-system`` are created in a new store, and a
store written by an older Joch (before Namespaces were a kind) gets a Namespace for every
namespace its objects already use, so admission, which refuses to create objects in a namespace
that does not exist, accepts everything it accepted before. Nothing is written when they all exist
(a store opened a second time stays at its revision). Several servers opening one Postgres store
at once agree: the missing ones are listed again inside the write transaction, which holds the
revision lock.

``terminate`` is how a namespace is deleted (the ``DELETE`` route and the namespace controller):
in one transaction it marks the Namespace ``Terminating``, deletes every namespaced object in it,
and deletes the Namespace once nothing is left. An object held back by finalizers (a run whose
runtime cleanup is pending) keeps the Namespace ``Terminating``; the controller calls
``terminate`` again until it is empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from joch.api import errors
from joch.api.namespaces import NAMESPACE, PERMANENT, TERMINATING, namespace_object
from joch.api.registry import KindInfo
from joch.store.base import ListOptions, Obj, Store, Writer


class UsedNamespaces(Protocol):
    def __call__(self) -> set[str]: ...


def ensure(store: Store, used: UsedNamespaces) -> list[str]:
    """Create the missing Namespaces (``PERMANENT`` and every one in ``used()``); their names."""
    wanted = {*PERMANENT, *used()}
    if wanted <= _existing(store):
        return []
    with store.transaction() as writer:
        existing = {o["metadata"]["name"] for o in writer.list(NAMESPACE).items}
        missing = sorted(wanted - existing)
        for name in missing:
            writer.create(NAMESPACE, namespace_object(name))
    return missing


def _existing(store: Store) -> set[str]:
    return {o["metadata"]["name"] for o in store.list(NAMESPACE).items}


def terminate(store: Store, name: str, kinds: Iterable[KindInfo]) -> tuple[Obj, bool]:
    """Delete namespace ``name`` and what it holds (see the module docstring): the Namespace as last
    written, and whether it is gone. ``default`` and ``joch-system`` are never deleted."""
    if name in PERMANENT:
        raise errors.Forbidden(f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                               kind="namespaces", name=name)
    with store.transaction() as writer:
        current = writer.get(NAMESPACE, None, name)
        if (current.get("status") or {}).get("phase") != TERMINATING:
            current = writer.update_status(NAMESPACE, {**current, "status": {"phase": TERMINATING}})
        if _emptied(writer, name, kinds):
            return writer.delete(NAMESPACE, None, name), True
        return current, False


def _emptied(writer: Writer, namespace: str, kinds: Iterable[KindInfo]) -> bool:
    """Delete what ``namespace`` holds; whether nothing is left (finalizers may hold objects back)."""
    left = 0
    for kind in kinds:
        if not kind.namespaced:
            continue
        for obj in writer.list(kind, ListOptions(namespace=namespace)).items:
            deleted = writer.delete(kind, namespace, obj["metadata"]["name"])
            if deleted["metadata"].get("deletionTimestamp") and deleted["metadata"].get("finalizers"):
                left += 1
    return left == 0
