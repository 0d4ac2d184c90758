"""Cron schedules in a time zone, daylight-saving transitions included (Europe/Berlin, 2026: clocks go
forward on 29 March at 02:00 and back on 25 October at 03:00)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joch.integrations import schedule


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_valid_schedules() -> None:
    assert schedule.validate("0 9 * * MON-FRI", "Europe/Berlin") is None
    assert schedule.validate("*/15 * * * *", "UTC") is None


@pytest.mark.parametrize(("cron", "tz", "says"), [
    ("61 * * * *", "UTC", 'cron "61 * * * *" is not valid (Bad minute)'),
    ("* * *", "UTC", "has 3 fields"),
    ("0 0 * * * *", "UTC", "has 6 fields"),
    ("0 0 31 2 *", "UTC", "Bad day-of-month"),
    ("0 9 * * *", "Mars/Olympus", 'time zone "Mars/Olympus" is unknown'),
    ("0 9 * * *", "", 'time zone "" is unknown'),
    ("0 9 * * *", "../../etc/passwd", "is unknown"),
])
def test_problems_name_the_fix(cron: str, tz: str, says: str) -> None:
    problem = schedule.validate(cron, tz)
    assert problem is not None and says in problem
    assert "e.g." in problem or "IANA" in problem
    with pytest.raises(ValueError, match=r"unknown|valid|fields"):
        schedule.next_after(cron, tz, utc(2026, 1, 1))


def test_next_after_is_strictly_after_and_in_utc() -> None:
    at = schedule.next_after("0 9 * * *", "Europe/Berlin", utc(2026, 1, 5, 8, 0))  # 09:00 CET = 08:00 UTC
    assert at == utc(2026, 1, 6, 8, 0)
    assert at.tzinfo is UTC
    assert schedule.next_after("0 9 * * *", "Europe/Berlin", utc(2026, 1, 5, 7, 59, 30)) == utc(2026, 1, 5, 8, 0)
    assert schedule.next_after("0 9 * * *", "Europe/Berlin", utc(2026, 7, 5, 12)) == utc(2026, 7, 6, 7, 0)  # CEST


def test_naive_and_other_offsets_are_read_as_instants() -> None:
    assert schedule.next_after("0 9 * * *", "UTC", datetime(2026, 1, 5, 8, 0)) == utc(2026, 1, 5, 9, 0)
    plus2 = datetime(2026, 1, 5, 10, 0, tzinfo=timezone(timedelta(hours=2)))  # 08:00 UTC
    assert schedule.next_after("0 9 * * *", "UTC", plus2) == utc(2026, 1, 5, 9, 0)


def test_spring_forward_runs_a_skipped_time_once_right_after_the_gap() -> None:
    at = schedule.next_after("30 2 * * *", "Europe/Berlin", utc(2026, 3, 28, 12))
    assert at == utc(2026, 3, 29, 1, 0)  # 02:30 does not exist: 03:00 CEST
    assert schedule.next_after("30 2 * * *", "Europe/Berlin", at) == utc(2026, 3, 30, 0, 30)  # 02:30 CEST


def test_fall_back_runs_a_doubled_time_once() -> None:
    first = schedule.next_after("30 2 * * *", "Europe/Berlin", utc(2026, 10, 24, 12))
    assert first == utc(2026, 10, 25, 0, 30)  # 02:30 CEST, the first of the two
    assert schedule.next_after("30 2 * * *", "Europe/Berlin", first) == utc(2026, 10, 26, 1, 30)  # 02:30 CET


def test_hourly_schedules_follow_real_time_across_the_fall_back() -> None:
    times = []
    at = utc(2026, 10, 24, 23, 30)
    for _ in range(4):
        at = schedule.next_after("0 * * * *", "Europe/Berlin", at)
        times.append(at)
    assert times == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 1), utc(2026, 10, 25, 2), utc(2026, 10, 25, 3)]


def test_latest_due_is_the_last_slot_in_the_window() -> None:
    since = utc(2026, 3, 27, 0)
    assert schedule.latest_due("0 9 * * *", "Europe/Berlin", since, utc(2026, 3, 30, 7, 0)) == utc(2026, 3, 30, 7, 0)
    assert schedule.latest_due("0 9 * * *", "Europe/Berlin", since, utc(2026, 3, 30, 6, 59)) == utc(2026, 3, 29, 7, 0)
    assert schedule.latest_due("0 9 * * *", "Europe/Berlin", since, utc(2026, 3, 27, 7, 59)) is None
    # ``since`` itself is not due again (it fired then)
    assert schedule.latest_due("0 9 * * *", "Europe/Berlin", utc(2026, 3, 27, 8), utc(2026, 3, 28, 7, 59)) is None
    assert schedule.latest_due("0 9 * * *", "UTC", utc(2026, 1, 2), utc(2026, 1, 1)) is None


def test_latest_due_across_the_spring_gap() -> None:
    assert schedule.latest_due("30 2 * * *", "Europe/Berlin", utc(2026, 3, 28, 12),
                               utc(2026, 3, 29, 1, 30)) == utc(2026, 3, 29, 1, 0)
    assert schedule.latest_due("30 2 * * *", "Europe/Berlin", utc(2026, 3, 28, 12),
                               utc(2026, 3, 29, 0, 59)) is None


def test_latest_due_across_the_fall_back() -> None:
    since = utc(2026, 10, 24, 12)
    assert schedule.latest_due("30 2 * * *", "Europe/Berlin", since, utc(2026, 10, 25, 2)) == utc(2026, 10, 25, 0, 30)
    # the second 02:30 (CET) is not a second slot
    assert schedule.latest_due("30 2 * * *", "Europe/Berlin", utc(2026, 10, 25, 0, 30),
                               utc(2026, 10, 25, 3)) is None


def test_latest_due_counts_a_slot_at_exactly_now_with_a_fraction() -> None:
    now = utc(2026, 1, 5, 9, 0) + timedelta(microseconds=500)
    assert schedule.latest_due("0 9 * * *", "UTC", utc(2026, 1, 5), now) == utc(2026, 1, 5, 9, 0)


@settings(max_examples=200, deadline=None)
@given(cron=st.sampled_from(["0 9 * * *", "30 2 * * *", "*/15 * * * *", "0 0 1 * *", "5 4 * * SUN"]),
       tz=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
       after=st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2028, 1, 1), timezones=st.just(UTC)))
def test_next_after_and_latest_due_agree(cron: str, tz: str, after: datetime) -> None:
    at = schedule.next_after(cron, tz, after)
    assert at > after
    assert schedule.latest_due(cron, tz, after, at) == at
    assert schedule.latest_due(cron, tz, after, at - timedelta(seconds=1)) is None
