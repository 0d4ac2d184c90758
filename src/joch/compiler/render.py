"""Rendering a compiled provider into the command a run executes: argv, env and input files.

Design decisions:

* **A sandbox, one string at a time.** Every template (the binary, each ``argsTemplate`` element,
  each ``envTemplate`` value, each input file's content) is rendered on its own by a Jinja2
  ``ImmutableSandboxedEnvironment`` with autoescape off. An argv element stays one argument
  whatever it renders to — spaces, quotes, ``;`` — because the command never passes through a shell.
* **Missing is an error, never an empty string.** ``StrictUndefined`` fails on any use of an
  undefined value; ``{{ x | default("y") }}`` and ``{% if x is defined %}`` still work. Context
  values carry their own path, so the message names the whole expression that was missing
  (``undefined variable "implementation.titel"; implementation has acceptanceCriteria, …``).
* **Every failure is a ``TemplateError``** whose ``path`` names the template
  (``AgentProvider/codex spec.argsTemplate[1]``): syntax errors, undefined values, sandbox refusals
  (``{{ ''.__class__ }}``), runtime errors (``{{ 1 / 0 }}``) and oversized results.
* **Sizes are capped where they would fail anyway.** Linux refuses a single argument or environment
  string over 128 KiB (``MAX_ARG_STRLEN``) and a whole command line past a few MiB, with an ``E2BIG``
  that names nothing; the renderer refuses first, naming the template and pointing to input files,
  which may be up to 1 MiB each. Output is streamed, so a loop cannot build a gigabyte before the
  check, and the obvious single expressions that could (``"x" * 10**10``, ``10**10**10``,
  ``"{:999999999}".format(1)``, ``center(10**9)``) are refused before they run.
* **Memory is bounded while rendering, not after.** Rendering runs in the server's controllers, so
  a template must not be able to take the process's memory: ``{% set x = x ~ x %}`` nine times
  over a 1 MiB string allocated 512 MiB (1.7 GB at peak) well within the time budget. Every way a
  template builds a value goes through the sandbox — operators (``+ * % ~``), calls, filters,
  the joins behind ``{% set %}`` blocks, macros and ``~`` (installed into each compiled template,
  ``_Template``) and output (``finalize``) — and each is checked *before* it allocates where the
  result could outgrow its inputs (a repeat, a join, ``replace``, ``indent``, a format) and
  after otherwise: no value may exceed ``_MAX_INTERMEDIATE`` characters (counting what a list or
  mapping would print), and one rendering may build at most ``MAX_RENDER_WORK`` characters in all,
  so a template cannot keep many large values alive either. CPU time has its own budget
  (``_time_budget``). Templates are written by whoever may edit AgentProviders, not by the agent or
  the implementation text, which are only data; the bounds keep a mistake, or a hostile provider,
  from taking the server down.
* ``check_templates`` is the compile-time half: it parses every template and resolves what can be
  known without a run — top-level names, fields of the fixed-shape context values, includes — so
  the Agent controller reports a broken provider (``Ready=False``, reason ``TemplateError``) before
  any run fails on it.
* **Parsed once.** Every run checks its provider's templates (compiling its agent) and renders
  them, the same few sources again and again: compiled templates and each source's problems are
  kept in bounded LRU caches keyed by the source text, so a template is parsed once, not per run.

The template context (``build_context`` builds it from the objects):

* ``agent``: ``{name, namespace, …}`` plus every field of the compiled Agent spec, defaults filled
  in (``systemPrompt``, ``modelRoute``, ``env``, ``defaults``, ``security``, …) and ``provider``.
* ``run``: ``{name, namespace, uid, attempt, parameters, labels}``.
* ``implementation``: ``{text, summary, description, acceptanceCriteria, labels, source}``; optional
  fields are ``None`` or ``[]``, never missing (``render_invocation`` fills them in).
* ``parameters``: the effective parameters (``effective_parameters``): the provider's declared
  defaults, overridden by the Agent's ``defaults.parameters``, overridden by the run's
  ``spec.parameters`` (a map of strings; also ``run.parameters``). A parameter nobody set is
  *undefined*: ``{{ parameters.baseUrl }}`` fails, ``{{ parameters.baseUrl | default("") }}`` and
  ``parameters.baseUrl is defined`` do not, and in a ``when`` condition it is simply false.
* ``workspace``: ``{root, path, inputs, outputs, home}`` — absolute paths (``joch.runtime.base.Workspace``).
* ``session``: ``{id, resumedFrom}``: the agent CLI's session id this attempt continues and the
  attempt it came from, both ``None`` when the attempt starts over.
* ``model`` and ``memory``: maps the caller resolved, or ``{}`` when the agent has none (``None``
  is taken as ``{}``).

**Conditional arguments.** An ``argsTemplate`` item is a string (always passed, even when it renders
to ``""``: nothing is dropped silently) or ``{when, args}``: ``when`` is one Jinja *expression*
(``parameters.baseUrl``, ``session.id``, ``parameters.effort in ["low", "high"]``) evaluated in the
same sandbox; truthy includes every rendered element of ``args``, falsy none. Reading a key a map
does not have is false there (not an error), while an undefined top-level name still is one.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import posixpath
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from types import FrameType
from typing import Any, cast

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError
from jinja2.meta import find_undeclared_variables
from jinja2.runtime import Context, StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

from joch.api.kinds import AgentSpec

CONTEXT_KEYS = ("agent", "run", "implementation", "parameters", "workspace", "model", "memory", "session")
SHAPES: Mapping[str, tuple[str, ...]] = {
    "agent": ("name", "namespace", "provider", *(f for f in AgentSpec.model_fields if f != "providerRef")),
    "run": ("name", "namespace", "uid", "attempt", "parameters", "labels"),
    "implementation": ("text", "summary", "description", "acceptanceCriteria", "labels", "source"),
    "workspace": ("root", "path", "inputs", "outputs", "home"),
    "session": ("id", "resumedFrom"),
}
"""The context values whose fields are fixed, so a misspelt field is found before any run."""

MAX_ARGUMENT_BYTES = 128 * 1024  # Linux MAX_ARG_STRLEN: one argv element, or one NAME=value
MAX_COMMAND_BYTES = 1024 * 1024  # argv and env together, well below ARG_MAX's usual 2 MiB
MAX_FILE_BYTES = 1024 * 1024     # one rendered input file
MAX_RENDER_SECONDS = 2.0         # one template's rendering
MAX_RENDER_WORK = 16 * 1024 * 1024  # characters one rendering may build in all, intermediates included
_MAX_INTERMEDIATE = MAX_FILE_BYTES  # any string, repeat count or width built inside a template
_MAX_POWER_BITS = 64 * 1024
_FORMAT_WIDTH = re.compile(r"%[-#0 +]*\d{7,}|%[-#0 +]*\d*\.\d{7,}|\{[^{}]*:[^{}]*\d{7,}[^{}]*\}")


class TemplateError(Exception):
    """A provider template that cannot be rendered: ``path`` names it, ``message`` says why."""

    reason = "TemplateError"

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class ParameterError(Exception):
    """A parameter the provider does not declare (``path`` names where it was set)."""

    reason = "UnknownParameter"

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True)
class Invocation:
    """What a run executes. Secrets are references here (env name, Secret name, key): the runtime
    resolves their values into the process environment only. The provider's policies are carried
    as written (camelCase keys, defaults filled in by the compiled manifest)."""

    argv: tuple[str, ...]
    env: dict[str, str]
    input_files: tuple[tuple[str, str], ...]       # (path below workspace.inputs, content)
    outputs: tuple[tuple[str, str, bool], ...]     # (name, path below workspace.outputs, optional)
    secret_env: tuple[tuple[str, str, str], ...]   # (env name, Secret name, key)
    config_files: tuple[tuple[str, str, int], ...] = ()   # (path below workspace.home, content, mode)
    output_format: str | None = None
    success: Mapping[str, Any] = dataclass_field(default_factory=dict)   # spec.successPolicy
    patch: Mapping[str, Any] = dataclass_field(default_factory=dict)     # spec.patch
    version_args: tuple[str, ...] = ("--version",)
    resumable: bool = False
    parameters: Mapping[str, str] = dataclass_field(default_factory=dict)  # the effective parameters


# --- the context ---------------------------------------------------------------------------------

def effective_parameters(manifest: Mapping[str, Any], run_parameters: Mapping[str, str]) -> dict[str, str]:
    """The provider's declared defaults ← the Agent's ``defaults.parameters`` ← the run's
    ``spec.parameters``. A provider that declares parameters declares all it takes: a value for
    another name (a typo, most likely) is a ``ParameterError``; a provider that declares none takes
    any (templates read what they expect, and a missing one is undefined)."""
    spec = manifest.get("spec") or {}
    provider = spec.get("provider") or {}
    declared = [p for p in provider.get("parameters") or [] if isinstance(p, Mapping)]
    names = [str(p["name"]) for p in declared]
    agent_values = dict((spec.get("defaults") or {}).get("parameters") or {})
    if names:
        for where, values in (("Agent spec.defaults.parameters", agent_values), ("spec.parameters", run_parameters)):
            for key in values:
                if key not in names:
                    raise ParameterError(f"{where}.{key}", (
                        f'AgentProvider/{provider.get("name", "?")} declares no parameter "{key}"'
                        f"{_did_you_mean(key, names)}; it declares {', '.join(names)}"))
    out = {str(p["name"]): str(p["default"]) for p in declared if p.get("default") is not None}
    out.update(agent_values)
    out.update(run_parameters)
    return out


def build_context(
    manifest: Mapping[str, Any], *, run: Mapping[str, Any], attempt: int,
    implementation: Mapping[str, Any], workspace: Mapping[str, str],
    model: Mapping[str, Any] | None = None, memory: Mapping[str, Any] | None = None,
    session: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The template context of one run attempt: ``run`` is the AgentRun object, ``implementation``
    the ImplementationSpec's spec (referenced or inline), ``workspace`` the runtime's paths,
    ``session`` the CLI session this attempt resumes (``{id, resumedFrom}``; None: it starts over).
    ``ParameterError`` for a parameter the provider does not declare."""
    run_meta = run.get("metadata") or {}
    parameters = effective_parameters(manifest, dict((run.get("spec") or {}).get("parameters") or {}))
    session = session or {}
    return {
        "agent": agent_context(manifest),
        "run": {"name": run_meta.get("name"), "namespace": run_meta.get("namespace"),
                "uid": run_meta.get("uid"), "attempt": attempt, "parameters": parameters,
                "labels": dict(run_meta.get("labels") or {})},
        "implementation": implementation_context(implementation),
        "parameters": parameters,
        "workspace": dict(workspace),
        "model": dict(model or {}),
        "memory": dict(memory or {}),
        "session": {"id": session.get("id"), "resumedFrom": session.get("resumedFrom")},
    }


def agent_context(manifest: Mapping[str, Any]) -> dict[str, Any]:
    meta = manifest.get("metadata") or {}
    return {**(manifest.get("spec") or {}), "name": meta.get("name"), "namespace": meta.get("namespace")}


def implementation_context(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "text": spec.get("text", ""),
        "summary": spec.get("summary"),
        "description": spec.get("description"),
        "acceptanceCriteria": list(spec.get("acceptanceCriteria") or []),
        "labels": list(spec.get("labels") or []),
        "source": dict(spec["source"]) if spec.get("source") else None,
    }


# --- rendering -----------------------------------------------------------------------------------

def render_invocation(manifest: Mapping[str, Any], context: Mapping[str, Any]) -> Invocation:
    """Render the manifest's provider against ``context``; ``TemplateError`` on the first failure."""
    spec = manifest["spec"]
    provider = spec["provider"]
    where = _where(provider)
    values = {key: _with_paths(value, key) for key, value in context.items()}
    if isinstance(context.get("implementation"), Mapping):
        values["implementation"] = _with_paths(implementation_context(context["implementation"]), "implementation")
    for key in ("model", "memory"):
        if values.get(key, None) is None:
            values[key] = _Map({}, key)
    if values.get("session", None) is None:
        values["session"] = _Map({"id": None, "resumedFrom": None}, "session")
    token = _KEYS.set(tuple(values))
    try:
        binary = _render(f"{where} spec.binary", provider["binary"], values, MAX_ARGUMENT_BYTES)
        if not binary:
            raise TemplateError(f"{where} spec.binary", "renders to an empty string: a command needs a program")
        argv = (binary, *_render_args(where, provider.get("argsTemplate") or [], values))
        env = {name: _render(f"{where} spec.envTemplate.{name}", text, values, MAX_ARGUMENT_BYTES - len(name) - 1)
               for name, text in (provider.get("envTemplate") or {}).items()}
        files = tuple((f["path"], _render(f"{where} spec.inputFiles[{i}].content", f["content"], values,
                                          MAX_FILE_BYTES))
                      for i, f in enumerate(provider.get("inputFiles") or []))
        configs = tuple(_render_config(where, i, f, values) for i, f in enumerate(provider.get("configFiles") or []))
    finally:
        _KEYS.reset(token)
    # The Agent's env is literal (not templated) and wins over the provider's: it is the more
    # specific of the two.
    env.update({e["name"]: e.get("value", "") for e in spec.get("env") or []})
    _check_command(where, argv, env)
    return Invocation(
        argv=argv,
        env=env,
        input_files=files,
        outputs=tuple((o["name"], o["path"], bool(o.get("optional", False)))
                      for o in provider.get("outputArtifacts") or []),
        secret_env=tuple((s["name"], s["secretRef"]["name"], s["secretRef"]["key"])
                         for s in provider.get("secretEnv") or []),
        config_files=configs,
        output_format=provider.get("outputFormat"),
        success=dict(provider.get("successPolicy") or {}),
        patch=dict(provider.get("patch") or {}),
        version_args=tuple(("--version",) if provider.get("versionArgs") is None else provider["versionArgs"]),
        resumable=bool(provider.get("resumable")),
        parameters=dict(context.get("parameters") or {}),
    )


def _render_args(where: str, items: list[Any], values: Mapping[str, Any]) -> Iterator[str]:
    for i, item in enumerate(items):
        if isinstance(item, str):
            yield _render(f"{where} spec.argsTemplate[{i}]", item, values, MAX_ARGUMENT_BYTES)
            continue
        path = f"{where} spec.argsTemplate[{i}].when"
        try:
            source = _when_source(item["when"])
        except TemplateSyntaxError as exc:
            raise TemplateError(path, _syntax(exc)) from None
        if _render(path, source, values, 1, when=True):
            for j, text in enumerate(item.get("args") or []):
                yield _render(f"{where} spec.argsTemplate[{i}].args[{j}]", text, values, MAX_ARGUMENT_BYTES)


def _render_config(where: str, i: int, config: Mapping[str, Any], values: Mapping[str, Any]) -> tuple[str, str, int]:
    path = _render(f"{where} spec.configFiles[{i}].path", config["path"], values, 4096)
    normal = posixpath.normpath(path.replace("\\", "/"))
    if not path or posixpath.isabs(normal) or normal in (".", "..") or normal.startswith("../"):
        raise TemplateError(f"{where} spec.configFiles[{i}].path", (
            f'renders to "{path}": a config file\'s path must be relative to the attempt\'s HOME and stay '
            'inside it (no leading "/", no ".." that leaves it)'))
    content = _render(f"{where} spec.configFiles[{i}].content", config["content"], values, MAX_FILE_BYTES)
    return normal, content, int(config.get("mode", 0o600))


@functools.lru_cache(maxsize=1024)
def _when_source(expression: str) -> str:
    """A ``when`` expression as a template that renders ``1`` when it holds and nothing otherwise;
    ``TemplateSyntaxError`` unless the text is exactly one expression (so it cannot close the tag)."""
    _ENV.compile_expression(expression)  # parses only; a statement or a second expression is an error
    return "{% if (" + expression + ") %}1{% endif %}"


def check_templates(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every problem that can be found without a run: (template path, message)."""
    return [(path, message) for path, source in templates(manifest) for message in _template_problems(source)]


def check_parameters(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The Agent's ``defaults.parameters`` against the parameters its provider declares."""
    try:
        effective_parameters(manifest, {})
    except ParameterError as exc:
        return [(exc.path, exc.message)]
    return []


@functools.lru_cache(maxsize=1024)
def _template_problems(source: str) -> tuple[str, ...]:
    try:
        if source.startswith(_WHEN_PREFIX):
            source = _when_source(source[len(_WHEN_PREFIX):])
        ast = _ENV.parse(source)
    except TemplateSyntaxError as exc:
        return (_syntax(exc),)
    return tuple(_static_problems(ast))


_WHEN_PREFIX = "\0when:"  # marks a ``when`` expression among ``templates``' sources (no template holds NUL)


def templates(manifest: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, source) of every template of the manifest's provider, in rendering order."""
    provider = manifest["spec"]["provider"]
    where = _where(provider)
    yield f"{where} spec.binary", provider["binary"]
    for i, item in enumerate(provider.get("argsTemplate") or []):
        if isinstance(item, str):
            yield f"{where} spec.argsTemplate[{i}]", item
            continue
        yield f"{where} spec.argsTemplate[{i}].when", _WHEN_PREFIX + item["when"]
        for j, text in enumerate(item.get("args") or []):
            yield f"{where} spec.argsTemplate[{i}].args[{j}]", text
    for name, text in (provider.get("envTemplate") or {}).items():
        yield f"{where} spec.envTemplate.{name}", text
    for i, f in enumerate(provider.get("inputFiles") or []):
        yield f"{where} spec.inputFiles[{i}].content", f["content"]
    for i, f in enumerate(provider.get("configFiles") or []):
        yield f"{where} spec.configFiles[{i}].path", f["path"]
        yield f"{where} spec.configFiles[{i}].content", f["content"]


def _where(provider: Mapping[str, Any]) -> str:
    return f"AgentProvider/{provider.get('name', '?')}"


class _TooSlow(BaseException):
    """A BaseException, raised from the trace function into whatever frame runs: Jinja's own
    ``except Exception`` (in tests such as ``is sequence``) must not swallow it."""


@contextlib.contextmanager
def _time_budget(seconds: float) -> Iterator[None]:
    """Abort the rendering (``_TooSlow`` from inside it) once it has run ``seconds``.

    Jinja compiles a template to Python functions, so a trace function sees every line they run:
    two nested ``range(50000)`` loops are stopped after ``seconds`` instead of pinning a controller
    worker — and with it the run's cancel and delete — for hours. Tracing costs a few times the
    (sub-millisecond) rendering of a normal template; the clock is read every 256 lines. The clock is
    the rendering thread's CPU time: a loop spends it, while a thread merely waiting for a CPU (a
    loaded machine, other threads holding the GIL) does not, so a busy host never fails a normal
    template."""
    deadline = time.thread_time() + seconds
    lines = 0

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal lines
        lines += 1
        if not lines & 0xFF and time.thread_time() > deadline:
            raise _TooSlow
        return local


    def calls(frame: FrameType, event: str, arg: object) -> Any:
        return local if event == "call" else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        yield
    finally:
        sys.settrace(previous)


def render_text(path: str, source: str, values: Mapping[str, Any], *, limit: int = 256 * 1024) -> str:
    """One text template (write-back's comment body, pull request title and body) over ``values`` in
    the same sandbox and under the same bounds as a provider's templates; every failure is a
    ``TemplateError`` naming ``path``."""
    return _render(path, source, values, limit)


def _render(path: str, source: str, values: Mapping[str, Any], limit: int, *, when: bool = False) -> str:
    work = _WORK.set(_Work())
    try:
        template = _compile(source, when)
        size = 0
        parts: list[str] = []
        deadline = time.thread_time() + MAX_RENDER_SECONDS  # CPU time, as _time_budget
        with _time_budget(MAX_RENDER_SECONDS):
            for chunk in template.generate(values):
                if time.thread_time() > deadline:  # a backstop the template's code cannot reach
                    raise _TooSlow
                size += len(chunk)  # characters: a lower bound of the UTF-8 size
                if size > limit:
                    raise TemplateError(path, _too_big(path, f"more than {_size(limit)}", limit))
                parts.append(chunk)
    except TemplateError:
        raise
    except _TooLarge as exc:
        raise TemplateError(path, f"{exc}; a provider template should only assemble text (long text belongs "
                            "in the context, e.g. implementation.text, not built by the template)") from None
    except _TooSlow:
        raise TemplateError(path, f"took longer than {MAX_RENDER_SECONDS:g} s to render (a loop too many?); "
                            "a provider template should only assemble text") from None
    except TemplateSyntaxError as exc:
        raise TemplateError(path, _syntax(exc)) from None
    except SecurityError as exc:
        shown = str(exc).replace("'_Map'", "'dict'").replace("'_List'", "'list'")
        raise TemplateError(path, f"refused by the sandbox: {shown}") from None
    except UndefinedError as exc:
        raise TemplateError(path, str(exc)) from None
    except jinja2.TemplateError as exc:
        raise TemplateError(path, str(exc) or type(exc).__name__) from None
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError,
            MemoryError) as exc:
        raise TemplateError(path, f"{type(exc).__name__}: {exc}") from None
    finally:
        _WORK.reset(work)
    text = "".join(parts)
    encoded = len(text.encode("utf-8", "surrogatepass"))
    if encoded > limit:
        raise TemplateError(path, _too_big(path, _size(encoded), limit))
    if "\x00" in text:
        raise TemplateError(path, "renders to text with a NUL character, which a process argument, "
                            "environment value or file name cannot hold")
    return text


def _check_command(where: str, argv: tuple[str, ...], env: Mapping[str, str]) -> None:
    total = sum(len(a.encode()) + 1 for a in argv) + sum(len(k.encode()) + len(v.encode()) + 2
                                                         for k, v in env.items())
    if total > MAX_COMMAND_BYTES:
        raise TemplateError(f"{where} spec.argsTemplate", (
            f"argv and environment render to {_size(total)} together; the limit is "
            f"{_size(MAX_COMMAND_BYTES)}: pass long text through spec.inputFiles and a path instead"))


def _too_big(path: str, size: str, limit: int) -> str:
    if ".inputFiles[" in path:
        return f"renders to {size}; an input file is limited to {_size(limit)}"
    return (f"renders to {size}; one argument or environment value is limited to {_size(limit)} by the "
            "operating system: write long text to an input file (spec.inputFiles) and pass its path "
            "({{ workspace.inputs }}/<file>)")


def _size(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB" if n >= 1024 * 1024 else f"{n / 1024:.0f} KiB"


def _syntax(exc: TemplateSyntaxError) -> str:
    line = f" on line {exc.lineno}" if exc.lineno and exc.source and exc.source.count("\n") else ""
    return f"syntax error{line}: {exc.message}"


@functools.lru_cache(maxsize=1024)
def _compile(source: str, when: bool = False) -> jinja2.Template:
    env = _WHEN_ENV if when else _ENV
    ast = env.parse(source)
    if _loads_templates(ast):
        raise jinja2.TemplateError(_NO_LOADER)
    return env.from_string(ast)


_NO_LOADER = "templates cannot extend, include or import other templates: there is no template loader"


def _loads_templates(ast: nodes.Template) -> bool:
    return any(True for _ in ast.find_all((nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport)))


# --- values that know where they are, and what is missing ---------------------------------------

_KEYS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("joch_template_keys", default=CONTEXT_KEYS)


class _Map(dict[str, Any]):
    """A context mapping that knows its path (``implementation``, ``agent.spec``) for messages.
    Templates cannot see ``_path``: the sandbox refuses attributes starting with ``_``."""

    __slots__ = ("_path",)

    def __init__(self, items: Mapping[str, Any], path: str) -> None:
        super().__init__(items)
        self._path = path


class _List(list[Any]):
    __slots__ = ("_path",)

    def __init__(self, items: list[Any], path: str) -> None:
        super().__init__(items)
        self._path = path


def _with_paths(value: Any, path: str) -> Any:
    if isinstance(value, Mapping):
        return _Map({str(k): _with_paths(v, _join(path, str(k))) for k, v in value.items()}, path)
    if isinstance(value, list | tuple):
        return _List([_with_paths(v, f"{path}[{i}]") for i, v in enumerate(value)], path)
    return value


def _join(path: str, key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def undefined_message(obj: Any, name: Any, keys: tuple[str, ...] = CONTEXT_KEYS) -> str:
    """The message for reading ``name`` from ``obj`` (``obj`` is None for a top-level name)."""
    if obj is None:
        return (f'undefined variable "{name}"; the context has {", ".join(keys)}'
                f"{_did_you_mean(name, keys)}")
    path = getattr(obj, "_path", None)
    if isinstance(obj, dict):
        full = _join(path, name) if path else str(name)
        has = ", ".join(sorted(map(str, obj))) if obj else "no fields"
        return f'undefined variable "{full}"; {path or "the mapping"} has {has}{_did_you_mean(name, obj)}'
    if isinstance(obj, list):
        full = f"{path}[{name!r}]" if path else repr(name)
        items = "1 item" if len(obj) == 1 else f"{len(obj)} items"
        return f'undefined variable "{full}"; {path or "the list"} has {items}'
    return f'"{name}" is undefined: it is read from a {type(obj).__name__} value, not from a mapping'


def _did_you_mean(name: Any, choices: Any) -> str:
    match = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1)
    return f' (did you mean "{match[0]}"?)' if match else ""


class _Undefined(StrictUndefined):
    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        if self._undefined_hint:
            return self._undefined_hint
        obj = self._undefined_obj
        if obj is jinja2.utils.missing:
            return undefined_message(None, self._undefined_name, _KEYS.get())
        if obj is None:
            return (f'"{self._undefined_name}" is undefined: it is read from a value that is None '
                    "(guard it with {% if … %} or use | default(…))")
        return undefined_message(obj, self._undefined_name)


class _WhenUndefined(_Undefined):
    """In a ``when`` condition, a key a mapping does not have is false (``parameters.baseUrl`` not
    set); anything else done with it, and an undefined top-level name, is still an error."""

    __slots__ = ()

    def __bool__(self) -> bool:  # type: ignore[override]
        if isinstance(self._undefined_obj, dict):
            return False
        return cast(bool, super().__bool__())


# --- the sandbox ---------------------------------------------------------------------------------

class _TooLarge(SecurityError):
    """A value the template would build is too large (see "Memory is bounded" above)."""


class _Work:
    """What one rendering has built so far, in characters (``MAX_RENDER_WORK``)."""

    __slots__ = ("built",)

    def __init__(self) -> None:
        self.built = 0


_WORK: contextvars.ContextVar[_Work | None] = contextvars.ContextVar("joch_template_work", default=None)


def _weight(value: Any, limit: int = _MAX_INTERMEDIATE) -> int:
    """Characters ``value`` stands for: a string's length, what a list or mapping would print
    (each item at least 1). Stops counting past ``limit``, so it costs at most ``limit`` steps even
    for a list that holds one large string a million times."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += max(1, len(item))
        elif isinstance(item, dict):
            total += 0 if item else 1  # its keys and values count, at least 1 each
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            total += 0 if item else 1
            stack.extend(item)
        else:
            total += 1
        if total > limit:
            return total
    return total


def _ensure(estimate: int, what: str) -> None:
    if estimate > _MAX_INTERMEDIATE:
        raise _TooLarge(f"{what} would build more than {_size(_MAX_INTERMEDIATE)} of text")


def _built(value: Any, what: str = "a value") -> Any:
    """Account for a value the template has just built; refuse it past either bound."""
    weight = _weight(value)
    _ensure(weight, what)
    work = _WORK.get()
    if work is not None and weight > 1:
        work.built += weight
        if work.built > MAX_RENDER_WORK:
            raise _TooLarge(f"the template built more than {_size(MAX_RENDER_WORK)} of text in all")
    return value


def _bounded_concat(parts: Any) -> str:
    items = list(parts)
    _ensure(sum(len(p) for p in items), "joining the output of a block or macro")
    return cast(str, _built(_CONCAT(items), "joining the output of a block or macro"))


def _bounded_str_join(seq: Any) -> str:
    items = list(seq)
    _ensure(sum(_weight(item) for item in items), "joining with ~")
    return cast(str, _built(_STR_JOIN(items), "joining with ~"))


def _bounded_markup_join(seq: Any) -> str:
    items = list(seq)
    _ensure(sum(_weight(item) for item in items), "joining with ~")
    return cast(str, _built(_MARKUP_JOIN(items), "joining with ~"))


_CONCAT, _STR_JOIN, _MARKUP_JOIN = "".join, jinja2.runtime.str_join, jinja2.runtime.markup_join


class _Template(jinja2.Template):
    """A compiled template whose joins are the bounded ones: the generated module calls
    ``concat``, ``str_join`` and ``markup_join`` by their global names, bound here."""

    @classmethod
    def _from_namespace(
        cls, environment: jinja2.Environment, namespace: Any, globals: Any,
    ) -> jinja2.Template:
        namespace.update(concat=_bounded_concat, str_join=_bounded_str_join, markup_join=_bounded_markup_join)
        return super()._from_namespace(environment, namespace, globals)


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, plus refusals of single expressions that would build huge values."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})
    template_class = _Template
    concat = staticmethod(_bounded_concat)  # what a {% set %} block's root function joins with

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right)
        return _built(super().call_binop(context, operator, left, right), f"{operator!r}")

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        name = getattr(obj, "__name__", None) or getattr(obj, "name", None) or "the call"
        _check_arguments(name, args, kwargs)
        _check_method(obj, args, kwargs)
        return _built(super().call(context, obj, *args, **kwargs), name)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        text: str = value.__self__
        _check_format(text)

        def bounded(*args: Any, **kwargs: Any) -> str:
            given = (*args, *kwargs.values())
            _ensure(len(text) + (text.count("{") + 1) * sum(_weight(v) for v in given), "format")
            return cast(str, _built(wrapped(*args, **kwargs), "format"))

        return bounded


def _check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and _is_int(n) and (weight := _weight(seq)) * n > _MAX_INTERMEDIATE:
                raise SecurityError(f"repeating a value of length {weight} {n} times is too large")
    elif operator == "**":
        if _is_int(left) and _is_int(right) and abs(left) > 1 and right > 0:
            if abs(left).bit_length() * right > _MAX_POWER_BITS:
                raise SecurityError(f"{left} ** {right} is too large")
    elif operator == "+" and isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
        _ensure(_weight(left) + _weight(right), "adding these values")
    elif operator == "%" and isinstance(left, str):
        _check_format(left)
        _ensure(len(left) + _weight(right) * max(1, left.count("%")), "formatting with %")


def _check_method(obj: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Methods of a string whose result can outgrow the string and its arguments by far."""
    text = getattr(obj, "__self__", None)
    if not isinstance(text, str):
        return
    name = getattr(obj, "__name__", "")
    given = (*args, *kwargs.values())
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str):
        _ensure(len(text) + (text.count(args[0]) + 1) * _weight(args[1]), "replace")
    elif name == "join" and args:
        items = list(args[0]) if isinstance(args[0], list | tuple | str) else []
        _ensure(sum(_weight(i) for i in items) + len(items) * len(text), "join")
    elif name == "expandtabs":
        size = next((v for v in given if _is_int(v)), 8)
        _ensure(len(text) + text.count("\t") * max(0, size), "expandtabs")
    elif name == "translate" and args:
        table = args[0]
        largest = max((_weight(v) for v in table.values()), default=1) if isinstance(table, dict) else 1
        _ensure(len(text) * max(1, largest), "translate")


def _check_arguments(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    for value in (*args, *kwargs.values()):
        if _is_int(value) and abs(value) > _MAX_INTERMEDIATE:
            raise SecurityError(f"argument {value} of {name} is too large")


def _check_format(text: str) -> None:
    if _FORMAT_WIDTH.search(text):
        raise SecurityError("a format width or precision of a million or more is too large")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _guarded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    skip = 2 if hasattr(func, "jinja_pass_arg") else 1  # (context,) value, then the arguments

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _check_arguments(f"the {name} filter", args[skip:], kwargs)
        if len(args) >= skip:
            _check_filter(name, args[skip - 1], args[skip:], kwargs)
        return _built(func(*args, **kwargs), f"the {name} filter")

    return guarded


def _check_filter(name: str, value: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Filters whose result can outgrow their input and arguments by far, checked before they run."""
    given = (*args, *kwargs.values())
    if name == "format" and isinstance(value, str):
        _check_format(value)
        _ensure(len(value) + (value.count("%") + 1) * sum(_weight(v) for v in given), "the format filter")
    elif name == "join" and isinstance(value, list | tuple):
        separator = args[0] if args else kwargs.get("d", "")
        _ensure(sum(_weight(i) for i in value) + len(value) * _weight(separator), "the join filter")
    elif name == "replace" and isinstance(value, str) and len(args) >= 2 and isinstance(args[0], str):
        _ensure(len(value) + (value.count(args[0]) + 1) * _weight(args[1]), "the replace filter")
    elif name in ("indent", "wordwrap") and isinstance(value, str):
        pieces = value.count("\n") + 1 if name == "indent" else len(value) + 1
        largest = max((_weight(v) if isinstance(v, str) else v if _is_int(v) else 1 for v in given), default=4)
        _ensure(len(value) + pieces * largest, f"the {name} filter")


def _finalize(value: Any) -> Any:
    """Every ``{{ … }}`` before it becomes text: a list or mapping prints everything it holds."""
    _ensure(_weight(value), "printing this value")
    return value


def _environment(undefined: type[jinja2.Undefined] = _Undefined) -> _Sandbox:
    env = _Sandbox(undefined=undefined, autoescape=False, keep_trailing_newline=True, finalize=_finalize)
    env.filters = {name: _guarded_filter(name, f) for name, f in env.filters.items()}
    del env.globals["lipsum"]  # lipsum(n=…) builds text of any size, and no command needs it
    return env


_ENV = _environment()
_WHEN_ENV = _environment(_WhenUndefined)


# --- static checks -------------------------------------------------------------------------------

def _static_problems(ast: nodes.Template) -> Iterator[str]:
    if _loads_templates(ast):
        yield _NO_LOADER
        return
    assigned = {n.name for n in ast.find_all(nodes.Name) if n.ctx in ("store", "param")}
    # ``x.y | default(…)`` and ``x.y is defined`` are how a template says "may be missing"
    guarded = {id(f.node) for f in ast.find_all(nodes.Filter) if f.name in ("default", "d")}
    guarded |= {id(t.node) for t in ast.find_all(nodes.Test) if t.name in ("defined", "undefined")}
    for name in sorted(find_undeclared_variables(ast) - set(_ENV.globals) - set(CONTEXT_KEYS)):
        yield undefined_message(None, name)
    seen: set[str] = set()
    for read, target, field in _field_reads(ast):
        if id(read) in guarded or not isinstance(target, nodes.Name):
            continue
        if target.name not in SHAPES or target.name in assigned:
            continue
        fields = SHAPES[target.name]
        if field in fields or f"{target.name}.{field}" in seen or hasattr(dict, field):
            continue
        seen.add(f"{target.name}.{field}")
        yield undefined_message(_Map(dict.fromkeys(fields), target.name), field)


def _field_reads(ast: nodes.Template) -> Iterator[tuple[nodes.Node, nodes.Node, str]]:
    """``x.field`` and ``x["field"]``: (the read, the node read from, the field)."""
    for attr in ast.find_all(nodes.Getattr):
        yield attr, attr.node, attr.attr
    for item in ast.find_all(nodes.Getitem):
        if isinstance(item.arg, nodes.Const) and isinstance(item.arg.value, str):
            yield item, item.node, item.arg.value
