"""Which Kubernetes resource holds each Joch kind, and the one place objects cross that boundary.

Every Joch kind is a custom resource of its generated CRD (``joch crds``): group, version and plural
straight from the registry, so ``agents.joch.dev/v1alpha1`` is the CRD ``agents.joch.dev`` and an
Agent is stored exactly as ``joch get agent -o yaml`` shows it. One exception: the Lease that leader
election takes (``ops.joch.dev`` ``Lease``) is a ``coordination.k8s.io/v1`` Lease, the object every
Kubernetes controller elects its leader on, so ``kubectl get leases -n joch-system`` shows who
leads. Its spec has the same fields; only ``apiVersion`` is translated, in ``outgoing`` and
``incoming``. (So ``joch get leases -A`` on a Kubernetes store lists every Lease of the cluster,
other controllers' too.)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from lightkube.core import resource as lkr
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources import coordination_v1

from joch.api import kinds
from joch.api.registry import KindInfo

COORDINATION = ("coordination.k8s.io", "v1")


@dataclass(frozen=True)
class Mapping:
    """A Joch kind and the lightkube generic resource (main and ``/status``) that stores it."""

    kind: KindInfo
    group: str
    version: str
    resource: type[lkr.Resource]
    status: type[lkr.Resource] | None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def translated(self) -> bool:
        return self.api_version != self.kind.api_version

    @property
    def crd(self) -> str:
        """What an administrator installs so this kind can be stored (named in errors)."""
        if self.translated:
            return f"the {self.kind.plural}.{self.group} resource"
        return f"the CRD {self.kind.plural}.{self.kind.group}"

    def outgoing(self, obj: dict[str, Any]) -> dict[str, Any]:
        """``obj`` as the Kubernetes resource holds it (apiVersion and kind set; a coordination Lease
        has no status, so Joch's empty one is left out)."""
        out = {**obj, "apiVersion": self.api_version, "kind": self.kind.kind}
        if self.translated:
            out.pop("status", None)
        return out

    def incoming(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A Kubernetes object as Joch's readers expect it (the Joch apiVersion)."""
        if obj.get("kind") in (self.kind.kind, None) or self.translated:
            obj["apiVersion"] = self.kind.api_version
            obj["kind"] = self.kind.kind
        return obj


@cache
def mapping(kind: KindInfo) -> Mapping:
    if kind.key == kinds.LEASE.key:  # lightkube's own model: no /status subresource, as in Kubernetes
        return Mapping(kind=kind, group=COORDINATION[0], version=COORDINATION[1], resource=coordination_v1.Lease,
                       status=None)
    create = create_namespaced_resource if kind.namespaced else create_global_resource
    resource: Any = create(kind.group, kind.version, kind.kind, kind.plural)
    return Mapping(kind=kind, group=kind.group, version=kind.version, resource=resource, status=resource.Status)
