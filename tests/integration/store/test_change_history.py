"""How long the change log keeps what, per kind (``KindInfo.history`` and ``sensitive``), on SQLite
and Postgres: a Secret's values are not replayable once changed or deleted, Lease renewals keep one
row and do not push user objects past the compaction horizon, and a watch resuming across removed
rows still ends at each object's latest state."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from joch.api import errors
from joch.api.kinds import AGENT, LEASE, SECRET
from joch.api.namespaces import NAMESPACE
from joch.store import Store, WatchEvent, WatchOptions, open_store
from joch.store import migrations as schema

FIRST = "czNjcmV0LW9uZQ=="  # base64 of "s3cret-one"
SECOND = "czNjcmV0LXR3bw=="  # base64 of "s3cret-two"


def agent(name: str) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"providerRef": {"name": "p"}}}


def secret(name: str, value: str) -> dict[str, Any]:
    return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"type": "Opaque", "data": {"token": value}}}


def lease(name: str, holder: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "default", **meta},
            "spec": {"holderIdentity": holder, "renewTime": "2026-01-01T00:00:00.000000Z"}}


def renew(store: Store, name: str, n: int) -> dict[str, Any]:
    current = store.get(LEASE, "default", name)
    for i in range(n):
        current = store.update(LEASE, {**current, "spec": {**current["spec"], "renewTime": f"t{i}"}})
    return current


def replay(store: Store, kind: Any, resource_version: str, **options: Any) -> list[WatchEvent]:
    """Every event a watch from ``resource_version`` replays (it ends once nothing more comes)."""
    events = []
    with store.watch(kind, WatchOptions(resource_version=resource_version, **options)) as w:
        while (event := w.get(timeout=0.5)) is not None:
            events.append(event)
    return events


def change_rows(store_url: str) -> list[tuple[int, str, str, str, str]]:
    """The raw change log: (revision, kind, name, type, body), read past the store; without the
    Namespaces every store creates when it is opened (``joch.store.namespaces``)."""
    sql = f"SELECT revision, kind, name, type, body FROM joch_changes WHERE kind <> '{NAMESPACE.key}' ORDER BY revision"
    if store_url.startswith("sqlite:"):
        with closing(sqlite3.connect(urlsplit(store_url).path)) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]  # type: ignore[misc]
    with psycopg.connect(store_url) as pg:
        return [tuple(r) for r in pg.execute(sql).fetchall()]  # type: ignore[misc]


def test_a_changed_then_deleted_secret_leaves_no_value_in_any_replay_or_row(store: Store, store_url: str) -> None:
    store.create(AGENT, agent("seed"))  # revision 1: a watch from 1 would replay everything below
    created = store.create(SECRET, secret("db", FIRST))
    with store.watch(SECRET) as live:
        assert (added := live.get(timeout=5)) is not None and added.object == created
        store.update(SECRET, {**created, "spec": {"type": "Opaque", "data": {"token": SECOND, "more": FIRST}}})
        # A live watch sees each change as a read at that moment would: the keys, never a value.
        modified = live.get(timeout=5)
        assert modified is not None and "data" not in modified.object["spec"]
        assert modified.object["status"]["keys"] == [{"name": "more", "size": 10}, {"name": "token", "size": 10}]
        shown = json.dumps([e.object for e in replay(store, SECRET, "1")])
        assert SECOND not in shown and FIRST not in shown
        assert store.reveal(SECRET, "default", "db")["spec"]["data"] == {"token": SECOND, "more": FIRST}
        store.delete(SECRET, "default", "db")
        deleted = live.get(timeout=5)
    assert deleted is not None and deleted.type == "DELETED" and deleted.object["spec"] == {"type": "Opaque"}

    events = replay(store, SECRET, "1")
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [("DELETED", "db")]
    assert events[0].object["spec"] == {"type": "Opaque"}
    everything = json.dumps([e.object for e in replay(store, None, "1")])
    assert FIRST not in everything and SECOND not in everything
    rows = change_rows(store_url)
    assert [(kind, name, type_) for _, kind, name, type_, _ in rows] == [
        ("joch.dev/Agent", "seed", "ADDED"), ("ops.joch.dev/Secret", "db", "DELETED")]
    assert not [body for *_, body in rows if FIRST in body or SECOND in body]


def test_a_refused_create_of_an_existing_secret_keeps_its_change(store: Store, store_url: str) -> None:
    store.create(SECRET, secret("db", FIRST))
    with store.transaction() as tx:  # the refusal is caught and the transaction commits
        with pytest.raises(errors.AlreadyExists):
            tx.create(SECRET, secret("db", SECOND))
        tx.create(AGENT, agent("a"))
    assert [(name, type_) for _, _, name, type_, _ in change_rows(store_url)] == [("db", "ADDED"), ("a", "ADDED")]
    assert store.reveal(SECRET, "default", "db")["spec"]["data"] == {"token": FIRST}  # the refused one changed nothing


def test_lease_renewals_keep_one_row_and_do_not_push_user_objects_past_the_horizon(store_url: str) -> None:
    # A new store's first two changes are its Namespaces (default, joch-system): history 7 is the
    # old test's 5 plus those, and user objects start at revision 3.
    s = open_store(store_url, history=7, compact_interval=0.05)
    try:
        s.create(AGENT, agent("a1"))
        s.create(AGENT, agent("a2"))
        s.create(LEASE, lease("leader", "me"))
        renewed = renew(s, "leader", 60)
        s.create(AGENT, agent("a3"))
        rows = change_rows(store_url)
        assert [r[2] for r in rows if r[1] == LEASE.key] == ["leader"]
        time.sleep(0.5)  # several compaction passes: six rows kept are within a history of seven
        assert s.compacted_revision() == 0
        resumed = replay(s, None, "3")
        assert [(e.type, e.object["metadata"]["name"]) for e in resumed] == [
            ("ADDED", "a2"), ("MODIFIED", "leader"), ("ADDED", "a3")]
        assert resumed[1].object == renewed

        with s.transaction() as tx:  # nine rows at once: the two oldest (the Namespaces) go
            for i in range(4, 7):
                tx.create(AGENT, agent(f"a{i}"))
        deadline = time.monotonic() + 10
        while s.compacted_revision() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.compacted_revision() == 2
        assert len(change_rows(store_url)) == 7
        with pytest.raises(errors.Gone):
            s.watch(AGENT, WatchOptions(resource_version="1"))
    finally:
        s.close()


def test_a_resume_across_removed_rows_ends_at_the_latest_state(store: Store) -> None:
    store.create(AGENT, agent("seed"))
    created = store.create(LEASE, lease("leader", "me"))
    start = created["metadata"]["resourceVersion"]
    renewed = renew(store, "leader", 3)
    store.create(AGENT, agent("a"))
    events = replay(store, None, start)
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [("MODIFIED", "leader"), ("ADDED", "a")]
    assert events[0].object == renewed
    assert [e.revision for e in events] == sorted(e.revision for e in events)

    # From before the lease existed its ADDED is gone too: the latest state comes as MODIFIED,
    # which an informer adds to its cache like client-go's does.
    from_start = replay(store, LEASE, "1")
    assert [(e.type, e.object) for e in from_start] == [("MODIFIED", renewed)]


def test_a_deleted_and_recreated_object_still_reports_the_deletion(store: Store) -> None:
    store.create(AGENT, agent("seed"))
    store.create(LEASE, lease("leader", "old"))
    renew(store, "leader", 2)
    store.delete(LEASE, "default", "leader")
    again = store.create(LEASE, lease("leader", "new"))
    renewed = renew(store, "leader", 2)
    events = replay(store, LEASE, "1")
    assert [(e.type, e.object["spec"]["holderIdentity"]) for e in events] == [("DELETED", "old"), ("MODIFIED", "new")]
    assert events[1].object == renewed and events[1].object["metadata"]["uid"] == again["metadata"]["uid"]


def test_a_label_watch_that_missed_a_relabel_is_told_the_object_left(store: Store) -> None:
    created = store.create(LEASE, lease("leader", "me", labels={"team": "a"}))
    start = created["metadata"]["resourceVersion"]
    store.update(LEASE, {**created, "metadata": {**created["metadata"], "labels": {"team": "b"}}})
    renew(store, "leader", 1)  # removes the relabel's row: the change that left team=a is gone
    events = replay(store, LEASE, start, label_selector="team=a")
    assert [(e.type, e.object["metadata"]["labels"]) for e in events] == [("DELETED", {"team": "b"})]
    assert replay(store, LEASE, start, label_selector="team=b")[0].type == "MODIFIED"


def test_a_live_watch_whose_feed_missed_a_removed_row_still_gets_the_latest(store: Store) -> None:
    created = store.create(LEASE, lease("leader", "me", labels={"team": "a"}))
    with store.watch(LEASE, WatchOptions(resource_version=created["metadata"]["resourceVersion"],
                                          label_selector="team=a")) as w:
        assert w.get(timeout=0.3) is None  # the replay is done: what follows comes from the feed
        with store.transaction() as tx:  # both in one commit: the feed can only read the second
            moved = tx.update(LEASE, {**created, "metadata": {**created["metadata"], "labels": {"team": "b"}}})
            tx.update(LEASE, {**moved, "spec": {**moved["spec"], "renewTime": "later"}})
        event = w.get(timeout=5)
    assert event is not None and event.type == "DELETED"


def _apply_migrations_up_to(store_url: str, version: int) -> Callable[[str, tuple[Any, ...]], None]:
    """A database as a Joch with schema ``version`` left it, and a way to write rows into it."""
    dialect = "sqlite" if store_url.startswith("sqlite:") else "postgres"
    statements = [s for m in schema.load(dialect) if m.version <= version for s in m.statements()]
    recorded = [(m.version, m.name) for m in schema.load(dialect) if m.version <= version]

    def run(sql: str, params: tuple[Any, ...] = ()) -> None:
        if dialect == "sqlite":
            with closing(sqlite3.connect(urlsplit(store_url).path)) as conn, conn:
                conn.execute(sql, params)
        else:
            with psycopg.connect(store_url) as pg:
                if params:
                    pg.execute(sql.replace("?", "%s"), params)
                else:
                    pg.execute(sql.encode())  # DDL as written: no placeholders to parse

    run(schema.CREATE_TABLE)
    for statement in statements:
        run(statement)
    for number, name in recorded:
        run("INSERT INTO joch_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)", (number, name, "t"))
    return run


def test_upgrading_scrubs_secret_values_an_older_joch_left_in_the_change_log(store_url: str) -> None:
    run = _apply_migrations_up_to(store_url, 2)
    key = SECRET.key
    rows = [
        (1, key, "db", "ADDED", json.dumps(secret("db", FIRST))),
        (2, key, "db", "MODIFIED", json.dumps(secret("db", SECOND))),
        (3, key, "db", "DELETED", json.dumps(secret("db", SECOND))),
        (4, key, "kept", "ADDED", json.dumps(secret("kept", FIRST))),
        (5, AGENT.key, "a", "ADDED", json.dumps(agent("a"))),
    ]
    for row in rows:
        run("INSERT INTO joch_changes (revision, kind, namespace, name, type, body) VALUES (?, ?, 'default', ?, ?, ?)",
            row)
    run("INSERT INTO joch_objects (kind, namespace, name, uid, revision, body) "
        "VALUES (?, 'default', 'kept', 'u', 4, ?)", (key, json.dumps(secret("kept", FIRST))))
    run("UPDATE joch_meta SET value = 5 WHERE key = 'revision'")

    s = open_store(store_url)
    try:
        after = [(rev, name, type_) for rev, _, name, type_, _ in change_rows(store_url)]
        assert after == [(3, "db", "DELETED"), (4, "kept", "ADDED"), (5, "a", "ADDED")]
        deleted = json.loads(change_rows(store_url)[0][4])
        assert deleted["spec"] == {"type": "Opaque"}
        # The current value stays, sealed now (migration 0005), and out of the object row
        assert s.reveal(SECRET, "default", "kept")["spec"]["data"] == {"token": FIRST}
        assert "data" not in s.get(SECRET, "default", "kept")["spec"]
        assert not [body for *_, body in change_rows(store_url) if FIRST in body or SECOND in body]
    finally:
        s.close()
