from __future__ import annotations

import pytest

from joch.api import errors, selectors
from joch.api.kinds import AGENT_RUN, POLICY


def obj(name: str = "a", **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "default", "labels": labels}}


@pytest.mark.parametrize(("selector", "labels", "expected"), [
    ("app=web", {"app": "web"}, True),
    ("app==web", {"app": "db"}, False),
    ("app!=web", {}, True),
    ("app", {"app": ""}, True),
    ("!app", {"app": "x"}, False),
    ("env in (prod, staging)", {"env": "staging"}, True),
    ("env notin (prod)", {"env": "prod"}, False),
    ("env in (a,b),tier=1", {"env": "a", "tier": "1"}, True),
    ("env in (a,b),tier=1", {"env": "a", "tier": "2"}, False),
])
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert selectors.matches(obj(**labels), selectors.parse_labels(selector), ()) is expected


def test_field_selectors() -> None:
    fields = selectors.parse_fields("metadata.name=a,metadata.namespace!=kube-system")
    assert selectors.matches(obj("a"), (), fields)
    assert not selectors.matches(obj("b"), (), fields)


@pytest.mark.parametrize("bad", ["a=b=c", "in (x)", "x in y"])
def test_bad_label_selector(bad: str) -> None:
    with pytest.raises(errors.BadRequest, match="unable to parse"):
        selectors.parse_labels(bad)


def test_unsupported_field() -> None:
    with pytest.raises(errors.BadRequest, match=r"field label not supported: spec\.x"):
        selectors.parse_fields("spec.x=1")


def test_selectable_fields_are_the_plain_paths_of_a_kinds_columns() -> None:
    run_fields = selectors.selectable(AGENT_RUN)
    assert run_fields[:2] == selectors.FIELDS
    assert {"status.phase", "spec.agentRef.name", "status.attempt"} <= set(run_fields)
    assert "spec.rules[*].name" not in selectors.selectable(POLICY)  # a wildcard selects nothing sensible
    assert selectors.selectable(None) == selectors.FIELDS


def test_field_values_compare_as_text() -> None:
    run = {"metadata": {"name": "r"}, "status": {"phase": "Running", "attempt": 2, "done": False}}
    assert selectors.field_value(run, "status.phase") == "Running"
    assert selectors.field_value(run, "status.attempt") == "2"
    assert selectors.field_value(run, "status.done") == "false"
    assert selectors.field_value(run, "status.reason") == ""
    assert selectors.field_value(run, "spec.agentRef.name") == ""
    fields = (selectors.Requirement("status.attempt", "=", ("2",)), selectors.Requirement("status.reason", "=", ("",)))
    assert selectors.matches(run, (), fields)
    assert selectors.mutable(fields) and not selectors.mutable(selectors.parse_fields("metadata.name=r"))
