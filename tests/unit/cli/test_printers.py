"""Tables, ages and column paths: what ``joch get`` prints, without a server."""

from __future__ import annotations

import datetime as dt

import pytest

from joch.cli import printers
from joch.cli.resolve import ResourceType

NOW = dt.datetime(2025, 1, 10, 12, 0, 0, tzinfo=dt.UTC)
AGENTS = ResourceType(group="joch.dev", version="v1alpha1", kind="Agent", plural="agents", singular="agent",
                      namespaced=True, short_names=("ag",))


def agent(name: str, *, ready: str | None = None, created: str = "2025-01-10T11:58:00Z") -> dict[str, object]:
    obj: dict[str, object] = {
        "apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
        "spec": {"providerRef": {"name": "codex"}, "runtime": {"type": "local"}},
    }
    if ready is not None:
        obj["status"] = {"conditions": [{"type": "Accepted", "status": "True"}, {"type": "Ready", "status": ready}]}
    return obj


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(-5, "<invalid>"), (-0.5, "0s"), (0, "0s"), (5, "5s"), (59, "59s"), (60, "1m"), (3599, "59m"),
     (3600, "1h"), (2 * 3600 + 59 * 60, "2h"), (86399, "23h"), (86400, "1d"), (4 * 86400 + 5, "4d"),
     (364 * 86400, "364d"), (365 * 86400, "1y"), (800 * 86400, "2y")],
)
def test_short_duration_rounds_down_to_one_unit(seconds: float, expected: str) -> None:
    assert printers.short_duration(seconds) == expected


def test_format_age_of_timestamps() -> None:
    assert printers.format_age("2025-01-10T11:59:55Z", NOW) == "5s"
    assert printers.format_age("2025-01-06T12:00:00Z", NOW) == "4d"
    assert printers.format_age(None, NOW) == "<none>"
    assert printers.format_age("yesterday", NOW) == "<invalid>"


def test_extract_follows_filters_stars_and_indexes() -> None:
    obj = {"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Done", "status": "True"}]},
           "spec": {"rules": [{"name": "a"}, {"name": "b"}]}}
    assert printers.extract(obj, "status.conditions[type=Ready].status") == ["False"]
    assert printers.extract(obj, "status.conditions[type=Missing].status") == []
    assert printers.extract(obj, "spec.rules[*].name") == ["a", "b"]
    assert printers.extract(obj, "spec.rules[1].name") == ["b"]
    assert printers.extract(obj, "spec.rules[7].name") == []
    assert printers.extract(obj, "spec.nothing.here") == []
    assert printers.extract({"spec": {"rules": "not-a-list"}}, "spec.rules[*].name") == []


def test_cells_join_values_and_spell_missing_as_none() -> None:
    assert printers.cell([]) == "<none>"
    assert printers.cell([None, ""]) == "<none>"
    assert printers.cell(["a", "b"]) == "a,b"
    assert printers.cell([True, 3]) == "true,3"
    assert printers.cell([{"k": 1}]) == '{"k":1}'


def test_agent_columns_come_from_the_registry() -> None:
    names = [c.name for c in printers.columns_for(AGENTS, wide=False, all_namespaces=False)]
    assert names == ["NAME", "PROVIDER", "READY", "AGE"]
    wide = [c.name for c in printers.columns_for(AGENTS, wide=True, all_namespaces=True)]
    assert wide == ["NAMESPACE", "NAME", "PROVIDER", "READY", "RUNTIME", "AGE"]


def test_a_kind_unknown_locally_prints_name_and_age() -> None:
    other = ResourceType(group="example.com", version="v1", kind="Widget", plural="widgets", singular="widget",
                         namespaced=False)
    assert [c.name for c in printers.columns_for(other, wide=True, all_namespaces=True)] == ["NAME", "AGE"]


def test_rows_and_table_line_up_like_kubectl() -> None:
    columns = printers.columns_for(AGENTS, wide=False, all_namespaces=False)
    rows = [printers.row(agent("coder", ready="True"), columns, NOW),
            printers.row(agent("a-much-longer-name", created="2025-01-08T12:00:00Z"), columns, NOW)]
    assert rows[0] == ["coder", "codex", "True", "2m"]
    assert rows[1] == ["a-much-longer-name", "codex", "<none>", "2d"]
    lines = printers.render_table([c.name for c in columns], rows)
    assert lines == [
        "NAME                 PROVIDER   READY    AGE",
        "coder                codex      True     2m",
        "a-much-longer-name   codex      <none>   2d",
    ]


def test_render_row_never_truncates_a_wider_cell() -> None:
    assert printers.render_row(["abcdefgh", "x"], [3, 1]) == "abcdefgh   x"


def test_names_lists_and_serialisation() -> None:
    assert printers.object_name(AGENTS, agent("coder")) == "agent.joch.dev/coder"
    listed = printers.as_list([agent("a")])
    assert listed["kind"] == "List" and listed["items"][0]["metadata"]["name"] == "a"
    assert printers.dump({"a": 1, "b": [1]}, "yaml") == "a: 1\nb:\n- 1\n"
    assert printers.dump({"a": 1}, "json") == '{\n    "a": 1\n}\n'
    assert printers.dump({"p": "one\ntwo\n", "v": "7"}, "yaml") == "p: |\n  one\n  two\nv: '7'\n"
