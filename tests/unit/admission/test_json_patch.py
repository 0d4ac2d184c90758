"""JSON patch (RFC 6902) as the server applies it: shape checks, each op, and the errors."""

from __future__ import annotations

import json

import pytest

from joch.admission import json_patch
from joch.api import errors

OBJ = {"metadata": {"name": "a", "labels": {"x": "1"}, "resourceVersion": "7"}, "spec": {"list": [1, 2]}}


def test_every_operation_applies_in_order() -> None:
    ops = json_patch.decode(json.dumps([
        {"op": "test", "path": "/metadata/labels/x", "value": "1"},
        {"op": "add", "path": "/spec/list/-", "value": 3},
        {"op": "replace", "path": "/metadata/labels/x", "value": "2"},
        {"op": "copy", "from": "/metadata/labels/x", "path": "/metadata/labels/y"},
        {"op": "move", "from": "/metadata/labels/y", "path": "/metadata/labels/z"},
        {"op": "remove", "path": "/spec/list/0"},
    ]))
    out = json_patch.apply(OBJ, ops)
    assert out["spec"]["list"] == [2, 3] and out["metadata"]["labels"] == {"x": "2", "z": "2"}
    assert OBJ["spec"]["list"] == [1, 2]  # the stored object is left as it was


@pytest.mark.parametrize(("body", "says"), [
    ('{"op": "add"}', "must be a list of operations"),
    ('[1]', "operation 0 must be an object"),
    ('[{"op": "frob", "path": "/a"}]', "unknown op 'frob'"),
    ('[{"op": "add", "path": 3, "value": 1}]', "path must be a string"),
    ('[{"op": "replace", "path": "/a"}]', "value is required"),
    ('[{"op": "move", "path": "/a"}]', "from must be a string"),
    ("[", "not valid JSON"),
])
def test_a_malformed_patch_is_a_400_naming_the_operation(body: str, says: str) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        json_patch.decode(body)
    assert says in caught.value.message


def test_a_failing_test_is_a_422_naming_the_field_and_both_values() -> None:
    with pytest.raises(errors.Invalid) as caught:
        json_patch.apply(OBJ, [{"op": "test", "path": "/metadata/labels/x", "value": "9"}])
    assert caught.value.message == ('JSON patch operation 0 (test /metadata/labels/x) failed: metadata.labels.x is '
                                    '"1", not "9" as the patch\'s test operation expects; nothing was changed')
    assert caught.value.causes[0].field == "metadata.labels.x"
    with pytest.raises(errors.Invalid) as missing:
        json_patch.apply(OBJ, [{"op": "test", "path": "/spec/nope", "value": 1}])
    assert "spec.nope is absent" in missing.value.message


def test_an_operation_on_a_missing_path_is_a_422() -> None:
    with pytest.raises(errors.Invalid) as caught:
        json_patch.apply(OBJ, [{"op": "remove", "path": "/spec/nope"}])
    assert caught.value.message.startswith("JSON patch operation 0 (remove /spec/nope) cannot be applied")


def test_a_patch_naming_the_resource_version_is_pinned() -> None:
    assert json_patch.pinned([{"op": "test", "path": "/metadata/resourceVersion", "value": "7"}])
    assert not json_patch.pinned([{"op": "add", "path": "/spec/x", "value": 1}])


def test_many_operations_on_a_large_object_copy_it_once() -> None:
    # Each operation once deep-copied the whole object: 1500 tests on an object with 10000
    # annotations took ~6 s of the server's time, and a 3 MiB patch several minutes.
    import time

    doc = {"metadata": {"annotations": {f"k{i}": "v" for i in range(10000)}}, "spec": {}}
    ops = json_patch.decode(json.dumps([{"op": "test", "path": "/spec", "value": {}}] * 1499
                                       + [{"op": "add", "path": "/spec/x", "value": 1}]))
    started = time.monotonic()
    patched = json_patch.apply(doc, ops)
    assert time.monotonic() - started < 2.0
    assert patched["spec"] == {"x": 1} and doc["spec"] == {}  # the stored object is left alone


def test_more_operations_than_the_apiserver_allows_is_a_413() -> None:
    with pytest.raises(errors.RequestEntityTooLarge, match="allowed count of JSON patch operations is 10000"):
        json_patch.decode(json.dumps([{"op": "test", "path": "/spec", "value": {}}] * 10001))


def test_copy_operations_cannot_blow_the_object_up() -> None:
    # Each copy of /spec into /spec doubles it: 30 such operations in a 1 KB body once asked the
    # server for gigabytes (20 took 5 s and 28 MB).
    ops = json_patch.decode(json.dumps([{"op": "copy", "from": "/spec", "path": f"/spec/c{i}"} for i in range(30)]))
    with pytest.raises(errors.RequestEntityTooLarge, match=r"copy operations duplicate more than 500000 values"):
        json_patch.apply({"metadata": {"name": "a"}, "spec": {"x": [1, 2, 3, 4]}}, ops)
    few = json_patch.decode(json.dumps([{"op": "copy", "from": "/spec", "path": f"/spec/c{i}"} for i in range(3)]))
    assert len(json_patch.apply({"spec": {"x": 1}}, few)["spec"]) == 4
