"""The Kubernetes runtime's settings (``joch server --kube-*``); no client imported here, so the
controllers' options can hold them without loading lightkube."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_IMAGE = "ghcr.io/joch-dev/joch:latest"


@dataclass(frozen=True)
class KubeSettings:
    """``api_url``: the Joch API as the Job's Pods reach it (the runner reports there; empty: the
    server's ``--api-url``). ``namespace``: where Jobs go (default: the kubeconfig context's, or the
    server Pod's own in-cluster). ``kubeconfig`` None: the in-cluster configuration. ``image``: for
    runs whose provider and run name none. ``service_account``: the Pods' when the Agent names none
    (None: no Kubernetes identity). ``pull_grace``: how long an image that cannot be pulled may keep
    a run waiting before it fails."""

    api_url: str = ""
    kubeconfig: Path | None = None
    context: str | None = None
    namespace: str | None = None
    image: str = DEFAULT_IMAGE
    service_account: str | None = None
    ttl_seconds: int = 3600
    pull_grace: float = 60.0
    runner: tuple[str, ...] = ("joch", "runner")
