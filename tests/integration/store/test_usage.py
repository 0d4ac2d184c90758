"""The store's usage table and shared keys, on SQLite and Postgres: an event counts once, totals
filter and group, a key is made once and is the same for every store opened on the database."""

from __future__ import annotations

import pytest

from joch.store import Store, open_store
from joch.store.base import UsageFilter, UsageRecord


def record(event: str, *, run: str = "u1", cost: float = 0.5, at: float = 1000.0, agent: str = "a",
           namespace: str = "default", team: str = "", model: str = "m") -> UsageRecord:
    return UsageRecord(run_uid=run, event_id=event, namespace=namespace, run_name=f"run-{run}", agent=agent, team=team,
                       model=model, input_tokens=10, output_tokens=20, cached_tokens=5, cost_usd=cost,
                       recorded_at=at)


def test_an_event_is_recorded_once(store: Store) -> None:
    assert store.record_usage(record("e1"))
    assert not store.record_usage(record("e1", cost=99.0))  # a retry, even with other figures
    assert store.record_usage(record("e1", run="u2"))  # the same id in another run is another event
    total = store.usage_totals(UsageFilter())[0]
    assert (total.cost_usd, total.events, total.runs, total.input_tokens) == (1.0, 2, 2, 20)


def test_a_rolled_back_transaction_records_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError), store.transaction() as w:
        assert w.record_usage(record("e1"))
        raise RuntimeError("the status update failed")
    assert store.record_usage(record("e1"))


def test_totals_filter_and_group(store: Store) -> None:
    store.record_usage(record("1", run="r1", cost=1.0, at=100, agent="a", team="core", model="big"))
    store.record_usage(record("2", run="r1", cost=2.0, at=200, agent="a", team="core", model="small"))
    store.record_usage(record("3", run="r2", cost=4.0, at=300, agent="b", namespace="other"))
    assert store.usage_totals(UsageFilter(since=200))[0].cost_usd == 6.0
    assert store.usage_totals(UsageFilter(namespace="default", agent="a"))[0].cost_usd == 3.0
    assert store.usage_totals(UsageFilter(team="core", since=150))[0].cost_usd == 2.0
    assert store.usage_totals(UsageFilter(run_uid="r2"))[0].events == 1
    nothing = store.usage_totals(UsageFilter(agent="nobody"))
    assert [(t.cost_usd, t.runs) for t in nothing] == [(0.0, 0)]
    by_agent = store.usage_totals(UsageFilter(), "agent")
    assert [(t.group, t.cost_usd, t.runs) for t in by_agent] == [(("other", "b"), 4.0, 1), (("default", "a"), 3.0, 1)]
    assert [t.group for t in store.usage_totals(UsageFilter(), "model")] == [("m",), ("small",), ("big",)]
    assert store.usage_totals(UsageFilter(agent="nobody"), "team") == []
    assert store.usage_totals(UsageFilter(namespace="a\x00b"))[0].cost_usd == 0.0


def test_a_shared_key_is_made_once_for_every_store_of_the_database(store_url: str) -> None:
    first = open_store(store_url)
    second = open_store(store_url)
    try:
        key = first.shared_key("run-token")
        assert len(key) == 32
        assert second.shared_key("run-token") == key
        assert first.shared_key("another") != key
    finally:
        first.close()
        second.close()
    again = open_store(store_url)
    try:
        assert again.shared_key("run-token") == key  # and after a restart
    finally:
        again.close()
