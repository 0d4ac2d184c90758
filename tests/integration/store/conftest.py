"""The Kubernetes store's backend for the store tests: a stand-in cluster (``support.kubecluster``: a
real ``joch server`` process speaking the Kubernetes wire format) shared by a module's tests, and
emptied before each test so every test starts from an empty store as on SQLite and Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from joch.api import errors
from joch.api.registry import REGISTRY
from joch.store import ListOptions

NAMESPACES = ("team-a", "team-b", "team-x")  # namespaces the contract tests write to besides default


@pytest.fixture(scope="module")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from support.kubecluster import cluster

    with cluster(tmp_path_factory.mktemp("kubecluster")) as c:
        for name in NAMESPACES:  # a cluster refuses writes into a namespace that does not exist
            httpx.post(f"{c.url}/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": name}}, timeout=10)
        yield c


def empty(url: str) -> None:
    """Delete every object of every Joch kind (finalizers cleared first) through the store under test."""
    from joch.store.kubernetes import KubernetesStore

    store = KubernetesStore(url)
    try:
        for kind in REGISTRY:
            for obj in store.list(kind, ListOptions()).items:
                m = obj["metadata"]
                try:
                    if m.get("finalizers"):
                        store.update(kind, {**obj, "metadata": {**m, "finalizers": []}})
                    store.delete(kind, m.get("namespace"), m["name"])
                except errors.NotFound:
                    pass
    finally:
        store.close()


@pytest.fixture
def kubernetes_url(kube_cluster: object) -> str:
    url = f"kubernetes://?kubeconfig={Path(kube_cluster.kubeconfig)}"  # type: ignore[attr-defined]
    empty(url)
    return url
