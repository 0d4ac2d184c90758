"""A kind's routes are built once per process and shared by every app (``resources.install``): each
app still serves its own store with its own options, found through the request."""

from __future__ import annotations

from pathlib import Path

from fastapi.routing import APIRoute

from joch.server import ServerOptions
from joch.server.app import create_app
from joch.server.testing import live_server
from joch.store import open_store

GROUP_VERSION = "joch.dev/v1alpha1"
AGENT = {"apiVersion": GROUP_VERSION, "kind": "Agent", "metadata": {"name": "a"},
         "spec": {"providerRef": {"name": "demo-agent"}, "runtime": {"type": "local"}}}
AGENTS = f"/apis/{GROUP_VERSION}/namespaces/default/agents"


def test_two_apps_share_their_kind_routes_and_each_serves_its_own_store_and_limits(tmp_path: Path) -> None:
    first, second = (open_store(f"sqlite:///{tmp_path / name}.db") for name in ("one", "two"))
    try:
        small = ServerOptions(max_body_bytes=300)
        apps = create_app(first), create_app(second, options=small)
        routes = [{(r.path, *sorted(r.methods)): r for r in app.routes if isinstance(r, APIRoute)} for app in apps]
        create = (AGENTS.replace("default", "{namespace}"), "POST")
        assert routes[0][create] is routes[1][create], "the routes were built twice"
        with live_server(first) as one, live_server(second, small) as two:
            created = one.http.post(AGENTS, json=AGENT)
            assert created.status_code == 201, created.text
            assert two.http.get(f"{AGENTS}/a").status_code == 404, "the second app read the first one's store"
            assert one.http.get(f"{AGENTS}/a").status_code == 200
            padded = {**AGENT, "metadata": {"name": "a", "annotations": {"pad": "x" * 300}}}
            assert one.http.put(f"{AGENTS}/a", json=padded).status_code == 200
            too_large = two.http.put(f"{AGENTS}/a", json=padded)
            assert too_large.status_code == 413 and "300 bytes" in too_large.json()["message"], too_large.text
    finally:
        first.close()
        second.close()
