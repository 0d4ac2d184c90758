"""A stand-in Kubernetes API server for the Kubernetes Job runtime and the CRD store tests.

No kube-apiserver runs on these machines. ``joch server`` is itself a Kubernetes-compatible API
server, so the stand-in is a real ``joch server`` process (``--no-controllers``: an API server, not a
control plane) whose registry also declares the Kubernetes kinds under test — the modules of
``support.kubekinds`` (``batch/v1`` Jobs, ``v1`` Pods, ``coordination.k8s.io/v1`` Leases, ...), imported
in that process only. ``cluster()`` starts one and writes a kubeconfig for it, so the code under test
connects exactly as it would to a real cluster (lightkube's ``KubeConfig``)."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from support import stop_server, wait_ready

TESTS = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Cluster:
    url: str
    kubeconfig: Path
    log: Path
    process: subprocess.Popen[str]


def kubeconfig(url: str, path: Path, namespace: str = "default") -> Path:
    """A kubeconfig with one context, ``stand-in``, pointing at ``url`` (no credentials)."""
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
              "clusters": [{"name": "stand-in", "cluster": {"server": url}}],
              "users": [{"name": "tester", "user": {}}],
              "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "tester",
                                                             "namespace": namespace}}]}
    path.write_text(yaml.safe_dump(config))
    return path


@contextmanager
def cluster(tmp: Path, *extra_args: str) -> Iterator[Cluster]:
    """A stand-in cluster on a free port of 127.0.0.1 with its own SQLite data dir under ``tmp``."""
    from support.jochserver import free_port

    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = tmp / "cluster.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        [sys.executable, "-m", "support.kubecluster", "server", "--data-dir", str(tmp / "cluster-data"),
         "--port", str(port), "--no-controllers", *extra_args],
        stdout=log.open("a"), stderr=subprocess.STDOUT, text=True, env=env, cwd=TESTS)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process)
        yield Cluster(url, kubeconfig(url, tmp / "kubeconfig"), log, process)
    finally:
        stop_server(process)


def main() -> None:
    """``python -m support.kubecluster server ...``: ``joch`` with the stand-in kinds registered."""
    import support.kubekinds as kinds

    for module in pkgutil.iter_modules(kinds.__path__):
        importlib.import_module(f"{kinds.__name__}.{module.name}")
    from joch.cli.main import main as joch

    sys.argv = ["joch", *sys.argv[1:]]
    joch()


if __name__ == "__main__":
    main()
