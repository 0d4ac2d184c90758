from __future__ import annotations

import json
from typing import Any

from joch.admission.positions import Position, Positions, locate

STREAM = """\
# a team's agents
apiVersion: joch.dev/v1alpha1
kind: Agent
metadata:
  name: coder
  labels:
    app.kubernetes.io/name: coder
    on: yes
spec:
  providerRef: {name: codex}
  env:
  - name: A
    value: "1"
  - name: B
---
---
apiVersion: joch.dev/v1alpha1
kind: Policy
metadata: {name: guardrails}
spec:
  rules:
  - name: r
    expression: |
      object.spec.binary == "sh"
"""


def at(text: str, index: int, field: str, item: int | None = None) -> Position | None:
    return Positions(text).of(index=index, item=item, field=field)


def test_a_field_is_at_its_key_and_a_list_item_at_the_item() -> None:
    assert at(STREAM, 0, "metadata.name") == Position(5, 3)
    assert at(STREAM, 0, "spec.providerRef.name") == Position(10, 17)
    assert at(STREAM, 0, "spec.env[1]") == Position(14, 5)
    assert at(STREAM, 0, "spec.env[1].name") == Position(14, 5)
    assert at(STREAM, 0, "spec.env[0].value") == Position(13, 5)


def test_keys_are_matched_as_format_path_spells_them() -> None:
    assert at(STREAM, 0, "metadata.labels[app.kubernetes.io/name]") == Position(7, 5)
    assert at(STREAM, 0, "metadata.labels.on") == Position(8, 5)  # a key YAML read as true


def test_documents_are_numbered_like_the_loader_with_empty_sections_counted() -> None:
    assert at(STREAM, 2, "spec.rules[0].expression") == Position(23, 5)
    assert at(STREAM, 1, "spec") == Position(16, 1, exact=False)  # the empty section, not the next one
    assert at(STREAM, 3, "spec") is None


def test_the_document_itself_is_its_first_key() -> None:
    assert at(STREAM, 0, "") == Position(2, 1)
    assert at(STREAM, 2, "") == Position(17, 1)


def test_a_field_not_written_is_at_its_closest_written_ancestor() -> None:
    assert at(STREAM, 0, "spec.env[1].value") == Position(14, 5, exact=False)
    assert at(STREAM, 0, "spec.runtime.image") == Position(9, 1, exact=False)
    assert at(STREAM, 0, "spec.env[7]") == Position(11, 3, exact=False)
    # a prefix of a key is not the key
    assert at(STREAM, 0, "spec.provider") == Position(9, 1, exact=False)


def test_items_of_a_list_and_of_a_json_array() -> None:
    listed = "kind: List\nitems:\n- kind: Agent\n  spec: {a: 1}\n- kind: Agent\n  spec:\n    a: 2\n"
    assert at(listed, 0, "spec.a", item=1) == Position(7, 5)
    assert at(listed, 0, "", item=0) == Position(3, 3)
    array = json.dumps([{"kind": "Agent"}, {"kind": "Agent", "spec": {"a": 1}}], indent=1)
    found = at(array, 0, "spec.a", item=1)
    assert found is not None and array.splitlines()[found.line - 1].strip() == '"a": 1'


def test_text_that_does_not_compose_has_no_positions() -> None:
    assert at("a: [1, 2\n", 0, "a") is None
    assert at("[" * 10_000, 0, "") is None  # refused before the composer could recurse


def test_locate_adds_the_position_to_each_cause_of_a_rejected_batch() -> None:
    details: list[dict[str, Any]] = [
        {"index": 0, "causes": [{"field": "spec.env[0].value", "message": "m"},
                                {"field": "spec.nothing", "message": "n"}]},
        {"index": 2, "causes": [{"field": "spec.rules[0].expression", "message": "x"}]},
        {"index": 9, "causes": [{"field": "", "message": "gone"}]},
    ]
    locate(details, STREAM)
    assert details[0]["causes"][0] | {} == {"field": "spec.env[0].value", "message": "m", "line": 13,
                                            "column": 5, "exact": True}
    assert (details[0]["causes"][1]["line"], details[0]["causes"][1]["exact"]) == (9, False)
    assert details[1]["causes"][0]["line"] == 23
    assert "line" not in details[2]["causes"][0]
    locate(None, STREAM)  # no details: nothing to do
