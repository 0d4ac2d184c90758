"""Server-side apply's field sets, FieldsV1 and the apply/update algorithms (joch.admission.ssa)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from joch.admission import ssa
from joch.api.registry import REGISTRY

V = "joch.dev/v1alpha1"
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"


def obj(spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": V, "kind": "AgentProvider",
            "metadata": {"name": "p", "namespace": "default", "uid": "u", "resourceVersion": "3", **metadata},
            "spec": spec}


def f(*names: str) -> ssa.Path:
    return tuple(("f", n) for n in names)


def apply(live: dict[str, Any] | None, config: dict[str, Any], entries: list[ssa.Entry], manager: str = "a",
          force: bool = False, now: str = T1) -> ssa.Applied:
    return ssa.apply(live, config, entries, manager=manager, api_version=V, force=force, now=now,
                     ignore=("status",))


def by_manager(entries: list[ssa.Entry]) -> dict[str, ssa.FieldSet]:
    return {e.manager: e.fields for e in entries}


# --- field sets ----------------------------------------------------------------------------------

def test_field_set_has_leaves_and_atomic_lists_not_maps_or_server_fields() -> None:
    o = obj({"binary": "x", "versionArgs": ["-v"], "env": {"A": "1"}, "empty": {}}, labels={"t": "a"})
    assert ssa.field_set(ssa.tracked(o)) == {
        f("spec", "binary"), f("spec", "versionArgs"), f("spec", "env", "A"), f("metadata", "labels", "t")}


def test_metadata_finalizers_are_a_set_and_owner_references_keyed_by_uid() -> None:
    o = {"metadata": {"finalizers": ["x"], "ownerReferences": [{"uid": "1", "name": "n"}]}}
    item = (("f", "metadata"), ("f", "ownerReferences"), ("k", '{"uid":"1"}'))
    assert ssa.field_set(o) == {
        (("f", "metadata"), ("f", "finalizers"), ("v", '"x"')), item, (*item, ("f", "uid")), (*item, ("f", "name"))}


def test_fields_v1_round_trips_with_dot_for_members_that_have_children() -> None:
    o = {"spec": {"a": 1, "b": {"c": [1]}}, "metadata": {"ownerReferences": [{"uid": "1"}], "finalizers": ["z"]}}
    fields = ssa.field_set(o)
    encoded = ssa.encode_fields(fields)
    assert encoded == {
        "f:metadata": {"f:finalizers": {'v:"z"': {}},
                       "f:ownerReferences": {'k:{"uid":"1"}': {".": {}, "f:uid": {}}}},
        "f:spec": {"f:a": {}, "f:b": {"f:c": {}}}}
    assert ssa.decode_fields(encoded) == fields


def test_decode_refuses_keys_that_are_not_field_set_keys() -> None:
    with pytest.raises(ssa.ManagedFieldsError, match="not a field set key"):
        ssa.decode_fields({"spec": {}})
    with pytest.raises(ssa.ManagedFieldsError, match="JSON"):
        ssa.decode_fields({"k:{nope": {}})


def test_path_strings_are_structured_merge_diffs() -> None:
    assert ssa.path_string(f("spec", "x")) == ".spec.x"
    assert ssa.path_string((("f", "l"), ("k", '{"name":"a"}'), ("f", "image"))) == '.l[name="a"].image'
    assert ssa.path_string((("f", "finalizers"), ("v", '"x"'))) == '.finalizers[="x"]'


def test_managed_entries_round_trip_and_reset_entries_drop() -> None:
    entries = [ssa.Entry("m", ssa.APPLY, V, frozenset({f("spec", "a")}), T0)]
    encoded = ssa.encode_managed(entries)
    assert encoded == [{"manager": "m", "operation": "Apply", "apiVersion": V, "time": T0,
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:a": {}}}}]
    assert ssa.decode_managed(encoded) == entries
    assert ssa.decode_managed([{}]) == []
    with pytest.raises(ssa.ManagedFieldsError, match=r"managedFields\[0\].operation"):
        ssa.decode_managed([{"manager": "m", "operation": "Patch", "fieldsV1": {"f:a": {}}}])


def test_booleans_and_numbers_are_different_values() -> None:
    assert ssa.changes({"a": 1}, {"a": True}) == ({f("a")}, set())


# --- apply ---------------------------------------------------------------------------------------

def test_create_owns_what_the_configuration_names() -> None:
    out = apply(None, obj({"binary": "x"}, labels={"t": "a"}), [])
    assert out.tracked == {"metadata": {"labels": {"t": "a"}}, "spec": {"binary": "x"}}
    assert [(e.manager, e.operation, e.time) for e in out.entries] == [("a", "Apply", T1)]


def test_reapplying_the_same_configuration_changes_nothing_not_even_the_time() -> None:
    first = apply(None, obj({"binary": "x"}), [], now=T0)
    live = ssa.rebuild(obj({}), first.tracked)
    again = apply(live, obj({"binary": "x"}), first.entries, now=T1)
    assert again.entries == first.entries and again.tracked == first.tracked


def test_another_managers_field_with_another_value_is_a_conflict_naming_it() -> None:
    live = obj({"binary": "x"})
    entries = [ssa.Entry("b", ssa.UPDATE, V, frozenset({f("spec", "binary")}), T0)]
    with pytest.raises(ssa.ApplyConflict) as refused:
        apply(live, obj({"binary": "y"}), entries)
    assert refused.value.message == f'Apply failed with 1 conflict: conflict with "b" using {V}: .spec.binary'


def test_force_moves_the_field_and_the_same_value_shares_it() -> None:
    live = obj({"binary": "x", "versionArgs": ["-v"]})
    entries = [ssa.Entry("b", ssa.APPLY, V, frozenset({f("spec", "binary"), f("spec", "versionArgs")}), T0)]
    forced = apply(live, obj({"binary": "y", "versionArgs": ["-v"]}), entries, force=True)
    owners = by_manager(forced.entries)
    assert owners["b"] == {f("spec", "versionArgs")}
    assert owners["a"] == {f("spec", "binary"), f("spec", "versionArgs")}
    assert forced.tracked["spec"] == {"binary": "y", "versionArgs": ["-v"]}


def test_fields_left_out_are_removed_unless_someone_else_owns_them() -> None:
    live = obj({"binary": "x", "env": {"A": "1", "B": "2"}})
    entries = [ssa.Entry("a", ssa.APPLY, V, frozenset({f("spec", "binary"), f("spec", "env", "A"),
                                                        f("spec", "env", "B")}), T0),
               ssa.Entry("b", ssa.APPLY, V, frozenset({f("spec", "env", "B")}), T0)]
    out = apply(live, obj({"binary": "x"}), entries)
    assert out.tracked["spec"] == {"binary": "x", "env": {"B": "2"}}
    assert by_manager(out.entries)["a"] == {f("spec", "binary")}


def test_a_map_emptied_by_pruning_goes_too() -> None:
    live = obj({"binary": "x", "env": {"A": "1"}})
    entries = [ssa.Entry("a", ssa.APPLY, V, frozenset({f("spec", "binary"), f("spec", "env", "A")}), T0)]
    assert apply(live, obj({"binary": "x"}), entries).tracked["spec"] == {"binary": "x"}


def test_an_untracked_object_belongs_to_before_first_apply() -> None:
    with pytest.raises(ssa.ApplyConflict, match='"before-first-apply" using'):
        apply(obj({"binary": "x"}), obj({"binary": "y"}), [])
    shared = apply(obj({"binary": "x"}), obj({"binary": "x"}), [])
    assert by_manager(shared.entries) == {"before-first-apply": {f("spec", "binary")}, "a": {f("spec", "binary")}}


def test_kubectl_takes_over_client_side_apply_fields_and_keeps_the_annotation_current() -> None:
    last = '{"apiVersion":"joch.dev/v1alpha1","kind":"AgentProvider","metadata":{"name":"p"},"spec":{"binary":"x"}}'
    live = obj({"binary": "x"}, annotations={ssa.LAST_APPLIED: last})
    csa = [ssa.Entry("kubectl-client-side-apply", ssa.UPDATE, V, frozenset({f("spec", "binary")}), T0)]
    with pytest.raises(ssa.ApplyConflict):
        apply(live, obj({"binary": "y"}), csa, manager="someone-else")
    out = apply(live, obj({"binary": "y"}), csa, manager="kubectl")
    assert by_manager(out.entries) == {"kubectl": {f("spec", "binary")}}
    annotation = out.tracked["metadata"]["annotations"][ssa.LAST_APPLIED]
    assert '"binary":"y"' in annotation and ssa.LAST_APPLIED not in annotation


def test_nulls_in_the_configuration_are_no_opinion() -> None:
    out = apply(None, obj({"binary": "x", "resumable": None}), [])
    assert out.tracked["spec"] == {"binary": "x"}


def test_status_is_not_applied_through_the_main_resource() -> None:
    live = {**obj({"binary": "x"}), "status": {"phase": "Ready"}}
    out = apply(live, {**obj({"binary": "x"}), "status": {"phase": "Hacked"}}, [])
    assert "status" not in out.tracked
    assert ssa.rebuild(live, out.tracked, ignore=("status",))["status"] == {"phase": "Ready"}


def test_owner_references_merge_by_uid_and_finalizers_as_a_set() -> None:
    live = obj({}, finalizers=["keep"], ownerReferences=[{"uid": "1", "name": "one"}])
    out = apply(live, obj({}, finalizers=["mine"], ownerReferences=[{"uid": "2", "name": "two"}]), [])
    assert out.tracked["metadata"] == {"finalizers": ["keep", "mine"],
                                       "ownerReferences": [{"uid": "1", "name": "one"}, {"uid": "2", "name": "two"}]}


def test_a_list_with_duplicate_keys_is_atomic_rather_than_losing_items() -> None:
    refs = [{"uid": "1", "name": "a"}, {"uid": "1", "name": "b"}]
    assert ssa.field_set({"metadata": {"ownerReferences": refs}}) == {f("metadata", "ownerReferences")}


def test_spec_lists_of_named_objects_are_keyed_by_name() -> None:
    lists = ssa.kind_lists(REGISTRY.resolve("agentproviders"))
    assert lists(f("spec", "outputArtifacts")) == ssa.ListType("map", ("name",))
    assert lists(f("spec", "versionArgs")) == ssa.ListType()  # strings: atomic
    assert lists(f("metadata", "finalizers")) == ssa.ListType("set")
    assert ssa.kind_lists(REGISTRY.resolve("rolebindings"))(f("subjects")) == ssa.ListType()  # as Kubernetes'
    live = obj({"binary": "x", "outputArtifacts": [{"name": "a", "path": "a.txt"}]})
    entries = [ssa.Entry("b", ssa.APPLY, V, ssa.field_set(ssa.tracked(live), lists), T0)]
    out = ssa.apply(live, obj({"outputArtifacts": [{"name": "c", "path": "c.txt"}]}), entries, manager="a",
                    api_version=V, force=False, now=T1, lists=lists)
    assert out.tracked["spec"]["outputArtifacts"] == [{"name": "a", "path": "a.txt"}, {"name": "c", "path": "c.txt"}]
    assert ssa.encode_managed(out.entries)[1]["fieldsV1"] == {"f:spec": {"f:outputArtifacts": {
        'k:{"name":"c"}': {".": {}, "f:name": {}, "f:path": {}}}}}


def test_removing_a_keyed_item_with_its_fields_removes_the_item() -> None:
    item = (("f", "l"), ("k", '{"name":"a"}'))
    o = {"l": [{"name": "a", "x": 1}, {"name": "b"}]}
    assert ssa.remove(o, {item, (*item, ("f", "name")), (*item, ("f", "x"))}) == {"l": [{"name": "b"}]}
    assert ssa.remove(o, {(*item, ("f", "x"))}) == {"l": [{"name": "a"}, {"name": "b"}]}


# --- update --------------------------------------------------------------------------------------

def test_create_records_everything_for_the_updater() -> None:
    entries = ssa.update(None, obj({"binary": "x"}), [], manager="kubectl-create", api_version=V, now=T0)
    assert entries == [ssa.Entry("kubectl-create", ssa.UPDATE, V, frozenset({f("spec", "binary")}), T0)]


def test_update_takes_changed_fields_from_others_and_drops_removed_ones() -> None:
    old = obj({"binary": "x", "env": {"A": "1"}})
    entries = [ssa.Entry("a", ssa.APPLY, V, frozenset({f("spec", "binary"), f("spec", "env", "A")}), T0)]
    new = obj({"binary": "y"})
    out = ssa.update(old, new, entries, manager="edit", api_version=V, now=T1)
    assert by_manager(out) == {"edit": {f("spec", "binary")}}


def test_update_of_an_untracked_object_stays_untracked() -> None:
    assert ssa.update(obj({"binary": "x"}), obj({"binary": "y"}), [], manager="m", api_version=V, now=T1) == []


def test_update_entries_are_capped_by_merging_the_oldest_into_ancient_changes() -> None:
    entries = [ssa.Entry("seed", ssa.UPDATE, V, frozenset({f("spec", "binary")}), "2026-01-01T00:00:00Z")]
    old = obj({"binary": "x"})
    for i in range(12):  # twelve writers, each adding a key of its own
        new = obj({"binary": "x", "env": {f"K{j}": "v" for j in range(i + 1)}})
        entries = ssa.update(old, new, entries, manager=f"m{i}", api_version=V, now=f"2026-01-01T00:00:{10 + i}Z")
        old = new
    managers = [e.manager for e in entries]
    assert len(managers) == ssa.MAX_UPDATE_MANAGERS and managers[-1] == "ancient-changes"
    ancient = entries[-1]
    assert f("spec", "binary") in ancient.fields and f("spec", "env", "K0") in ancient.fields
    assert "seed" not in managers and "m0" not in managers and "m11" in managers


def test_manager_names() -> None:
    assert ssa.manager_from_user_agent("kubectl/v1.37.0 (linux/amd64) kubernetes/abc") == "kubectl"
    assert ssa.manager_from_user_agent(None) == "unknown"
    assert ssa.manager_problem("x" * 129) is not None and ssa.manager_problem("ok") is None


def test_a_managed_fields_entry_names_its_manager_as_the_field_manager_parameter_must() -> None:
    # A PUT carrying its own managedFields once stored a 20 KB manager name (the fieldManager
    # parameter is held to 128 characters), which every later conflict message then quoted.
    entry = {"manager": "x" * 20000, "operation": "Apply", "apiVersion": "joch.dev/v1alpha1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:description": {}}}}
    with pytest.raises(ssa.ManagedFieldsError, match=r"managedFields\[0\]\.manager.*at most 128"):
        ssa.decode_managed([entry])
    with pytest.raises(ssa.ManagedFieldsError, match=r"managedFields\[0\]\.manager.*printable"):
        ssa.decode_managed([{**entry, "manager": "bad\nname"}])
    assert ssa.decode_managed([{**entry, "manager": "x" * 128}])[0].manager == "x" * 128


def test_encode_fields_orders_every_level_and_marks_members_with_members() -> None:
    fields = frozenset({
        (("f", "spec"), ("f", "b")), (("f", "spec"), ("f", "a")),
        (("f", "spec"), ("f", "list"), ("k", '{"name":"x"}')),
        (("f", "spec"), ("f", "list"), ("k", '{"name":"x"}'), ("f", "name")),
        (("f", "metadata"), ("f", "labels"), ("f", "z")),
    })
    encoded = ssa.encode_fields(fields)
    assert json.dumps(encoded) == json.dumps({
        "f:metadata": {"f:labels": {"f:z": {}}},
        "f:spec": {"f:a": {}, "f:b": {}, "f:list": {'k:{"name":"x"}': {".": {}, "f:name": {}}}},
    })
    assert ssa.decode_fields(encoded) == fields


CREATED_CASES: list[tuple[str, dict[str, Any]]] = [
    ("agentproviders", {"metadata": {"name": "p", "labels": {"a": "b"}, "finalizers": ["x/y", "x/z", "x/y"],
                                     "ownerReferences": [{"uid": "1", "name": "o"}, {"uid": "2"}],
                                     "annotations": {}},
                        "spec": {"binary": "x", "versionArgs": [], "parameters": [],
                                 "outputArtifacts": [{"name": "a", "path": "a.txt"}, {"name": "b"}],
                                 "envTemplate": {"K": "v", "E": {}}, "inputFiles": [{}, []]}}),
    ("agentproviders", {"spec": {"outputArtifacts": [{"name": "a"}, {"name": "a", "path": "x"}],  # not keyed
                                 "argsTemplate": [{"when": {}}], "x": [[1, {"a": None}], None]}}),
    ("agentproviders", {"metadata": {"finalizers": [{"a": 1}], "ownerReferences": [{"name": "no uid"}]},
                        "spec": {}}),
    ("agents", {"metadata": {"name": "a"}, "spec": {"providerRef": {"name": "codex"}, "labels": {1: "a", "1": "b"}}}),
    ("agents", {"metadata": {"name": "a"}}),
    ("agents", {}),
    ("rolebindings", {"metadata": {"name": "r"}, "subjects": [{"kind": "User", "name": "a"}],
                      "roleRef": {"kind": "ClusterRole", "name": "view"}}),
]


@pytest.mark.parametrize(("resource", "body"), CREATED_CASES)
def test_a_creates_managed_fields_are_those_of_the_general_update(resource: str, body: dict[str, Any]) -> None:
    kind = REGISTRY.resolve(resource)
    new = {"apiVersion": kind.api_version, "kind": kind.kind, **body}
    lists = ssa.kind_lists(kind)
    for ignore in ((), ("status",), ("subjects",)):
        general = ssa.encode_managed(ssa.update(None, new, [], manager="m", api_version=V, now=T0, ignore=ignore,
                                                lists=lists))
        assert json.dumps(ssa.created(new, manager="m", api_version=V, now=T0, ignore=ignore, lists=lists),
                          sort_keys=False) == json.dumps(general, sort_keys=False)


def test_the_examples_creates_managed_fields_are_those_of_the_general_update() -> None:
    from pathlib import Path

    from joch.admission.documents import load_documents
    from joch.api import errors

    examples = sorted(Path(__file__).resolve().parents[3].joinpath("examples").rglob("*.yaml"))
    assert examples
    seen = 0
    for path in examples:
        try:
            docs = load_documents(path.read_text(), str(path))
        except errors.JochError:  # not a manifest (a config file of an example)
            continue
        for doc in docs:
            try:
                kind = REGISTRY.for_object(str(doc.obj.get("apiVersion")), str(doc.obj.get("kind")))
            except errors.NotFound:
                continue
            lists = ssa.kind_lists(kind)
            general = ssa.encode_managed(ssa.update(None, doc.obj, [], manager="m", api_version=V, now=T0,
                                                    lists=lists))
            assert ssa.created(doc.obj, manager="m", api_version=V, now=T0, lists=lists) == general, path
            seen += 1
    assert seen > 10
