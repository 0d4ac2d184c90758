"""render_invocation and check_templates: a sandbox, one string at a time, errors that name the template."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from joch.compiler.render import (
    MAX_ARGUMENT_BYTES,
    MAX_FILE_BYTES,
    Invocation,
    TemplateError,
    build_context,
    check_templates,
    render_invocation,
)

KEYS = "the context has agent, run, implementation, parameters, workspace, model, memory, session"


def manifest(**provider: Any) -> dict[str, Any]:
    agent_env = provider.pop("agent_env", [])
    return {
        "apiVersion": "joch.dev/v1alpha1", "kind": "CompiledAgentManifest",
        "metadata": {"name": "coder", "namespace": "default"},
        "spec": {"systemPrompt": "Be careful.", "modelRoute": None, "env": agent_env,
                 "provider": {"name": "codex", "binary": "codex", "argsTemplate": [], "envTemplate": {},
                              "inputFiles": [], "outputArtifacts": [], "secretEnv": [], **provider}},
    }


RUN = {"metadata": {"name": "fix-1", "namespace": "default", "uid": "u-1", "labels": {"team": "core"}},
       "spec": {"parameters": {"model": "o3", "level": "high"}}}
WORKSPACE = {"root": "/w", "path": "/w/app", "inputs": "/w/.in", "outputs": "/w/.out"}
IMPLEMENTATION = {"text": "Add a greeting.", "summary": "Greet", "acceptanceCriteria": ["says hello"]}


def context(m: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    ctx = build_context(m or manifest(), run=RUN, attempt=2, implementation=IMPLEMENTATION, workspace=WORKSPACE)
    ctx.update(overrides)
    return ctx


def render(*args: str, **provider: Any) -> Invocation:
    m = manifest(argsTemplate=list(args), **provider)
    return render_invocation(m, context(m))


def error(*args: str, **provider: Any) -> TemplateError:
    with pytest.raises(TemplateError) as info:
        render(*args, **provider)
    return info.value


# --- rendering -----------------------------------------------------------------------------------

def test_every_argument_is_rendered_on_its_own_and_never_by_a_shell() -> None:
    hostile = "a b; rm -rf / && echo $(whoami) `id` \"quoted\" 'single' | tee x > y\n*"
    m = manifest(argsTemplate=["exec", "{{ implementation.text }}", "--level={{ parameters.level }}", "$HOME"])
    inv = render_invocation(m, context(m, implementation={"text": hostile}))
    assert inv.argv == ("codex", "exec", hostile, "--level=high", "$HOME")


def test_the_binary_is_a_template_too() -> None:
    assert render(binary="{{ parameters.model }}-cli").argv == ("o3-cli",)


def test_env_input_files_outputs_and_secret_references() -> None:
    inv = render(
        envTemplate={"JOCH_RUN": "{{ run.name }}/{{ run.attempt }}", "SHARED": "from the provider"},
        inputFiles=[{"path": "task.md", "content": "# {{ implementation.summary }}\n\n{{ implementation.text }}\n"}],
        outputArtifacts=[{"name": "summary", "path": "summary.md", "optional": False},
                         {"name": "log", "path": "x/log.txt", "optional": True}],
        secretEnv=[{"name": "OPENAI_API_KEY", "secretRef": {"name": "openai", "key": "api-key"}}],
        agent_env=[{"name": "SHARED", "value": "{{ from the agent, literal }}"}, {"name": "EMPTY"}],
    )
    assert inv.env == {"JOCH_RUN": "fix-1/2", "SHARED": "{{ from the agent, literal }}", "EMPTY": ""}
    assert inv.input_files == (("task.md", "# Greet\n\nAdd a greeting.\n"),)
    assert inv.outputs == (("summary", "summary.md", False), ("log", "x/log.txt", True))
    assert inv.secret_env == (("OPENAI_API_KEY", "openai", "api-key"),)


def test_an_invocation_is_frozen() -> None:
    inv = render("x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        inv.argv = ()  # type: ignore[misc]


def test_the_context_shape() -> None:
    m = manifest()
    ctx = build_context(m, run=RUN, attempt=2, implementation={"text": "t"}, workspace=WORKSPACE)
    assert ctx["run"] == {"name": "fix-1", "namespace": "default", "uid": "u-1", "attempt": 2,
                          "parameters": {"model": "o3", "level": "high"}, "labels": {"team": "core"}}
    assert ctx["implementation"] == {"text": "t", "summary": None, "description": None, "acceptanceCriteria": [],
                                     "labels": [], "source": None}
    assert ctx["parameters"] == {"model": "o3", "level": "high"}
    assert ctx["agent"]["name"] == "coder" and ctx["agent"]["namespace"] == "default"
    assert ctx["agent"]["systemPrompt"] == "Be careful." and ctx["agent"]["provider"]["name"] == "codex"
    assert (ctx["workspace"], ctx["model"], ctx["memory"]) == (WORKSPACE, {}, {})


def test_context_values_render_as_expected() -> None:
    inv = render("{{ agent.name }}/{{ agent.systemPrompt }}", "{{ run.uid }}", "{{ workspace.path }}",
                 "{{ implementation.acceptanceCriteria | join(',') }}", "{{ parameters | tojson }}",
                 "{{ run.labels.team }}")
    assert inv.argv[1:] == ("coder/Be careful.", "u-1", "/w/app", "says hello", '{"level": "high", "model": "o3"}',
                            "core")


def test_optional_implementation_fields_are_none_not_missing() -> None:
    m = manifest(argsTemplate=["{{ implementation.description or 'none' }}", "{{ implementation.labels | length }}"])
    assert render_invocation(m, context(m, implementation={"text": "t"})).argv[1:] == ("none", "0")


@pytest.mark.parametrize("value", [None, {}])
def test_model_and_memory_may_be_none_or_empty(value: Any) -> None:
    m = manifest(argsTemplate=["{% if model %}{{ model.name }}{% else %}default{% endif %}",
                               "{{ memory.url | default('-') }}"])
    assert render_invocation(m, context(m, model=value, memory=value)).argv[1:] == ("default", "-")


def test_defaults_and_tests_handle_missing_values() -> None:
    assert render("{{ parameters.missing | default('d') }}", "{{ 'y' if parameters.nope is defined else 'n' }}",
                  "{{ parameters['level'] }}").argv[1:] == ("d", "n", "high")


def test_an_empty_argument_stays_an_argument() -> None:
    assert render("", "{{ parameters.missing | default('') }}").argv == ("codex", "", "")


def test_rendering_is_repeatable_and_thread_independent() -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> tuple[str, ...]:
        m = manifest(argsTemplate=["{{ run.name }}", "{{ nope }}" if i % 2 else "ok"])
        try:
            return render_invocation(m, context(m)).argv
        except TemplateError as exc:
            return (exc.message,)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(64)))
    assert set(results) == {("codex", "fix-1", "ok"), (f'undefined variable "nope"; {KEYS}',)}


# --- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("template", "message"), [
    ("{{ implementation.titel }}",
     'undefined variable "implementation.titel"; implementation has acceptanceCriteria, description, labels, '
     "source, summary, text"),
    ("{{ implemntation.text }}", f'undefined variable "implemntation"; {KEYS} (did you mean "implementation"?)'),
    ("{{ parameters.modle }}", 'undefined variable "parameters.modle"; parameters has level, model '
                               '(did you mean "model"?)'),
    ("{{ implementation.acceptanceCriteria[3] }}",
     'undefined variable "implementation.acceptanceCriteria[3]"; implementation.acceptanceCriteria has 1 item'),
    ("{{ parameters['no such'] }}", "undefined variable \"parameters['no such']\"; parameters has level, model"),
    ("{{ implementation.source.url }}",
     '"url" is undefined: it is read from a value that is None (guard it with {% if … %} or use | default(…))'),
    ("{{ run.name.first }}", '"first" is undefined: it is read from a str value, not from a mapping'),
    ("{{ model.route }}", 'undefined variable "model.route"; model has no fields'),
    ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
    ("{{ run.name + 1 }}", 'TypeError: can only concatenate str (not "int") to str'),
    ("{% if %}", "syntax error: Expected an expression, got 'end of statement block'"),
    ("first\n{{ run.name }\nthird", "syntax error on line 2: unexpected '}'"),
    ("{% include 'x' %}", "templates cannot extend, include or import other templates: there is no template loader"),
])
def test_a_template_error_names_the_template_and_says_what_to_do(template: str, message: str) -> None:
    exc = error("ok", template)
    assert exc.path == "AgentProvider/codex spec.argsTemplate[1]"
    assert exc.message == message
    assert str(exc) == f"{exc.path}: {message}"
    assert exc.reason == "TemplateError"


def test_every_template_path_is_named() -> None:
    bad = "{{ nope }}"
    assert error(binary=bad).path == "AgentProvider/codex spec.binary"
    assert error("a", "b", bad).path == "AgentProvider/codex spec.argsTemplate[2]"
    assert error(envTemplate={"OK": "1", "BROKEN": bad}).path == "AgentProvider/codex spec.envTemplate.BROKEN"
    assert error(inputFiles=[{"path": "a", "content": "x"}, {"path": "b", "content": bad}]).path == (
        "AgentProvider/codex spec.inputFiles[1].content")


def test_the_context_lists_only_the_keys_it_has() -> None:
    m = manifest(argsTemplate=["{{ workspace.path }}"])
    with pytest.raises(TemplateError) as info:
        render_invocation(m, {"run": {"name": "x"}})
    assert info.value.message == 'undefined variable "workspace"; the context has run, model, memory, session'


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ run.__class__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ parameters._path }}",
    "{{ self.__init__.__globals__ }}",
    "{{ (run.name).format.__globals__ }}",
])
def test_the_sandbox_refuses_internals(template: str) -> None:
    exc = error(template)
    assert exc.message.startswith("refused by the sandbox: access to attribute ")
    assert "is unsafe" in exc.message and "_Map" not in exc.message


@pytest.mark.parametrize("template", ["{{ parameters.update({'level': 'low'}) }}", "{{ run.labels.clear() }}",
                                      "{{ implementation.labels.append('x') }}"])
def test_the_context_is_immutable(template: str) -> None:
    assert error(template).message.startswith("refused by the sandbox: access to attribute ")


@pytest.mark.parametrize(("template", "message"), [
    ("{{ 'x' * 10**9 }}", "repeating a value of length 1 1000000000 times is too large"),
    ("{{ 10**9 * 'x' }}", "repeating a value of length 1 1000000000 times is too large"),
    ("{{ [1] * 10**9 }}", "repeating a value of length 1 1000000000 times is too large"),
    ("{{ 7 ** 100000 }}", "7 ** 100000 is too large"),
    ("{{ '%99999999d' % 1 }}", "a format width or precision of a million or more is too large"),
    ("{{ '{:99999999}'.format(1) }}", "a format width or precision of a million or more is too large"),
    ("{{ '%.99999999f' | format(1) }}", "a format width or precision of a million or more is too large"),
    ("{{ 'x' | center(10**9) }}", "argument 1000000000 of the center filter is too large"),
    ("{{ 'x'.ljust(10**9) }}", "argument 1000000000 of ljust is too large"),
    ("{{ range(10**9) | list }}", "argument 1000000000 of safe_range is too large"),
])
def test_expressions_that_would_build_huge_values_are_refused(template: str, message: str) -> None:
    assert error(template).message == f"refused by the sandbox: {message}"


def test_lipsum_is_not_available() -> None:
    assert error("{{ lipsum(10) }}").message == f'undefined variable "lipsum"; {KEYS}'


def repeat(text: str, n: int) -> str:
    return "{{ '" + text + "' * " + str(n) + " }}"


def test_an_argument_over_128_kib_points_to_input_files() -> None:
    render(repeat("x", MAX_ARGUMENT_BYTES))  # exactly the limit is fine
    exc = error(repeat("x", MAX_ARGUMENT_BYTES + 1))
    assert exc.message == (
        "renders to more than 128 KiB; one argument or environment value is limited to 128 KiB by the operating "
        "system: write long text to an input file (spec.inputFiles) and pass its path ({{ workspace.inputs }}/<file>)")


def test_multibyte_text_is_measured_in_bytes() -> None:
    exc = error(repeat("é", MAX_ARGUMENT_BYTES // 2 + 1))
    assert exc.message.startswith("renders to 128 KiB; one argument")


def test_output_is_streamed_so_loops_stop_at_the_limit() -> None:
    exc = error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}")
    assert exc.message.startswith("renders to more than 128 KiB")


def test_input_files_may_be_up_to_1_mib() -> None:
    big = repeat("x", MAX_FILE_BYTES)
    ((_, content),) = render(inputFiles=[{"path": "a", "content": big}]).input_files
    assert len(content) == MAX_FILE_BYTES
    exc = error(inputFiles=[{"path": "a", "content": "{{ 'x' * 1000000 }}{{ 'x' * 100000 }}"}])
    assert exc.message == "renders to more than 1.0 MiB; an input file is limited to 1.0 MiB"


def test_argv_and_env_together_are_capped() -> None:
    arg = "{{ 'x' * 120000 }}"
    exc = error(*[arg] * 9)
    assert exc.path == "AgentProvider/codex spec.argsTemplate"
    assert exc.message.startswith("argv and environment render to 1.0 MiB together; the limit is 1.0 MiB: pass long "
                                  "text through spec.inputFiles")


def test_an_empty_binary_and_nul_characters_are_errors() -> None:
    assert error(binary="{{ parameters.missing | default('') }}").message == (
        "renders to an empty string: a command needs a program")
    assert error("a{{ '\\x00' }}b").message.startswith("renders to text with a NUL character")


# --- check_templates -----------------------------------------------------------------------------

def test_a_sound_provider_has_no_problems() -> None:
    m = manifest(binary="codex", argsTemplate=[
        "exec", "{{ implementation.text }}", "{{ parameters.model | default('o3') }}", "{{ agent.systemPrompt }}",
        "{% for c in implementation.acceptanceCriteria %}- {{ c }}\n{% endfor %}",
        "{% set run = {'custom': 1} %}{{ run.custom }}", "{{ workspace.nope | default('x') }}",
        "{{ run.nope is defined }}", "{{ range(3) | list }}", "{{ parameters.anything }}",
        "{{ implementation.text.upper() }}", "{{ agent.provider.binary }}"],
        envTemplate={"A": "{{ run.name }}"}, inputFiles=[{"path": "p", "content": "{{ workspace.inputs }}"}])
    assert check_templates(m) == []


def test_check_templates_finds_what_can_be_known_before_a_run() -> None:
    m = manifest(binary="{{ binary }}", argsTemplate=[
        "{% if %}", "line one\n{{ run.name }", "{{ implementation.titel }}", "{{ workspace['outputz'] }}",
        "{{ agent.sytemPrompt }}", "{% include 'other' %}"],
        envTemplate={"X": "{{ run.attmpt }}"}, inputFiles=[{"path": "p", "content": "{{ nope }} {{ nope2 }}"}])
    assert check_templates(m) == [
        ("AgentProvider/codex spec.binary", f'undefined variable "binary"; {KEYS}'),
        ("AgentProvider/codex spec.argsTemplate[0]", "syntax error: Expected an expression, got 'end of statement "
                                                     "block'"),
        ("AgentProvider/codex spec.argsTemplate[1]", "syntax error on line 2: unexpected '}'"),
        ("AgentProvider/codex spec.argsTemplate[2]", 'undefined variable "implementation.titel"; implementation has '
                                                     "acceptanceCriteria, description, labels, source, summary, text"),
        ("AgentProvider/codex spec.argsTemplate[3]", 'undefined variable "workspace.outputz"; workspace has home, '
                                                     'inputs, outputs, path, root (did you mean "outputs"?)'),
        ("AgentProvider/codex spec.argsTemplate[4]", 'undefined variable "agent.sytemPrompt"; agent has '
         "approvalSeparationOfDuties, approvalTimeoutSeconds, defaults, description, env, maxConcurrentRuns, "
         "mcpServers, memoryRef, modelRoute, name, namespace, "
         "policies, provider, requiresApproval, resources, runtime, security, systemPrompt, tools, writeBack "
         '(did you mean "systemPrompt"?)'),
        ("AgentProvider/codex spec.argsTemplate[5]", "templates cannot extend, include or import other templates: "
                                                     "there is no template loader"),
        ("AgentProvider/codex spec.envTemplate.X", 'undefined variable "run.attmpt"; run has attempt, labels, name, '
                                                   'namespace, parameters, uid (did you mean "attempt"?)'),
        ("AgentProvider/codex spec.inputFiles[0].content", f'undefined variable "nope"; {KEYS}'),
        ("AgentProvider/codex spec.inputFiles[0].content", f'undefined variable "nope2"; {KEYS}'),
    ]


def test_what_check_templates_passes_renders() -> None:
    m = manifest(argsTemplate=["{{ implementation.summary }}", "{{ run.attempt }}", "{{ agent.modelRoute }}"])
    assert check_templates(m) == []
    assert render_invocation(m, context(m)).argv[1:] == ("Greet", "2", "None")


def test_a_template_that_loops_for_ever_is_stopped_with_a_template_error() -> None:
    import time as _time

    from joch.compiler import render as rendering

    started = _time.thread_time()  # the budget's own clock: a loaded machine stretches only wall time
    with pytest.raises(rendering.TemplateError) as caught:
        rendering._render("AgentProvider/p spec.argsTemplate[0]",
                          "{% for i in range(50000) %}{% for j in range(50000) %}{% endfor %}{% endfor %}done",
                          {}, rendering.MAX_ARGUMENT_BYTES)
    assert _time.thread_time() - started < rendering.MAX_RENDER_SECONDS + 2
    assert caught.value.path == "AgentProvider/p spec.argsTemplate[0]"
    assert "longer than 2 s to render" in caught.value.message
    assert rendering._render("x", "{% for i in range(100) %}{{ i }}{% endfor %}", {}, 1000).startswith("0123")


@pytest.mark.parametrize("pad", range(0, 4))
def test_the_time_budget_cannot_be_swallowed_by_jinjas_own_exception_handlers(pad: int) -> None:
    """``is sequence`` runs ``except Exception``: the budget's exception must pass through it, whatever
    line it lands on (the padding moves that line)."""
    import time as _time

    from joch.compiler import render as rendering

    assert not issubclass(rendering._TooSlow, Exception)  # what `except Exception` in Jinja cannot catch
    body = "{% set a = 1 %}" * pad + "{% if j is sequence %}{% endif %}"
    started = _time.thread_time()  # the budget counts this thread's CPU, so does the check: a loaded
    with pytest.raises(rendering.TemplateError, match="longer than"):  # machine stretches wall time only
        rendering._render("p", "{% for i in range(12000) %}{% for j in range(3000) %}" + body
                          + "{% endfor %}{% endfor %}x", {}, rendering.MAX_ARGUMENT_BYTES)
    assert _time.thread_time() - started < rendering.MAX_RENDER_SECONDS + 2


def test_the_time_budget_counts_the_renderings_cpu_not_a_busy_machines_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rendering thread kept waiting (a loaded host, other threads holding the GIL: CI saw a one-line
    ``spec.binary`` fail after 2 s) is not a template looping: only the CPU it spends counts."""
    import time as _time

    from joch.compiler import render as rendering

    class Slow:  # stands for the wait: sleeping spends no CPU, as a descheduled thread does not
        def __str__(self) -> str:
            _time.sleep(0.5)
            return "codex"

    monkeypatch.setattr(rendering, "MAX_RENDER_SECONDS", 0.2)
    assert rendering._render("AgentProvider/p spec.binary", "{{ v }}", {"v": Slow()}, 1000) == "codex"
    with pytest.raises(rendering.TemplateError, match="longer than"):  # a loop still is stopped
        rendering._render("p", "{% for i in range(50000) %}{% for j in range(50000) %}{% endfor %}{% endfor %}",
                          {}, rendering.MAX_ARGUMENT_BYTES)
