"""Column paths, cells and definitions: what a kind's Table holds, without a server."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from joch.api import REGISTRY, columns
from joch.api.registry import Column

NOW = dt.datetime(2025, 1, 10, 12, 0, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(-5, "<invalid>"), (-0.5, "0s"), (0, "0s"), (5, "5s"), (59, "59s"), (60, "1m"), (3599, "59m"),
     (3600, "1h"), (2 * 3600 + 59 * 60, "2h"), (86399, "23h"), (86400, "1d"), (4 * 86400 + 5, "4d"),
     (364 * 86400, "364d"), (365 * 86400, "1y"), (800 * 86400, "2y")],
)
def test_short_duration_rounds_down_to_one_unit(seconds: float, expected: str) -> None:
    assert columns.short_duration(seconds) == expected


def test_age_of_timestamps() -> None:
    assert columns.age("2025-01-10T11:59:55Z", NOW) == "5s"
    assert columns.age("2025-01-06T12:00:00+00:00", NOW) == "4d"
    assert columns.age(None, NOW) == "<none>"
    assert columns.age("yesterday", NOW) == "<invalid>"
    assert columns.age("2025-01-10T11:59:55", NOW) == "<invalid>"  # no offset: not RFC 3339
    assert columns.age(1736510395, NOW) == "<invalid>"


def test_extract_follows_filters_stars_and_indexes() -> None:
    obj = {"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Done", "status": "True"}]},
           "spec": {"rules": [{"name": "a"}, {"name": "b"}]}}
    assert columns.extract(obj, "status.conditions[type=Ready].status") == ["False"]
    assert columns.extract(obj, "status.conditions[type=Missing].status") == []
    assert columns.extract(obj, "spec.rules[*].name") == ["a", "b"]
    assert columns.extract(obj, "spec.rules[1].name") == ["b"]
    assert columns.extract(obj, "spec.rules[7].name") == []
    assert columns.extract(obj, "spec.nothing.here") == []
    assert columns.extract({"spec": {"rules": "not-a-list"}}, "spec.rules[*].name") == []


def test_cells_join_values_and_spell_missing_as_none() -> None:
    assert columns.cell([]) == "<none>"
    assert columns.cell([None, ""]) == "<none>"
    assert columns.cell(["a", "b"]) == "a,b"
    assert columns.cell([True, 3]) == "true,3"
    assert columns.cell([{"k": 1}]) == '{"k":1}'


def test_values_follow_the_column_type() -> None:
    obj = {"metadata": {"creationTimestamp": "2025-01-10T11:58:00Z"},
           "status": {"attempt": 3, "cost": 1.5, "done": False, "note": "7", "tags": ["x", "y"]}}

    def value(path: str, kind: str | None) -> object:
        return columns.value(obj, Column("X", path, type=kind), NOW)  # type: ignore[arg-type]

    assert value("status.attempt", "integer") == 3
    assert value("status.attempt", "number") == 3
    assert value("status.cost", "number") == 1.5
    assert value("status.done", "boolean") is False
    assert value("status.done", "integer") == "false"  # the wrong type still shows, as text
    assert value("status.note", "integer") == "7"
    assert value("status.tags[*]", "string") == "x,y"
    assert value("status.missing", "integer") == "<none>"
    assert value("metadata.creationTimestamp", "date") == "2m"
    assert value("status.missing", "date") == "<none>"
    # a column headed AGE is a date unless it says otherwise; any other header is a string
    assert columns.value(obj, Column("AGE", "metadata.creationTimestamp"), NOW) == "2m"
    assert columns.value(obj, Column("ATTEMPT", "status.attempt"), NOW) == "3"


def test_a_kind_s_columns_start_with_name_and_default_to_age() -> None:
    agent = REGISTRY.resolve("agents")
    assert [c.name for c in columns.for_kind(agent)] == ["NAME", "PROVIDER", "READY", "RUNTIME", "AGE"]
    assert columns.for_kind(dataclasses.replace(agent, columns=())) == [columns.NAME, columns.AGE]


def test_definitions_mark_the_name_column_and_wide_columns() -> None:
    defs = columns.definitions(columns.for_kind(REGISTRY.resolve("agents")))
    assert defs[0] == {"name": "NAME", "type": "string", "format": "name",
                       "description": columns.NAME.description, "priority": 0}
    by_name = {d["name"]: d for d in defs}
    assert by_name["RUNTIME"]["priority"] == 1 and by_name["READY"]["priority"] == 0
    assert by_name["READY"]["description"] == "status.conditions[type=Ready].status"
    assert by_name["AGE"]["type"] == "date" and by_name["AGE"]["format"] == ""
    assert all(set(d) == {"name", "type", "format", "description", "priority"} for d in defs)
