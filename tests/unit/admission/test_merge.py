from __future__ import annotations

import copy
from typing import Any

import pytest

from joch.admission.merge import merge_patch

# RFC 7386, Appendix A (the cases whose target and patch are objects; the rest nested one level).
RFC_7386_EXAMPLES: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    ({"x": ["a", "b"]}, {"x": ["c", "d"]}, {"x": ["c", "d"]}),
    ({"x": {"a": "b"}}, {"x": ["c"]}, {"x": ["c"]}),
    ({"x": {"a": "foo"}}, {"x": None}, {}),
    ({"x": {"a": "foo"}}, {"x": "bar"}, {"x": "bar"}),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ({"x": [1, 2]}, {"x": {"a": "b", "c": None}}, {"x": {"a": "b"}}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "expected"), RFC_7386_EXAMPLES)
def test_rfc_7386_examples(target: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]) -> None:
    assert merge_patch(target, patch) == expected


def test_is_pure_and_shares_nothing_mutable() -> None:
    target = {"metadata": {"labels": {"a": "1"}}, "spec": {"args": ["x"], "env": {"A": "1"}}}
    patch = {"metadata": {"labels": {"b": "2"}}, "spec": {"args": ["y"]}}
    before_target, before_patch = copy.deepcopy(target), copy.deepcopy(patch)
    result = merge_patch(target, patch)
    assert target == before_target and patch == before_patch
    result["spec"]["env"]["B"] = "2"
    result["spec"]["args"].append("z")
    assert target == before_target and patch == before_patch
    assert result["metadata"]["labels"] == {"a": "1", "b": "2"}


def test_empty_patch_is_identity() -> None:
    target = {"a": {"b": [1, {"c": None}]}}
    assert merge_patch(target, {}) == target
