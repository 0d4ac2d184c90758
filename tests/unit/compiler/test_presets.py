"""The AgentProvider presets in examples/providers: they pass admission (as ``joch apply --dry-run``
would), compile with an Agent that allows their Secret, and render to exactly the intended command."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from joch.admission.apply import apply_documents
from joch.admission.documents import load_paths
from joch.api import errors, kinds
from joch.api.registry import KindInfo
from joch.compiler.manifest import compile_agent
from joch.compiler.render import Invocation, build_context, render_invocation
from joch.store import Store
from joch.store.base import Obj

PRESETS = Path(__file__).resolve().parents[3] / "examples" / "providers"
SECRETS = {"codex": "openai", "claude-code": "anthropic", "aider": "anthropic"}
WORKSPACE = {"root": "/runs/u-1/1/work", "path": "/runs/u-1/1/work/app", "inputs": "/runs/u-1/1/inputs",
             "outputs": "/runs/u-1/1/outputs"}
RUN = {"metadata": {"name": "fix-1", "namespace": "default", "uid": "u-1"}, "spec": {"parameters": {}}}
TASK = {"text": "Add a greeting to README.md.\n", "acceptanceCriteria": ["README.md ends with \"Hello\"",
                                                                      "nothing else changes"]}
PROMPT = ("Be careful.\n\nAdd a greeting to README.md.\n\nAcceptance criteria:\n- README.md ends with \"Hello\"\n"
          "- nothing else changes")


@pytest.fixture
def admitted(store: Store) -> dict[str, Obj]:
    """The presets as admission would store them, from a dry-run apply of the directory."""
    result = apply_documents(store, load_paths([str(PRESETS)]), dry_run=True)
    assert [(i.kind.kind, i.action, i.warnings) for i in result.items] == [("AgentProvider", "created", [])] * 3
    with pytest.raises(errors.NotFound):
        store.get(kinds.AGENT_PROVIDER, "default", "codex")  # a dry run writes nothing
    return {i.name or "": i.object for i in result.items}


def invocation(provider: Obj, *, system_prompt: str | None = "Be careful.", task: dict[str, Any] | None = None,
               parameters: dict[str, str] | None = None) -> Invocation:
    name = provider["metadata"]["name"]
    secret_name = SECRETS[name]
    agent: Obj = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
                  "metadata": {"name": "coder", "namespace": "default", "uid": "a", "generation": 1},
                  "spec": {"providerRef": {"name": name}, "security": {"allowedSecrets": [secret_name]},
                           **({"systemPrompt": system_prompt} if system_prompt else {})}}
    secret: Obj = {"kind": "Secret", "metadata": {"name": secret_name, "namespace": "default"},
                   "spec": {"data": {"api-key": base64.b64encode(b"sk-test").decode()}}}

    def read(kind: KindInfo, namespace: str | None, obj_name: str) -> Obj | None:
        found = {("AgentProvider", name): provider, ("Secret", secret_name): secret}
        return found.get((kind.kind, obj_name))

    compiled = compile_agent(read, agent)
    assert compiled.ok, compiled.problems
    assert compiled.manifest is not None
    run = {**RUN, "spec": {"parameters": parameters or {}}}
    context = build_context(compiled.manifest, run=run, attempt=1, implementation=task or TASK, workspace=WORKSPACE)
    return render_invocation(compiled.manifest, context)


def test_codex(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["codex"])
    assert inv.argv == (
        "codex", "exec", "--cd", "/runs/u-1/1/work/app", "--sandbox", "workspace-write", "--skip-git-repo-check",
        "--color", "never", "--output-last-message", "/runs/u-1/1/outputs/summary.md", "--model", "gpt-5-codex",
        "--", PROMPT)
    assert (inv.env, inv.input_files) == ({}, ())
    assert inv.outputs == (("summary", "summary.md", False),)
    assert inv.secret_env == (("OPENAI_API_KEY", "openai", "api-key"), ("CODEX_API_KEY", "openai", "api-key"))


def test_claude_code(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["claude-code"])
    assert inv.argv == (
        "claude", "-p", "--output-format", "json", "--permission-mode", "acceptEdits", "--model", "sonnet",
        "--add-dir", "/runs/u-1/1/outputs", "--",
        PROMPT + "\n\nWhen you are done, write a short summary of what you changed and why to "
                 "/runs/u-1/1/outputs/summary.md.")
    assert (inv.env, inv.input_files) == ({}, ())
    assert inv.outputs == (("summary", "summary.md", True),)
    assert inv.secret_env == (("ANTHROPIC_API_KEY", "anthropic", "api-key"),)


def test_aider(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["aider"])
    assert inv.argv == (
        "aider", "--model", "sonnet", "--message-file", "/runs/u-1/1/inputs/task.md", "--yes-always",
        "--no-auto-commits", "--no-dirty-commits", "--no-gitignore", "--no-check-update", "--no-analytics",
        "--no-pretty", "--no-stream", "--chat-history-file", "/runs/u-1/1/outputs/chat.md",
        "--input-history-file", "/runs/u-1/1/outputs/input.history")
    assert inv.input_files == (("task.md", PROMPT),)
    assert inv.env == {}
    assert inv.outputs == (("summary", "chat.md", False),)
    assert inv.secret_env == (("ANTHROPIC_API_KEY", "anthropic", "api-key"),)


@pytest.mark.parametrize("name", ["codex", "claude-code", "aider"])
def test_a_bare_task_and_a_chosen_model(admitted: dict[str, Obj], name: str) -> None:
    inv = invocation(admitted[name], system_prompt=None, task={"text": "- fix the bug\n"},
                     parameters={"model": "my-model"})
    assert inv.argv[inv.argv.index("--model") + 1] == "my-model"
    prompt = inv.input_files[0][1] if inv.input_files else inv.argv[inv.argv.index("--") + 1]
    assert prompt.startswith("- fix the bug")  # after `--`: a prompt starting with a dash is no flag
    assert "Acceptance criteria" not in prompt


@pytest.mark.parametrize("name", ["codex", "claude-code", "aider"])
def test_an_agent_must_allow_the_preset_secret(admitted: dict[str, Obj], name: str) -> None:
    provider = admitted[name]

    def read(kind: KindInfo, namespace: str | None, obj_name: str) -> Obj | None:
        return provider if kind.kind == "AgentProvider" else None

    agent: Obj = {"kind": "Agent", "metadata": {"name": "coder", "namespace": "default"},
                  "spec": {"providerRef": {"name": name}}}
    reasons = [p.reason for p in compile_agent(read, agent).problems]
    assert reasons[:2] == ["SecretNotAllowed", "SecretNotFound"]
