"""compile_agent: a deterministic, content-hashed manifest, or the problems a person must fix."""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from joch.api.registry import KindInfo
from joch.compiler.manifest import (
    REFERENCE_REASONS,
    Compiled,
    Problem,
    canonical_json,
    compile_agent,
    manifest_hash,
)
from joch.store.base import Obj

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SECRET_VALUE = "s3cr3t-value-never-in-a-manifest"


class Objects:
    """The reader a controller passes, over a dict: (kind, namespace, name) → object."""

    def __init__(self, *objs: Obj) -> None:
        self.objects: dict[tuple[str, str | None, str], Obj] = {}
        for obj in objs:
            self.put(obj)

    def put(self, obj: Obj) -> Obj:
        m = obj["metadata"]
        self.objects[(obj["kind"], m.get("namespace"), m["name"])] = obj
        return obj

    def drop(self, kind: str, name: str) -> None:
        del self.objects[(kind, "default", name)]

    def __call__(self, kind: KindInfo, namespace: str | None, name: str) -> Obj | None:
        return self.objects.get((kind.kind, namespace, name))


def stored(kind: str, name: str, spec: dict[str, Any], *, uid: str | None = None, generation: int = 1,
           api: str = "joch.dev/v1alpha1") -> Obj:
    return {"apiVersion": api, "kind": kind, "spec": spec,
            "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{kind}-{name}",
                         "generation": generation, "resourceVersion": "7",
                         "creationTimestamp": "2026-01-01T00:00:00Z"}}


def agent(**spec: Any) -> Obj:
    return stored("Agent", "coder", {"providerRef": {"name": "codex"}, **spec})


def provider(**spec: Any) -> Obj:
    return stored("AgentProvider", "codex", {"binary": "codex", "argsTemplate": ["exec", "{{ implementation.text }}"],
                                             **spec})


def secret(name: str = "openai", **data: str) -> Obj:
    data = data or {"api-key": SECRET_VALUE}
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return stored("Secret", name, {"type": "Opaque", "data": encoded}, api="ops.joch.dev/v1alpha1")


def policy(name: str = "no-prod") -> Obj:
    return stored("Policy", name, {"rules": [{"name": "r", "expression": "true"}]})


def compiled(read: Objects, obj: Obj | None = None) -> Compiled:
    result = compile_agent(read, obj or read.objects[("Agent", "default", "coder")])
    assert result.ok, result.problems
    return result


def problems(read: Objects, obj: Obj | None = None) -> list[Problem]:
    result = compile_agent(read, obj or read.objects[("Agent", "default", "coder")])
    assert (result.manifest, result.hash) == (None, None)
    return result.problems


# --- the manifest --------------------------------------------------------------------------------

def test_the_quickstart_compiles_to_a_complete_manifest() -> None:
    docs = [yaml.safe_load((EXAMPLES / "quickstart" / f).read_text()) for f in ("agent.yaml", "provider.yaml")]
    for doc, uid in zip(docs, ("a-1", "p-1"), strict=True):
        doc["metadata"].update(namespace="default", uid=uid, generation=3)
    read = Objects(*docs)
    result = compiled(read, docs[0])

    manifest = result.manifest
    assert manifest is not None
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", result.hash or "")
    assert manifest["hash"] == result.hash == manifest_hash(manifest)
    assert (manifest["apiVersion"], manifest["kind"], manifest["metadata"]) == (
        "joch.dev/v1alpha1", "CompiledAgentManifest", {"name": "demo", "namespace": "default"})
    assert manifest["sources"] == [
        {"kind": "Agent", "name": "demo", "uid": "a-1", "generation": 3},
        {"kind": "AgentProvider", "name": "demo-agent", "uid": "p-1", "generation": 3},
    ]
    spec = manifest["spec"]
    assert spec["provider"] == {
        "name": "demo-agent", "binary": "joch-demo-agent",
        "argsTemplate": ["--implementation", "{{ workspace.inputs }}/implementation.md", "--summary",
                         "{{ workspace.outputs }}/summary.md"],
        "envTemplate": {"JOCH_RUN_NAME": "{{ run.name }}"},
        "inputFiles": [{"path": "implementation.md", "content": "{{ implementation.text }}"}],
        "outputArtifacts": [{"name": "summary", "path": "summary.md", "optional": False}],
        "secretEnv": [], "workload": None,
        # what issue 9 added, with its defaults
        "versionArgs": None, "parameters": [], "configFiles": [], "outputFormat": None,
        "resumable": None, "successPolicy": None, "patch": None,
    }
    # everything a run needs from the Agent, with the defaults the user did not write filled in
    assert spec["runtime"] == {"type": "local", "config": {}}
    assert spec["defaults"] == {"timeoutSeconds": 300, "retryLimit": 0, "budgetUsd": None, "parameters": {}}
    assert spec["security"] == {"allowedSecrets": [], "allowedServiceAccounts": [], "network": None}
    assert (spec["requiresApproval"], spec["maxConcurrentRuns"], spec["env"]) == (False, None, [])
    assert (spec["systemPrompt"], spec["modelRoute"], spec["memoryRef"]) == (None, None, None)
    assert (spec["tools"], spec["mcpServers"], spec["policies"]) == ([], [], [])
    assert "providerRef" not in spec


def test_no_timestamps_or_resource_versions_inside() -> None:
    result = compiled(Objects(agent(), provider()))
    text = canonical_json(result.manifest).decode()
    assert "2026-01-01" not in text and "resourceVersion" not in text and "creationTimestamp" not in text


def test_compiling_twice_gives_the_same_bytes_and_hash() -> None:
    read = Objects(agent(systemPrompt="hi", env=[{"name": "A", "value": "1"}]),
                   provider(envTemplate={"B": "2", "A": "1"}))
    first, second = compiled(read), compiled(read)
    assert first.hash == second.hash
    assert canonical_json(first.manifest) == canonical_json(second.manifest)
    # the manifest is canonical JSON parsed back: even a plain dump is byte-identical
    assert json.dumps(first.manifest) == json.dumps(second.manifest)


def reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(v) for v in value]
    return value


def test_dict_ordering_is_irrelevant() -> None:
    a = agent(systemPrompt="hi", security={"allowedSecrets": ["openai"]}, runtime={"type": "local", "config": {
        "x": 1, "y": {"b": 2, "a": 1}}})
    p = provider(envTemplate={"Z": "1", "A": "2"}, secretEnv=[{"name": "K", "secretRef": {"name": "openai",
                                                                                          "key": "api-key"}}])
    forwards = compiled(Objects(a, p, secret()))
    backwards = compiled(Objects(reversed_keys(a), reversed_keys(p), secret()), reversed_keys(a))
    assert forwards.hash == backwards.hash
    assert json.dumps(forwards.manifest) == json.dumps(backwards.manifest)


def test_defaults_written_out_or_left_out_compile_alike() -> None:
    bare = compiled(Objects(agent(), provider()))
    explicit = compiled(Objects(
        agent(runtime={"type": "local"}, defaults={"timeoutSeconds": 3600, "retryLimit": 0}, tools=[],
              requiresApproval=False),
        provider(envTemplate={}, inputFiles=[])))
    assert bare.hash == explicit.hash


def _edit_agent(read: Objects) -> None:
    read.put(agent(systemPrompt="be brief"))


def _bump_agent_generation(read: Objects) -> None:
    read.put({**agent(), "metadata": {**agent()["metadata"], "generation": 2}})


def _edit_args(read: Objects) -> None:
    read.put(provider(argsTemplate=["exec", "--json", "{{ implementation.text }}"]))


def _edit_env(read: Objects) -> None:
    read.put(provider(envTemplate={"CODEX_HOME": "/tmp"}))


def _recreate_provider(read: Objects) -> None:
    read.put(stored("AgentProvider", "codex", provider()["spec"], uid="a-new-uid"))


def _bump_provider_generation(read: Objects) -> None:
    read.put(stored("AgentProvider", "codex", provider()["spec"], generation=5))


def _add_policy(read: Objects) -> None:
    read.put(policy())
    read.put(agent(policies=[{"name": "no-prod"}]))


@pytest.mark.parametrize("change", [_edit_agent, _bump_agent_generation, _edit_args, _edit_env, _recreate_provider,
                                    _bump_provider_generation, _add_policy])
def test_every_input_change_changes_the_hash(change: Any) -> None:
    read = Objects(agent(), provider())
    before = compiled(read).hash
    change(read)
    assert compiled(read).hash != before


def test_the_changes_give_pairwise_different_hashes() -> None:
    hashes = set()
    for change in (_edit_agent, _bump_agent_generation, _edit_args, _edit_env, _recreate_provider,
                   _bump_provider_generation, _add_policy):
        read = Objects(agent(), provider())
        change(read)
        hashes.add(compiled(read).hash)
    assert len(hashes) == 7


def test_what_is_not_an_input_leaves_the_hash_alone() -> None:
    read = Objects(agent(), provider())
    before = compiled(read).hash
    relabelled = provider()
    relabelled["metadata"].update(labels={"team": "x"}, resourceVersion="99", creationTimestamp="2030-01-01T00:00:00Z")
    relabelled["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    read.put(relabelled)
    with_status = agent()
    with_status["status"] = {"compiledManifestHash": "sha256:old", "observedGeneration": 1}
    read.put(with_status)
    assert compiled(read).hash == before


def test_secret_values_never_reach_the_manifest() -> None:
    read = Objects(agent(security={"allowedSecrets": ["openai"]}), secret(),
                   provider(secretEnv=[{"name": "OPENAI_API_KEY", "secretRef": {"name": "openai", "key": "api-key"}}]))
    result = compiled(read)
    text = canonical_json(result.manifest).decode()
    encoded = base64.b64encode(SECRET_VALUE.encode()).decode()
    assert SECRET_VALUE not in text and encoded not in text
    assert result.manifest is not None
    assert result.manifest["spec"]["provider"]["secretEnv"] == [
        {"name": "OPENAI_API_KEY", "secretRef": {"name": "openai", "key": "api-key"}}]
    assert [s["kind"] for s in result.manifest["sources"]] == ["Agent", "AgentProvider"]


def test_rotating_a_secret_changes_no_manifest() -> None:
    read = Objects(agent(security={"allowedSecrets": ["openai"]}), secret(),
                   provider(secretEnv=[{"name": "OPENAI_API_KEY", "secretRef": {"name": "openai", "key": "api-key"}}]))
    before = compiled(read).hash
    read.put(stored("Secret", "openai", secret(**{"api-key": "rotated"})["spec"], uid="new", generation=9,
                    api="ops.joch.dev/v1alpha1"))
    assert compiled(read).hash == before


def test_policies_are_sources() -> None:
    read = Objects(agent(policies=[{"name": "no-prod"}]), provider(), policy())
    result = compiled(read)
    assert result.manifest is not None
    assert result.manifest["sources"][2] == {"kind": "Policy", "name": "no-prod", "uid": "uid-Policy-no-prod",
                                             "generation": 1}
    assert result.manifest["spec"]["policies"] == [{"name": "no-prod"}]


# --- problems ------------------------------------------------------------------------------------

def test_a_missing_provider() -> None:
    assert problems(Objects(agent())) == [Problem("ProviderNotFound", (
        'AgentProvider "codex" not found in namespace "default": create it (joch apply -f provider.yaml) or fix '
        "spec.providerRef.name"))]


def test_a_secret_the_agent_does_not_allow() -> None:
    read = Objects(agent(), secret(), provider(secretEnv=[
        {"name": "OPENAI_API_KEY", "secretRef": {"name": "openai", "key": "api-key"}}]))
    assert problems(read) == [Problem("SecretNotAllowed", (
        'AgentProvider "codex" spec.secretEnv[0] (OPENAI_API_KEY) uses Secret "openai", which Agent "coder" does '
        "not allow: add \"openai\" to the Agent's spec.security.allowedSecrets"))]


def test_a_missing_secret() -> None:
    read = Objects(agent(security={"allowedSecrets": ["openai"]}), provider(secretEnv=[
        {"name": "OPENAI_API_KEY", "secretRef": {"name": "openai", "key": "api-key"}},
        {"name": "CODEX_API_KEY", "secretRef": {"name": "openai", "key": "api-key"}}]))
    assert problems(read) == [Problem("SecretNotFound", (
        'Secret "openai" not found in namespace "default" (AgentProvider "codex" spec.secretEnv[0] (OPENAI_API_KEY)): '
        "create it (joch apply -f secret.yaml) or fix spec.secretEnv[0].secretRef.name"))]  # once per Secret


def test_a_missing_key_names_the_keys_there_are() -> None:
    read = Objects(agent(security={"allowedSecrets": ["openai"]}), secret(token="x", other="y"), provider(secretEnv=[
        {"name": "OPENAI_API_KEY", "secretRef": {"name": "openai", "key": "api-key"}}]))
    assert problems(read) == [Problem("SecretKeyNotFound", (
        'Secret "openai" has no key "api-key" (AgentProvider "codex" spec.secretEnv[0] (OPENAI_API_KEY)); it has '
        "other, token: add the key to the Secret or fix spec.secretEnv[0].secretRef.key"))]


def test_a_missing_policy() -> None:
    assert problems(Objects(agent(policies=[{"name": "no-prod"}]), provider())) == [Problem("PolicyNotFound", (
        'Policy "no-prod" not found in namespace "default": create it or remove it from the Agent\'s spec.policies'))]


def test_a_broken_template() -> None:
    read = Objects(agent(), provider(argsTemplate=["exec", "{{ implementation.titel }}", "{% if %}"]))
    assert problems(read) == [
        Problem("TemplateError", 'AgentProvider/codex spec.argsTemplate[1]: undefined variable "implementation.titel"; '
                                 "implementation has acceptanceCriteria, description, labels, source, summary, text"),
        Problem("TemplateError", "AgentProvider/codex spec.argsTemplate[2]: syntax error: Expected an expression, "
                                 "got 'end of statement block'"),
    ]


def test_a_broken_condition_and_an_agent_parameter_the_provider_does_not_declare() -> None:
    read = Objects(agent(defaults={"parameters": {"modle": "o3"}}), provider(
        parameters=[{"name": "model", "default": "gpt-5-codex"}],
        argsTemplate=["exec", {"when": "parameters.model ==", "args": ["--model", "{{ parameters.model }}"]}]))
    assert problems(read) == [
        Problem("TemplateError", "AgentProvider/codex spec.argsTemplate[1].when: syntax error: "
                                 "unexpected 'end of template'"),
        Problem("UnknownParameter", 'Agent spec.defaults.parameters.modle: AgentProvider/codex declares no parameter '
                                    '"modle" (did you mean "model"?); it declares model'),
    ]


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.md", "a/../../b"])
def test_input_and_output_paths_stay_inside_their_directories(path: str) -> None:
    read = Objects(agent(), provider(inputFiles=[{"path": path, "content": "x"}]))
    assert problems(read) == [Problem("InvalidPath", (
        f'AgentProvider "codex" spec.inputFiles[0].path is "{path}": it must be a relative path inside the run\'s '
        "inputs or outputs directory (no leading / and no ..)"))]
    read = Objects(agent(), provider(outputArtifacts=[{"name": "x", "path": path}]))
    assert [p.reason for p in problems(read)] == ["InvalidPath"]


def test_a_stored_spec_that_no_longer_validates() -> None:
    read = Objects(agent(), provider(binary=""))
    (problem,) = problems(read)
    assert problem.reason == "InvalidSpec"
    assert problem.message.startswith('AgentProvider "codex" has an invalid spec.binary: ')
    (problem,) = problems(Objects(provider()), agent(defaults={"timeoutSeconds": "soon"}))
    assert problem.message.startswith('Agent "coder" has an invalid spec.defaults.timeoutSeconds: ')


def test_every_problem_is_reported_in_order() -> None:
    read = Objects(agent(policies=[{"name": "gone"}]), provider(
        argsTemplate=["{{ nope }}"],
        secretEnv=[{"name": "A", "secretRef": {"name": "a", "key": "k"}}]))
    assert [p.reason for p in problems(read)] == ["SecretNotAllowed", "SecretNotFound", "PolicyNotFound",
                                                  "TemplateError"]


def test_reference_reasons_are_the_not_found_ones() -> None:
    assert REFERENCE_REASONS == {"ProviderNotFound", "SecretNotFound", "SecretKeyNotFound", "PolicyNotFound"}


def test_compiling_reads_but_never_changes_its_inputs() -> None:
    read = Objects(agent(systemPrompt="x"), provider())
    before = copy.deepcopy(read.objects)
    compiled(read)
    assert read.objects == before
