"""Every store holds the Namespaces its objects live in (see ``joch.api.namespaces``).

Run when a SQL store is opened: ``default`` and ``joch-system`` are created in a new store, and a
store written by an older Joch (before Namespaces were a kind) gets a Namespace for every
namespace its objects already use, so admission, which refuses to create objects in a namespace
that does not exist, accepts everything it accepted before. Nothing is written when they all exist
(a store opened a second time stays at its revision). Several servers opening one Postgres store
at once agree: the missing ones are listed again inside the write transaction, which holds the
revision lock.
"""

from __future__ import annotations

from typing import Protocol

from joch.api.namespaces import NAMESPACE, PERMANENT, namespace_object
from joch.store.base import Store


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
