"""The URL local agents get for the server (``JOCH_API_URL``), from ``joch server``'s --host and --port."""

from __future__ import annotations

import pytest

from joch.server.serving import runtime_url


@pytest.mark.parametrize(("host", "url"), [
    ("127.0.0.1", "http://127.0.0.1:8080"),
    ("0.0.0.0", "http://127.0.0.1:8080"),  # a wildcard bind is reached on loopback
    ("::", "http://127.0.0.1:8080"),
    ("::1", "http://[::1]:8080"),
    ("localhost", "http://localhost:8080"),
    ("10.1.2.3", "http://10.1.2.3:8080"),
])
def test_the_runtime_reaches_the_server_at(host: str, url: str) -> None:
    assert runtime_url(host, 8080) == url
