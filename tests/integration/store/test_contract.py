"""The Store contract, run against every backend (``store`` is parametrized: sqlite, postgres and
kubernetes — the Kubernetes store against a stand-in cluster, ``conftest.kube_cluster``).

What a Kubernetes API server cannot give is listed in ``KUBERNETES_CANNOT``: those tests are
expected to fail there (strict xfail, so one that starts passing is noticed), each with the reason."""

from __future__ import annotations

import base64
import threading
from typing import Any

import pytest

from joch.api import errors
from joch.api.kinds import AGENT, AGENT_PROVIDER, AGENT_RUN, ENVIRONMENT, ROLE_BINDING
from joch.api.namespaces import NAMESPACE
from joch.store import ListOptions, Store, WatchOptions

KUBERNETES_CANNOT: dict[str, str] = {
    "test_transaction_is_all_or_nothing":
        "the apiserver has no multi-object transaction: each write commits (and takes a revision) at once; "
        "a failed transaction only deletes the objects it created",
    "test_watch_from_compacted_revision_is_gone":
        "the apiserver compacts etcd itself, a client cannot (Gone is still passed through: "
        "test_kubernetes_store.py compacts the stand-in's own store)",
    "test_watch_compacted_while_replaying_ends_with_expired": "a client cannot compact (as above)",
    "test_history_is_compacted_automatically": "a client cannot compact (as above)",
    "test_a_live_watch_that_falls_behind_compaction_ends_with_410": "a client cannot compact (as above)",
    "test_watch_bookmarks":
        "the apiserver sends bookmarks at its own interval (about a minute); WatchOptions.bookmark_interval "
        "cannot be asked of it",
    "test_a_failed_snapshot_leaves_no_subscription_behind":
        "SQL internals (the joch_objects table, the feed's subscriptions): a Kubernetes store has neither",
    "test_a_store_migrated_by_a_newer_joch_is_refused":
        "SQL schema migrations: on Kubernetes the schema is the CRDs (charts/agents/crds/)",
}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "kubernetes"])
def store_url(request: pytest.FixtureRequest) -> str:
    if request.param == "kubernetes":
        reason = KUBERNETES_CANNOT.get(request.node.originalname)
        if reason:
            request.node.add_marker(pytest.mark.xfail(reason=f"Kubernetes store: {reason}", strict=True))
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


def agent(name: str, provider: str = "p", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": name, "namespace": "default", **meta},
        "spec": {"providerRef": {"name": provider}},
    }


def test_create_sets_server_fields(store: Store) -> None:
    created = store.create(AGENT, agent("coder", labels={"team": "a"}))
    m = created["metadata"]
    assert m["uid"] and m["creationTimestamp"].endswith("Z")
    assert m["generation"] == 1
    assert int(m["resourceVersion"]) == store.current_revision()
    assert store.get(AGENT, "default", "coder") == created


def test_create_twice_is_already_exists(store: Store) -> None:
    store.create(AGENT, agent("coder"))
    with pytest.raises(errors.AlreadyExists, match=r'agents\.joch\.dev "coder"'):
        store.create(AGENT, agent("coder"))


def test_get_missing_is_not_found(store: Store) -> None:
    with pytest.raises(errors.NotFound, match="not found"):
        store.get(AGENT, "default", "nope")


def test_generate_name(store: Store) -> None:
    obj = agent("")
    obj["metadata"] = {"generateName": "run-", "namespace": "default"}
    names = {store.create(AGENT, obj)["metadata"]["name"] for _ in range(5)}
    assert len(names) == 5 and all(n.startswith("run-") and len(n) == 9 for n in names)


def test_revisions_strictly_increase(store: Store) -> None:
    revs = [int(store.create(AGENT, agent(f"a{i}"))["metadata"]["resourceVersion"]) for i in range(5)]
    assert revs == sorted(revs) and len(set(revs)) == 5
    assert store.current_revision() == revs[-1]


def test_generation_bumps_on_spec_change_only(store: Store) -> None:
    created = store.create(AGENT, agent("coder"))
    relabeled = store.update(AGENT, {**created, "metadata": {**created["metadata"], "labels": {"x": "y"}}})
    assert relabeled["metadata"]["generation"] == 1
    assert relabeled["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    respec = store.update(AGENT, {**relabeled, "spec": {"providerRef": {"name": "q"}}})
    assert respec["metadata"]["generation"] == 2
    status = store.update_status(AGENT, {**respec, "status": {"conditions": []}})
    assert status["metadata"]["generation"] == 2


def test_generation_of_a_kind_with_top_level_fields_bumps_when_they_change(store: Store) -> None:
    binding = {"apiVersion": ROLE_BINDING.api_version, "kind": ROLE_BINDING.kind,
               "metadata": {"name": "b", "namespace": "default"},
               "roleRef": {"kind": "Role", "name": "viewer"}, "subjects": [{"kind": "User", "name": "u"}]}
    created = store.create(ROLE_BINDING, binding)
    assert "spec" not in created and created["roleRef"]["name"] == "viewer"
    relabeled = store.update(ROLE_BINDING, {**created, "metadata": {**created["metadata"], "labels": {"x": "y"}}})
    assert relabeled["metadata"]["generation"] == 1
    assert store.update(ROLE_BINDING, relabeled) == relabeled  # nothing changed, nothing written
    rebound = store.update(ROLE_BINDING, {**relabeled, "roleRef": {"kind": "Role", "name": "editor"}})
    assert rebound["metadata"]["generation"] == 2 and rebound["roleRef"]["name"] == "editor"
    emptied = store.update(ROLE_BINDING, {k: v for k, v in rebound.items() if k != "subjects"})
    assert emptied["metadata"]["generation"] == 3 and "subjects" not in emptied


def test_noop_update_writes_nothing(store: Store) -> None:
    created = store.create(AGENT, agent("coder"))
    before = store.current_revision()
    same = store.update(AGENT, created)
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert store.current_revision() == before


def test_stale_resource_version_conflicts(store: Store) -> None:
    created = store.create(AGENT, agent("coder"))
    store.update(AGENT, {**created, "spec": {"providerRef": {"name": "first"}}})
    with pytest.raises(errors.Conflict, match="has been modified"):
        store.update(AGENT, {**created, "spec": {"providerRef": {"name": "second"}}})
    with pytest.raises(errors.Conflict):
        store.update_status(AGENT, {**created, "status": {"conditions": []}})


def test_concurrent_writers_with_same_version_one_wins(store: Store) -> None:
    created = store.create(AGENT, agent("coder"))
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def write(i: int) -> None:
        barrier.wait()
        try:
            store.update(AGENT, {**created, "spec": {"providerRef": {"name": f"p{i}"}}})
            outcomes.append("ok")
        except errors.Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["conflict"] * 7 + ["ok"]


def test_update_never_touches_status_and_status_never_touches_spec(store: Store) -> None:
    created = store.create(AGENT, agent("coder"))
    with_status = store.update_status(AGENT, {**created, "status": {"observedGeneration": 1}})
    updated = store.update(AGENT, {**with_status, "spec": {"providerRef": {"name": "q"}}, "status": {}})
    assert updated["status"] == {"observedGeneration": 1}
    sneaky = {**updated, "spec": {"providerRef": {"name": "zzz"}}, "status": {"observedGeneration": 2}}
    after = store.update_status(AGENT, sneaky)
    assert after["spec"]["providerRef"] == {"name": "q"}  # (a Kubernetes apiserver adds the CRD's defaults)
    assert after["status"] == {"observedGeneration": 2}


def test_delete_without_finalizers_removes(store: Store) -> None:
    store.create(AGENT, agent("coder"))
    store.delete(AGENT, "default", "coder")
    with pytest.raises(errors.NotFound):
        store.get(AGENT, "default", "coder")


def test_delete_honours_finalizers(store: Store) -> None:
    store.create(AGENT, agent("coder", finalizers=["joch.dev/cleanup"]))
    marked = store.delete(AGENT, "default", "coder")
    assert marked["metadata"]["deletionTimestamp"]
    again = store.delete(AGENT, "default", "coder")
    assert again["metadata"]["resourceVersion"] == marked["metadata"]["resourceVersion"]
    current = store.get(AGENT, "default", "coder")
    released = {**current, "metadata": {**current["metadata"], "finalizers": []}}
    store.update(AGENT, released)
    with pytest.raises(errors.NotFound):
        store.get(AGENT, "default", "coder")


def test_delete_preconditions(store: Store) -> None:
    created = store.create(AGENT, agent("coder"))
    with pytest.raises(errors.Conflict):
        store.delete(AGENT, "default", "coder", uid="not-the-uid")
    with pytest.raises(errors.Conflict):
        store.delete(AGENT, "default", "coder", resource_version="999999")
    store.delete(AGENT, "default", "coder", uid=created["metadata"]["uid"])


def test_transaction_is_all_or_nothing(store: Store) -> None:
    before = store.current_revision()
    with pytest.raises(errors.AlreadyExists):
        with store.transaction() as tx:
            tx.create(AGENT, agent("one"))
            tx.create(AGENT, agent("two"))
            tx.create(AGENT, agent("one"))
    assert store.list(AGENT).items == []
    assert store.current_revision() == before
    with store.transaction() as tx:
        tx.create(AGENT, agent("one"))
        assert tx.get(AGENT, "default", "one")["metadata"]["name"] == "one"
        tx.create(AGENT, agent("two"))
    assert [o["metadata"]["name"] for o in store.list(AGENT).items] == ["one", "two"]


def test_list_in_a_transaction_is_at_the_transactions_revision(store: Store) -> None:
    """A list inside a write transaction shows the transaction's own writes and reports the revision
    after them (not the revision the transaction started from, which a watch would replay)."""
    store.create(AGENT, agent("before"))
    with store.transaction() as tx:
        created = tx.create(AGENT, agent("inside"))
        listed = tx.list(AGENT, ListOptions(namespace="default"))
        empty = tx.list(AGENT, ListOptions(namespace="nobody-here"))
    assert [o["metadata"]["name"] for o in listed.items] == ["before", "inside"]
    assert listed.resource_version == created["metadata"]["resourceVersion"] == str(store.current_revision())
    assert empty.items == [] and empty.resource_version == listed.resource_version


def test_list_many_answers_each_query_as_list_would(store: Store) -> None:
    """``list_many`` (one statement in a transaction) gives each (kind, namespace) what ``list``
    gives: namespaced and cluster-scoped kinds, every namespace (None), overlapping and empty
    queries, a namespace no row can have, in order, and the transaction's own writes."""
    for ns, name in (("team-b", "z"), ("default", "b"), ("default", "a"), ("team-a", "c")):
        store.create(AGENT, agent(name, namespace=ns))
    store.create(AGENT_PROVIDER, {"metadata": {"name": "a", "namespace": "default"}, "spec": {"binary": "x"}})
    store.create(ENVIRONMENT, {"metadata": {"name": "prod"}, "spec": {"namespaces": ["team-a"]}})
    queries = [(AGENT, "default"), (ENVIRONMENT, None), (AGENT, None), (AGENT_PROVIDER, "default"),
               (AGENT, "nobody"), (AGENT, "bad\x00ns"), (AGENT_RUN, None)]

    def expected() -> list[list[Any]]:
        return [store.list(kind, ListOptions(namespace=ns)).items for kind, ns in queries]

    assert store.list_many(queries) == expected()
    with store.transaction() as tx:
        tx.create(AGENT, agent("inside", namespace="team-a"))
        got = tx.list_many(queries)
        assert got == [tx.list(kind, ListOptions(namespace=ns)).items for kind, ns in queries]
    assert got == expected()
    assert [[o["metadata"]["name"] for o in items] for items in got] == [
        ["a", "b"], ["prod"], ["a", "b", "c", "inside", "z"], ["a"], [], [], []]
    assert got[0][0] is not got[2][0]  # each list holds objects of its own


def test_list_namespaces_and_kinds_are_separate(store: Store) -> None:
    store.create(AGENT, agent("a"))
    other = agent("b")
    other["metadata"]["namespace"] = "team-x"
    store.create(AGENT, other)
    store.create(AGENT_PROVIDER, {"metadata": {"name": "a", "namespace": "default"}, "spec": {"binary": "x"}})
    assert [o["metadata"]["name"] for o in store.list(AGENT, ListOptions(namespace="default")).items] == ["a"]
    assert [o["metadata"]["name"] for o in store.list(AGENT).items] == ["a", "b"]
    assert len(store.list(AGENT_PROVIDER).items) == 1


def test_list_selectors(store: Store) -> None:
    store.create(AGENT, agent("a", labels={"team": "x", "tier": "1"}))
    store.create(AGENT, agent("b", labels={"team": "y"}))
    store.create(AGENT, agent("c"))

    def names(**kw: Any) -> list[str]:
        return [o["metadata"]["name"] for o in store.list(AGENT, ListOptions(**kw)).items]

    assert names(label_selector="team=x") == ["a"]
    assert names(label_selector="team!=x") == ["b", "c"]
    assert names(label_selector="team") == ["a", "b"]
    assert names(label_selector="!team") == ["c"]
    assert names(label_selector="team in (x,y),tier") == ["a"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="metadata.name!=b") == ["a", "c"]
    with pytest.raises(errors.BadRequest):
        names(field_selector="spec.foo=bar")


def test_list_paging_with_continue(store: Store) -> None:
    with store.transaction() as tx:
        for i in range(25):
            tx.create(AGENT, agent(f"a{i:02d}", labels={"even": str(i % 2 == 0).lower()}))
    seen: list[str] = []
    token = None
    pages = 0
    first_rv = None
    while True:
        page = store.list(AGENT, ListOptions(limit=10, continue_token=token))
        first_rv = first_rv or page.resource_version
        assert page.resource_version == first_rv
        seen += [o["metadata"]["name"] for o in page.items]
        pages += 1
        token = page.continue_token
        if token is None:
            break
    assert pages == 3 and seen == [f"a{i:02d}" for i in range(25)]
    evens = store.list(AGENT, ListOptions(limit=5, label_selector="even=true"))
    assert [o["metadata"]["name"] for o in evens.items] == ["a00", "a02", "a04", "a06", "a08"]
    rest = store.list(AGENT, ListOptions(limit=50, label_selector="even=true",
                                         continue_token=evens.continue_token))
    assert len(rest.items) == 8 and rest.continue_token is None
    with pytest.raises(errors.BadRequest, match="continue token"):
        store.list(AGENT, ListOptions(continue_token="garbage!"))


def test_watch_replays_from_resource_version_in_order(store: Store) -> None:
    first = store.create(AGENT, agent("a"))
    rv = first["metadata"]["resourceVersion"]
    b = store.create(AGENT, agent("b"))
    store.update(AGENT, {**b, "spec": {"providerRef": {"name": "z"}}})
    store.delete(AGENT, "default", "a")
    with store.watch(AGENT, WatchOptions(resource_version=rv)) as w:
        events = [w.get(timeout=2) for _ in range(3)]
        assert [(e.type, e.object["metadata"]["name"]) for e in events if e] == [
            ("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]
        revs = [e.revision for e in events if e]
        assert revs == sorted(revs)
        store.create(AGENT, agent("c"))
        live = w.get(timeout=5)
        assert live is not None and (live.type, live.object["metadata"]["name"]) == ("ADDED", "c")
        assert w.get(timeout=0.2) is None


def test_watch_without_version_lists_then_follows(store: Store) -> None:
    store.create(AGENT, agent("a"))
    store.create(AGENT_PROVIDER, {"metadata": {"name": "p", "namespace": "default"}, "spec": {"binary": "x"}})
    with store.watch(AGENT, WatchOptions()) as w:
        first = w.get(timeout=2)
        assert first is not None and first.type == "ADDED" and first.object["metadata"]["name"] == "a"
        store.create(AGENT, agent("b"))
        second = w.get(timeout=5)
        assert second is not None and second.object["metadata"]["name"] == "b"


def test_watch_filters_namespace_and_labels(store: Store) -> None:
    rv = str(store.current_revision())
    with store.watch(AGENT, WatchOptions(resource_version=rv, namespace="team-x",
                                         label_selector="app=yes")) as w:
        store.create(AGENT, agent("nope", labels={"app": "yes"}))
        other = agent("yes-1", labels={"app": "yes"})
        other["metadata"]["namespace"] = "team-x"
        store.create(AGENT, other)
        unlabeled = agent("no-label")
        unlabeled["metadata"]["namespace"] = "team-x"
        store.create(AGENT, unlabeled)
        event = w.get(timeout=5)
        assert event is not None and event.object["metadata"]["name"] == "yes-1"
        assert w.get(timeout=0.3) is None


def test_watch_all_kinds(store: Store) -> None:
    rv = str(store.current_revision())
    with store.watch(None, WatchOptions(resource_version=rv)) as w:
        store.create(AGENT, agent("a"))
        store.create(AGENT_PROVIDER, {"metadata": {"name": "p", "namespace": "default"},
                                      "spec": {"binary": "x"}})
        kinds = [w.get(timeout=5).object["kind"] for _ in range(2)]  # type: ignore[union-attr]
        assert kinds == ["Agent", "AgentProvider"]


def test_watch_all_kinds_from_now_starts_with_every_object(store: Store) -> None:
    store.create(AGENT, agent("a"))
    elsewhere = agent("b")
    elsewhere["metadata"]["namespace"] = "team-x"
    store.create(AGENT, elsewhere)
    store.create(AGENT_PROVIDER, {"metadata": {"name": "p", "namespace": "default"}, "spec": {"binary": "x"}})
    expected = [("Agent", "a"), ("Agent", "b"), ("AgentProvider", "p")]  # by kind, namespace, name
    for rv in (None, "0"):
        revision = store.current_revision()
        with store.watch(None, WatchOptions(resource_version=rv)) as w:
            # first the store's Namespaces (default, joch-system: the core group sorts first)
            namespaces = len(store.list(NAMESPACE).items)
            events = [w.get(timeout=2) for _ in range(namespaces + len(expected))][namespaces:]
            assert [(e.type, e.object["kind"], e.object["metadata"]["name"], e.revision)  # type: ignore[union-attr]
                    for e in events] == [("ADDED", kind, name, revision) for kind, name in expected]
            store.create(AGENT, agent(f"after-{rv}".lower()))  # a valid name for an apiserver too
            event = w.get(timeout=5)
            assert event is not None and event.type == "ADDED"
            assert event.object["metadata"]["name"] == f"after-{rv}".lower()
        expected.insert(1, ("Agent", f"after-{rv}".lower()))
    with store.watch(None, WatchOptions(namespace="team-x", label_selector="")) as w:
        first = w.get(timeout=2)
        assert first is not None and first.object["metadata"]["name"] == "b"
        assert w.get(timeout=0.3) is None


def test_watch_from_compacted_revision_is_gone(store: Store) -> None:
    old = store.create(AGENT, agent("a"))["metadata"]["resourceVersion"]
    store.create(AGENT, agent("b"))
    store.create(AGENT, agent("c"))
    horizon = store.compact(store.current_revision() - 1)
    assert store.compacted_revision() == horizon
    with pytest.raises(errors.Gone, match="too old resource version"):
        store.watch(AGENT, WatchOptions(resource_version=old))
    with store.watch(AGENT, WatchOptions(resource_version=str(horizon))) as w:
        event = w.get(timeout=2)
        assert event is not None and event.object["metadata"]["name"] == "c"


def test_watch_compacted_while_replaying_ends_with_expired(store: Store) -> None:
    rv = store.create(AGENT, agent("a"))["metadata"]["resourceVersion"]
    with store.transaction() as tx:
        for i in range(600):
            tx.create(AGENT, agent(f"b{i}"))
    w = store.watch(AGENT, WatchOptions(resource_version=rv))
    first = w.get(timeout=2)
    assert first is not None and first.type == "ADDED"
    store.compact(store.current_revision())
    types = set()
    while (event := w.get(timeout=2)) is not None:
        types.add(event.type)
        if event.type == "ERROR":
            assert event.object["code"] == 410 and event.object["reason"] == "Expired"
            break
    assert "ERROR" in types
    w.close()


def test_watch_bookmarks(store: Store) -> None:
    store.create(AGENT, agent("a"))
    rv = str(store.current_revision())
    options = WatchOptions(resource_version=rv, allow_bookmarks=True, bookmark_interval=0.2)
    with store.watch(AGENT, options) as w:
        store.create(AGENT_PROVIDER, {"metadata": {"name": "p", "namespace": "default"},
                                      "spec": {"binary": "x"}})
        event = w.get(timeout=3)
        assert event is not None and event.type == "BOOKMARK"
        assert event.object["kind"] == "Agent"
        assert int(event.object["metadata"]["resourceVersion"]) >= int(rv)


def test_async_watch(store: Store) -> None:
    import asyncio

    async def run() -> list[str]:
        rv = str(store.current_revision())
        w = store.watch(AGENT, WatchOptions(resource_version=rv))
        assert await w.aget(timeout=0.1) is None
        # (an Agent, not an AgentRun: an apiserver running Joch's admission wants a run's references to exist)
        await asyncio.to_thread(store.create, AGENT, agent("r"))
        event = await w.aget(timeout=5)
        w.close()
        return [event.type] if event else []

    assert asyncio.run(run()) == ["ADDED"]


def test_watcher_never_misses_concurrent_writes(store: Store) -> None:
    rv = str(store.current_revision())
    writers, per_writer = 4, 25
    w = store.watch(AGENT, WatchOptions(resource_version=rv))

    def write(n: int) -> None:
        for i in range(per_writer):
            store.create(AGENT, agent(f"w{n}-{i}"))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    revisions = []
    while len(revisions) < writers * per_writer:
        event = w.get(timeout=10)
        assert event is not None, f"watch stalled after {len(revisions)} events"
        revisions.append(event.revision)
    for t in threads:
        t.join()
    w.close()
    assert revisions == sorted(revisions)
    assert revisions == list(range(int(rv) + 1, int(rv) + 1 + writers * per_writer))


def test_reopen_keeps_data_and_revision(store_url: str) -> None:
    from joch.store import open_store

    s = open_store(store_url)
    s.create(AGENT, agent("a"))
    rev = s.current_revision()
    s.close()
    s = open_store(store_url)
    try:
        assert s.current_revision() == rev
        assert s.get(AGENT, "default", "a")["metadata"]["resourceVersion"] == str(rev)
    finally:
        s.close()


def test_writes_from_another_store_instance_reach_watchers(store_url: str) -> None:
    """Two servers on one database: a write through one wakes watchers on the other."""
    from joch.store import open_store

    reader, writer = open_store(store_url), open_store(store_url)
    try:
        rv = str(reader.current_revision())
        with reader.watch(AGENT, WatchOptions(resource_version=rv)) as w:
            writer.create(AGENT, agent("from-elsewhere"))
            event = w.get(timeout=5)
            assert event is not None and event.object["metadata"]["name"] == "from-elsewhere"
    finally:
        reader.close()
        writer.close()


def test_history_is_compacted_automatically(store_url: str) -> None:
    import time

    from joch.store import open_store

    s = open_store(store_url, history=5, compact_interval=0.05)
    try:
        for i in range(20):
            s.create(AGENT, agent(f"a{i}"))
        deadline = time.monotonic() + 5
        # (a new store's first revisions are its Namespaces: compare with where it is, not with 20)
        while s.compacted_revision() < s.current_revision() - 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.compacted_revision() == s.current_revision() - 5
        with pytest.raises(errors.Gone):
            s.watch(AGENT, WatchOptions(resource_version="1"))
    finally:
        s.close()


@pytest.mark.postgres
def test_postgres_notify_channel_is_per_schema(postgres_url: str) -> None:
    """NOTIFY is database-wide: stores in two schemas of one database must use two channels."""
    import uuid
    from urllib.parse import quote

    import psycopg

    from joch.store.postgres import PostgresBackend

    base = postgres_url.split("?")[0]
    other_schema = f"joch_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{other_schema}"')
    first = PostgresBackend(postgres_url)
    second = PostgresBackend(f"{base}?options={quote(f'-csearch_path={other_schema}')}")
    try:
        assert first.channel != second.channel
        again = PostgresBackend(postgres_url)
        assert first.channel == again.channel
        again.close()
    finally:
        first.close()
        second.close()
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{other_schema}" CASCADE')


def test_a_refused_create_inside_a_transaction_leaves_no_revision_gap(store: Store) -> None:
    store.create(AGENT, agent("taken"))
    before = store.current_revision()
    with store.transaction() as tx:
        with pytest.raises(errors.AlreadyExists):
            tx.create(AGENT, agent("taken"))
        created = tx.create(AGENT, agent("fresh"))
    assert int(created["metadata"]["resourceVersion"]) == before + 1 == store.current_revision()


# --- regressions from the store review ----------------------------------------------------------

def drain(w: Any, timeout: float = 1.0) -> list[Any]:
    out = []
    while (event := w.get(timeout=timeout)) is not None:
        out.append(event)
    return out


def test_label_watch_reports_objects_leaving_and_entering(store: Store) -> None:
    a = store.create(AGENT, agent("a", labels={"team": "x"}))
    with store.watch(AGENT, WatchOptions(resource_version=a["metadata"]["resourceVersion"],
                                         label_selector="team=x")) as w:
        left = store.update(AGENT, {**a, "metadata": {**a["metadata"], "labels": {"team": "y"}}})
        store.update(AGENT, {**left, "spec": {"providerRef": {"name": "other"}}})  # unseen: not selected
        back = store.get(AGENT, "default", "a")
        back = store.update(AGENT, {**back, "metadata": {**back["metadata"], "labels": {"team": "x"}}})
        store.update(AGENT, {**back, "spec": {"providerRef": {"name": "third"}}})
        store.delete(AGENT, "default", "a")
        assert [e.type for e in drain(w)] == ["DELETED", "ADDED", "MODIFIED", "DELETED"]


def test_a_live_watch_that_falls_behind_compaction_ends_with_410(store_url: str) -> None:
    from joch.store import open_store

    writer, reader = open_store(store_url, history=None), open_store(store_url, history=None)
    try:
        w = reader.watch(AGENT, WatchOptions(resource_version=str(reader.current_revision())))
        assert w.get(timeout=0.3) is None  # replay done: live on the reader's feed
        for i in range(5):
            writer.create(AGENT, agent(f"g{i}"))
        writer.compact(writer.current_revision())  # usually before the reader's feed polls
        writer.create(AGENT, agent("after"))
        events = []  # until the six ADDED or the ERROR, then until 0.3 s pass with nothing more
        while (event := w.get(timeout=0.3 if len(events) == 6 or (events and events[-1].type == "ERROR") else 4)):
            events.append(event)
        w.close()
        # Either the feed read the changes before they were compacted, or the watch says it lost them.
        delivered = [e.object["metadata"]["name"] for e in events if e.type == "ADDED"]
        assert delivered == [f"g{i}" for i in range(5)] + ["after"] or (
            events and events[-1].type == "ERROR" and events[-1].object["code"] == 410)
    finally:
        writer.close()
        reader.close()


def test_a_failed_snapshot_leaves_no_subscription_behind(store: Store, store_url: str) -> None:
    from joch.store.sql import SqlStore

    assert isinstance(store, SqlStore)
    if store_url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(store_url.removeprefix("sqlite://")) as conn:
            conn.execute("DROP TABLE joch_objects")
    else:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("DROP TABLE joch_objects")
    with pytest.raises(Exception, match="joch_objects"):
        store.watch(AGENT)
    assert store.feed.subscribers_count() == 0


def test_watch_from_a_future_revision_is_refused(store: Store) -> None:
    with pytest.raises(errors.BadRequest, match="too large resource version"):
        store.watch(AGENT, WatchOptions(resource_version=str(store.current_revision() + 3)))


def test_synthetic_added_events_carry_the_snapshot_revision(store: Store) -> None:
    for name in ("b", "a", "c"):
        store.create(AGENT, agent(name))
    store.create(AGENT_PROVIDER, {"metadata": {"name": "p", "namespace": "default"}, "spec": {"binary": "x"}})
    snapshot = store.current_revision()
    with store.watch(AGENT) as w:
        events = [w.get(timeout=1) for _ in range(3)]
    assert [e.revision for e in events if e] == [snapshot] * 3


def test_cancelled_async_reads_lose_no_event(store: Store) -> None:
    import asyncio
    import time

    rv = store.create(AGENT, agent("seed"))["metadata"]["resourceVersion"]  # "0" would mean list-then-follow
    with store.transaction() as tx:
        for i in range(1200):
            tx.create(AGENT, agent(f"c{i:04d}"))

    async def run() -> list[int]:
        w = store.watch(AGENT, WatchOptions(resource_version=rv))
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < 1200 and time.monotonic() < deadline:
            try:
                event = await asyncio.wait_for(w.aget(timeout=5), 0.0005)
            except TimeoutError:
                continue
            if event is None:
                break
            got.append(event.revision)
        w.close()
        return got

    assert asyncio.run(run()) == list(range(int(rv) + 1, int(rv) + 1201))


def test_no_new_finalizers_while_deleting(store: Store) -> None:
    store.create(AGENT, agent("fin", finalizers=["x/one"]))
    marked = store.delete(AGENT, "default", "fin")
    with pytest.raises(errors.Invalid, match="no new finalizers"):
        store.update(AGENT, {**marked, "metadata": {**marked["metadata"], "finalizers": ["x/one", "x/two"]}})
    store.update(AGENT, {**marked, "metadata": {**marked["metadata"], "finalizers": []}})
    with pytest.raises(errors.NotFound):
        store.get(AGENT, "default", "fin")


def test_a_nested_write_on_one_thread_fails_fast_instead_of_deadlocking(store: Store) -> None:
    with store.transaction() as tx:
        tx.create(AGENT, agent("outer"))
        with pytest.raises(RuntimeError, match="inside a store transaction"):
            store.create(AGENT, agent("inner"))
    assert store.get(AGENT, "default", "outer")
    store.create(AGENT, agent("after"))  # the store is still usable


def test_reads_do_not_wait_for_a_write_transaction(store: Store) -> None:
    import time

    store.create(AGENT, agent("a"))
    started, release = threading.Event(), threading.Event()

    def hold_write() -> None:
        with store.transaction() as tx:
            tx.create(AGENT, agent("slow"))
            started.set()
            release.wait(5)

    holder = threading.Thread(target=hold_write)
    holder.start()
    started.wait(5)
    results: list[float] = []

    def read() -> None:  # a new thread: its reader connection may have to be created
        t0 = time.monotonic()
        store.get(AGENT, "default", "a")
        results.append(time.monotonic() - t0)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(3)
    release.set()
    holder.join()
    assert len(results) == 4 and max(results) < 1.0


@pytest.mark.postgres
@pytest.mark.parametrize(("url", "error", "text"), [
    ("postgresql://postgres@127.0.0.1:1/test", errors.ServiceUnavailable,
     "cannot connect to PostgreSQL at postgres@127.0.0.1:1/test"),
    ("postgresql://nosuchrole:hunter2@127.0.0.1:5432/test", errors.ServiceUnavailable, "nosuchrole"),
    ("postgresql://postgres@127.0.0.1:5432/test?options=-csearch_path%3Dno_such_schema_here", errors.BadRequest,
     "no schema to keep Joch's tables in"),
])
def test_postgres_problems_fail_fast_with_a_clear_message(
    postgres_available: None, url: str, error: type[errors.JochError], text: str
) -> None:
    import time

    from joch.store import open_store

    started = time.monotonic()
    with pytest.raises(error) as caught:
        open_store(url)
    assert text in caught.value.message and "hunter2" not in caught.value.message
    assert time.monotonic() - started < 10


def test_a_store_migrated_by_a_newer_joch_is_refused(store_url: str) -> None:
    from joch.store import open_store

    open_store(store_url).close()
    if store_url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(store_url.removeprefix("sqlite://")) as conn:
            conn.execute("INSERT INTO joch_schema_migrations VALUES (999, 'from-the-future', 'now')")
    else:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("INSERT INTO joch_schema_migrations VALUES (999, 'from-the-future', 'now')")
    with pytest.raises(errors.ServiceUnavailable, match="schema version 999, newer than this joch"):
        open_store(store_url)


def test_reads_inside_a_transaction_see_its_own_writes(store: Store) -> None:
    store.create(AGENT, agent("a"))
    with store.transaction() as tx:
        first = tx.get(AGENT, "default", "a")
        tx.update(AGENT, {**first, "spec": {"providerRef": {"name": "changed"}}})
        assert tx.get(AGENT, "default", "a")["spec"]["providerRef"]["name"] == "changed"
        tx.delete(AGENT, "default", "a")
        with pytest.raises(errors.NotFound):
            tx.get(AGENT, "default", "a")
        with pytest.raises(errors.NotFound):
            tx.get(AGENT, "default", "never")
        tx.create(AGENT, agent("never"))
        again = tx.create(AGENT, agent("a"))
        assert again["metadata"]["generation"] == 1
        mutated = tx.get(AGENT, "default", "never")
        mutated["spec"] = {"mutated": True}  # callers own what they read
        assert tx.get(AGENT, "default", "never")["spec"]["providerRef"] == {"name": "p"}
    assert store.get(AGENT, "default", "a")["spec"]["providerRef"]["name"] == "p"


def test_keys_with_nul_name_nothing_on_every_backend(store: Store) -> None:
    """Postgres text cannot hold NUL: such a key must be "not found", never a database error."""
    store.create(AGENT, agent("a"))
    with pytest.raises(errors.NotFound):
        store.get(AGENT, "default", "a\x00b")
    with pytest.raises(errors.NotFound):
        store.delete(AGENT, "default", "a\x00b")
    with pytest.raises(errors.NotFound):
        store.update(AGENT, agent("a\x00b"))
    with store.transaction() as tx, pytest.raises(errors.NotFound):
        tx.get(AGENT, "default", "a\x00b")
    assert store.list(AGENT, ListOptions(field_selector="metadata.name=a\x00b")).items == []
    assert store.list(AGENT, ListOptions(namespace="x\x00y")).items == []
    assert [o["metadata"]["name"] for o in store.list(
        AGENT, ListOptions(field_selector="metadata.name!=a\x00b")).items] == ["a"]
    with pytest.raises(errors.Invalid, match="NUL"):
        store.create(AGENT, agent("a\x00b"))
    forged = base64.urlsafe_b64encode(b'{"rv":1,"ns":"default","n":"a\\u0000b"}').decode()
    with pytest.raises(errors.BadRequest, match="invalid continue token"):
        store.list(AGENT, ListOptions(limit=1, continue_token=forged))
    with store.watch(AGENT, WatchOptions(namespace="x\x00y")) as w:
        assert w.get(timeout=0.2) is None
