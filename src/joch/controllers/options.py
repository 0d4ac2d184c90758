"""How the controller manager is configured: one frozen ``ControllerOptions``.

``joch server`` and ``joch controller`` build it from their flags; tests build it directly with
short periods. Leader election times follow client-go's defaults (15 s lease, 10 s renew deadline,
2 s retry period). The log and artifact limits travel in each run's ``RunnerSpec``: the runner
enforces them where it writes.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from joch.runtime.kubernetes.settings import KubeSettings

MiB = 1024 * 1024
GiB = 1024 * MiB


def default_identity() -> str:
    """``host/pid/random``: unique per process, and says which host and process hold a lease, so a
    restarted server on the same host can tell that the previous holder is dead."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class ControllerOptions:
    data_dir: Path = Path(".joch")
    identity: str = field(default_factory=default_identity)
    leader_election: bool = True
    lease_name: str = "joch-controller-manager"
    lease_namespace: str = "joch-system"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    resync_period: float = 30.0
    workers: int = 4
    max_concurrent_runs: int | None = 10
    max_concurrent_runs_per_namespace: int | None = None
    grace_seconds: float = 10.0  # SIGTERM → SIGKILL when a run is cancelled or times out
    max_log_bytes: int | None = 64 * MiB  # a run's log keeps the first and last halves of this (None: all)
    max_artifact_bytes: int | None = GiB  # a larger output artifact is refused (None: no limit)
    sandbox: str = "none"  # the local runtime's: auto, bwrap or none (joch server's --sandbox, default auto)
    sandbox_hide: tuple[Path, ...] = ()  # besides the data dir: what sandboxed agents must not read (--store-file)
    sandbox_reason: str | None = None  # why sandbox is none (auto found no bubblewrap): each run's status says it
    agent_user: str | None = None  # --agent-user: whom a root server's sandboxed agents run as (None: nobody)
    # The API server as agents reach it (their JOCH_API_URL, for the run callback). `joch server`
    # derives it from --host and --port; `joch controller` takes --api-url. None: no callback.
    api_url: str | None = None
    # The Kubernetes runtime's settings (joch server --kube-config or --kube-in-cluster); None: runs
    # whose runtime.type is kubernetes fail RuntimeUnavailable.
    kubernetes: KubeSettings | None = None
