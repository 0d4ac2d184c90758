from __future__ import annotations

import json
from typing import Any

import pytest

from joch.admission.documents import load_documents
from joch.admission.metadata import normalize_metadata
from joch.admission.validation import AdmissionOptions, Admitted, admit, validate_status
from joch.api import errors
from joch.api.kinds import AGENT, AGENT_PROVIDER, AGENT_RUN, ROLE_BINDING, AgentProviderSpec, AgentProviderStatus
from joch.api.namespaces import NAMESPACE
from joch.api.registry import KindInfo
from joch.store.base import ListOptions, ListResult, Obj, Writer


class MemoryReader(Writer):
    """Objects by (kind, namespace, name); writes are not admission's business and fail loudly."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], Obj] = {}

    def add(self, kind: KindInfo, name: str, namespace: str | None = "default", **extra: Any) -> Obj:
        obj = {"apiVersion": kind.api_version, "kind": kind.kind,
               "metadata": {"name": name, "namespace": namespace}, **extra}
        self.objects[(kind.kind, namespace, name)] = obj
        return obj

    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj:
        try:
            return self.objects[(kind.kind, namespace, name)]
        except KeyError:
            raise errors.NotFound(f"{kind.plural} {name!r} not found") from None

    def list(self, kind: KindInfo, options: ListOptions | None = None) -> ListResult:
        namespace = options.namespace if options else None
        items = [o for (k, ns, _), o in self.objects.items() if k == kind.kind and namespace in (None, ns)]
        return ListResult(items=items, resource_version="1")

    def create(self, kind: KindInfo, obj: Obj) -> Obj:
        raise AssertionError("admission must not write")

    update = update_status = create

    def delete(self, kind: KindInfo, namespace: str | None, name: str, *,
               resource_version: str | None = None, uid: str | None = None) -> Obj:
        raise AssertionError("admission must not write")


@pytest.fixture
def reader() -> MemoryReader:
    memory = MemoryReader()
    memory.add(NAMESPACE, "default", namespace=None)  # as every store has it
    return memory


AGENT_YAML = """\
apiVersion: joch.dev/v1alpha1
kind: Agent
metadata:
  name: coder
spec:
  providerRef:
    name: codex
"""

RUN_YAML = """\
apiVersion: runtime.joch.dev/v1alpha1
kind: AgentRun
metadata:
  name: fix-1
spec:
  agentRef:
    name: coder
  implementation:
    inline:
      text: Fix the bug.
"""


def admit_yaml(reader: MemoryReader, text: str, *, old: dict[str, Any] | None = None, **kw: Any) -> Admitted:
    doc = load_documents(text, "test.yaml")[0]
    return admit(reader, doc.obj, old=old, raw=doc.raw, **kw)


def rejected(reader: MemoryReader, text: str, **kw: Any) -> errors.Invalid:
    with pytest.raises(errors.Invalid) as info:
        admit_yaml(reader, text, **kw)
    return info.value


def causes(exc: errors.JochError) -> dict[str, str]:
    return {c.field: c.message for c in exc.causes}


# --- defaulting ----------------------------------------------------------------------------------

def test_defaults_keep_scalars_and_prune_unwritten_empty_collections(reader: MemoryReader) -> None:
    reader.add(AGENT_PROVIDER, "codex")
    admitted = admit_yaml(reader, AGENT_YAML)
    assert admitted.obj["spec"] == {
        "providerRef": {"name": "codex"},
        "runtime": {"type": "local"},
        "defaults": {"timeoutSeconds": 3600, "retryLimit": 0},
        "requiresApproval": False,
    }
    assert admitted.obj["metadata"] == {"name": "coder", "namespace": "default"}
    assert admitted.obj["apiVersion"] == "joch.dev/v1alpha1" and admitted.obj["kind"] == "Agent"
    assert admitted.warnings == []


def test_empty_collections_the_user_wrote_are_kept(reader: MemoryReader) -> None:
    text = AGENT_YAML + "  tools: []\n  security: {}\n  runtime: {config: {}}\n"
    spec = admit_yaml(reader, text).obj["spec"]
    assert spec["tools"] == []
    assert spec["security"] == {}
    assert spec["runtime"] == {"type": "local", "config": {}}


def test_defaulting_is_deterministic(reader: MemoryReader) -> None:
    text = RUN_YAML + "  parameters: {b: '2', a: '1'}\n  input: {x: null, y: [1, {}]}\n"
    reader.add(AGENT, "coder")
    first = admit_yaml(reader, text).obj
    second = admit_yaml(reader, text).obj
    assert json.dumps(first) == json.dumps(second)
    assert first["spec"]["input"] == {"x": None, "y": [1, {}]}


def test_status_in_input_is_dropped_on_create_and_old_status_kept_on_update(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    text = RUN_YAML + "status:\n  phase: Succeeded\n"
    assert admit_yaml(reader, text).obj["status"] == {"phase": "Pending"}  # the initial phase, not the input's
    old = {"metadata": {"name": "fix-1", "namespace": "default", "uid": "u-1", "resourceVersion": "7",
                        "generation": 2, "creationTimestamp": "2024-01-01T00:00:00Z"},
           "spec": {}, "status": {"phase": "Running"}}
    updated = admit_yaml(reader, text, old=old).obj
    assert updated["status"] == {"phase": "Running"}
    assert updated["metadata"]["uid"] == "u-1"
    assert updated["metadata"]["generation"] == 2
    assert "resourceVersion" not in updated["metadata"]


def test_a_new_run_starts_pending_and_kinds_without_an_initial_phase_get_no_status(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    assert admit_yaml(reader, RUN_YAML).obj["status"] == {"phase": "Pending"}
    assert "status" not in admit_yaml(reader, AGENT_YAML).obj


def test_resource_version_and_uid_in_the_input_are_passed_through_as_preconditions(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    text = RUN_YAML.replace("  name: fix-1\n", "  name: fix-1\n  resourceVersion: '42'\n  uid: forged\n")
    metadata = admit_yaml(reader, text).obj["metadata"]
    assert (metadata["resourceVersion"], metadata["uid"]) == ("42", "forged")
    old = {**admit_yaml(reader, RUN_YAML).obj, "metadata": {"name": "fix-1", "uid": "real", "generation": 3}}
    updated = admit_yaml(reader, RUN_YAML, old=old).obj["metadata"]
    assert (updated["uid"], updated["generation"]) == ("real", 3)  # absent: the stored one, no precondition


def test_a_resource_version_that_is_not_a_revision_is_invalid(reader: MemoryReader) -> None:
    text = AGENT_YAML.replace("  name: coder\n", "  name: coder\n  resourceVersion: latest\n")
    assert causes(rejected(reader, text)) == {"metadata.resourceVersion": (
        '"latest" is not a resourceVersion: it must be the decimal revision the server returned (e.g. "42"); '
        "remove it to write without a precondition")}


# --- collecting errors ---------------------------------------------------------------------------

def test_all_errors_are_reported_at_their_paths(reader: MemoryReader) -> None:
    text = """\
apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata:
  name: Bad_Name
spec:
  binary: ""
  argsTemplate: [--flag, "{{ x }}", 3]
  outputArtifacts:
    - name: log
  workload: {imgae: x}
"""
    exc = rejected(reader, text)
    assert exc.message.startswith('AgentProvider.joch.dev "Bad_Name" is invalid: [')
    assert exc.kind == "AgentProvider" and exc.name == "Bad_Name"
    found = causes(exc)
    assert set(found) == {"metadata.name", "spec.binary", "spec.argsTemplate[2]",
                          "spec.outputArtifacts[0].path", "spec.workload.imgae"}
    assert found["spec.binary"] == "must not be empty"
    assert found["spec.outputArtifacts[0].path"] == "required field is missing"
    assert found["spec.workload.imgae"] == 'unknown field "imgae"; did you mean "image"?'
    assert found["spec.argsTemplate[2]"].startswith("expected a string, got number 3")
    assert 'e.g. "bad-name"' in found["metadata.name"]


def test_a_single_problem_reads_like_kubernetes(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML + "  requiresAproval: true\n")
    assert exc.message == ('Agent.joch.dev "coder" is invalid: spec.requiresAproval: unknown field '
                           '"requiresAproval"; did you mean "requiresApproval"?')
    assert [c.field for c in exc.causes] == ["spec.requiresAproval"]


def test_missing_spec(reader: MemoryReader) -> None:
    exc = rejected(reader, "apiVersion: joch.dev/v1alpha1\nkind: Agent\nmetadata: {name: a}\n")
    assert causes(exc) == {"spec": "required field is missing"}


def test_unknown_top_level_field(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML + "specs: {}\n")
    assert causes(exc)["specs"] == 'unknown field "specs"; did you mean "spec"?'


@pytest.mark.parametrize(
    ("field", "hint"),
    [("stringData", "spec.stringData"), ("data", "spec.data"), ("stringdata", "spec.stringData"),
     ("stringDat", "spec.stringData"), ("metdata", "metadata")],
)
def test_a_spec_field_written_at_the_top_level_points_into_spec(reader: MemoryReader, field: str, hint: str) -> None:
    # A Kubernetes Secret has data and stringData at the top level; a Joch Secret under spec.
    exc = rejected(reader, "apiVersion: ops.joch.dev/v1alpha1\nkind: Secret\nmetadata: {name: s}\n"
                           f"{field}: {{token: abc}}\n")
    assert causes(exc)[field] == f'unknown field "{field}"; did you mean "{hint}"?'


def test_a_spec_level_rule_is_reported_at_spec(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    text = RUN_YAML + "  implementationRef: {name: other}\n"
    exc = rejected(reader, text)
    assert causes(exc)["spec"] == "set exactly one of spec.implementationRef or spec.implementation.inline"


def test_union_member_errors_are_folded_into_one(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML + "  resources: {cpu: [1]}\n")
    assert causes(exc) == {"spec.resources.cpu": "expected a string or a number, got a list"}


def test_constraint_messages_say_what_they_got(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML + "  defaults: {timeoutSeconds: 0}\n  runtime: {type: docker}\n")
    found = causes(exc)
    assert found["spec.defaults.timeoutSeconds"] == "must be greater than or equal to 1; got number 0"
    assert found["spec.runtime.type"].startswith("must be one of 'local', 'kubernetes'")
    assert found["spec.runtime.type"].endswith('got "docker"')


def test_quoted_numbers_are_not_coerced(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML + "  defaults: {timeoutSeconds: '60'}\n")
    assert causes(exc)["spec.defaults.timeoutSeconds"] == (
        'expected an integer, got "60"; remove the quotes if you meant an integer')


# --- kinds ---------------------------------------------------------------------------------------

def test_unknown_kind_has_a_hint(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML.replace("kind: Agent", "kind: Agnet"))
    assert "no kind 'Agnet' is registered in 'joch.dev/v1alpha1'" in exc.message
    assert "did you mean kind: Agent?" in exc.message
    assert [c.field for c in exc.causes] == ["kind"]


def test_wrong_api_version_suggests_the_right_one(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML.replace("joch.dev/v1alpha1", "v1"))
    assert "did you mean apiVersion: joch.dev/v1alpha1?" in exc.message


def test_missing_api_version_and_kind(reader: MemoryReader) -> None:
    exc = rejected(reader, "metadata: {name: a}\nspec: {}\n")
    assert causes(exc) == {"apiVersion": "required field is missing", "kind": "required field is missing"}


# --- YAML 1.1 traps ------------------------------------------------------------------------------

@pytest.mark.parametrize(("written", "loaded"), [("on", "true"), ("off", "false"), ("yes", "true"),
                                                 ("no", "false"), ("On", "true"), ("NO", "false")])
def test_yaml_booleans_in_string_fields_are_rejected_with_the_hint(
    reader: MemoryReader, written: str, loaded: str
) -> None:
    reader.add(AGENT, "coder")
    exc = rejected(reader, RUN_YAML + f"  parameters:\n    mode: {written}\n")
    assert causes(exc) == {"spec.parameters.mode": (
        f"expected a string, got boolean {loaded}; YAML 1.1 reads unquoted on/off/yes/no as booleans "
        f'— quote the value ("{written}")')}


@pytest.mark.parametrize(("written", "loaded"), [("on", "true"), ("off", "false")])
def test_yaml_booleans_in_word_fields_are_rejected_with_the_hint(reader: MemoryReader, written: str,
                                                                 loaded: str) -> None:
    exc = rejected(reader, AGENT_YAML + f"  security:\n    network: {{mode: {written}}}\n")
    assert causes(exc) == {"spec.security.network.mode": (
        f"must be one of 'on', 'off' or 'limited'; got boolean {loaded}; YAML 1.1 reads unquoted on/off/yes/no "
        f'as booleans — quote the value ("{written}")')}


def test_quoted_and_non_boolean_words_are_fine(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    admitted = admit_yaml(reader, RUN_YAML + '  parameters:\n    mode: "on"\n    a: y\n    b: n\n')
    assert admitted.obj["spec"]["parameters"] == {"mode": "on", "a": "y", "b": "n"}


def test_a_written_true_is_not_blamed_on_yaml(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    exc = rejected(reader, RUN_YAML + "  parameters:\n    mode: true\n")
    assert causes(exc)["spec.parameters.mode"] == (
        'expected a string, got boolean true; quote the value ("true") if you meant text')


def test_numbers_that_lose_digits(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    exc = rejected(reader, RUN_YAML + "  parameters:\n    version: 1.10\n")
    assert causes(exc) == {"spec.parameters.version": (
        'expected a string, got number 1.1; YAML reads unquoted 1.10 as a number — quote the value ("1.10")')}


def test_booleans_in_lists_and_labels(reader: MemoryReader) -> None:
    text = AGENT_YAML.replace("  name: coder\n", "  name: coder\n  labels:\n    enabled: yes\n")
    exc = rejected(reader, text + "  security:\n    allowedSecrets: [token, off]\n")
    found = causes(exc)
    assert found["metadata.labels.enabled"].endswith('quote the value ("yes")')
    assert found["spec.security.allowedSecrets[1]"].endswith('quote the value ("off")')


def test_a_boolean_key_is_reported_with_its_spelling(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    exc = rejected(reader, RUN_YAML + "  parameters:\n    on: push\n")
    assert causes(exc) == {"spec.parameters.on": (
        "the key on was read as boolean true, not a string; YAML 1.1 reads unquoted on/off/yes/no as "
        'booleans — quote the key ("on")')}


def test_a_boolean_key_in_an_open_map_is_still_rejected(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML + "  runtime:\n    config:\n      yes: 1\n")
    assert list(causes(exc)) == ["spec.runtime.config.yes"]


def test_a_numeric_key(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML + "  runtime:\n    config:\n      1.10: x\n")
    assert causes(exc)["spec.runtime.config[1.10]"].endswith('quote the key ("1.10")')


def test_unquoted_dates_are_named(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    exc = rejected(reader, RUN_YAML + "  input:\n    since: 2024-01-31\n")
    assert causes(exc) == {"spec.input.since": (
        'got the timestamp 2024-01-31; YAML reads unquoted dates and times as timestamps — quote the value '
        '("2024-01-31")')}


def test_json_input_gets_the_hint_without_a_spelling(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    obj = load_documents(RUN_YAML, "t.yaml")[0].obj
    obj["spec"]["parameters"] = {"mode": True}
    with pytest.raises(errors.Invalid) as info:
        admit(reader, obj, old=None)
    assert causes(info.value)["spec.parameters.mode"] == (
        "expected a string, got boolean true; YAML 1.1 reads unquoted on/off/yes/no as booleans — quote the value")


# --- metadata ------------------------------------------------------------------------------------

def test_name_is_required_unless_generate_name(reader: MemoryReader) -> None:
    reader.add(AGENT_PROVIDER, "codex")
    exc = rejected(reader, AGENT_YAML.replace("  name: coder\n", "  labels: {a: b}\n"))
    assert list(causes(exc)) == ["metadata.name"]
    admitted = admit_yaml(reader, AGENT_YAML.replace("  name: coder\n", "  generateName: coder-\n"))
    assert admitted.obj["metadata"] == {"generateName": "coder-", "namespace": "default"}


@pytest.mark.parametrize("name", ["Coder", "coder_1", "-coder", "coder.", "a" * 254, "co der"])
def test_invalid_names(reader: MemoryReader, name: str) -> None:
    exc = rejected(reader, AGENT_YAML.replace("name: coder", f"name: '{name}'"))
    assert "is not a valid name" in causes(exc)["metadata.name"]


@pytest.mark.parametrize("name", ["coder", "a", "coder-1.example", "a" * 253])
def test_valid_names(reader: MemoryReader, name: str) -> None:
    assert admit_yaml(reader, AGENT_YAML.replace("name: coder", f"name: '{name}'")).name == name


def test_metadata_fields_and_label_syntax(reader: MemoryReader) -> None:
    text = AGENT_YAML.replace("  name: coder\n", """\
  name: coder
  namespace: Team_A
  color: blue
  labels:
    app.kubernetes.io/name: ok
    bad key: x
    good: "not valid!"
  annotations:
    example.com/note: any text at all, even spaces
  finalizers: [joch.dev/cleanup]
""")
    found = causes(rejected(reader, text))
    assert set(found) == {"metadata.namespace", "metadata.color", "metadata.labels[bad key]",
                          "metadata.labels.good"}
    assert found["metadata.color"] == 'unknown field "color"'


def test_annotations_total_size_is_limited(reader: MemoryReader) -> None:
    text = AGENT_YAML.replace("  name: coder\n", f"  name: coder\n  annotations: {{a: '{'x' * 262_144}'}}\n")
    assert "the limit is 262144 bytes" in causes(rejected(reader, text))["metadata.annotations"]


def test_cluster_scoped_kinds_refuse_a_namespace() -> None:
    cluster = KindInfo(group="test.joch.dev", version="v1", kind="Thing", plural="things",
                       spec_model=AgentProviderSpec, status_model=AgentProviderStatus, namespaced=False)
    metadata, found = normalize_metadata(cluster, {"name": "t", "namespace": "default"}, raw=_no_raw())
    assert [c.field for c in found] == ["metadata.namespace"]
    assert "cluster-scoped" in found[0].message
    metadata, found = normalize_metadata(cluster, {"name": "t", "namespace": ""}, raw=_no_raw())
    assert found == [] and metadata == {"name": "t"}


@pytest.mark.parametrize("name", ["a.b", "a" * 64])
def test_a_namespace_name_is_a_dns_label_like_the_namespaces_objects_name(name: str) -> None:
    # A Namespace "a.b" (or of 64 characters) was created, yet no object could name it in
    # metadata.namespace, and its kubernetes.io/metadata.name label value was invalid.
    _, found = normalize_metadata(NAMESPACE, {"name": name}, raw=_no_raw())
    assert [c.field for c in found] == ["metadata.name"]
    assert "is not a valid Namespace name" in found[0].message
    _, found = normalize_metadata(NAMESPACE, {"name": "a" * 63}, raw=_no_raw())
    assert found == []


def test_a_core_kind_is_named_without_a_trailing_dot(reader: MemoryReader) -> None:
    exc = rejected(reader, "apiVersion: v1\nkind: Namespace\nmetadata: {name: a.b}\n")
    assert str(exc).startswith('Namespace "a.b" is invalid: metadata.name:'), str(exc)


def _no_raw() -> Any:
    from joch.admission.documents import RawScalars

    return RawScalars()


# --- size limits ---------------------------------------------------------------------------------

def test_implementation_text_is_limited_in_utf8_bytes(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    limit = 256 * 1024
    at_limit = "é" * (limit // 2)  # two bytes each
    admit_yaml(reader, RUN_YAML.replace("text: Fix the bug.", f"text: {at_limit}"))
    exc = rejected(reader, RUN_YAML.replace("text: Fix the bug.", f"text: {at_limit}x"))
    assert causes(exc) == {"spec.implementation.inline.text": (
        f"is {limit + 1} bytes of UTF-8; the limit is {limit} bytes (256 KiB) — keep long material in the "
        "repository and point to it")}


def test_implementation_spec_text_limit_follows_the_options(reader: MemoryReader) -> None:
    text = ("apiVersion: joch.dev/v1alpha1\nkind: ImplementationSpec\nmetadata: {name: i}\n"
            "spec:\n  text: '0123456789'\n")
    admit_yaml(reader, text, options=AdmissionOptions(max_implementation_text_bytes=10))
    exc = rejected(reader, text, options=AdmissionOptions(max_implementation_text_bytes=9))
    assert "the limit is 9 bytes" in causes(exc)["spec.text"]


def test_whole_object_size_is_limited(reader: MemoryReader) -> None:
    text = AGENT_YAML + f"  systemPrompt: '{'x' * 2000}'\n"
    exc = rejected(reader, text, options=AdmissionOptions(max_object_bytes=1000))
    (cause,) = exc.causes
    assert cause.reason == "RequestEntityTooLarge"
    assert cause.message.startswith("the object is ") and "the limit is 1000 bytes" in cause.message


# --- references ----------------------------------------------------------------------------------

def test_missing_reject_reference_names_the_path(reader: MemoryReader) -> None:
    exc = rejected(reader, RUN_YAML)
    assert causes(exc) == {"spec.agentRef.name": (
        'agent "coder" not found in namespace "default"; create it first or fix spec.agentRef.name')}


def test_reference_targets_live_in_the_same_namespace(reader: MemoryReader) -> None:
    reader.add(NAMESPACE, "other", namespace=None)
    reader.add(AGENT, "coder", namespace="other")
    exc = rejected(reader, RUN_YAML)
    assert list(causes(exc)) == ["spec.agentRef.name"]
    text = RUN_YAML.replace("  name: fix-1\n", "  name: fix-1\n  namespace: other\n")
    assert admit_yaml(reader, text).namespace == "other"


def test_creating_in_a_namespace_that_does_not_exist_is_a_404_naming_it(reader: MemoryReader) -> None:
    text = AGENT_YAML.replace("  name: coder\n", "  name: coder\n  namespace: nowhere\n")
    with pytest.raises(errors.NotFound) as caught:
        admit_yaml(reader, text)
    assert caught.value.message.startswith('namespaces "nowhere" not found: create it first')
    assert admit_yaml(reader, text, pending={("Namespace", None, "nowhere")}).namespace == "nowhere"
    old = {**admit_yaml(reader, AGENT_YAML).obj}
    old["metadata"] = {**old["metadata"], "namespace": "nowhere"}
    assert admit_yaml(reader, text, old=old).namespace == "nowhere"  # only creates are checked


def test_creating_in_a_terminating_namespace_is_forbidden(reader: MemoryReader) -> None:
    reader.add(NAMESPACE, "leaving", namespace=None, status={"phase": "Terminating"})
    text = AGENT_YAML.replace("  name: coder\n", "  name: coder\n  namespace: leaving\n")
    with pytest.raises(errors.Forbidden) as caught:
        admit_yaml(reader, text)
    assert "unable to create new content in namespace leaving because it is being terminated" in caught.value.message
    # An apply batch that also holds the (Terminating) Namespace is no way around it: the objects
    # would be admitted, then deleted by the namespace controller finishing the deletion.
    with pytest.raises(errors.Forbidden):
        admit_yaml(reader, text, pending={("Namespace", None, "leaving")})


def test_pending_objects_satisfy_references(reader: MemoryReader) -> None:
    admitted = admit_yaml(reader, RUN_YAML, pending={("Agent", "default", "coder")})
    assert admitted.obj["spec"]["agentRef"] == {"name": "coder"}


def test_missing_warn_reference_is_accepted_with_a_warning_and_no_status(reader: MemoryReader) -> None:
    admitted = admit_yaml(reader, AGENT_YAML)
    assert admitted.warnings == [
        'spec.providerRef.name: agentprovider "codex" not found in namespace "default"; Agent is accepted '
        "but cannot be used until the agentprovider exists"]


def test_a_missing_model_route_warns_of_what_it_costs_not_that_the_agent_is_unusable(reader: MemoryReader) -> None:
    reader.add(AGENT_PROVIDER, "codex")
    admitted = admit_yaml(reader, AGENT_YAML + "  modelRoute: gpt-9\n")
    assert admitted.warnings == [
        'spec.modelRoute: model "gpt-9" not found in namespace "default"; Agent is accepted but usage its runs '
        "report without a model of their own is not recorded until the model exists"]
    assert "status" not in admitted.obj  # ReferencesResolved is the Agent controller's


def test_the_stored_status_is_kept_as_it_is_on_update(reader: MemoryReader) -> None:
    old = {**admit_yaml(reader, AGENT_YAML).obj}
    written_by_the_controller = {"observedGeneration": 1, "conditions": [
        {"type": "ReferencesResolved", "status": "False", "reason": "ProviderNotFound", "message": "gone",
         "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
    old["status"] = written_by_the_controller
    reader.add(AGENT_PROVIDER, "codex")
    admitted = admit_yaml(reader, AGENT_YAML, old=old)
    assert admitted.warnings == []
    assert admitted.obj["status"] == written_by_the_controller
    assert admitted.obj["status"] is not written_by_the_controller


def test_unchanged_reject_references_are_not_rechecked_on_update(reader: MemoryReader) -> None:
    reader.add(AGENT, "coder")
    old = admit_yaml(reader, RUN_YAML).obj
    reader.objects.clear()
    admit_yaml(reader, RUN_YAML, old=old)  # the agent is gone, but the run did not change it
    exc = rejected(reader, RUN_YAML.replace("name: coder", "name: other"), old=old)
    assert list(causes(exc)) == ["spec.agentRef.name"]


# --- status subresource --------------------------------------------------------------------------

def test_validate_status_normalizes() -> None:
    obj = {"metadata": {"name": "fix-1"}, "status": {"phase": "Running", "attempt": 1}}
    assert validate_status(AGENT_RUN, obj) == {"phase": "Running", "attempt": 1}
    assert validate_status(AGENT_RUN, {"metadata": {"name": "x"}}) == {}


def test_validate_status_reports_paths() -> None:
    obj = {"metadata": {"name": "fix-1"},
           "status": {"phase": "Done", "conditions": [{"type": "Ready", "status": True}], "extra": 1}}
    with pytest.raises(errors.Invalid) as info:
        validate_status(AGENT_RUN, obj)
    assert info.value.message.startswith('AgentRun.runtime.joch.dev "fix-1" is invalid')
    assert set(causes(info.value)) == {"status.phase", "status.conditions[0].status", "status.extra"}


def test_a_scalar_where_a_mapping_belongs(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML.replace("  providerRef:\n    name: codex\n", "  providerRef: codex\n"))
    assert causes(exc) == {"spec.providerRef": 'expected a mapping, got "codex"'}


# --- review fixes: paths, suggestions, apiVersion, Secrets, Policies ------------------------------

def _fields(exc: errors.JochError) -> list[tuple[str, str]]:
    return [(c.field, c.message) for c in exc.causes]


def test_a_value_under_a_boolean_key_is_reported_at_the_key_as_written(reader: MemoryReader) -> None:
    text = AGENT_YAML.replace("  name: coder\n", "  name: coder\n  annotations: {yes: 2}\n")
    found = _fields(rejected(reader, text))
    assert [field for field, _ in found] == ["metadata.annotations.yes", "metadata.annotations.yes"]
    assert found[0][1].startswith("the key yes was read as boolean true")
    assert found[1][1] == 'expected a string, got number 2; YAML reads unquoted 2 as a number — quote the value ("2")'


@pytest.mark.parametrize(("name", "suggestion"), [
    ("a..b", "a.b"), ("ünïcode", "unicode"), ("My App.v2", "my-app.v2"), ("-x-", "x"), ("a.-b", "a.b"),
])
def test_name_suggestions_are_valid_names(reader: MemoryReader, name: str, suggestion: str) -> None:
    message = causes(rejected(reader, AGENT_YAML.replace("name: coder", f"name: '{name}'")))["metadata.name"]
    assert message.endswith(f'(e.g. "{suggestion}")')


def test_no_suggestion_when_none_is_valid(reader: MemoryReader) -> None:
    message = causes(rejected(reader, AGENT_YAML.replace("name: coder", "name: '日本'")))["metadata.name"]
    assert "e.g." not in message and message.endswith("at most 253 characters")


def test_namespace_problems_suggest_a_label(reader: MemoryReader) -> None:
    text = AGENT_YAML.replace("  name: coder\n", "  name: coder\n  namespace: Team.A\n")
    assert causes(rejected(reader, text))["metadata.namespace"].endswith('(e.g. "team-a")')


def test_an_unknown_api_version_of_a_known_kind_is_reported_at_api_version(reader: MemoryReader) -> None:
    exc = rejected(reader, AGENT_YAML.replace("joch.dev/v1alpha1", "joch.dev/v2"))
    assert [c.field for c in exc.causes] == ["apiVersion"]
    assert "did you mean apiVersion: joch.dev/v1alpha1?" in exc.causes[0].message


SECRET_YAML = """\
apiVersion: ops.joch.dev/v1alpha1
kind: Secret
metadata:
  name: token
spec:
"""


def test_secret_data_must_be_base64(reader: MemoryReader) -> None:
    exc = rejected(reader, SECRET_YAML + "  data:\n    ok: aGVsbG8=\n    token: hello world\n    tls.crt: abc\n")
    found = causes(exc)
    assert set(found) == {"spec.data.token", "spec.data[tls.crt]"}
    assert found["spec.data.token"].startswith('must be base64-encoded (e.g. "aGVsbG8=" for "hello"), got 11 '
                                               'characters that are not; put plain text under spec.stringData')
    assert "hello world" not in str(exc.to_status())  # a value is never echoed back


def test_secret_string_data_is_encoded_into_data_and_not_kept(reader: MemoryReader) -> None:
    text = (SECRET_YAML + "  data:\n    a: b2xk\n    b: YmJi\n"
            "  stringData:\n    a: new\n    c: |\n      two\n      lines\n")
    spec = admit_yaml(reader, text).obj["spec"]
    assert spec == {"type": "Opaque", "data": {"a": "bmV3", "b": "YmJi", "c": "dHdvCmxpbmVzCg=="}}
    wrapped = SECRET_YAML + "  data:\n    key: |\n      aGVs\n      bG8=\n"
    assert admit_yaml(reader, wrapped).obj["spec"]["data"] == {"key": "aGVs\nbG8=\n"}


POLICY_YAML = """\
apiVersion: joch.dev/v1alpha1
kind: Policy
metadata:
  name: guard
spec:
  selector:
    kinds: [Agent, agentruns, ar, Agnet, Gizmo]
  rules:
  - {name: budget, expression: "true"}
  - {name: approval, expression: "true"}
  - {name: budget, expression: "false"}
"""


def test_policy_rule_names_are_unique_and_selector_kinds_known(reader: MemoryReader) -> None:
    found = causes(rejected(reader, POLICY_YAML))
    assert set(found) == {"spec.rules[2].name", "spec.selector.kinds[3]", "spec.selector.kinds[4]"}
    assert found["spec.rules[2].name"].startswith('duplicate rule name "budget" (spec.rules[0] has it already)')
    assert found["spec.selector.kinds[3]"].startswith('unknown kind "Agnet": did you mean "Agent"? the known '
                                                      "kinds are Agent, AgentProvider, AgentRun, Approval,")
    assert 'unknown kind "Gizmo": the known kinds are' in found["spec.selector.kinds[4]"]
    fixed = POLICY_YAML.replace(", Agnet, Gizmo", "").replace("name: budget, expression: \"false\"",
                                                              "name: other, expression: \"false\"")
    assert admit_yaml(reader, fixed).obj["spec"]["selector"]["kinds"] == ["Agent", "agentruns", "ar"]


@pytest.mark.parametrize(("name", "message"), [
    ("../../tmp/escaped", "invalid artifact name"),
    ("changes.patch", "workspace diff"),
])
def test_provider_output_names_are_plain_and_not_the_patch(name: str, message: str) -> None:
    doc = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
           "spec": {"binary": "x", "outputArtifacts": [{"name": name, "path": "a.md"}]}}
    with pytest.raises(errors.Invalid) as caught:
        admit(MemoryReader(), doc, old=None)
    assert caught.value.causes[0].field == "spec.outputArtifacts[0].name"
    assert message in caught.value.causes[0].message


def test_provider_output_names_are_unique() -> None:
    doc = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
           "spec": {"binary": "x", "outputArtifacts": [{"name": "s", "path": "a.md"}, {"name": "s", "path": "b"}]}}
    with pytest.raises(errors.Invalid) as caught:
        admit(MemoryReader(), doc, old=None)
    assert caught.value.causes[0].field == "spec.outputArtifacts[1].name"


@pytest.mark.parametrize("url", [".", "../..", "repo", "~/src/repo", "./a:b"])
def test_a_relative_repository_path_is_refused_naming_the_way_out(reader: MemoryReader, url: str) -> None:
    # The server's working directory is not the user's: only the client that read the file can resolve it.
    reader.add(AGENT, "coder")
    exc = rejected(reader, RUN_YAML + f"  execution: {{coordinates: {{git: {{url: '{url}'}}}}}}\n")
    message = causes(exc)["spec.execution.coordinates.git.url"]
    assert message.startswith(f'"{url}" is a relative path, which the server cannot resolve')
    assert "give an absolute path or a URL" in message and "joch apply -f resolves" in message


@pytest.mark.parametrize("url", ["/srv/repo", "file:///srv/r.git", "https://h/o/r.git", "git@h:o/r.git", "h:o/r"])
def test_absolute_paths_and_urls_are_accepted(reader: MemoryReader, url: str) -> None:
    reader.add(AGENT, "coder")
    obj = admit_yaml(reader, RUN_YAML + f"  execution: {{coordinates: {{git: {{url: '{url}'}}}}}}\n").obj
    assert obj["spec"]["execution"]["coordinates"]["git"]["url"] == url


def _causes(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(errors.Invalid) as caught:
        admit(MemoryReader(), doc, old=None)
    return {c.field: c.message for c in caught.value.causes}


@pytest.mark.parametrize("path", ["../escape.md", "/etc/passwd", "a/../../b", "..", "."])
def test_provider_input_and_output_paths_stay_inside_their_directories(path: str) -> None:
    doc = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
           "spec": {"binary": "x", "outputArtifacts": [{"name": "out", "path": path}],
                    "inputFiles": [{"path": "ok/task.md", "content": "c"}, {"path": path, "content": "c"}]}}
    found = _causes(doc)
    assert set(found) == {"spec.inputFiles[1].path", "spec.outputArtifacts[0].path"}
    assert found["spec.inputFiles[1].path"] == (f'path "{path}" must be relative to the inputs directory and stay '
                                                'inside it (no leading "/", no ".." that leaves it)')


def test_environment_variable_names_cannot_hold_an_equals_sign() -> None:
    provider = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
                "spec": {"binary": "x", "envTemplate": {"A=B": "1", "GOOD": "2"},
                         "secretEnv": [{"name": "T=1", "secretRef": {"name": "s", "key": "k"}}]}}
    found = _causes(provider)
    assert set(found) == {"spec.envTemplate[A=B]", "spec.secretEnv[0].name"}
    assert found["spec.secretEnv[0].name"].startswith('invalid environment variable name "T=1": use printable ASCII')
    agent = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
             "spec": {"providerRef": {"name": "p"}, "env": [{"name": "X=Y", "value": "v"}]}}
    assert set(_causes(agent)) == {"spec.env[0].name"}


def test_secret_keys_follow_the_kubernetes_rule() -> None:
    doc = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "s"},
           "spec": {"data": {"bad key": "eA==", "tls.crt": "eA=="}, "stringData": {"A=B": "x", "JOCH_X": "y"}}}
    found = _causes(doc)
    assert set(found) == {"spec.data[bad key]", "spec.stringData[A=B]"}
    assert found["spec.stringData[A=B]"] == ('invalid key "A=B": a Secret key must consist of letters, digits, "-", '
                                             '"_" or "." (at most 253 characters)')


@pytest.mark.parametrize(("url", "message"), [
    ("ext::sh -c touch% /tmp/x", 'repository URL "ext::sh -c touch% /tmp/x" names a git transport helper'),
    ("-uhelp", 'repository URL "-uhelp" cannot start with "-"'),
])
def test_repository_urls_git_must_not_be_given_are_rejected(reader: MemoryReader, url: str, message: str) -> None:
    reader.add(AGENT, "a", spec={"providerRef": {"name": "p"}})
    doc = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r"},
           "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "t"}},
                    "execution": {"coordinates": {"git": {"url": url}}}}}
    with pytest.raises(errors.Invalid) as caught:
        admit(reader, doc, old=None)
    assert [c.field for c in caught.value.causes] == ["spec.execution.coordinates.git.url"]
    assert caught.value.causes[0].message.startswith(message)
    doc["spec"]["execution"]["coordinates"]["git"]["url"] = "github.invalid:org/repo.git"  # scp-style: fine
    admit(reader, doc, old=None)


def test_a_secret_value_of_the_wrong_type_is_not_quoted_back(reader: MemoryReader) -> None:
    exc = rejected(reader, SECRET_YAML + "  stringData:\n    pin: 98765432\n    flag: yes\n")
    found = causes(exc)
    assert set(found) == {"spec.stringData.pin", "spec.stringData.flag"}
    assert found["spec.stringData.pin"].startswith("must be a string: quote the value in YAML")
    shown = json.dumps(exc.to_status())
    assert "98765432" not in shown and '"yes"' not in shown and "98765432" not in exc.message


# --- kinds whose fields are top-level keys (KindInfo.body == "top") ------------------------------

ROLE_BINDING_YAML = """\
apiVersion: ops.joch.dev/v1alpha1
kind: RoleBinding
metadata: {name: alice-edits, namespace: default}
roleRef: {apiGroup: ops.joch.dev, kind: Role, name: editor}
subjects:
- {kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}
- {kind: Group, name: devs}
"""


def test_a_role_binding_is_admitted_with_its_fields_at_the_top_level(reader: MemoryReader) -> None:
    obj = admit_yaml(reader, ROLE_BINDING_YAML).obj
    assert set(obj) == {"apiVersion", "kind", "metadata", "roleRef", "subjects"}
    assert obj["roleRef"] == {"apiGroup": "ops.joch.dev", "kind": "Role", "name": "editor"}
    assert obj["subjects"][1] == {"kind": "Group", "name": "devs"}
    old = {**obj, "metadata": {**obj["metadata"], "uid": "u", "generation": 1}, "status": {"x": 1}}
    assert "status" not in admit_yaml(reader, ROLE_BINDING_YAML, old=old).obj  # it has none to keep


def test_a_role_binding_reports_causes_at_top_level_paths(reader: MemoryReader) -> None:
    found = causes(rejected(reader, ROLE_BINDING_YAML.replace("name: editor", "name: owner")))
    assert list(found) == ["roleRef.name"]
    assert all(role in found["roleRef.name"] for role in ("viewer", "editor", "approver", "admin"))
    twice = ROLE_BINDING_YAML.replace("{kind: Group, name: devs}", "{kind: User, name: alice}")
    assert causes(rejected(reader, twice)) == {"subjects[1]": 'User "alice" is listed twice'}
    missing = causes(rejected(reader, ROLE_BINDING_YAML.split("roleRef:")[0]))
    assert list(missing) == ["roleRef"]


def test_a_role_binding_refuses_spec_status_and_unknown_keys_naming_the_fix(reader: MemoryReader) -> None:
    nested = ROLE_BINDING_YAML.replace("roleRef:", "spec:\n  roleRef:").replace("subjects:\n- ", "  subjects:\n  - ")
    nested = nested.replace("\n- {kind: Group", "\n  - {kind: Group")
    found = causes(rejected(reader, nested))
    assert found == {"spec": 'unknown field "spec"; a RoleBinding has no spec: write roleRef, subjects at the '
                             "top level of the object, as in Kubernetes (move them out of spec)"}  # only that
    found = causes(rejected(reader, ROLE_BINDING_YAML + "roleref: {name: admin}\nstatus: {}\nmetdata: {}\n"))
    assert found["roleref"] == 'unknown field "roleref"; did you mean "roleRef"?'
    assert found["metdata"] == 'unknown field "metdata"; did you mean "metadata"?'
    assert found["status"] == 'unknown field "status"; a RoleBinding has no status'
    with pytest.raises(errors.Invalid, match="has no status"):
        validate_status(ROLE_BINDING, {"metadata": {"name": "x"}, "status": {}})


# --- the scan's quick path (diagnostics._plain) --------------------------------------------------

class _Text(str):
    """A ``str`` subclass, as some YAML loaders produce: the quick path leaves it to the full scan."""


@pytest.mark.parametrize(("value", "field"), [
    ({"deep": [1, {"x": "a\x00b"}]}, "spec.input.deep[1].x"),
    ({"deep": [1.5, float("nan")]}, "spec.input.deep[1]"),
    ({"deep": {"k\x00": "v"}}, "spec.input.deep"),
    ({"deep": [{"when": __import__("datetime").date(2024, 1, 31)}]}, "spec.input.deep[0].when"),
    ({"deep": {"s": {1, 2}}}, "spec.input.deep.s"),
    ({"deep": {"t": _Text("a\x00")}}, "spec.input.deep.t"),
])
def test_a_problem_deep_in_plain_json_is_still_found(reader: MemoryReader, value: Any, field: str) -> None:
    reader.add(AGENT, "coder")
    obj = load_documents(RUN_YAML, "t.yaml")[0].obj
    obj["spec"]["input"] = value
    with pytest.raises(errors.Invalid) as info:
        admit(reader, obj, old=None)
    assert any(c.field.startswith(field) for c in info.value.causes), info.value.causes


def test_metadata_is_copied_not_shared(reader: MemoryReader) -> None:
    reader.add(AGENT_PROVIDER, "codex")
    obj = load_documents(AGENT_YAML, "t.yaml")[0].obj
    obj["metadata"]["labels"] = {"a": "b"}
    obj["metadata"]["finalizers"] = ["example.com/x"]
    admitted = admit(reader, obj, old=None).obj["metadata"]
    obj["metadata"]["labels"]["a"] = "changed"
    obj["metadata"]["finalizers"].append("example.com/y")
    assert admitted["labels"] == {"a": "b"} and admitted["finalizers"] == ["example.com/x"]
