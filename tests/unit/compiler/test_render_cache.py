"""Templates are parsed once per source text (every run compiles its agent and renders twice), and
the caches change no answer: the same problems, paths and renderings, the same template errors."""

from __future__ import annotations

from typing import Any

import pytest

from joch.compiler import render
from joch.compiler.render import TemplateError, build_context, check_templates, render_invocation


def manifest(name: str, *args: str) -> dict[str, Any]:
    return {
        "apiVersion": "joch.dev/v1alpha1", "kind": "CompiledAgentManifest",
        "metadata": {"name": "coder", "namespace": "default"},
        "spec": {"env": [], "provider": {"name": name, "binary": "tool", "argsTemplate": list(args),
                                         "envTemplate": {}, "inputFiles": [], "outputArtifacts": [],
                                         "secretEnv": []}},
    }


def context(m: dict[str, Any], run: str = "r-1") -> dict[str, Any]:
    return build_context(m, run={"metadata": {"name": run, "namespace": "default", "uid": "u"}, "spec": {}},
                         attempt=1, implementation={"text": "t"},
                         workspace={"root": "/w", "path": "/w", "inputs": "/i", "outputs": "/o"})


def test_a_template_is_checked_once_and_its_problems_named_for_every_provider() -> None:
    source = "{{ implementation.titel }} {{ nope }}-cache-test"
    first = check_templates(manifest("one", source))
    hits = render._template_problems.cache_info().hits
    second = check_templates(manifest("two", "ok", source))
    assert render._template_problems.cache_info().hits > hits
    assert [m for _, m in first] == [m for _, m in second] and len(first) == 2
    assert {p for p, _ in first} == {"AgentProvider/one spec.argsTemplate[0]"}
    assert {p for p, _ in second} == {"AgentProvider/two spec.argsTemplate[1]"}


def test_a_syntax_error_is_reported_every_time() -> None:
    for _ in range(2):
        assert check_templates(manifest("p", "{{ broken-cache-test ")) == [
            ("AgentProvider/p spec.argsTemplate[0]", "syntax error: unexpected end of template, expected 'end of "
                                                    "print statement'.")]
        with pytest.raises(TemplateError, match="syntax error"):
            m = manifest("p", "{{ broken-cache-test ")
            render_invocation(m, context(m))


def test_a_cached_template_renders_each_runs_own_values() -> None:
    m = manifest("p", "{{ run.name }}-cache-test")
    assert render_invocation(m, context(m, "a")).argv == ("tool", "a-cache-test")
    assert render_invocation(m, context(m, "b")).argv == ("tool", "b-cache-test")


def test_the_caches_are_bounded() -> None:
    assert render._template_problems.cache_info().maxsize == render._compile.cache_info().maxsize == 1024
