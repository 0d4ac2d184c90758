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
from joch.store import ListOptions, Store, open_store

NAMESPACES = ("team-a", "team-b", "team-x")  # namespaces the contract tests write to besides default


@pytest.fixture(scope="module")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from support.kubecluster import cluster

    with cluster(tmp_path_factory.mktemp("kubecluster")) as c:
        for name in NAMESPACES:  # a cluster refuses writes into a namespace that does not exist
            httpx.post(f"{c.url}/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": name}}, timeout=10)
        yield c


def backing_url(cluster: object) -> str:
    """The stand-in's own SQLite store (what etcd is to an apiserver)."""
    return f"sqlite:///{Path(cluster.kubeconfig).parent / 'cluster-data' / 'joch.db'}"  # type: ignore[attr-defined]


def empty(url: str) -> None:
    """Delete every object of every Joch kind (finalizers cleared first) in one transaction on the
    stand-in's own store: quicker than one request per object, and the stand-in sees it as any write."""
    store = open_store(url, history=None)
    try:
        with store.transaction() as tx:
            for kind in REGISTRY:
                if not kind.group:  # core kinds (Namespaces) are the cluster's, not the test's
                    continue
                for obj in tx.list(kind, ListOptions()).items:
                    m = obj["metadata"]
                    if m.get("finalizers"):
                        tx.update(kind, {**obj, "metadata": {**m, "finalizers": []}})
                    try:
                        tx.delete(kind, m.get("namespace"), m["name"])
                    except errors.NotFound:
                        pass
    finally:
        store.close()


@pytest.fixture
def kubernetes_url(kube_cluster: object) -> str:
    empty(backing_url(kube_cluster))
    return f"kubernetes://?kubeconfig={Path(kube_cluster.kubeconfig)}"  # type: ignore[attr-defined]


@pytest.fixture
def backing(kube_cluster: object) -> Iterator[Store]:
    """The stand-in's own store, opened beside it: compacting it is what etcd compaction is to a client."""
    s = open_store(backing_url(kube_cluster), history=None)
    yield s
    s.close()
