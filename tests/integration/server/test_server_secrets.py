"""No answer of a real server shows a Secret's value (SQLite and Postgres, the store encrypting with
a key ring): POST, GET, LIST, Table, WATCH (initial ADDED, MODIFIED, DELETED), SSE, PUT, PATCH,
DELETE, ``/v1/resources/apply`` and every dry run. Reads show ``status.keys``; re-applying ``get``
output keeps the values; a PUT naming ``data`` replaces them."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from joch.api.kinds import SECRET
from joch.server.testing import LiveServer, live_server
from joch.store import KeyRing, Store, open_store
from joch.store.sealing import new_key

VALUE = "tok-3141592653-secret"
OTHER = "tok-2718281828-other"
KUBECTL_TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
MERGE = {"Content-Type": "application/merge-patch+json"}


def forms(value: str) -> list[str]:
    return [value, base64.b64encode(value.encode()).decode()]


def assert_hidden(text: str, *values: str) -> None:
    for value in values:
        for form in forms(value):
            assert form not in text, f"{form!r} in {text[:400]}"


def secret(value: str = VALUE, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "db"},
            "spec": {"stringData": {"token": value}, **spec}}


@pytest.fixture
def sealed_store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url, secret_keys=KeyRing([new_key()], source="test ring"))
    yield s
    s.close()


@pytest.fixture
def server(sealed_store: Store) -> Iterator[LiveServer]:
    with live_server(sealed_store) as running:
        yield running


def stream(server: LiveServer, path: str, **params: str) -> str:
    with server.http.stream("GET", path, params={"timeoutSeconds": "1", **params}) as r:
        assert r.status_code == 200, r.read()
        return "\n".join(line for line in r.iter_lines() if line.strip())


def test_no_read_or_write_answer_shows_a_value(server: LiveServer, sealed_store: Store) -> None:
    answers: list[str] = []

    def answer(r: httpx.Response, code: int = 200) -> dict[str, Any]:
        assert r.status_code == code, r.text
        answers.append(r.text)
        body: dict[str, Any] = r.json()
        return body

    dry = answer(server.http.post(server.path("secrets"), json=secret(), params={"dryRun": "All"}), 201)
    assert dry["status"]["keys"] == [{"name": "token", "size": len(VALUE)}] and "data" not in dry["spec"]
    created = answer(server.http.post(server.path("secrets"), json=secret()), 201)
    assert created["spec"] == {"type": "Opaque"}
    assert created["status"] == {"keys": [{"name": "token", "size": len(VALUE)}]}
    rv = created["metadata"]["resourceVersion"]
    got = answer(server.http.get(server.path("secrets", "db")))
    assert got == created
    answer(server.http.get(server.path("secrets")))
    answer(server.http.get(server.path("secrets", namespace=None)))
    table = answer(server.http.get(server.path("secrets"), headers=KUBECTL_TABLE))
    assert table["kind"] == "Table" and table["rows"][0]["cells"][:3] == ["db", "Opaque", "token"]
    answers.append(stream(server, server.path("secrets"), watch="1"))  # the initial ADDED
    answers.append(stream(server, "/v1/resources/watch", kind="secrets"))  # SSE, initial ADDED

    # PUT and PATCH, their dry runs first; the values change, and only the size shows it.
    put = {**got, "spec": {"stringData": {"token": OTHER, "extra": VALUE}}}
    answer(server.http.put(server.path("secrets", "db"), json=put, params={"dryRun": "All"}))
    replaced = answer(server.http.put(server.path("secrets", "db"), json=put))
    assert replaced["status"]["keys"] == [{"name": "extra", "size": len(VALUE)}, {"name": "token", "size": len(OTHER)}]
    patch = {"spec": {"stringData": {"token": VALUE}}}
    answer(server.http.patch(server.path("secrets", "db"), content=json.dumps(patch), headers=MERGE,
                             params={"dryRun": "All"}))
    patched = answer(server.http.patch(server.path("secrets", "db"), content=json.dumps(patch), headers=MERGE))
    assert patched["status"]["keys"] == [{"name": "token", "size": len(VALUE)}]  # named data replaces all keys
    assert sealed_store.reveal(SECRET, "default", "db")["spec"]["data"] == {
        "token": base64.b64encode(VALUE.encode()).decode()}
    answers.append(stream(server, server.path("secrets"), watch="1", resourceVersion=rv))  # MODIFIED
    answers.append(stream(server, "/v1/resources/watch", kind="secrets", resourceVersion=rv))

    # The seed's apply, with and without dry run, and kubectl's last-applied annotation.
    annotated = secret(OTHER)
    annotated["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(annotated)}
    for params in ({"dryRun": "All"}, {}):
        answer(server.http.post("/v1/resources/apply", content=json.dumps(annotated),
                                headers={"Content-Type": "application/json"}, params=params))
    shown = answer(server.http.get(server.path("secrets", "db")))
    assert "stringData" not in shown["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]

    answer(server.http.delete(server.path("secrets", "db"), params={"dryRun": "All"}))
    deleted = answer(server.http.delete(server.path("secrets", "db")))
    assert deleted["metadata"]["name"] == "db" and "data" not in deleted["spec"]
    answers.append(stream(server, server.path("secrets"), watch="1", resourceVersion=rv))  # DELETED
    answers.append(stream(server, "/v1/resources/watch", resourceVersion=rv))
    answer(server.http.get(server.path("events", namespace=None)))
    assert len(answers) > 20
    assert_hidden("\n".join(answers), VALUE, OTHER)


def test_reapplying_get_output_keeps_the_values(server: LiveServer, sealed_store: Store) -> None:
    server.create(secret())
    shown = server.http.get(server.path("secrets", "db")).json()
    again = server.http.post("/v1/resources/apply", content=json.dumps(shown),
                             headers={"Content-Type": "application/json"})
    assert again.status_code == 200, again.text
    assert [i["action"] for i in again.json()["items"]] == ["unchanged"]
    # PUT of the same output (with its resourceVersion) keeps them too: it names no data.
    put = server.http.put(server.path("secrets", "db"), json={**shown, "spec": {"type": "Opaque"}})
    assert put.status_code == 200 and put.json()["metadata"]["resourceVersion"] == shown["metadata"]["resourceVersion"]
    assert sealed_store.reveal(SECRET, "default", "db")["spec"]["data"] == {
        "token": base64.b64encode(VALUE.encode()).decode()}
    # A merge patch of labels leaves the data alone (and bumps no generation).
    labelled = server.http.patch(server.path("secrets", "db"), content=json.dumps({"metadata": {"labels": {"a": "b"}}}),
                                 headers=MERGE)
    assert labelled.status_code == 200 and labelled.json()["metadata"]["generation"] == 1
    assert sealed_store.reveal(SECRET, "default", "db")["spec"]["data"] == {
        "token": base64.b64encode(VALUE.encode()).decode()}
    shown = labelled.json()
    # Naming data: {} on purpose empties it.
    emptied = server.http.put(server.path("secrets", "db"), json={**shown, "spec": {"data": {}}})
    assert emptied.status_code == 200 and emptied.json()["status"]["keys"] == []
    assert sealed_store.reveal(SECRET, "default", "db")["spec"].get("data", {}) == {}


def test_a_status_write_cannot_change_the_keys(server: LiveServer) -> None:
    created = server.create(secret())
    r = server.http.put(server.path("secrets", "db", sub="status"),
                        json={**created, "status": {"keys": [{"name": "forged", "size": 1}]}})
    assert r.status_code == 200, r.text
    assert r.json()["status"]["keys"] == [{"name": "token", "size": len(VALUE)}]
