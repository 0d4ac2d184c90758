"""Atomic apply through admission, against the real store (SQLite and Postgres, see conftest)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from joch.admission.apply import (
    ApplyResult,
    apply_documents,
    create_documents,
    create_object,
    patch_object,
    update_object,
    update_status,
)
from joch.admission.documents import load_documents
from joch.admission.validation import AdmissionOptions
from joch.api import errors
from joch.api.kinds import AGENT, AGENT_PROVIDER, AGENT_RUN, IMPLEMENTATION_SPEC, SECRET
from joch.api.registry import KindInfo
from joch.store import Store

PROVIDER = """\
apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata:
  name: codex
spec:
  binary: codex
  argsTemplate: [exec, "{{ implementation.text }}"]
"""

AGENT_DOC = """\
apiVersion: joch.dev/v1alpha1
kind: Agent
metadata:
  name: coder
  labels:
    team: core
spec:
  providerRef:
    name: codex
"""

IMPL = """\
apiVersion: joch.dev/v1alpha1
kind: ImplementationSpec
metadata:
  name: readme
spec:
  text: Add a greeting to the README.
"""

RUN = """\
apiVersion: runtime.joch.dev/v1alpha1
kind: AgentRun
metadata:
  name: fix-1
spec:
  agentRef:
    name: coder
  implementationRef:
    name: readme
"""

QUICKSTART = "---\n".join([PROVIDER, AGENT_DOC, IMPL])


def apply(store: Store, text: str, source: str = "quickstart.yaml", **kw: Any) -> ApplyResult:
    return apply_documents(store, load_documents(text, source), **kw)


def rejected(store: Store, text: str, source: str = "quickstart.yaml", **kw: Any) -> errors.Invalid:
    before = store.current_revision()
    with pytest.raises(errors.Invalid) as info:
        apply(store, text, source, **kw)
    assert store.current_revision() == before, "a rejected apply must write nothing"
    return info.value


def exists(store: Store, kind: KindInfo, name: str) -> bool:
    try:
        store.get(kind, "default", name)
    except errors.NotFound:
        return False
    return True


def test_apply_creates_then_reports_unchanged_without_writing(store: Store) -> None:
    first = apply(store, QUICKSTART)
    assert list(first.lines()) == ["agentprovider.joch.dev/codex created", "agent.joch.dev/coder created",
                                   "implementationspec.joch.dev/readme created"]
    versions = {i.name: i.object["metadata"]["resourceVersion"] for i in first.items}
    revision = store.current_revision()

    again = apply(store, QUICKSTART)
    assert [i.action for i in again.items] == ["unchanged"] * 3
    assert {i.name: i.object["metadata"]["resourceVersion"] for i in again.items} == versions
    assert store.current_revision() == revision
    for kind, name in ((AGENT_PROVIDER, "codex"), (AGENT, "coder"), (IMPLEMENTATION_SPEC, "readme")):
        assert store.get(kind, "default", name)["metadata"]["resourceVersion"] == versions[name]


def test_stored_objects_are_defaulted_and_readable(store: Store) -> None:
    apply(store, QUICKSTART)
    agent = store.get(AGENT, "default", "coder")
    assert agent["spec"] == {"providerRef": {"name": "codex"}, "runtime": {"type": "local"},
                             "defaults": {"timeoutSeconds": 3600, "retryLimit": 0},
                             "requiresApproval": False}
    assert agent["metadata"]["labels"] == {"team": "core"}
    assert agent["metadata"]["uid"] and agent["metadata"]["creationTimestamp"]


def test_one_invalid_document_rejects_the_whole_file(store: Store) -> None:
    bad_agent = AGENT_DOC.replace("coder", "helper").replace("  providerRef:\n    name: codex\n",
                                                             "  providerref:\n    name: codex\n")
    text = "---\n".join([PROVIDER, IMPL, RUN.replace("name: coder", "name: helper"), bad_agent])
    exc = rejected(store, text)
    assert exc.message == "1 of 4 documents is invalid; nothing was applied"
    label = "documents[3] (Agent/helper in quickstart.yaml:26)"
    assert {c.field: c.message for c in exc.causes} == {
        f"{label}.spec.providerRef": "required field is missing",
        f"{label}.spec.providerref": 'unknown field "providerref"; did you mean "providerRef"?',
    }
    (detail,) = exc.extra["documents"]
    assert (detail["index"], detail["kind"], detail["name"], detail["source"], detail["line"]) == (
        3, "Agent", "helper", "quickstart.yaml", 26)
    assert detail["message"].startswith('Agent.joch.dev "helper" is invalid')
    assert exc.to_status()["details"]["documents"] == exc.extra["documents"]
    for kind, name in ((AGENT_PROVIDER, "codex"), (IMPLEMENTATION_SPEC, "readme"), (AGENT_RUN, "fix-1"),
                       (AGENT, "helper")):
        assert not exists(store, kind, name)


def test_every_invalid_document_is_reported(store: Store) -> None:
    text = "---\n".join([PROVIDER.replace("binary: codex", "binary: ''"), AGENT_DOC,
                         IMPL.replace("name: readme", "name: Readme")])
    exc = rejected(store, text, "team.yaml")
    assert exc.message == "2 of 3 documents are invalid; nothing was applied"
    assert [c.field for c in exc.causes] == [
        "documents[0] (AgentProvider/codex in team.yaml:1).spec.binary",
        "documents[2] (ImplementationSpec/Readme in team.yaml:19).metadata.name",
    ]


def test_agent_with_missing_provider_is_accepted_with_a_warning(store: Store) -> None:
    result = apply(store, AGENT_DOC)
    (item,) = result.items
    assert item.action == "created"
    assert item.warnings == [
        'spec.providerRef.name: agentprovider "codex" not found in namespace "default"; Agent is accepted '
        "but cannot be used until the agentprovider exists"]
    assert result.warnings() == [f"agent.joch.dev/coder: {item.warnings[0]}"]
    # status (ReferencesResolved included) is the Agent controller's: admission writes none
    assert not store.get(AGENT, "default", "coder").get("status")

    later = apply(store, PROVIDER + "---\n" + AGENT_DOC)
    assert [i.action for i in later.items] == ["created", "unchanged"]
    assert later.items[1].warnings == []
    assert [i.action for i in apply(store, PROVIDER + "---\n" + AGENT_DOC).items] == ["unchanged"] * 2


def test_run_with_missing_agent_is_rejected(store: Store) -> None:
    exc = rejected(store, IMPL + "---\n" + RUN, "run.yaml")
    assert exc.message == "1 of 2 documents is invalid; nothing was applied"
    (cause,) = exc.causes
    assert cause.field == "documents[1] (AgentRun/fix-1 in run.yaml:8).spec.agentRef.name"
    assert cause.message == ('agent "coder" not found in namespace "default"; create it first or fix '
                             "spec.agentRef.name")
    assert not exists(store, IMPLEMENTATION_SPEC, "readme")


def test_references_resolve_within_the_batch_in_any_order(store: Store) -> None:
    result = apply(store, "---\n".join([RUN, AGENT_DOC, IMPL, PROVIDER]))
    assert [i.action for i in result.items] == ["created"] * 4
    assert result.items[1].warnings == []


@pytest.mark.parametrize("word", ["on", "no", "yes"])
def test_yaml_booleans_in_string_fields_are_rejected(store: Store, word: str) -> None:
    text = PROVIDER.replace('argsTemplate: [exec, "{{ implementation.text }}"]', f"argsTemplate: [exec, {word}]")
    exc = rejected(store, text)
    (cause,) = exc.causes
    assert cause.field == "documents[0] (AgentProvider/codex in quickstart.yaml:1).spec.argsTemplate[1]"
    assert "YAML 1.1 reads unquoted on/off/yes/no as booleans" in cause.message
    assert cause.message.endswith(f'quote the value ("{word}")')


def test_implementation_text_over_256_kib_is_rejected(store: Store) -> None:
    big = "x" * (256 * 1024 + 1)
    exc = rejected(store, IMPL.replace("Add a greeting to the README.", big))
    (cause,) = exc.causes
    assert cause.field.endswith(".spec.text")
    assert f"is {256 * 1024 + 1} bytes" in cause.message and "the limit is 262144 bytes" in cause.message
    assert [i.action for i in apply(store, IMPL.replace("Add a greeting to the README.", big[:-1])).items] == [
        "created"]


def test_object_size_limit_comes_from_the_options(store: Store) -> None:
    exc = rejected(store, AGENT_DOC, options=AdmissionOptions(max_object_bytes=100))
    assert "the limit is 100 bytes" in exc.causes[0].message


def test_dry_run_writes_nothing(store: Store) -> None:
    before = store.current_revision()
    result = apply(store, QUICKSTART, dry_run=True)
    assert list(result.lines()) == [
        "agentprovider.joch.dev/codex created (server dry run)", "agent.joch.dev/coder created (server dry run)",
        "implementationspec.joch.dev/readme created (server dry run)"]
    assert store.current_revision() == before
    assert not exists(store, AGENT, "coder")

    apply(store, QUICKSTART)
    before = store.current_revision()
    changed = apply(store, AGENT_DOC.replace("team: core", "team: platform"), dry_run=True)
    assert changed.items[0].action == "configured"
    assert changed.items[0].object["metadata"]["labels"] == {"team": "platform"}
    assert store.current_revision() == before
    assert store.get(AGENT, "default", "coder")["metadata"]["labels"] == {"team": "core"}


def test_changes_are_configured_and_labels_follow_the_document(store: Store) -> None:
    created = apply(store, QUICKSTART).items[1].object
    result = apply(store, QUICKSTART.replace("  labels:\n    team: core\n", ""))
    assert [i.action for i in result.items] == ["unchanged", "configured", "unchanged"]
    agent = store.get(AGENT, "default", "coder")
    assert "labels" not in agent["metadata"]
    assert agent["metadata"]["uid"] == created["metadata"]["uid"]
    assert agent["metadata"]["generation"] == 1  # labels are not spec

    apply(store, QUICKSTART.replace("  providerRef:\n    name: codex\n",
                                    "  providerRef:\n    name: codex\n  systemPrompt: be brief\n"))
    assert store.get(AGENT, "default", "coder")["metadata"]["generation"] == 2


def test_apply_keeps_finalizers_a_controller_added(store: Store) -> None:
    apply(store, QUICKSTART)
    agent = store.get(AGENT, "default", "coder")
    agent["metadata"]["finalizers"] = ["joch.dev/cleanup"]
    store.update(AGENT, agent)
    assert apply(store, QUICKSTART).items[1].action == "unchanged"
    assert store.get(AGENT, "default", "coder")["metadata"]["finalizers"] == ["joch.dev/cleanup"]


def _as_got(obj: dict[str, Any]) -> str:
    """What ``joch get -o yaml`` prints: the stored object, server fields and status included."""
    return yaml.safe_dump(obj, sort_keys=False)


def test_apply_honours_the_resource_version_of_get_output(store: Store) -> None:
    apply(store, QUICKSTART)
    got = _as_got(store.get(AGENT, "default", "coder"))
    assert apply(store, got, "coder.yaml").items[0].action == "unchanged"

    apply(store, AGENT_DOC.replace("team: core", "team: someone-else"))  # a change made after the get
    before = store.current_revision()
    with pytest.raises(errors.Conflict) as info:
        apply(store, PROVIDER + "---\n" + got.replace("team: core", "team: mine"), "coder.yaml")
    assert info.value.message.startswith(
        "documents[1] (Agent/coder in coder.yaml:9): the object has been modified since resourceVersion ")
    assert "get it again and re-apply your change, or remove metadata.resourceVersion" in info.value.message
    assert info.value.message.endswith("; nothing was applied")
    (cause,) = info.value.causes
    assert cause.field.startswith("documents[") and cause.field.endswith(".metadata")
    assert cause.message.startswith("the object has been modified since resourceVersion")
    assert store.current_revision() == before
    assert store.get(AGENT, "default", "coder")["metadata"]["labels"] == {"team": "someone-else"}

    current = _as_got(store.get(AGENT, "default", "coder"))
    assert apply(store, current.replace("team: someone-else", "team: mine")).items[0].action == "configured"


def test_apply_refuses_the_uid_of_an_object_deleted_since(store: Store) -> None:
    apply(store, QUICKSTART)
    got = _as_got(store.get(AGENT_PROVIDER, "default", "codex"))
    store.delete(AGENT_PROVIDER, "default", "codex")
    with pytest.raises(errors.Conflict, match=r"the object no longer exists, but the document carries the "
                                              r"metadata.resourceVersion of one that did"):
        apply(store, got)
    apply(store, PROVIDER)
    with pytest.raises(errors.Conflict, match=r"metadata.uid \S+ is not the uid of the stored object"):
        apply(store, got)
    without_uid = yaml.safe_load(got)
    del without_uid["metadata"]["uid"], without_uid["metadata"]["resourceVersion"]
    assert apply(store, _as_got(without_uid)).items[0].action == "unchanged"


def test_a_resource_version_that_is_not_a_revision_is_invalid_not_a_conflict(store: Store) -> None:
    apply(store, QUICKSTART)
    exc = rejected(store, AGENT_DOC.replace("  name: coder\n", "  name: coder\n  resourceVersion: latest\n"))
    assert [c.field for c in exc.causes] == ["documents[0] (Agent/coder in quickstart.yaml:1).metadata.resourceVersion"]


def test_totals_count_documents_the_way_their_indexes_do(store: Store) -> None:
    bad = PROVIDER.replace("binary: codex", "binary: ''")
    exc = rejected(store, "---\n---\n" + bad)  # an empty first document still takes documents[0]
    assert exc.message == "1 of 2 documents is invalid; nothing was applied"
    assert exc.causes[0].field.startswith("documents[1] ")
    items = load_documents(json.dumps({"kind": "List", "items": [
        yaml.safe_load(bad), yaml.safe_load(bad.replace("codex", "aider"))]}), "list.json")
    with pytest.raises(errors.Invalid) as info:
        apply_documents(store, items)
    assert info.value.message == "1 of 1 document is invalid; nothing was applied"
    assert [c.field.split(" ")[0] for c in info.value.causes] == ["documents[0].items[0]", "documents[0].items[1]"]


def test_secret_string_data_is_stored_as_data(store: Store) -> None:
    secret = ("apiVersion: ops.joch.dev/v1alpha1\nkind: Secret\nmetadata:\n  name: token\n"
              "spec:\n  stringData:\n    token: s3cret\n")
    assert apply(store, secret).items[0].action == "created"
    assert store.reveal(SECRET, "default", "token")["spec"] == {"type": "Opaque", "data": {"token": "czNjcmV0"}}
    assert store.get(SECRET, "default", "token")["spec"] == {"type": "Opaque"}  # reads show the keys only
    assert apply(store, secret).items[0].action == "unchanged"


def test_generate_name_is_for_create(store: Store) -> None:
    apply(store, QUICKSTART)
    run = RUN.replace("  name: fix-1\n", "  generateName: fix-\n")
    result = create_documents(store, load_documents(run + "---\n" + run, "runs.yaml"))
    names = [i.name for i in result.items]
    assert len(set(names)) == 2 and all(n.startswith("fix-") and len(n) > 4 for n in names)
    assert [i.action for i in result.items] == ["created", "created"]
    for name in names:
        assert exists(store, AGENT_RUN, name)

    exc = rejected(store, run, "runs.yaml")
    assert exc.causes[0].field == "documents[0] (AgentRun/fix- in runs.yaml:1).metadata.name"
    assert "generateName is honoured only by create" in exc.causes[0].message


def test_create_refuses_existing_objects_and_rolls_back(store: Store) -> None:
    apply(store, PROVIDER)
    before = store.current_revision()
    with pytest.raises(errors.AlreadyExists) as info:
        create_documents(store, load_documents(IMPL + "---\n" + PROVIDER, "new.yaml"))
    assert info.value.message.startswith("documents[1] (AgentProvider/codex in new.yaml:8): ")
    assert "already exists" in info.value.message
    assert store.current_revision() == before
    assert not exists(store, IMPLEMENTATION_SPEC, "readme")


def test_the_same_object_twice_in_a_batch_is_invalid(store: Store) -> None:
    exc = rejected(store, PROVIDER + "---\n" + PROVIDER.replace("binary: codex", "binary: other"))
    (cause,) = exc.causes
    assert cause.field == "documents[1] (AgentProvider/codex in quickstart.yaml:9).metadata.name"
    assert "documents[0] (AgentProvider/codex in quickstart.yaml:1) defines the same object" in cause.message


# --- single objects (the HTTP server's helpers) --------------------------------------------------

def _obj(text: str) -> dict[str, Any]:
    return load_documents(text, "body.json")[0].obj


def test_create_object_and_its_dry_run(store: Store) -> None:
    before = store.current_revision()
    preview, _ = create_object(store, AGENT_PROVIDER, _obj(PROVIDER), namespace="default", dry_run=True)
    assert preview["metadata"]["uid"]
    assert store.current_revision() == before
    created, warnings = create_object(store, AGENT_PROVIDER, _obj(PROVIDER), namespace="default")
    assert warnings == [] and created["spec"]["binary"] == "codex"
    with pytest.raises(errors.AlreadyExists):
        create_object(store, AGENT_PROVIDER, _obj(PROVIDER), namespace="default")
    elsewhere = _obj(PROVIDER)
    elsewhere["metadata"]["namespace"] = "default"
    with pytest.raises(errors.BadRequest, match="does not match"):
        create_object(store, AGENT_PROVIDER, elsewhere, namespace="other-team")


def test_create_object_refuses_a_resource_version(store: Store) -> None:
    obj = _obj(PROVIDER)
    obj["metadata"]["resourceVersion"] = "3"
    with pytest.raises(errors.Invalid) as info:
        create_object(store, AGENT_PROVIDER, obj, namespace="default")
    assert [c.field for c in info.value.causes] == ["metadata.resourceVersion"]


def test_update_object_has_put_semantics(store: Store) -> None:
    apply(store, QUICKSTART)
    current = store.get(AGENT, "default", "coder")
    body = {**current, "metadata": {"name": "coder", "resourceVersion": current["metadata"]["resourceVersion"]},
            "spec": {"providerRef": {"name": "codex"}, "systemPrompt": "hi"}}
    updated, _ = update_object(store, AGENT, body, namespace="default", name="coder")
    assert updated["spec"]["systemPrompt"] == "hi"
    assert "labels" not in updated["metadata"]
    assert updated.get("status") == current.get("status")
    with pytest.raises(errors.Conflict):
        update_object(store, AGENT, body, namespace="default", name="coder")
    with pytest.raises(errors.BadRequest, match="does not match"):
        update_object(store, AGENT, body, namespace="default", name="other")
    with pytest.raises(errors.NotFound):
        update_object(store, AGENT, {**body, "metadata": {"name": "ghost"}}, namespace="default", name="ghost")


def test_patch_object_merges_and_admits(store: Store) -> None:
    apply(store, QUICKSTART)
    patched, _ = patch_object(store, AGENT, "default", "coder",
                              {"metadata": {"labels": {"tier": "1"}}, "spec": {"defaults": {"retryLimit": 2}}})
    assert patched["metadata"]["labels"] == {"team": "core", "tier": "1"}
    assert patched["spec"]["defaults"] == {"timeoutSeconds": 3600, "retryLimit": 2}

    with pytest.raises(errors.Invalid) as info:
        patch_object(store, AGENT, "default", "coder", {"spec": {"defaults": {"retryLimit": "two"}}})
    assert [c.field for c in info.value.causes] == ["spec.defaults.retryLimit"]

    _, warnings = patch_object(store, AGENT, "default", "coder", {"spec": {"providerRef": {"name": "gone"}}})
    assert warnings and "gone" in warnings[0]

    with pytest.raises(errors.Conflict):
        patch_object(store, AGENT, "default", "coder", {"metadata": {"resourceVersion": "1"}, "spec": {}})


def test_update_status_validates_and_writes_only_status(store: Store) -> None:
    apply(store, QUICKSTART + "---\n" + RUN)
    run = store.get(AGENT_RUN, "default", "fix-1")
    written = update_status(store, AGENT_RUN, {**run, "status": {"phase": "Running", "attempt": 1}},
                            namespace="default", name="fix-1")
    assert written["status"] == {"phase": "Running", "attempt": 1}
    assert written["spec"] == run["spec"]
    with pytest.raises(errors.Invalid) as info:
        update_status(store, AGENT_RUN, {**run, "status": {"phase": "Exploded"}}, namespace="default",
                      name="fix-1")
    assert [c.field for c in info.value.causes] == ["status.phase"]
    with pytest.raises(errors.Conflict):
        update_status(store, AGENT_RUN, {**run, "status": {"phase": "Queued"}}, namespace="default",
                      name="fix-1")
