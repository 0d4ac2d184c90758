"""The Namespace kind, in the Kubernetes core group (``apiVersion: v1``, ``/api/v1/namespaces``).

A namespaced object can only be created in a namespace that exists (``joch.admission.namespaces``
enforces it on every admission path, as the apiserver's NamespaceLifecycle plugin does). ``default``
and ``joch-system`` always exist: every store gets them when it is opened, together with a
Namespace for each namespace its objects already use (``joch.store.namespaces``), and they cannot
be deleted. Deleting another namespace marks it ``Terminating``, deletes what it holds, and removes
it once nothing is left (``joch.server.corev1``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from joch.api.kinds import CLUSTER_NAMESPACE
from joch.api.meta import DEFAULT_NAMESPACE, Model, Str
from joch.api.registry import Column, KindInfo, register

ACTIVE = "Active"
TERMINATING = "Terminating"
NAME_LABEL = "kubernetes.io/metadata.name"
"""The label every Namespace carries with its own name, as the apiserver sets it."""
PERMANENT = (DEFAULT_NAMESPACE, CLUSTER_NAMESPACE)
"""The namespaces every store has and none may delete."""


class NamespaceSpec(Model):
    finalizers: list[Str] = Field(default_factory=list)


class NamespaceStatus(Model):
    phase: Literal["Active", "Terminating"] | None = None


NAMESPACE = register(KindInfo(
    group="", version="v1", kind="Namespace", plural="namespaces", short_names=("ns",), namespaced=False,
    spec_model=NamespaceSpec, status_model=NamespaceStatus, spec_required=False, categories=(),
    initial_phase=ACTIVE,
    columns=(Column("STATUS", "status.phase"), Column("AGE", "metadata.creationTimestamp")),
))


def collection_deletable(kind: KindInfo) -> bool:
    """Whether ``kind`` offers ``deletecollection``. Namespaces do not, as in the apiserver: a
    ``DELETE /api/v1/namespaces`` would otherwise remove ``default`` and ``joch-system`` and every
    other Namespace without the cascade, leaving their objects in namespaces that do not exist."""
    return (kind.group, kind.plural) != (NAMESPACE.group, NAMESPACE.plural)


def namespace_object(name: str) -> dict[str, Any]:
    """A new Namespace as the store writes it when it creates one itself (no admission)."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {NAME_LABEL: name}},
            "spec": {}, "status": {"phase": ACTIVE}}
