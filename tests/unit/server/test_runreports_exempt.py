"""The Job runner's report routes authenticate with the run token themselves (``server.runreports``):
user authentication leaves exactly those paths alone, and only for PUT."""

from __future__ import annotations

from joch.server.auth.middleware import is_exempt

BASE = "/v1/namespaces/ns/agentruns/r/attempts/2"


def test_the_report_routes_and_only_they_are_exempt() -> None:
    assert all(is_exempt("PUT", f"{BASE}/{tail}") for tail in ("record", "log", "artifacts/changes.patch"))
    assert not any(is_exempt("GET", f"{BASE}/{tail}") for tail in ("record", "log", "artifacts/x"))
    assert not is_exempt("PUT", f"{BASE}/artifacts")
    assert not is_exempt("PUT", f"{BASE}/artifacts/x/y")
    assert not is_exempt("PUT", f"{BASE}/other")
    assert not is_exempt("PUT", "/v1/namespaces/ns/agentruns//attempts/2/record")
    assert not is_exempt("PUT", "/apis/runtime.joch.dev/v1alpha1/namespaces/ns/agentruns/r")
