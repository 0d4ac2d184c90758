"""Namespace lifecycle in admission, as the apiserver's NamespaceLifecycle plugin has it.

Creating a namespaced object needs its namespace: one that does not exist is a 404
``namespaces "x" not found``, and one being deleted (``status.phase: Terminating``) is a 403.
Only creates are checked (an update concerns an object that is there already). A batch that holds
the Namespace itself (``pending``) passes, whatever the documents' order, unless that Namespace
exists and is Terminating (re-applying it does not stop its deletion). The check lives in
admission, so every writer that admits — HTTP routes, ``joch apply``, controllers that create
through admission — obeys it; the store itself does not check (it also stores the Namespaces).

Every Namespace carries the label ``kubernetes.io/metadata.name: <its name>``, which the apiserver
sets and network policies and namespace selectors rely on; a value written over it is replaced.
"""

from __future__ import annotations

from typing import Any

from joch.admission.references import Pending
from joch.api import errors
from joch.api.namespaces import NAME_LABEL, NAMESPACE, TERMINATING
from joch.api.registry import KindInfo
from joch.store.base import Writer


def check_exists(reader: Writer, kind: KindInfo, namespace: str | None, pending: Pending = frozenset()) -> None:
    if not kind.namespaced or not namespace:
        return
    try:
        found = reader.get(NAMESPACE, None, namespace)
    except errors.NotFound:
        if (NAMESPACE.kind, None, namespace) in pending:  # created in the same batch
            return
        raise errors.NotFound(
            f'namespaces "{namespace}" not found: create it first (kubectl create namespace {namespace}, or a '
            f"Namespace in the same apply)", kind="namespaces", name=namespace,
        ) from None
    if (found.get("status") or {}).get("phase") == TERMINATING:
        raise errors.Forbidden(
            f'{kind.resource} is forbidden: unable to create new content in namespace {namespace} because it is '
            "being terminated", kind=kind.plural,
        )


def check_phase(kind: KindInfo, current: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """A status write's ``status`` for ``current``: a Namespace's phase is the server's (Terminating
    only once it is being deleted, which ``joch.store.namespaces.terminate`` records), as the
    apiserver has it; a write that leaves the phase out keeps it. A status PATCH that set
    Terminating once made the namespace controller delete everything in the namespace, ``default``
    included."""
    if kind is not NAMESPACE:
        return status
    phase = (current.get("status") or {}).get("phase")
    wanted = status.get("phase")
    if wanted is None or wanted == phase:
        return {**status, "phase": phase} if phase is not None else status
    rule = ("may only be 'Terminating' once the Namespace is being deleted" if phase == TERMINATING else
            "may only be 'Active' while the Namespace is not being deleted: delete the Namespace to terminate it")
    raise errors.Invalid(f'Namespace "{current["metadata"]["name"]}" is invalid: status.phase: {rule}',
                         kind=kind.kind, name=str(current["metadata"]["name"]),
                         causes=[errors.Cause("status.phase", rule, "FieldValueInvalid")])


def with_name_label(kind: KindInfo, metadata: dict[str, Any]) -> dict[str, Any]:
    if kind is not NAMESPACE or not metadata.get("name"):
        return metadata
    return {**metadata, "labels": {**(metadata.get("labels") or {}), NAME_LABEL: metadata["name"]}}
