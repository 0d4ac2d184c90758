"""Issue 9's AgentProvider and Agent fields, as admission checks them: every problem at its path."""

from __future__ import annotations

from typing import Any

import pytest

from joch.admission.validation import admit
from joch.api import errors
from joch.api.kinds import OUTPUT_FORMATS, AgentProviderSpec, host_problem
from joch.api.namespaces import NAMESPACE
from joch.runtime.agentoutput import FORMATS
from joch.store.base import ListOptions, ListResult, Obj, Writer


class Nothing(Writer):
    """A store with no objects but the default namespace; admission of a provider or agent reads
    none that matter here."""

    def get(self, kind: Any, namespace: str | None, name: str) -> Obj:
        if kind is NAMESPACE and name == "default":
            return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        raise errors.NotFound(name)

    def list(self, kind: Any, options: ListOptions | None = None) -> ListResult:
        return ListResult(items=[], resource_version="1")

    def create(self, kind: Any, obj: Obj) -> Obj:
        raise AssertionError("admission must not write")

    update = update_status = create

    def delete(self, kind: Any, namespace: str | None, name: str, *,
               resource_version: str | None = None, uid: str | None = None) -> Obj:
        raise AssertionError("admission must not write")


def admitted(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    doc = {"apiVersion": "joch.dev/v1alpha1", "kind": kind, "metadata": {"name": "x"}, "spec": spec}
    return admit(Nothing(), doc, old=None).obj


def causes(kind: str, spec: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(errors.Invalid) as caught:
        admitted(kind, spec)
    return {c.field: c.message for c in caught.value.causes}


def test_output_formats_are_the_runtime_parsers() -> None:
    assert set(OUTPUT_FORMATS) == set(FORMATS)


def test_a_full_provider_is_admitted_as_written() -> None:
    spec = {
        "binary": "codex", "versionArgs": ["--version"],
        "parameters": [{"name": "model", "default": "gpt-5-codex", "description": "the model"}, {"name": "baseUrl"}],
        "argsTemplate": ["exec", {"when": "parameters.baseUrl", "args": ["-c", "u={{ parameters.baseUrl }}"]}],
        "configFiles": [{"path": ".codex/config.toml", "content": "model = 1\n"}],
        "outputFormat": "codex", "resumable": True,
        "outputArtifacts": [{"name": "summary", "path": "summary.md"}],
        "successPolicy": {"requireChanges": True, "failurePatterns": [r"litellm\.APIConnectionError"],
                          "requiredArtifacts": ["summary"], "agentResult": True},
        "patch": {"exclude": [".aider*"], "maxFileBytes": 1048576},
    }
    stored = admitted("AgentProvider", spec)["spec"]
    assert stored["argsTemplate"][1] == {"when": "parameters.baseUrl", "args": ["-c", "u={{ parameters.baseUrl }}"]}
    assert stored["configFiles"][0]["mode"] == 0o600
    assert stored["outputFormat"] == "codex" and stored["resumable"] is True


def test_provider_problems_are_reported_at_their_paths() -> None:
    found = causes("AgentProvider", {
        "binary": "x",
        "parameters": [{"name": "model"}, {"name": "model"}, {"name": "base-url"}],
        "argsTemplate": ["a", 3, {"when": "x"}, {"when": "y", "args": ["z"], "extra": 1}],
        "configFiles": [{"path": "../.bashrc", "content": ""}, {"path": "/etc/x", "content": ""}],
        "outputFormat": "cursor",
        "outputArtifacts": [{"name": "summary", "path": "s.md"}],
        "successPolicy": {"failurePatterns": ["ok", "(unclosed"], "requiredArtifacts": ["summary", "transcript"]},
    })
    assert "spec.argsTemplate[1]" in found
    assert found["spec.argsTemplate[2].args"] == "required field is missing"
    assert "spec.argsTemplate[3].extra" in found
    assert "spec.outputFormat" in found and "claude-code" in found["spec.outputFormat"]
    # the schema passed for these in a second admission: the rules beyond it
    found = causes("AgentProvider", {
        "binary": "x",
        "parameters": [{"name": "model"}, {"name": "model"}, {"name": "base-url"}],
        "configFiles": [{"path": "../.bashrc", "content": ""}, {"path": "/etc/x", "content": ""}],
        "outputArtifacts": [{"name": "summary", "path": "s.md"}],
        "successPolicy": {"failurePatterns": ["ok", "(unclosed"], "requiredArtifacts": ["summary", "transcript"]},
        "patch": {"exclude": [":(exclude)x"]},
    })
    assert "duplicate parameter" in found["spec.parameters[1].name"]
    assert "invalid parameter name" in found["spec.parameters[2].name"]
    assert "relative to the HOME directory" in found["spec.configFiles[0].path"]
    assert "spec.configFiles[1].path" in found
    assert "not a Python regular expression" in found["spec.successPolicy.failurePatterns[1]"]
    assert "spec.successPolicy.failurePatterns[0]" not in found
    assert "names no output artifact" in found["spec.successPolicy.requiredArtifacts[1]"]
    assert "summary" in found["spec.successPolicy.requiredArtifacts[1]"]
    assert "spec.patch.exclude[0]" in found


def test_agent_network_and_parameters_are_checked() -> None:
    spec = {"providerRef": {"name": "p"}, "defaults": {"parameters": {"baseUrl": "http://127.0.0.1:9/v1"}},
            "security": {"network": {"mode": "limited", "allow": ["api.openai.com:443", "127.0.0.1:9999", "[::1]:80"]}}}
    assert admitted("Agent", spec)["spec"]["security"]["network"]["mode"] == "limited"
    found = causes("Agent", {"providerRef": {"name": "p"}, "defaults": {"parameters": {"1x": "a"}},
                             "security": {"network": {"mode": "on", "allow": ["https://x/", "h:99999", "ok.org"]}}})
    assert "invalid parameter name" in found["spec.defaults.parameters[1x]"]
    assert "not a host or host:port" in found["spec.security.network.allow[0]"]
    assert "spec.security.network.allow[1]" in found and "spec.security.network.allow[2]" not in found
    assert 'only applies to mode "limited"' in found["spec.security.network.allow"]
    assert "spec.security.network.mode" in causes("Agent", {"providerRef": {"name": "p"},
                                                           "security": {"network": {"mode": "partly"}}})


@pytest.mark.parametrize(("entry", "ok"), [
    ("api.openai.com", True), ("api.openai.com:443", True), ("127.0.0.1:9999", True), ("[::1]:8080", True),
    ("localhost", True), ("*.openai.com", False), ("http://x", False), ("x:0", False), ("x:/p", False), ("", False),
])
def test_host_entries(entry: str, ok: bool) -> None:
    assert (host_problem(entry) is None) is ok


def test_version_args_default_and_empty() -> None:
    assert AgentProviderSpec.model_validate({"binary": "x"}).versionArgs is None
    assert AgentProviderSpec.model_validate({"binary": "x", "versionArgs": []}).versionArgs == []


def test_a_patch_exclude_that_leaves_the_worktree_is_refused() -> None:
    # git refuses a pathspec outside the worktree ("is outside repository"): every run of the
    # provider would end without changes.patch.
    found = causes("AgentProvider", {"binary": "x", "patch": {"exclude": [
        "/tmp/cache", "../x", "**/../..", "a/../../b", ".aider*", "**/node_modules/**", "sub/../ok"]}})
    for i in range(4):
        assert "leaves the worktree" in found[f"spec.patch.exclude[{i}]"], found
    assert not any(f"spec.patch.exclude[{i}]" in found for i in range(4, 7)), found
