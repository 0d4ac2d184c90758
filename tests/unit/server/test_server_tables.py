"""Table negotiation and Table bodies, without a server: which Accept gets a Table, and its shape."""

from __future__ import annotations

from typing import Any

import pytest

from joch.api import REGISTRY, errors
from joch.server import tables
from joch.store.base import ListResult

KUBECTL = ("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
           "application/json")
AGENTS = tables.KindTables(REGISTRY.resolve("agents"))


def agent(name: str, **status: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": name, "namespace": "default", "resourceVersion": "7",
                         "creationTimestamp": "2025-01-10T11:58:00Z", "labels": {"team": "core"}},
            "spec": {"providerRef": {"name": "codex"}, "runtime": {"type": "local"}}, "status": status}


@pytest.mark.parametrize(
    ("accept", "expected"),
    [(None, None), ("", None), ("application/json", None), ("*/*", None),
     (KUBECTL, "v1"),
     ("application/json;as=Table;v=v1beta1;g=meta.k8s.io", "v1beta1"),
     ("application/json; as=Table; g=meta.k8s.io; v=v1", "v1"),
     ("application/json, application/json;as=Table;v=v1;g=meta.k8s.io", None),  # written order decides
     ("application/json;q=0.5, application/json;as=Table;v=v1;g=meta.k8s.io", "v1"),  # then q
     ("application/json;as=Table;v=v1;g=meta.k8s.io;q=0, application/json", None),
     ("application/json;as=Table;v=v2;g=meta.k8s.io, application/json", None),  # unknown version
     ("application/json;as=Table;v=v1;g=example.com", None),
     ("application/yaml;as=Table;v=v1;g=meta.k8s.io, application/json;as=Table;v=v1beta1;g=meta.k8s.io",
      "v1beta1"),
     ("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io, "
      "application/json;as=Table;v=v1;g=meta.k8s.io", "v1")],
)
def test_negotiation_picks_the_first_acceptable_representation(accept: str | None, expected: str | None) -> None:
    chosen = tables.negotiate(accept, None)
    assert (chosen.version if chosen else None) == expected


def test_include_object_defaults_to_metadata_and_rejects_unknown_values() -> None:
    assert tables.negotiate(KUBECTL, None) == tables.TableRequest("v1", "Metadata")
    assert tables.negotiate(KUBECTL, "Object") == tables.TableRequest("v1", "Object")
    assert tables.negotiate(KUBECTL, "None") == tables.TableRequest("v1", "None")
    with pytest.raises(errors.BadRequest, match='includeObject value "everything"'):
        tables.negotiate(KUBECTL, "everything")
    assert tables.negotiate("application/json", "everything") is None  # only read for a Table


def test_a_list_table_has_list_metadata_columns_and_one_row_per_object() -> None:
    result = ListResult(items=[agent("coder", conditions=[{"type": "Ready", "status": "True"}]), agent("bare")],
                        resource_version="42", continue_token="next")
    table = AGENTS.for_list(result, tables.TableRequest())
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert table["metadata"] == {"resourceVersion": "42", "continue": "next"}
    assert [d["name"] for d in table["columnDefinitions"]] == ["NAME", "PROVIDER", "READY", "RUNTIME", "AGE"]
    assert [r["cells"][:4] for r in table["rows"]] == [["coder", "codex", "True", "local"],
                                                       ["bare", "codex", "<none>", "local"]]
    assert all(r["cells"][4].endswith(("s", "m", "h", "d", "y")) for r in table["rows"])
    assert table["rows"][0]["object"] == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                          "metadata": agent("coder")["metadata"]}


def test_include_object_chooses_what_a_row_carries() -> None:
    obj = agent("coder")
    full = AGENTS.for_object(obj, tables.TableRequest("v1beta1", "Object"))
    assert full["apiVersion"] == "meta.k8s.io/v1beta1" and full["metadata"] == {"resourceVersion": "7"}
    assert full["rows"][0]["object"] == obj
    assert "object" not in AGENTS.for_object(obj, tables.TableRequest("v1", "None"))["rows"][0]
    partial = AGENTS.for_object(obj, tables.TableRequest("v1beta1", "Metadata"))["rows"][0]["object"]
    assert partial["apiVersion"] == "meta.k8s.io/v1beta1" and partial["kind"] == "PartialObjectMetadata"


def test_watch_events_carry_the_columns_once() -> None:
    transform = AGENTS.watch_transform(tables.TableRequest())
    first = transform("ADDED", agent("coder"))
    assert first["columnDefinitions"] == AGENTS.definitions and len(first["rows"]) == 1
    later = transform("MODIFIED", agent("coder"))
    assert later["columnDefinitions"] == [] and later["rows"][0]["cells"][0] == "coder"
    bookmark = transform("BOOKMARK", {"kind": "Agent", "metadata": {"resourceVersion": "99"}})
    assert bookmark["metadata"] == {"resourceVersion": "99"} and bookmark["rows"] == []
    status = {"kind": "Status", "code": 410}
    assert transform("ERROR", status) is status


def test_a_bookmark_first_still_carries_the_columns() -> None:
    transform = AGENTS.watch_transform(tables.TableRequest())
    assert transform("BOOKMARK", {"metadata": {"resourceVersion": "5"}})["columnDefinitions"] == AGENTS.definitions
    assert transform("ADDED", agent("coder"))["columnDefinitions"] == []
