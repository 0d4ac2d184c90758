"""The Kubernetes store: Joch's objects as custom resources of its CRDs on a Kubernetes API server
(``--store kubernetes://``). ``store`` explains what passes through and what a Kubernetes store
cannot do; ``resources`` which resource holds each kind; ``watching`` the watch streams."""

from joch.store.kubernetes.store import KubernetesStore

__all__ = ["KubernetesStore"]
