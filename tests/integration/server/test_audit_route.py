"""``GET /v1/audit`` over a real server on SQLite and Postgres: an apply of N objects leaves N rows
carrying the request's id and peer, a rejected or dry-run apply leaves none, the filters and the
newest-first paging, 400s naming the parameter, and no route that changes the log."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from joch.api.audit import AuditEntry, AuditQuery
from joch.server.retention import AuditPruner
from joch.server.testing import LiveServer, is_status
from joch.store import Store

YAML = {"Content-Type": "application/yaml"}


def providers(n: int, *, prefix: str = "p") -> str:
    return "".join(f"---\napiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {{name: {prefix}{i}}}\n"
                   f"spec: {{binary: codex}}\n" for i in range(n))


def apply(server: LiveServer, text: str, request_id: str, **params: str) -> Any:
    return server.http.post("/v1/resources/apply", content=text, params=params,
                            headers={**YAML, "X-Request-Id": request_id})


def audit(server: LiveServer, **params: Any) -> dict[str, Any]:
    response = server.http.get("/v1/audit", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_an_apply_of_n_objects_writes_n_rows_with_the_request_id_and_peer(server: LiveServer) -> None:
    response = apply(server, providers(7), "apply-1")
    assert response.status_code == 200, response.text
    assert response.headers["audit-id"] == "apply-1"
    body = audit(server)
    assert body["kind"] == "AuditEventList" and body["apiVersion"] == "v1" and "continue" not in body["metadata"]
    items = body["items"]
    assert sorted(i["name"] for i in items) == [f"p{i}" for i in range(7)]
    for item in items:
        assert set(item) == {"id", "time", "actor", "groups", "verb", "kind", "namespace", "name", "decision",
                             "reason", "requestId", "sourceIP"}
        assert (item["requestId"], item["sourceIP"], item["decision"], item["kind"], item["namespace"],
                item["actor"], item["verb"], item["reason"]) == (
            "apply-1", "127.0.0.1", "allowed", "AgentProvider", "default", "system:anonymous", "apply", "created")
    # Re-applying the same file changes nothing, so it writes no row.
    assert apply(server, providers(7), "apply-2").status_code == 200
    assert len(audit(server)["items"]) == 7


def test_a_rejected_or_dry_run_apply_writes_no_row(server: LiveServer) -> None:
    bad = providers(3) + "---\napiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: b}\nspec: {}\n"
    assert apply(server, bad, "rejected").status_code == 422
    assert apply(server, providers(3), "dry", dryRun="All").status_code == 200
    assert audit(server)["items"] == []


def test_rows_of_single_object_routes_carry_their_verbs(server: LiveServer) -> None:
    created = server.create({"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider",
                             "metadata": {"name": "solo"}, "spec": {"binary": "x"}})
    path = server.path("agentproviders", "solo")
    patched = server.http.patch(path, json={"spec": {"binary": "y"}},
                                headers={"Content-Type": "application/merge-patch+json"})
    assert patched.status_code == 200, patched.text
    assert server.http.delete(path).status_code == 200
    assert created["metadata"]["name"] == "solo"
    verbs = [(i["verb"], i["reason"]) for i in audit(server, name="solo")["items"]]
    assert verbs == [("delete", "deleted"), ("patch", "updated"), ("create", "created")]


def test_filters_and_newest_first_paging(server: LiveServer, store: Store) -> None:
    assert apply(server, providers(5), "a").status_code == 200
    assert apply(server, providers(2, prefix="q"), "b", namespace="team-b").status_code == 200
    store.audit(AuditEntry("dispatch", kind="AgentRun", namespace="team-b", name="r", decision="denied",
                           reason="policy no-main denies it"))

    assert [i["name"] for i in audit(server, namespace="team-b", kind="agentproviders")["items"]] == ["q1", "q0"]
    assert [i["reason"] for i in audit(server, decision="denied")["items"]] == ["policy no-main denies it"]
    assert len(audit(server, actor="system:anonymous", verb="apply", since="1h")["items"]) == 7
    assert audit(server, until="1h")["items"] == []
    assert audit(server, since=(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)).isoformat())["items"] == []

    seen: list[int] = []
    token = None
    pages = 0
    while True:
        body = audit(server, limit=3, **({"continue": token} if token else {}))
        seen += [i["id"] for i in body["items"]]
        pages += 1
        token = body["metadata"].get("continue")
        if token is None:
            break
        apply(server, providers(1, prefix=f"late{pages}-"), f"late{pages}")  # newer rows shift nothing
    assert pages == 3 and len(seen) == 8 and seen == sorted(seen, reverse=True)


@pytest.mark.parametrize(("params", "parameter"), [
    ({"since": "yesterday"}, "since"),
    ({"until": "2026-01-01T00:00:00"}, "until"),
    ({"limit": "0"}, "limit"),
    ({"limit": "5001"}, "limit"),
    ({"limit": "many"}, "limit"),
    ({"decision": "maybe"}, "decision"),
    ({"continue": "not-a-token"}, "continue"),
    ({"namespace": "Bad_NS"}, "namespace"),
])
def test_a_bad_parameter_is_a_400_naming_it(server: LiveServer, params: dict[str, str], parameter: str) -> None:
    response = server.http.get("/v1/audit", params=params)
    assert response.status_code == 400
    body = response.json()
    assert is_status(body, 400, "BadRequest")
    assert parameter in body["message"]


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_nothing_changes_the_log_through_the_api(server: LiveServer, method: str) -> None:
    apply(server, providers(1), "one")
    response = server.http.request(method, "/v1/audit", json={"items": []})
    assert response.status_code == 405, response.text
    assert len(audit(server)["items"]) == 1


def test_the_pruner_deletes_rows_past_the_retention_in_the_background(server: LiveServer, store: Store) -> None:
    apply(server, providers(2), "old")
    time.sleep(1.2)
    with AuditPruner(store, retention=1.0, interval=0.1):
        deadline = time.monotonic() + 10
        while audit(server)["items"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert audit(server)["items"] == []
        apply(server, providers(1, prefix="new"), "new")
        assert [i["name"] for i in audit(server)["items"]] == ["new0"]


def test_a_retention_of_zero_keeps_every_row(store: Store) -> None:
    store.audit(AuditEntry("kept"))
    pruner = AuditPruner(store, retention=0)
    with pruner:
        time.sleep(0.1)
    assert len(store.audit_events(AuditQuery()).items) == 1
