"""The AgentProvider presets in examples/providers: they pass admission (as ``joch apply --dry-run``
would), compile with an Agent that allows their Secret, and render to exactly the intended command."""

from __future__ import annotations

import base64
import json
import tomllib
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
SECRETS = {"codex": "openai", "claude-code": "anthropic", "aider": "openai", "opencode": "openai", "gemini": "gemini"}
WORKSPACE = {"root": "/runs/u-1/1/work", "path": "/runs/u-1/1/work/app", "inputs": "/runs/u-1/1/inputs",
             "outputs": "/runs/u-1/1/outputs", "home": "/runs/u-1/1/home"}
RUN = {"metadata": {"name": "fix-1", "namespace": "default", "uid": "u-1"}, "spec": {"parameters": {}}}
TASK = {"text": "Add a greeting to README.md.\n", "acceptanceCriteria": ["README.md ends with \"Hello\"",
                                                                      "nothing else changes"]}
PROMPT = ("Be careful.\n\nAdd a greeting to README.md.\n\nAcceptance criteria:\n- README.md ends with \"Hello\"\n"
          "- nothing else changes")


@pytest.fixture
def admitted(store: Store) -> dict[str, Obj]:
    """The presets as admission would store them, from a dry-run apply of the directory."""
    result = apply_documents(store, load_paths([str(PRESETS)]), dry_run=True)
    presets = len(list(PRESETS.glob("*.yaml")))
    assert [(i.kind.kind, i.action, i.warnings) for i in result.items] == [("AgentProvider", "created", [])] * presets
    with pytest.raises(errors.NotFound):
        store.get(kinds.AGENT_PROVIDER, "default", "codex")  # a dry run writes nothing
    return {i.name or "": i.object for i in result.items}


def invocation(provider: Obj, *, system_prompt: str | None = "Be careful.", task: dict[str, Any] | None = None,
               parameters: dict[str, str] | None = None, session: dict[str, Any] | None = None) -> Invocation:
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
    context = build_context(compiled.manifest, run=run, attempt=1, implementation=task or TASK, workspace=WORKSPACE,
                            session=session)
    return render_invocation(compiled.manifest, context)


def test_codex(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["codex"])
    assert inv.argv == (
        "codex", "exec", "--json", "--color", "never", "--cd", "/runs/u-1/1/work/app", "--skip-git-repo-check",
        "--output-last-message", "/runs/u-1/1/outputs/summary.md", "--model", "gpt-5-codex",
        "--dangerously-bypass-approvals-and-sandbox", "--", PROMPT)
    assert (inv.env, inv.input_files) == ({"CODEX_HOME": "/runs/u-1/1/home/.codex"}, ())
    assert inv.outputs == (("summary", "summary.md", False),)
    assert inv.secret_env == (("CODEX_API_KEY", "openai", "api-key"),)


def test_codex_config_toml_names_the_endpoint_only_when_given(admitted: dict[str, Obj]) -> None:
    (path, content, mode), = invocation(admitted["codex"]).config_files
    assert (path, mode) == (".codex/config.toml", 0o600)
    state = "/runs/u-1/1/home/.codex/state-1"
    # OpenAI's own endpoint, Codex's built-in provider
    assert tomllib.loads(content) == {"model": "gpt-5-codex", "sqlite_home": state}
    inv = invocation(admitted["codex"], parameters={"baseUrl": 'http://127.0.0.1:9/v1?a="b"', "retries": "1"})
    config = tomllib.loads(inv.config_files[0][1])
    assert config == {"model": "gpt-5-codex", "sqlite_home": state, "model_provider": "joch",
                      "model_providers": {"joch": {
        "name": "Joch model endpoint", "base_url": 'http://127.0.0.1:9/v1?a="b"', "env_key": "CODEX_API_KEY",
        "wire_api": "responses", "request_max_retries": 1, "stream_max_retries": 1}}}
    assert (inv.output_format, inv.resumable, inv.success) == ("codex", True, {
        "requireChanges": False, "failurePatterns": [], "requiredArtifacts": [], "agentResult": True})


def test_codex_with_its_own_sandbox(admitted: dict[str, Obj]) -> None:
    argv = invocation(admitted["codex"], parameters={"sandbox": "workspace-write"}).argv
    assert "--dangerously-bypass-approvals-and-sandbox" not in argv
    assert argv[argv.index("--sandbox"):argv.index("--sandbox") + 4] == (
        "--sandbox", "workspace-write", "-c", 'approval_policy="never"')


SUMMARY = "\n\nWhen you are done, write a short summary of what you changed and why to /runs/u-1/1/outputs/summary.md."
RESUMING = ("You were interrupted. Continue the task below where you left off: check what is already done before "
            "you change anything.\n\n")


def test_claude_code(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["claude-code"])
    assert inv.argv == (
        "claude", "-p", "--output-format", "stream-json", "--verbose", "--permission-mode", "acceptEdits",
        "--model", "sonnet", "--add-dir", "/runs/u-1/1/outputs", "--", PROMPT + SUMMARY)
    assert inv.env == {"ANTHROPIC_BASE_URL": "https://api.anthropic.com", "CLAUDE_CODE_MAX_RETRIES": "10",
                       "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
    assert (inv.input_files, inv.config_files) == ((), ())
    assert inv.outputs == (("summary", "summary.md", True),)
    assert inv.secret_env == (("ANTHROPIC_API_KEY", "anthropic", "api-key"),)
    assert (inv.output_format, inv.resumable, inv.version_args) == ("claude-code", True, ("--version",))
    assert inv.success["agentResult"] is True


def test_claude_code_through_a_gateway_resuming_its_session(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["claude-code"], parameters={"baseUrl": "http://127.0.0.1:9", "maxRetries": "0",
                                                          "permissionMode": "bypassPermissions"},
                     session={"id": "5f1c-sess", "resumedFrom": 1})
    assert inv.argv == (
        "claude", "-p", "--output-format", "stream-json", "--verbose", "--permission-mode", "bypassPermissions",
        "--model", "sonnet", "--add-dir", "/runs/u-1/1/outputs", "--resume", "5f1c-sess", "--",
        RESUMING + PROMPT + SUMMARY)
    assert (inv.env["ANTHROPIC_BASE_URL"], inv.env["CLAUDE_CODE_MAX_RETRIES"]) == ("http://127.0.0.1:9", "0")


def test_gemini(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["gemini"])
    assert inv.argv == (
        "gemini", "--output-format", "stream-json", "--approval-mode", "auto_edit", "--skip-trust",
        "--model", "gemini-2.5-pro", "--include-directories", "/runs/u-1/1/outputs", f"--prompt={PROMPT}{SUMMARY}")
    assert inv.env == {"GOOGLE_GEMINI_BASE_URL": "https://generativelanguage.googleapis.com"}
    assert inv.secret_env == (("GEMINI_API_KEY", "gemini", "api-key"),)
    (path, content, mode), = inv.config_files
    assert (path, mode) == (".gemini/settings.json", 0o600)
    assert json.loads(content) == {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False, "maxAttempts": 10},
        "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}
    assert inv.outputs == (("summary", "summary.md", True),)
    assert (inv.output_format, inv.resumable) == ("gemini", True)
    assert inv.success["agentResult"] is True


def test_gemini_through_a_gateway_resuming_its_session(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["gemini"], parameters={"baseUrl": "http://127.0.0.1:9", "maxAttempts": "1",
                                                     "model": "gemini-2.5-flash"},
                     session={"id": "9a-sess", "resumedFrom": 1}, task={"text": "- fix the bug\n"}, system_prompt=None)
    assert inv.argv[-4:] == ("/runs/u-1/1/outputs", "--resume", "9a-sess",
                             f"--prompt={RESUMING}- fix the bug{SUMMARY}")  # a dash-led prompt is the option's value
    assert inv.argv[inv.argv.index("--model") + 1] == "gemini-2.5-flash"
    assert inv.env == {"GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9"}
    assert json.loads(inv.config_files[0][1])["general"]["maxAttempts"] == 1


AIDER_FLAGS = ("--message-file", "/runs/u-1/1/inputs/task.md", "--yes-always", "--no-auto-commits",
               "--no-dirty-commits", "--no-gitignore", "--no-check-update", "--no-show-release-notes",
               "--no-analytics", "--no-show-model-warnings", "--no-pretty", "--no-stream",
               "--chat-history-file", "/runs/u-1/1/outputs/chat.md",
               "--input-history-file", "/runs/u-1/1/outputs/input.history",
               "--llm-history-file", "/runs/u-1/1/outputs/llm.history")


def test_aider(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["aider"])
    assert inv.argv == ("aider", "--model", "gpt-4.1", "--timeout", "600", *AIDER_FLAGS)
    assert inv.input_files == (("task.md", PROMPT),)
    assert inv.env == {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    assert inv.outputs == (("summary", "chat.md", False), ("transcript", "llm.history", True),
                           ("input-history", "input.history", True))
    assert inv.secret_env == (("OPENAI_API_KEY", "openai", "api-key"),)


def test_aider_with_an_endpoint(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["aider"], parameters={"baseUrl": "http://127.0.0.1:9/v1", "model": "openai/m"})
    assert inv.argv == ("aider", "--model", "openai/m", "--openai-api-base", "http://127.0.0.1:9/v1",
                        "--timeout", "600", *AIDER_FLAGS)


def test_aider_policies(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["aider"])
    assert (inv.output_format, inv.resumable, inv.config_files) == ("aider", False, ())
    assert inv.success["agentResult"] is True
    assert inv.patch["exclude"] == [".aider*", ".aider*/**", "**/.aider*", "**/.aider*/**"]


def test_opencode(admitted: dict[str, Obj]) -> None:
    inv = invocation(admitted["opencode"])
    (path, content, _), = inv.config_files
    assert path == ".config/opencode/opencode.json"
    assert json.loads(content) == {"$schema": "https://opencode.ai/config.json", "autoupdate": False,
                                   "share": "disabled", "model": "openai/gpt-4.1",
                                   "permission": {"edit": "allow", "bash": "allow", "webfetch": "allow"}}
    assert (inv.output_format, inv.resumable) == ("opencode", True)
    assert inv.argv == ("opencode", "run", "--format", "json", "--dir", "/runs/u-1/1/work/app",
                        "--model", "openai/gpt-4.1", "--", PROMPT)
    assert inv.env == {"OPENCODE_DISABLE_AUTOUPDATE": "true", "OPENCODE_DISABLE_MODELS_FETCH": "true",
                       "OPENCODE_DISABLE_LSP_DOWNLOAD": "true"}
    assert inv.secret_env == (("OPENAI_API_KEY", "openai", "api-key"),)
    with_endpoint = invocation(admitted["opencode"], parameters={"baseUrl": "http://127.0.0.1:9/v1"})
    assert with_endpoint.argv[with_endpoint.argv.index("--model") + 1] == "joch/gpt-4.1"
    config = json.loads(with_endpoint.config_files[0][1])
    assert config["model"] == "joch/gpt-4.1"
    assert config["provider"] == {"joch": {
        "npm": "@ai-sdk/openai-compatible", "name": "Joch model endpoint",
        "options": {"baseURL": "http://127.0.0.1:9/v1", "apiKey": "{env:OPENAI_API_KEY}"},
        "models": {"gpt-4.1": {"name": "gpt-4.1"}}}}


@pytest.mark.parametrize("name", ["codex", "claude-code", "aider", "opencode"])
def test_a_bare_task_and_a_chosen_model(admitted: dict[str, Obj], name: str) -> None:
    inv = invocation(admitted[name], system_prompt=None, task={"text": "- fix the bug\n"},
                     parameters={"model": "my-model"})
    assert inv.argv[inv.argv.index("--model") + 1] in ("my-model", "openai/my-model")  # OpenCode: provider/model
    prompt = inv.input_files[0][1] if inv.input_files else inv.argv[inv.argv.index("--") + 1]
    assert prompt.startswith("- fix the bug")  # after `--`: a prompt starting with a dash is no flag
    assert "Acceptance criteria" not in prompt


@pytest.mark.parametrize("name", ["codex", "claude-code", "aider", "opencode", "gemini"])
def test_an_agent_must_allow_the_preset_secret(admitted: dict[str, Obj], name: str) -> None:
    provider = admitted[name]

    def read(kind: KindInfo, namespace: str | None, obj_name: str) -> Obj | None:
        return provider if kind.kind == "AgentProvider" else None

    agent: Obj = {"kind": "Agent", "metadata": {"name": "coder", "namespace": "default"},
                  "spec": {"providerRef": {"name": name}}}
    reasons = [p.reason for p in compile_agent(read, agent).problems]
    assert reasons[:2] == ["SecretNotAllowed", "SecretNotFound"]
