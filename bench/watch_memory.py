"""Server memory with stuck watchers: RSS before, at peak and after a burst of writes.

Starts ``joch server --no-controllers`` on a fresh SQLite store in a subprocess, opens ``--watchers``
(5) ``?watch=1`` streams whose clients never read (raw sockets with a small receive buffer), then
writes ``--writes`` (100,000) Agents of about 1 KiB each straight into the store file in
transactions of 500 (the server's change feed picks them up as it does another replica's writes).
It prints the server's resident memory before the watchers, its peak (``VmHWM``) and its memory
after the burst, and then reads each stuck stream to its end to show how it was ended.

With unbounded watch buffers every stuck watcher held every change, decoded; with the bound (see
``joch.store.feed``) a watcher that falls ``--watch-buffer-events`` behind is ended with an ERROR
event carrying a 410, and its buffer is freed.

    .venv/bin/python bench/watch_memory.py                     # the figures, ~1-2 minutes
    .venv/bin/python bench/watch_memory.py --writes 20000      # quicker
    .venv/bin/python bench/watch_memory.py --src /tmp/old/src  # the server from other sources

``--src`` serves with another copy of Joch's sources (say ``git archive <commit> src | tar -x -C
/tmp/old`` from before the bound), put first on the server's ``PYTHONPATH``; the writes always go
through this checkout's store code, so both must share a schema version.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, VENV_BIN, free_port

from joch.api.kinds import AGENT
from joch.store import open_store

BATCH = 500
PROMPT = "x" * 900  # an Agent of about 1 KiB as stored


def rss_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def mib(kib: int) -> str:
    return f"{kib / 1024:,.0f} MB"


def stuck_watcher(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /apis/joch.dev/v1alpha1/agents?watch=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return sock


def drain(sock: socket.socket, timeout: float, limit: float = 60.0) -> tuple[int, str]:
    """Read a stuck stream to its end (or for ``limit`` seconds): (events read, how it ended)."""
    sock.settimeout(timeout)
    events, tail = 0, b""
    deadline = time.monotonic() + limit
    try:
        while not tail.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            events += (tail[-8:] + chunk).count(b'"type"') - tail[-8:].count(b'"type"')
            tail = (tail + chunk)[-65536:]
            if time.monotonic() > deadline:
                return events, f"still streaming after {limit:.0f} s (nothing ends it)"
    except TimeoutError:
        return events, "still open (nothing ends it)"
    last = tail.rfind(b'{"type":"ERROR"')
    if last >= 0:
        status = json.loads(tail[last:].split(b"\n", 1)[0])["object"]
        return events, f"ERROR {status.get('code')} {status.get('reason')}"
    return events, "ended"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--watchers", type=int, default=5)
    parser.add_argument("--writes", type=int, default=100_000)
    parser.add_argument("--src", help="serve with the joch package under this directory instead")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to wait after the writes")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="joch-bench-") as tmp:
        url = f"sqlite:///{tmp}/joch.db"
        open_store(url, history=None).close()  # create the schema
        port = free_port()
        log = (Path(tmp) / "server.log").open("w")
        env = {**os.environ, "PYTHONPATH": args.src} if args.src else None
        server = subprocess.Popen(
            [str(VENV_BIN / "joch"), "server", "--store", url, "--port", str(port), "--no-controllers"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"the server did not start: see {tmp}/server.log")
                time.sleep(0.1)
            time.sleep(1.0)
            before = rss_kib(server.pid)["VmRSS"]
            sockets = [stuck_watcher(port) for _ in range(args.watchers)]
            time.sleep(1.0)
            store = open_store(url, history=None)
            started = time.monotonic()
            for first in range(0, args.writes, BATCH):
                with store.transaction() as tx:
                    for i in range(first, min(args.writes, first + BATCH)):
                        tx.create(AGENT, {"metadata": {"name": f"a{i}", "namespace": "default"},
                                          "spec": {"providerRef": {"name": "p"}, "systemPrompt": PROMPT}})
            wrote = time.monotonic() - started
            store.close()
            time.sleep(args.settle)  # the feed catches up (it polls every second for others' writes)
            after = rss_kib(server.pid)
            ends = [drain(sock, timeout=10, limit=20) for sock in sockets]
            for sock in sockets:
                sock.close()
        finally:
            server.terminate()
            server.wait(timeout=15)
            log.close()

    print(f"joch server (from {args.src or 'this checkout'}), {args.watchers} watchers that read nothing, "
          f"{args.writes:,} writes of ~1 KiB in {wrote:.0f} s")
    print(f"  RSS before the watchers   {mib(before)}")
    print(f"  RSS peak (VmHWM)          {mib(after['VmHWM'])}")
    print(f"  RSS after the writes      {mib(after['VmRSS'])}")
    for n, (events, how) in enumerate(ends, 1):
        print(f"  watcher {n}: {events:,} events reached the socket, then {how}")


if __name__ == "__main__":
    main()
