"""Stopping ``joch server`` while clients watch: the streams end, the process exits promptly and
cleanly, and nothing is logged as a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from support import ports, wait_ready


def free_port() -> int:
    return ports.free_port()  # not an ephemeral port: see support/ports.py


def test_sigint_with_open_watches_exits_cleanly(store_url: str, tmp_path: Path) -> None:
    port = free_port()
    code = ("import pathlib, sys; from joch.server import serve; from joch.store.sealing import load_ring; "
            "keys = load_ring(key_file=None, env_value=None, data_dir=pathlib.Path(sys.argv[3]))[0]; "
            "serve(store_url=sys.argv[1], port=int(sys.argv[2]), secret_keys=keys)")
    proc = subprocess.Popen([sys.executable, "-c", code, store_url, str(port), str(tmp_path / "keys")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        ended: list[str] = []
        streaming = threading.Semaphore(0)

        def watch(path: str) -> None:
            with httpx.stream("GET", f"{base}{path}", timeout=30) as response:
                streaming.release()  # the server answered: the stream is open
                for _ in response.iter_lines():
                    pass
            ended.append(path)

        paths = ["/apis/joch.dev/v1alpha1/namespaces/default/agents?watch=1",
                 "/apis/joch.dev/v1alpha1/agentproviders?watch=1", "/v1/resources/watch"]
        watchers = [threading.Thread(target=watch, args=(p,), daemon=True) for p in paths]
        for w in watchers:
            w.start()
        # Wait for every stream to be open rather than sleeping: on a loaded machine a fixed pause
        # sent SIGINT before the watches were connected, and their connections were refused.
        for _ in watchers:
            assert streaming.acquire(timeout=15), "a watch did not open"
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=15)
        took = time.monotonic() - started
        for w in watchers:
            w.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert sorted(ended) == sorted(paths)
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr
    assert took < 2.5, f"shutdown took {took:.1f}s (the grace period is 3s: streams were not ended)"
