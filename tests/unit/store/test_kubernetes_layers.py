"""The Kubernetes client stays in the two packages that talk to a cluster, and the Kubernetes store
imports only what a store may (``api`` and ``store``), like every other backend."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src" / "joch"
KUBE_CLIENTS = re.compile(r"^\s*(?:from|import)\s+(lightkube|kubernetes)\b", re.MULTILINE)
JOCH_IMPORTS = re.compile(r"^\s*(?:from|import)\s+joch\.(\w+)", re.MULTILINE)
ALLOWED = ("store/kubernetes", "runtime/kubernetes")


def test_kubernetes_clients_are_imported_only_where_joch_talks_to_a_cluster() -> None:
    offenders = [str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
                 if KUBE_CLIENTS.search(path.read_text())
                 and not str(path.relative_to(SRC).parent).startswith(ALLOWED)]
    assert offenders == [], f"lightkube/kubernetes imported outside {ALLOWED}: {offenders}"


def test_the_kubernetes_store_imports_only_lower_layers() -> None:
    layers = {match for path in (SRC / "store" / "kubernetes").rglob("*.py")
              for match in JOCH_IMPORTS.findall(path.read_text())}
    assert layers <= {"api", "store"}, layers
