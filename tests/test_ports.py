"""support/ports.py: the ports the tests hand to server subprocesses lie below the kernel's ephemeral
range (no outgoing connection of another xdist worker can take one before the server binds it), in a
band of their own per worker, and are free."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from support import ports


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low < ports.FIRST + 8 * ports.BAND:
        pytest.skip(f"the ephemeral range starts at {low}: no room below it")
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    band = range(ports.FIRST + worker * ports.BAND, ports.FIRST + (worker + 1) * ports.BAND)
    got = [ports.free_port() for _ in range(20)]
    assert len(set(got)) == 20
    assert all(port in band and port < low for port in got)
    with socket.socket() as s:
        s.bind(("127.0.0.1", got[0]))  # really free


def test_a_port_in_use_is_passed_over() -> None:
    taken = socket.socket()
    try:
        while True:
            port = ports.free_port()
            try:
                taken.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        taken.listen()
        assert port not in {ports.free_port() for _ in range(ports.BAND)}
    finally:
        taken.close()
