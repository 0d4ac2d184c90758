"""A deleted Secret's values cannot be replayed over HTTP: ``?watch=1&resourceVersion=1`` on the
real app, after create, update and delete, shows none of them (SQLite and Postgres)."""

from __future__ import annotations

import base64
import json

from joch.server.testing import LiveServer
from support import provider

VALUES = ("s3cret-one", "s3cret-two")


def test_a_watch_from_revision_1_replays_no_value_of_a_deleted_secret(server: LiveServer) -> None:
    server.create(provider("seed"))
    created = server.create({"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret",
                             "metadata": {"name": "db"}, "spec": {"stringData": {"token": VALUES[0]}}})
    updated = server.http.put(server.path("secrets", "db"),
                              json={**created, "spec": {"stringData": {"token": VALUES[1]}}})
    assert updated.status_code == 200, updated.text
    assert server.http.delete(server.path("secrets", "db")).status_code == 200

    with server.http.stream("GET", server.path("secrets"),
                            params={"watch": "1", "resourceVersion": "1", "timeoutSeconds": "1"}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.strip()]
    events, text = [json.loads(line) for line in lines], "\n".join(lines)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("DELETED", "db")]
    assert events[0]["object"]["spec"] == {"type": "Opaque"}
    assert events[0]["object"]["status"] == {"keys": [{"name": "token", "size": len(VALUES[1])}]}
    for value in VALUES:
        assert value not in text and base64.b64encode(value.encode()).decode() not in text

