"""``joch render run -f run.yaml`` against a real server (its render route), store and runtime:
what a run would execute, and that nothing was created or started."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml

from integration.cli.test_runs_commands import PY, Cluster, cluster
from joch.api import kinds

__all__ = ["cluster"]  # fixture

SECRET_VALUE = "sk-very-secret-value"
RUN_YAML = """\
apiVersion: runtime.joch.dev/v1alpha1
kind: AgentRun
metadata:
  name: fix-1
spec:
  agentRef: {name: coder}
  implementation:
    inline: {text: "Fix the bug."}
  execution:
    coordinates:
      git: {url: repo}
  parameters: {model: o3}
"""


def setup(cluster: Cluster, when: str = "parameters.baseUrl") -> None:
    cluster.apply(
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "openai"},
         "spec": {"data": {"api-key": base64.b64encode(SECRET_VALUE.encode()).decode()}}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"}, "spec": {
            "binary": PY,
            "parameters": [{"name": "model", "default": "gpt-5-codex"}, {"name": "baseUrl"}],
            "argsTemplate": ["exec", {"when": when, "args": ["-c", "url={{ parameters.baseUrl }}"]},
                             "--model", "{{ parameters.model }}", "{{ implementation.text }}"],
            "envTemplate": {"CODEX_HOME": "{{ workspace.home }}/.codex"},
            "secretEnv": [{"name": "CODEX_API_KEY", "secretRef": {"name": "openai", "key": "api-key"}}],
            "configFiles": [{"path": ".codex/config.toml", "content": 'model = "{{ parameters.model }}"\n'}],
            "inputFiles": [{"path": "task.md", "content": "{{ implementation.text }}"}],
            "outputFormat": "codex", "resumable": True}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "coder"}, "spec": {
            "providerRef": {"name": "p"}, "env": [{"name": "PLAIN", "value": "shown"}],
            "defaults": {"parameters": {"baseUrl": "http://127.0.0.1:9/v1"}},
            "security": {"allowedSecrets": ["openai"], "network": {"mode": "off"}}}},
    )


def run_file(cluster: Cluster, text: str = RUN_YAML) -> str:
    path = cluster.repo.parent / "run.yaml"  # next to the repository: "url: repo" is relative to it
    path.write_text(text)
    return str(path)


def test_render_run_shows_what_would_run_and_starts_nothing(cluster: Cluster) -> None:
    setup(cluster)
    out = cluster.ok("render", "run", "-f", run_file(cluster)).out
    rendered = yaml.safe_load(out)
    assert rendered["kind"] == "RenderedRun" and rendered["metadata"] == {"name": "fix-1", "namespace": "default"}
    assert rendered["argv"] == [PY, "exec", "-c", "url=http://127.0.0.1:9/v1", "--model", "o3", "Fix the bug."]
    home = rendered["workspace"]["home"]
    assert rendered["workingDir"] == rendered["workspace"]["path"] == str(cluster.data / "workspaces" / "dry-run-1")
    assert rendered["env"] == {"CODEX_HOME": f"{home}/.codex", "PLAIN": "shown"}
    assert rendered["secretEnv"] == [{"name": "CODEX_API_KEY", "secret": "openai", "key": "api-key"}]
    assert rendered["parameters"] == {"model": "o3", "baseUrl": "http://127.0.0.1:9/v1"}
    assert rendered["configFiles"] == [{"path": ".codex/config.toml", "absolutePath": f"{home}/.codex/config.toml",
                                        "mode": "0600", "content": 'model = "o3"\n'}]
    assert rendered["inputFiles"][0]["content"] == "Fix the bug."
    assert (rendered["outputFormat"], rendered["resumable"]) == ("codex", True)
    assert rendered["network"] == {"mode": "off", "allow": []}
    assert rendered["compiledManifestHash"].startswith("sha256:")
    assert SECRET_VALUE not in out and base64.b64encode(SECRET_VALUE.encode()).decode() not in out
    # nothing was created, nothing started
    assert cluster.store.list(kinds.AGENT_RUN).items == []
    assert not (cluster.data / "runs").exists() and not (cluster.data / "workspaces").exists()
    as_json = json.loads(cluster.ok("render", "run", "-f", run_file(cluster), "-o", "json").out)
    assert as_json == rendered


def test_render_run_reports_a_broken_condition_and_an_unknown_parameter(cluster: Cluster) -> None:
    setup(cluster, when="parameters.baseUrl ==")
    result = cluster.joch("render", "run", "-f", run_file(cluster))
    assert result.code == 2, result
    assert "AgentProvider/p spec.argsTemplate[1].when: syntax error" in result.err
    setup(cluster)
    result = cluster.joch("render", "run", "-f", run_file(cluster, RUN_YAML.replace("{model: o3}", "{modle: o3}")))
    assert result.code == 2, result
    assert 'spec.parameters.modle: AgentProvider/p declares no parameter "modle" (did you mean "model"?)' in (
        result.err)


def test_render_run_usage_errors(cluster: Cluster, tmp_path: Path) -> None:
    setup(cluster)
    assert "only runs can be rendered" in cluster.joch("render", "agent", "-f", run_file(cluster)).err
    two = tmp_path / "two.yaml"
    two.write_text(RUN_YAML + "---\n" + RUN_YAML)
    assert "exactly one AgentRun" in cluster.joch("render", "run", "-f", str(two)).err
    with_secret = RUN_YAML + "  secrets: [openai, other]\n"
    other = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "other"},
             "spec": {"data": {"X": base64.b64encode(b"x").decode()}}}
    cluster.apply(other)
    refused = cluster.joch("render", "run", "-f", run_file(cluster, with_secret))
    assert refused.code == 2 and "spec.secrets[1]: Secret \"other\" is not in the Agent's" in refused.err
    rendered = yaml.safe_load(cluster.ok("render", "run", "-f", run_file(cluster, RUN_YAML + "  secrets: [openai]\n")
                                         ).out)
    assert {"name": "api-key", "secret": "openai", "key": "api-key"} in rendered["secretEnv"]
    missing = cluster.joch("render", "run", "-f", run_file(cluster, RUN_YAML.replace("name: coder", "name: nobody")))
    assert missing.code == 2 and "spec.agentRef.name: agent \"nobody\" not found" in missing.err
