"""Cron schedules in a time zone (``TriggerRule.spec.schedule``): five-field cron expressions, read by
cronsim, evaluated in the rule's IANA time zone (zoneinfo), answered in UTC.

Daylight-saving transitions follow Debian cron, as cronsim implements it for five-field expressions at
fixed times: a time that does not exist that day (02:30 when Europe/Berlin springs forward) runs at the
first minute after the gap, and a time that happens twice (02:30 when clocks fall back) runs once, at
its first occurrence. ``latest_due`` is what a controller asks after a restart: the last time the rule
should have fired since it last did — one catch-up run, never one per missed slot.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronsim import CronSim

from joch.api.integrations import cron_problem, time_zone_problem


def validate(cron: str, tz: str) -> str | None:
    """What is wrong with the schedule (to show a person), or None. Admission says the same
    (``joch.api.integrations``), so a rule that got in fails here only if this machine lacks a zone."""
    return time_zone_problem(tz) or cron_problem(cron, tz)


def next_after(cron: str, tz: str, after: datetime) -> datetime:
    """The first time strictly after ``after`` (aware) the schedule fires, in UTC. ``ValueError`` with
    ``validate``'s message for a bad schedule, or when it never fires."""
    zone = _checked(cron, tz)
    try:
        return next(CronSim(cron, _aware(after).astimezone(zone))).astimezone(UTC)
    except StopIteration:
        raise ValueError(f'cron "{cron}" never fires after {after.isoformat()}') from None


def latest_due(cron: str, tz: str, since: datetime, now: datetime) -> datetime | None:
    """The latest time ``t`` with ``since < t <= now`` the schedule fires (UTC), or None when none."""
    zone = _checked(cron, tz)
    since, now = _aware(since), _aware(now)
    if now <= since:
        return None
    # Reverse iteration yields times strictly before its start (to the second): start one second past
    # ``now`` (with its fraction dropped) so a slot at exactly ``now`` counts.
    start = now.replace(microsecond=0) + timedelta(seconds=1)
    try:
        latest = next(CronSim(cron, start.astimezone(zone), reverse=True)).astimezone(UTC)
    except StopIteration:
        return None
    return latest if since < latest <= now else None


def _checked(cron: str, tz: str) -> ZoneInfo:
    problem = validate(cron, tz)
    if problem is not None:
        raise ValueError(problem)
    return ZoneInfo(tz)


def _aware(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC (the store writes UTC)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
