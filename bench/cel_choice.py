"""Why joch.policy uses common-expression-language: the comparison behind the figures in
``src/joch/policy/__init__.py``. Not part of ``make bench``: it needs cel-python, which Joch does not
depend on (``pip install cel-python`` into the venv first).

Prints, for each library, the error it gives for a few broken expressions (syntax errors with
positions, an unknown function, a non-bool result, a missing key) and the time to compile one
expression and to evaluate five rules against one object.
"""

from __future__ import annotations

import time

import cel
import celpy

OBJ = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider",
       "metadata": {"name": "codex", "namespace": "default", "labels": {"team": "a", "env": "dev"}},
       "spec": {"binary": "codex", "argsTemplate": ["exec", "{{ implementation.text }}", "--json"],
                "envTemplate": {"A": "b"}}}
VARS = {"object": OBJ, "oldObject": None, "request": {"user": "alice", "groups": ["dev"], "verb": "create"},
        "namespaceObject": {"name": "default", "environment": "dev"}}
EXPRS = [
    'object.spec.binary in ["codex", "claude", "aider"]',
    'has(object.metadata.labels) && "team" in object.metadata.labels',
    'object.metadata.name.startsWith("co") || request.user == "admin"',
    "size(object.spec.argsTemplate) < 20",
    'namespaceObject.environment != "prod" || request.groups.exists(g, g == "release")',
]
BAD = {"syntax": 'object.spec.binary in ["codex",\n  "claude" && ]',
       "syntax at end": 'object.spec.binary in ["codex"] &&\n  size(1, 2, 3) > foo(',
       "unknown function": "object.spec.binary.frobnicate() == 1",
       "non-bool": "1 + 2",
       "missing key": 'object.spec.missing == "x"'}


def errors() -> None:
    env = celpy.Environment()
    for label, src in BAD.items():
        try:
            result = f"result {cel.compile(src).execute(VARS)!r}"
        except Exception as exc:  # noqa: BLE001 - any error is what is being compared
            result = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"common-expression-language  {label}: {result}")
        try:
            result = f"result {env.program(env.compile(src)).evaluate(celpy.json_to_cel(VARS))!r}"
        except Exception as exc:  # noqa: BLE001 - any error is what is being compared
            result = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"cel-python                  {label}: {result}")


def speed() -> None:
    n = 2000
    programs = [cel.compile(e) for e in EXPRS]
    start = time.perf_counter()
    for _ in range(n):
        context = cel.Context(VARS)
        for program in programs:
            program.execute(context)
    print(f"common-expression-language: {(time.perf_counter() - start) / n * 1e6:7.1f} µs per object (5 rules)")
    env = celpy.Environment()
    celpy_programs = [env.program(env.compile(e)) for e in EXPRS]
    m = 200
    start = time.perf_counter()
    for _ in range(m):
        activation = celpy.json_to_cel(VARS)
        for program in celpy_programs:
            program.evaluate(activation)
    print(f"cel-python:                 {(time.perf_counter() - start) / m * 1e6:7.1f} µs per object (5 rules)")
    start = time.perf_counter()
    for e in EXPRS * 20:
        cel.compile(e)
    print(f"common-expression-language: {(time.perf_counter() - start) / 100 * 1e6:7.1f} µs per compile")
    start = time.perf_counter()
    for e in EXPRS * 4:
        env.program(env.compile(e))
    print(f"cel-python:                 {(time.perf_counter() - start) / 20 * 1e6:7.1f} µs per compile")


if __name__ == "__main__":
    errors()
    speed()
