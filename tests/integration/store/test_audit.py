"""The audit log in the store, on SQLite and Postgres: a write made during a request has its row in
the same transaction (none when it rolls back or is a dry run), explicit entries join the open
transaction or commit on their own from any thread, the filters and newest-first paging, and
retention pruning."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest

from joch.admission import apply as admission
from joch.admission import documents
from joch.api import errors
from joch.api.audit import REASON_MAX, AuditEntry, AuditQuery
from joch.api.identity import CONTROLLER, RequestContext, UserInfo, acting_as
from joch.api.kinds import AGENT_PROVIDER, SECRET
from joch.store import Store, open_store
from support import provider

ALICE = RequestContext(UserInfo("alice", ("team-a", "system:authenticated")), request_id="req-1",
                       source_ip="10.0.0.7", verb="create")


class Boom(Exception):
    pass


def rows(store: Store, **query: Any) -> list[tuple[Any, ...]]:
    page = store.audit_events(AuditQuery(**query))
    return [(e.actor, e.verb, e.kind, e.namespace, e.name, e.decision, e.reason) for e in page.items]


def test_every_write_during_a_request_has_its_row_with_the_request_fields(store: Store) -> None:
    with acting_as(ALICE):
        created = store.create(AGENT_PROVIDER, provider("p", namespace="default"))
        store.update(AGENT_PROVIDER, {**created, "spec": {"binary": "other"}})
        store.update_status(AGENT_PROVIDER, {**store.get(AGENT_PROVIDER, "default", "p"), "status": {"ok": 1}})
        store.update(AGENT_PROVIDER, store.get(AGENT_PROVIDER, "default", "p"))  # changes nothing: no row
        store.delete(AGENT_PROVIDER, "default", "p")
    events = store.audit_events(AuditQuery()).items
    assert [(e.verb, e.kind, e.namespace, e.name, e.decision, e.reason) for e in events] == [
        ("create", "AgentProvider", "default", "p", "allowed", "deleted"),
        ("create", "AgentProvider", "default", "p", "allowed", "status updated"),
        ("create", "AgentProvider", "default", "p", "allowed", "updated"),
        ("create", "AgentProvider", "default", "p", "allowed", "created"),
    ]
    first = events[-1]
    assert (first.actor, first.groups, first.request_id, first.source_ip) == (
        "alice", ("team-a", "system:authenticated"), "req-1", "10.0.0.7")
    assert [e.id for e in events] == sorted((e.id for e in events), reverse=True)
    assert len(first.time) == 27 and first.time.endswith("Z")


def test_writes_outside_any_request_get_no_automatic_row(store: Store) -> None:
    store.create(AGENT_PROVIDER, provider("p", namespace="default"))
    store.delete(AGENT_PROVIDER, "default", "p")
    assert rows(store) == []


def test_a_rolled_back_transaction_leaves_no_row_and_a_committed_one_all_of_them(store: Store) -> None:
    with acting_as(ALICE):
        with pytest.raises(Boom), store.transaction() as tx:
            tx.create(AGENT_PROVIDER, provider("a", namespace="default"))
            store.audit(AuditEntry("decide", kind="Approval", namespace="default", name="x"))  # joins tx
            tx.audit(AuditEntry("note", reason="inside"))
            raise Boom
        assert rows(store) == []
        with store.transaction() as tx:
            tx.create(AGENT_PROVIDER, provider("a", namespace="default"))
            store.audit(AuditEntry("decide", kind="Approval", namespace="default", name="x", reason="approved"))
    assert rows(store) == [
        ("alice", "decide", "Approval", "default", "x", "allowed", "approved"),
        ("alice", "create", "AgentProvider", "default", "a", "allowed", "created"),
    ]


def test_a_failed_or_dry_run_apply_writes_no_row(store: Store) -> None:
    docs = documents.load_documents(
        "apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: ok}\nspec: {binary: x}\n---\n"
        "apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: ok2}\nspec: {binary: y}\n")
    with acting_as(ALICE):
        admission.apply_documents(store, docs, dry_run=True)
        assert rows(store) == []
        store.create(AGENT_PROVIDER, provider("ok2", namespace="default"))
        before = rows(store)
        with pytest.raises(errors.AlreadyExists):  # a create over an existing object: nothing is written
            admission.create_documents(store, docs)
    assert rows(store) == before
    with pytest.raises(errors.NotFound):
        store.get(AGENT_PROVIDER, "default", "ok")


def test_an_explicit_entry_keeps_its_own_fields_and_outside_a_request_is_the_controllers(store: Store) -> None:
    store.audit(AuditEntry("dispatch", kind="AgentRun", namespace="ns", name="r", decision="denied",
                           reason="x" * 5000))
    with acting_as(ALICE):
        store.audit(AuditEntry("authenticate", actor="mallory", decision="denied", reason="invalid token"))
    auth, dispatch = store.audit_events(AuditQuery()).items
    assert (dispatch.actor, dispatch.groups, dispatch.request_id) == (CONTROLLER.name, CONTROLLER.groups, "")
    assert len(dispatch.reason) == REASON_MAX and dispatch.reason.endswith("…")
    # An actor given explicitly is not dressed with the caller's groups; the request's id and peer are.
    assert (auth.actor, auth.groups, auth.request_id, auth.source_ip) == ("mallory", (), "req-1", "10.0.0.7")


def test_nul_characters_from_a_request_do_not_fail_the_write_they_record(store: Store) -> None:
    odd = RequestContext(UserInfo("eve\x00il", ("g\x00",)), request_id="r", source_ip="::1", verb="create")
    with acting_as(odd):
        store.create(AGENT_PROVIDER, provider("p", namespace="default"))
        store.audit(AuditEntry("authenticate", actor="who\x00", name="a\x00b", decision="denied"))
    denied, created = store.audit_events(AuditQuery()).items
    assert (created.actor, created.groups) == ("eve\ufffdil", ("g\x00",))
    assert (denied.actor, denied.name) == ("who\ufffd", "a\ufffdb")


def test_store_audit_works_from_another_thread_while_a_transaction_is_open(store: Store) -> None:
    done = threading.Event()

    def other() -> None:
        store.audit(AuditEntry("block", kind="Budget", namespace="default", name="b", decision="denied"))
        done.set()

    with pytest.raises(Boom), store.transaction() as tx:
        tx.create(AGENT_PROVIDER, provider("a", namespace="default"))
        worker = threading.Thread(target=other)
        worker.start()
        time.sleep(0.2)
        raise Boom
    worker.join(timeout=10)
    assert done.is_set()
    # Its own transaction: committed although the one open meanwhile rolled back.
    assert rows(store) == [(CONTROLLER.name, "block", "Budget", "default", "b", "denied", "")]


def test_no_secret_value_reaches_a_row(store: Store) -> None:
    value = "c3VwZXItc2VjcmV0LXZhbHVl"
    with acting_as(ALICE):
        store.create(SECRET, {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret",
                              "metadata": {"name": "s", "namespace": "default"},
                              "spec": {"type": "Opaque", "data": {"token": value}}})
    (event,) = store.audit_events(AuditQuery()).items
    assert value not in repr(event.to_dict())


def test_filters_and_paging_newest_first(store: Store) -> None:
    bob = RequestContext(UserInfo("bob"), request_id="req-2", source_ip="127.0.0.1", verb="delete")
    with acting_as(ALICE):
        for i in range(5):
            store.create(AGENT_PROVIDER, provider(f"p{i}", namespace="team-a"))
    with acting_as(bob):
        store.delete(AGENT_PROVIDER, "team-a", "p0")
    store.audit(AuditEntry("dispatch", kind="AgentRun", namespace="team-b", name="r", decision="denied"))

    assert [r[0] for r in rows(store, actor="bob")] == ["bob"]
    assert len(rows(store, verb="create")) == 5
    assert rows(store, decision="denied") == [(CONTROLLER.name, "dispatch", "AgentRun", "team-b", "r", "denied", "")]
    assert len(rows(store, kind="AgentProvider", namespace="team-a")) == 6
    assert [r[6] for r in rows(store, namespace="team-a", name="p0")] == ["deleted", "created"]
    assert rows(store, actor="nobody\x00") == []

    pages, before = [], None
    while True:
        page = store.audit_events(AuditQuery(limit=3, before_id=before))
        pages.append([e.id for e in page.items])
        if not page.more:
            break
        before = page.items[-1].id
    ids = [i for page in pages for i in page]
    assert [len(p) for p in pages] == [3, 3, 1] and ids == sorted(ids, reverse=True) and len(set(ids)) == 7

    newest = store.audit_events(AuditQuery(limit=1)).items[0]
    at = dt.datetime.fromisoformat(newest.time.replace("Z", "+00:00"))
    assert [e.id for e in store.audit_events(AuditQuery(since=at)).items] == [newest.id]
    assert newest.id not in [e.id for e in store.audit_events(AuditQuery(until=at)).items]
    assert store.audit_events(AuditQuery(since=at + dt.timedelta(seconds=1))).items == []


def test_retention_prunes_only_rows_older_than_the_cutoff(store: Store) -> None:
    store.audit(AuditEntry("old"))
    store.audit(AuditEntry("old"))
    time.sleep(0.05)
    cutoff = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    store.audit(AuditEntry("new"))
    assert store.prune_audit(cutoff) == 2
    assert [r[1] for r in rows(store)] == ["new"]
    assert store.prune_audit(cutoff) == 0


def test_rows_survive_reopening_and_ids_keep_growing(store_url: str) -> None:
    first = open_store(store_url)
    try:
        first.audit(AuditEntry("one"))
        first_id = first.audit_events(AuditQuery()).items[0].id
        first.prune_audit(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1))  # the table is empty now
    finally:
        first.close()
    second = open_store(store_url)
    try:
        second.audit(AuditEntry("two"))
        (event,) = second.audit_events(AuditQuery()).items
        assert event.id > first_id  # an id is never handed out twice, even after its row was pruned
    finally:
        second.close()
