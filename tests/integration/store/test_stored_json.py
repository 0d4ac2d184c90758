"""The SQL stores write and read object bodies through orjson where it gives what ``json`` gives,
and through ``json`` elsewhere (``joch.store.sql.dumps``/``loads``): each value these two libraries
treat differently is read back as it was written, by every read path."""

from __future__ import annotations

import enum
import math
from typing import Any

import pytest

from joch.api.kinds import AGENT_RUN
from joch.store import ListOptions, Store, open_store
from joch.store.sql import dumps, loads


class Mode(enum.StrEnum):
    FAST = "fast"


INPUTS: dict[str, Any] = {
    "huge": 2 ** 70, "negative": -(2 ** 64) - 1, "nothing": None, "tiny": 1e-05, "large": 1e16,
    "hugefloat": 1e19, "overflow": -1.5e300, "half": 0.5,
    "text": "é\u2028\u00a0日本", "quote": 'a "b" \\ c', "empty": {}, "items": [1, [2, {"x": None}]],
    "enum": Mode.FAST, "word": "null-ish but no null",
}


def run(name: str, given: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"agentRef": {"name": "a"}, "input": given}}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest) -> Any:
    store = open_store(request.getfixturevalue(f"{request.param}_url"))
    yield store
    store.close()


def test_values_json_and_orjson_treat_differently_are_read_back_as_written(sql_store: Store) -> None:
    expected = {**INPUTS, "enum": "fast"}
    for key, value in INPUTS.items():
        sql_store.create(AGENT_RUN, run(f"r-{key.lower()}", {key: value}))
    for key in INPUTS:
        name = f"r-{key.lower()}"
        got = sql_store.get(AGENT_RUN, "default", name)["spec"]["input"]
        assert got == {key: expected[key]} and type(got[key]) is type(expected[key]), key
        with sql_store.transaction() as tx:
            assert tx.get(AGENT_RUN, "default", name)["spec"]["input"] == got
            listed = tx.list_many([(AGENT_RUN, "default")])[0]
            assert {o["metadata"]["name"]: o["spec"]["input"] for o in listed}[name] == got
    listed = sql_store.list(AGENT_RUN, ListOptions(namespace="default")).items
    assert {o["metadata"]["name"]: o["spec"]["input"] for o in listed} == {
        f"r-{k.lower()}": {k: v} for k, v in expected.items()}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {1: "a"}, "\ud800", Mode.FAST, 2 ** 70, None])
def test_dumps_writes_what_json_writes_where_orjson_would_differ(value: Any) -> None:
    import json

    expected = json.dumps({"v": value}, separators=(",", ":"), ensure_ascii=False)
    assert dumps({"v": value}) == expected
    if "\ud800" not in expected:
        back = loads(expected)["v"]
        assert (math.isnan(back) if isinstance(value, float) and math.isnan(value)
                else back == json.loads(expected)["v"])
