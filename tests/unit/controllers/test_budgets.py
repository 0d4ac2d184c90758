"""Budget arithmetic: UTC calendar periods, which Budgets count a run, the dispatch check, and how a
usage event is priced and parsed (``joch.controllers.budgets``, ``joch.controllers.metering``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from joch.api import errors
from joch.controllers import budgets, metering
from joch.controllers.budgets import RunScope

UTC = dt.UTC


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("period", "now", "start", "end"), [
    ("day", "2026-11-25T17:03:00", "2026-11-25T00:00:00", "2026-11-26T00:00:00"),
    ("week", "2026-11-25T17:03:00", "2026-11-23T00:00:00", "2026-11-30T00:00:00"),  # a Wednesday: from Monday
    ("week", "2026-11-23T00:00:00", "2026-11-23T00:00:00", "2026-11-30T00:00:00"),
    ("month", "2026-12-31T23:59:59", "2026-12-01T00:00:00", "2027-01-01T00:00:00"),
    ("month", "2026-02-10T08:00:00", "2026-02-01T00:00:00", "2026-03-01T00:00:00"),
])
def test_periods_are_utc_calendar_periods(period: str, now: str, start: str, end: str) -> None:
    got = budgets.period_bounds(period, at(now))
    assert got == (dt.datetime.fromisoformat(start).replace(tzinfo=UTC),
                   dt.datetime.fromisoformat(end).replace(tzinfo=UTC))


def test_a_total_budget_has_no_period() -> None:
    assert budgets.period_bounds("total", at("2026-11-25T17:03:00")) == (None, None)


def budget(name: str = "b", namespace: str = "default", limit: float = 1.0, *, period: str = "day",
           on_exceed: str = "deny", **scope: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
            "spec": {"scope": scope, "period": period, "limitUsd": limit, "onExceed": on_exceed}}


def test_which_budgets_count_a_run() -> None:
    run = RunScope(namespace="team-a", agent="coder", team="core")
    assert budgets.applies(budget(namespace="team-a"), run)
    assert not budgets.applies(budget(namespace="team-b"), run)
    assert budgets.applies(budget(namespace="joch-system"), run)  # every namespace
    assert budgets.applies(budget(namespace="joch-system", team="core"), run)
    assert not budgets.applies(budget(namespace="joch-system", team="infra"), run)
    assert not budgets.applies(budget(namespace="team-a", agent="reviewer"), run)
    system_scoped = budget(namespace="joch-system")
    system_scoped["spec"]["scope"]["namespace"] = "team-b"
    assert not budgets.applies(system_scoped, run)
    # Outside joch-system a Budget cannot reach into another namespace: it counts nothing, and says so.
    reaching = budget(namespace="team-b")
    reaching["spec"]["scope"]["namespace"] = "team-a"
    assert not budgets.applies(reaching, run)
    assert "counts nothing" in (budgets.scope_problem(reaching) or "")


def test_the_dispatch_check_gives_the_limit_the_spend_and_the_reservation() -> None:
    daily = budget("daily")
    scope = RunScope("default", "a", "")
    uid = daily["metadata"]["uid"]
    now = at("2026-11-25T17:03:00")
    assert budgets.check([daily], scope, 0.2, {uid: 0.8}, {}, now) is None  # exactly the limit fits
    block = budgets.check([daily], scope, 0.5, {uid: 0.8}, {}, now)
    assert block is not None and not block.hold
    assert block.message == ('Budget "daily" in namespace "default": limit $1.00 per day; spent $0.80 since '
                             "2026-11-25T00:00:00Z, $0.00 reserved by runs in flight; this run reserves $0.50")
    # What runs in flight have reserved counts; a run reserving nothing needs something left.
    assert budgets.check([daily], scope, 0.3, {uid: 0.5}, {uid: 0.3}, now) is not None
    assert budgets.check([daily], scope, 0.0, {uid: 1.0}, {}, now) is not None
    assert budgets.check([daily], scope, 0.0, {uid: 0.99}, {}, now) is None
    held = budgets.check([budget("daily", on_exceed="hold")], scope, 0.5, {uid: 0.8}, {}, now)
    assert held is not None and held.hold
    assert held.message.endswith("held until the period ends at 2026-11-26T00:00:00Z")
    assert held.until == dt.datetime(2026, 11, 26, tzinfo=UTC)


def test_outstanding_reservations_are_what_runs_in_flight_may_still_spend() -> None:
    from joch.controllers.base import Key

    b = budget("b", agent="a")
    reserved = {Key("default", "r1"): budgets.Reserved(RunScope("default", "a", ""), 1.0),
                Key("default", "r2"): budgets.Reserved(RunScope("default", "a", ""), 0.5),
                Key("default", "r3"): budgets.Reserved(RunScope("default", "other", ""), 9.0)}
    costs = {Key("default", "r1"): 0.25, Key("default", "r2"): 0.75}
    assert budgets.outstanding(reserved, costs, b) == pytest.approx(0.75)  # r2 overspent: counts 0, r3 not b's
    assert budgets.outstanding(reserved, costs, b, excluding=Key("default", "r1")) == 0


def test_dollars_are_shown_to_the_cent_or_to_what_they_are() -> None:
    assert [budgets.usd(x) for x in (1, 0.8, 0.1 + 0.2, 0.000125)] == ["$1.00", "$0.80", "$0.30", "$0.000125"]


def test_a_usage_event_is_priced_per_million_tokens_with_cached_input_apart() -> None:
    model = {"spec": {"pricing": {"inputPerMillionUsd": 1.25, "outputPerMillionUsd": 10,
                                  "cachedInputPerMillionUsd": 0.125}}}
    event = metering.UsageEvent(id="1", inputTokens=200_000, cachedTokens=100_000, outputTokens=50_000)
    assert metering.price(event, model) == pytest.approx(0.125 + 0.0125 + 0.5)
    del model["spec"]["pricing"]["cachedInputPerMillionUsd"]
    assert metering.price(event, model) == pytest.approx(0.25 + 0.5)


def test_a_report_is_a_list_of_events_or_one_event() -> None:
    assert [e.id for e in metering.parse_events({"events": [{"id": "a"}, {"id": "b", "costUsd": 1}]})] == ["a", "b"]
    assert metering.parse_events({"id": "a", "inputTokens": 3})[0].inputTokens == 3
    with pytest.raises(errors.Invalid) as caught:
        metering.parse_events({"events": [{"id": "a"}, {"id": "", "outputTokens": -1}, {"id": "c", "inputTokens": 1,
                                                                                        "cachedTokens": 2}]})
    fields = [c.field for c in caught.value.causes]
    assert fields == ["events[1].id", "events[1].outputTokens", "events[2].cachedTokens"]
    for bad in ({"events": []}, {"events": "x"}, {"nothing": 1}, [1]):
        with pytest.raises(errors.Invalid):
            metering.parse_events(bad)
