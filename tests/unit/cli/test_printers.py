"""Server Tables laid out, names, lists and YAML: what ``joch get`` prints, without a server."""

from __future__ import annotations

import datetime as dt

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


DEFINITIONS = [
    {"name": "NAME", "type": "string", "format": "name", "description": "", "priority": 0},
    {"name": "Provider", "type": "string", "format": "", "description": "", "priority": 0},
    {"name": "RUNTIME", "type": "string", "format": "", "description": "", "priority": 1},
    {"name": "AGE", "type": "date", "format": "", "description": "", "priority": 0},
]


def row(*cells: object, namespace: str | None = "default") -> dict[str, object]:
    metadata = {"name": cells[0], **({"namespace": namespace} if namespace else {})}
    return {"cells": list(cells), "object": {"kind": "PartialObjectMetadata", "metadata": metadata}}


def test_the_layout_shows_priority_columns_only_when_wide_and_upper_cases_headers() -> None:
    narrow = printers.layout(DEFINITIONS, wide=False, namespace=False)
    assert narrow.headers == ["NAME", "PROVIDER", "AGE"]
    assert narrow.cells(row("coder", "codex", "local", "2m")) == ["coder", "codex", "2m"]
    wide = printers.layout(DEFINITIONS, wide=True, namespace=True)
    assert wide.headers == ["NAMESPACE", "NAME", "PROVIDER", "RUNTIME", "AGE"]
    assert wide.cells(row("coder", "codex", "local", "2m", namespace="team-a")) == [
        "team-a", "coder", "codex", "local", "2m"]
    assert (narrow.name_at, wide.name_at) == (0, 1)


def test_the_name_column_is_the_one_formatted_as_name() -> None:
    moved = [DEFINITIONS[1], DEFINITIONS[0]]
    assert printers.layout(moved, wide=False, namespace=True).name_at == 2


def test_cells_print_like_kubectl_but_spell_nothing_as_none() -> None:
    assert [printers.text(v) for v in (None, "", "x", 3, True, 1.5)] == ["<none>", "<none>", "x", "3", "true", "1.5"]
    assert printers.text("first line\nsecond") == "first line..."
    assert printers.text("a\r\nb") == "a..."
    layout = printers.layout(DEFINITIONS, wide=True, namespace=True)
    short = {"cells": ["lonely"], "object": None}  # fewer cells than columns, no object: no crash
    assert layout.cells(short) == ["<none>", "lonely", "<none>", "<none>", "<none>"]


def test_a_plain_list_from_an_older_server_becomes_name_and_age() -> None:
    listing = {"kind": "AgentList", "metadata": {"resourceVersion": "9"},
               "items": [agent("coder"), agent("a-much-longer-name", created="2025-01-08T12:00:00Z")]}
    table = printers.as_table(listing, NOW)
    assert table["metadata"] == {"resourceVersion": "9"}
    layout = printers.layout(table["columnDefinitions"], wide=True, namespace=True)
    rows = [layout.cells(r) for r in table["rows"]]
    assert printers.render_table(layout.headers, rows) == [
        "NAMESPACE   NAME                 AGE",
        "default     coder                2m",
        "default     a-much-longer-name   2d",
    ]
    one = printers.as_table(agent("coder"), NOW)
    assert [r["cells"] for r in one["rows"]] == [["coder", "2m"]]
    served = {"kind": "Table", "columnDefinitions": DEFINITIONS, "rows": []}
    assert printers.as_table(served, NOW) is served


def test_rows_and_table_line_up_like_kubectl() -> None:
    layout = printers.layout(DEFINITIONS, wide=False, namespace=False)
    rows = [layout.cells(row("coder", "codex", "local", "2m")),
            layout.cells(row("a-much-longer-name", None, "local", "2d"))]
    assert printers.render_table(layout.headers, rows) == [
        "NAME                 PROVIDER   AGE",
        "coder                codex      2m",
        "a-much-longer-name   <none>     2d",
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
