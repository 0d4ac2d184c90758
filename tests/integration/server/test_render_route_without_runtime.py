"""``POST .../agentruns/render`` on a server without a runtime (workspace paths are placeholders):
a repository path the runtime would refuse is still a 422 naming the field, not a rendering."""

from __future__ import annotations

from typing import Any

import httpx

from joch.server.app import create_app
from joch.server.testing import ServerThread
from joch.store import Store
from support import provider


def test_a_path_outside_the_repository_is_refused_without_a_runtime_too(store: Store) -> None:
    with ServerThread(create_app(store)) as thread, httpx.Client(base_url=thread.url) as http:
        assert http.post("/apis/joch.dev/v1alpha1/namespaces/default/agentproviders", json=provider("p")).is_success
        agent = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
                 "spec": {"providerRef": {"name": "p"}}}
        assert http.post("/apis/joch.dev/v1alpha1/namespaces/default/agents", json=agent).is_success

        def render(path: str) -> httpx.Response:
            body: dict[str, Any] = {"spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}},
                                             "execution": {"coordinates": {"git": {"url": "/srv/repo", "path": path}}}}}
            return http.post("/v1/namespaces/default/agentruns/render", json=body)

        refused = render("../..")
        assert refused.status_code == 422, refused.text
        cause = refused.json()["details"]["causes"][0]
        assert cause["field"] == "spec.execution.coordinates.git.path" and "../.." in cause["message"]
        shown = render("sub/dir")
        assert shown.status_code == 200 and shown.json()["workingDir"] == "<workspace>/sub/dir", shown.text
