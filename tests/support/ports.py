"""Free localhost ports for the servers the tests start as subprocesses (``joch server --port N``).

A port found by binding port 0 is one of the kernel's ephemeral ports. Between that probe and the
server's own bind (a second or more: an interpreter starts and imports joch) any outgoing connection
of any process may take it as its local port — under ``make test`` that is the HTTP and PostgreSQL
clients of the other xdist workers — and the server then fails with "address already in use". So the
ports come from below the ephemeral range (``net.ipv4.ip_local_port_range``), where no connection
takes its local port, from a band of their own per xdist worker, starting at a random place in it
(two checkouts testing on one machine), each checked free by binding it. Where there is no room below
the range, the kernel's choice (port 0) is the fallback.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

BAND = 500
"""Ports per xdist worker."""
FIRST = 12000
"""The first port of worker gw0's band; gw1's starts BAND above, and so on."""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # the Linux default; elsewhere binding may fail and falls back to port 0


def _band() -> range | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    start = FIRST + index * BAND
    if start + BAND > _ephemeral_low():
        return None
    return range(start, start + BAND)


_BAND = _band()
_next = random.randrange(BAND)


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A localhost port nothing listens on and no connection uses, to hand to a server to bind."""
    global _next
    if _BAND is not None:
        for _ in range(BAND):
            port = _BAND[_next % BAND]
            _next += 1
            if _bindable(port):
                return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        found: int = probe.getsockname()[1]
        return found
