"""``coordination.k8s.io/v1`` Lease, as a cluster serves it: where the Kubernetes store's leader
election keeps its lease (``joch.store.kubernetes.resources``). Same spec as Joch's own Lease, no
status subresource in Kubernetes (the kind declares an empty one, which nobody writes)."""

from __future__ import annotations

from joch.api.kinds import AGE, LeaseSpec, LeaseStatus
from joch.api.registry import Column, KindInfo, register

LEASE = register(KindInfo(
    group="coordination.k8s.io", version="v1", kind="Lease", plural="leases",
    spec_model=LeaseSpec, status_model=LeaseStatus, categories=(), history="latest",
    columns=(Column("HOLDER", "spec.holderIdentity"), AGE),
))
