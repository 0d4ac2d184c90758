"""Templates cannot take the server's memory: every value a template builds is bounded while it is
built (1 MiB each, 16 MiB per rendering), so the attempts below fail fast, naming the template,
having allocated a few MiB at most. Before, the doubling ones allocated 512 MiB (1.7 GB at peak)."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest

from joch.compiler.render import MAX_FILE_BYTES, TemplateError, build_context, render_invocation

MIB = "{% set x = 'a' * 2**20 %}"
HALF = "{% set x = 'a' * 2**19 %}"
KIB = "{% set x = 'a' * 2**10 %}"

HOSTILE = [
    MIB + "{% set x = x ~ x %}" * 9,
    MIB + "{% set x = x + x %}" * 9,
    HALF + "{% set y %}{{ x }}{{ x }}{{ x }}{% endset %}",
    HALF + "{% macro m() %}{{ x }}{{ x }}{{ x }}{% endmacro %}{% set y = m() %}",
    HALF + "{% set y = [x, x, x] %}{% set z = y | join %}",
    HALF + "{% set y = [x, x, x] %}{{ y }}",
    HALF + "{% set y = [x, x, x] | string %}",
    KIB + "{% set y = x.replace('a', x) %}",
    KIB + "{% set y = x | replace('a', x) %}",
    KIB + "{% set y = x.join(['a'] * 2000) %}",
    "{% set x = '{0}' * 2**10 %}{% set y = x.format('a' * 2**10) %}",
    "{% set x = '%s' * 2**10 %}{% set y = x % (('a' * 2**10,) * 2**10) %}",
    "{% set x = 'a\n' * 2**10 %}{% set y = x | indent('a' * 2**10) %}",
    "{% set x = '\t' * 2**19 %}{% set y = x.expandtabs(2**10) %}",
    # many values, each under the bound: the rendering's total is bounded too
    "{% set x = 'a' * 2**19 %}" + "".join(f"{{% set v{i} = x ~ {i} %}}" for i in range(60)),
    "{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = ns.l + ['a' * 2**19] %}{% endfor %}",
]


def render_file(content: str) -> Any:
    provider = {"name": "p", "binary": "x", "argsTemplate": [], "envTemplate": {}, "outputArtifacts": [],
                "secretEnv": [], "inputFiles": [{"path": "f.txt", "content": content}]}
    manifest = {"metadata": {"name": "a", "namespace": "default"}, "spec": {"provider": provider, "env": []}}
    context = build_context(manifest, run={"metadata": {"name": "r"}}, attempt=1, implementation={"text": "t"},
                            workspace={"root": "/w", "path": "/w", "inputs": "/i", "outputs": "/o"})
    return render_invocation(manifest, context)


@pytest.mark.parametrize("template", HOSTILE)
def test_templates_that_would_build_huge_values_fail_fast_without_allocating(template: str) -> None:
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(TemplateError) as caught:
            render_file(template)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.path == "AgentProvider/p spec.inputFiles[0].content"
    assert "would build more than 1.0 MiB of text" in caught.value.message or (
        "built more than 16.0 MiB of text in all" in caught.value.message)
    assert "a provider template should only assemble text" in caught.value.message
    assert peak < 24 * 2**20, f"peaked at {peak / 2**20:.0f} MiB"
    assert time.monotonic() - started < 2


def test_an_input_file_of_the_full_size_still_renders() -> None:
    text = "x" * (MAX_FILE_BYTES - 10)
    invocation = render_file("{% set y = 'x' * " + str(MAX_FILE_BYTES - 10) + " %}{{ y }}")
    assert invocation.input_files == (("f.txt", text),)
