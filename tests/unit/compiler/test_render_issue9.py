"""Conditional arguments, parameters (declared, defaulted, overridden), config files and the
session in the template context: rendering and the compile-time checks."""

from __future__ import annotations

from typing import Any

import pytest

from joch.compiler.render import (
    Invocation,
    ParameterError,
    TemplateError,
    build_context,
    check_parameters,
    check_templates,
    effective_parameters,
    render_invocation,
)

WORKSPACE = {"root": "/w", "path": "/w", "inputs": "/r/in", "outputs": "/r/out", "home": "/r/home"}
PARAMETERS = [{"name": "model", "default": "gpt-5-codex", "description": "the model"},
              {"name": "baseUrl", "description": "unset = the vendor's"}]


def manifest(agent_parameters: dict[str, str] | None = None, **provider: Any) -> dict[str, Any]:
    return {
        "apiVersion": "joch.dev/v1alpha1", "kind": "CompiledAgentManifest",
        "metadata": {"name": "coder", "namespace": "default"},
        "spec": {"env": [], "defaults": {"parameters": agent_parameters or {}},
                 "provider": {"name": "codex", "binary": "codex", "argsTemplate": [], "envTemplate": {},
                              "inputFiles": [], "outputArtifacts": [], "secretEnv": [], **provider}},
    }


def run(**parameters: str) -> dict[str, Any]:
    return {"metadata": {"name": "r", "namespace": "default", "uid": "u"}, "spec": {"parameters": parameters}}


def render(m: dict[str, Any], session: dict[str, Any] | None = None, **parameters: str) -> Invocation:
    ctx = build_context(m, run=run(**parameters), attempt=1, implementation={"text": "t"}, workspace=WORKSPACE,
                        session=session)
    return render_invocation(m, ctx)


CODEX = dict(parameters=PARAMETERS, argsTemplate=[
    "exec",
    {"when": "parameters.baseUrl", "args": ["-c", 'openai_base_url="{{ parameters.baseUrl }}"']},
    {"when": "session.id", "args": ["resume", "{{ session.id }}"]},
    "--model", "{{ parameters.model }}",
    "{{ parameters.baseUrl | default('') }}",
])


def test_a_conditional_argument_is_included_only_when_its_condition_holds() -> None:
    m = manifest(**CODEX)
    assert render(m).argv == ("codex", "exec", "--model", "gpt-5-codex", "")  # a plain "" is still passed
    assert render(m, baseUrl="http://127.0.0.1:9/v1").argv == (
        "codex", "exec", "-c", 'openai_base_url="http://127.0.0.1:9/v1"', "--model", "gpt-5-codex",
        "http://127.0.0.1:9/v1")
    resumed = render(m, {"id": "sess-1", "resumedFrom": 1})
    assert resumed.argv[2:4] == ("resume", "sess-1")


@pytest.mark.parametrize(("when", "included"), [
    ("parameters.baseUrl is defined", False), ("parameters.model is defined", True),
    ("parameters.model == 'gpt-5-codex'", True), ("not parameters.baseUrl", True),
    ("parameters.baseUrl or parameters.model", True), ("session.resumedFrom", False),
    ("parameters.model in ['o3', 'o4']", False),
])
def test_when_is_a_sandboxed_expression(when: str, included: bool) -> None:
    m = manifest(parameters=PARAMETERS, argsTemplate=[{"when": when, "args": ["yes"]}])
    assert render(m).argv == (("codex", "yes") if included else ("codex",))


def test_an_undefined_name_in_when_is_still_an_error() -> None:
    m = manifest(argsTemplate=["a", {"when": "paramters.baseUrl", "args": ["x"]}])
    with pytest.raises(TemplateError) as info:
        render(m)
    assert info.value.path == "AgentProvider/codex spec.argsTemplate[1].when"
    assert 'did you mean "parameters"' in info.value.message


def test_when_must_be_one_expression_within_the_sandbox_bounds() -> None:
    for bad in ("x %}{{ 1 }}{% if y", "a b", "{{ x }}", "(", "''.__class__.__mro__[1]", "'x' * 10**10",
                "parameters.x.y", "1 / 0"):
        m = manifest(argsTemplate=["a", "b", {"when": bad, "args": ["x"]}])
        with pytest.raises(TemplateError) as info:
            render(m)
        assert info.value.path == "AgentProvider/codex spec.argsTemplate[2].when"


def test_check_templates_covers_conditions_their_args_and_config_files() -> None:
    m = manifest(argsTemplate=["a", "b", "c", {"when": "sesion.id", "args": ["ok", "{{ nope }}"]},
                               {"when": "x +", "args": ["y"]}],
                 configFiles=[{"path": "{{ workspace.hom }}/x", "content": "{% if %}"}])
    found = dict(check_templates(m))
    assert set(found) == {
        "AgentProvider/codex spec.argsTemplate[3].when", "AgentProvider/codex spec.argsTemplate[3].args[1]",
        "AgentProvider/codex spec.argsTemplate[4].when", "AgentProvider/codex spec.configFiles[0].path",
        "AgentProvider/codex spec.configFiles[0].content"}
    assert 'did you mean "session"' in found["AgentProvider/codex spec.argsTemplate[3].when"]
    assert "syntax error" in found["AgentProvider/codex spec.argsTemplate[4].when"]
    assert 'did you mean "home"' in found["AgentProvider/codex spec.configFiles[0].path"]
    # a valid provider: nothing to report
    assert check_templates(manifest(**CODEX)) == []


def test_parameters_take_provider_defaults_then_the_agent_then_the_run() -> None:
    m = manifest({"model": "agent-model", "baseUrl": "http://agent"}, parameters=PARAMETERS)
    assert effective_parameters(m, {}) == {"model": "agent-model", "baseUrl": "http://agent"}
    assert effective_parameters(m, {"model": "run-model"}) == {"model": "run-model", "baseUrl": "http://agent"}
    assert effective_parameters(manifest(parameters=PARAMETERS), {}) == {"model": "gpt-5-codex"}
    inv = render(manifest({"model": "agent-model"}, **CODEX), model="run-model")
    assert inv.argv[-2] == "run-model" and inv.parameters == {"model": "run-model"}


def test_an_undeclared_parameter_is_an_error_when_the_provider_declares_any() -> None:
    with pytest.raises(ParameterError) as info:
        render(manifest(**CODEX), modle="x")
    assert info.value.path == "spec.parameters.modle"
    assert 'declares no parameter "modle" (did you mean "model"?)' in info.value.message
    assert check_parameters(manifest({"baseurl": "x"}, **CODEX)) == [(
        "Agent spec.defaults.parameters.baseurl",
        'AgentProvider/codex declares no parameter "baseurl" (did you mean "baseUrl"?); it declares model, baseUrl')]
    # a provider that declares none takes any (what templates read is up to them)
    assert render(manifest(argsTemplate=["{{ parameters.anything }}"]), anything="v").argv == ("codex", "v")


def test_config_files_are_rendered_below_home() -> None:
    m = manifest(parameters=PARAMETERS, configFiles=[
        {"path": ".codex/config.toml", "content": 'model = "{{ parameters.model }}"\nhome = "{{ workspace.home }}"\n'},
        {"path": "{{ 'sub' }}/./x.json", "content": "{}", "mode": 0o640}])
    inv = render(m)
    assert inv.config_files == ((".codex/config.toml", 'model = "gpt-5-codex"\nhome = "/r/home"\n', 0o600),
                                ("sub/x.json", "{}", 0o640))


@pytest.mark.parametrize("path", ["{{ '..' }}/x", "{{ '/etc' }}/passwd", "{{ '' }}"])
def test_a_config_path_that_renders_outside_home_is_refused(path: str) -> None:
    with pytest.raises(TemplateError) as info:
        render(manifest(configFiles=[{"path": path, "content": "x"}]))
    assert info.value.path == "AgentProvider/codex spec.configFiles[0].path"


def test_the_invocation_carries_the_provider_policies() -> None:
    inv = render(manifest(outputFormat="claude-code", resumable=True, versionArgs=[],
                          successPolicy={"requireChanges": True, "failurePatterns": ["x"]},
                          patch={"exclude": [".aider*"], "maxFileBytes": 10}))
    assert (inv.output_format, inv.resumable, inv.version_args) == ("claude-code", True, ())
    assert inv.success == {"requireChanges": True, "failurePatterns": ["x"]}
    assert inv.patch == {"exclude": [".aider*"], "maxFileBytes": 10}
    assert render(manifest()).version_args == ("--version",)
