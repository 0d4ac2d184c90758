"""One CEL expression: compiled once, with every mistake found at compile time reported at its
line and column, and evaluated to a bool or a clear error.

Compilation (``compile_expression``) is the library's parser plus two static checks the library
does not do (it has no type checker): every variable the expression reads must be one Joch
provides (``VARIABLES``; a typo such as ``objct.spec`` is an error where it is written, not a
runtime failure on the first object), and every function must be one the CEL core library has
(``FUNCTIONS``). Types are dynamic: a type mismatch (``1 + "a"``) is found when the rule runs,
and reported then as that rule's error.

``namespace`` is a reserved word in CEL (the grammar keeps it for packages), so an expression may
not name it as an identifier. Joch's variable for the object's namespace is called ``namespace``
all the same: before compiling, the identifier ``namespace`` (not a field such as
``object.metadata.namespace``, not text inside a string) is rewritten to ``namespaceObject`` —
the name Kubernetes' ValidatingAdmissionPolicy gives it, which works too — and positions in errors
are mapped back to what the user wrote.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cel

VARIABLES = frozenset({
    "object", "oldObject", "request", "namespaceObject",
    "run", "agent", "provider", "implementation", "environment",
})
"""What an expression may read (``namespace`` is spelled ``namespaceObject`` once compiled)."""

FUNCTIONS = frozenset({
    "size", "contains", "startsWith", "endsWith", "matches",
    "int", "uint", "double", "string", "bytes", "dyn", "type", "timestamp", "duration",
    "getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear",
    "getHours", "getMinutes", "getSeconds", "getMilliseconds",
})
"""The CEL core library's functions that the implementation provides (its macros ``has``,
``all``, ``exists``, ``exists_one``, ``map`` and ``filter`` are syntax, not functions)."""

_TYPE_NAMES = frozenset({"bool", "int", "uint", "double", "string", "bytes", "list", "map", "null_type",
                         "type", "timestamp", "duration", "dyn"})
_ALIAS = "namespaceObject"
_RESERVED = "namespace"
_SHIFT = len(_ALIAS) - len(_RESERVED)
_POSITION = re.compile(r"<input>:(\d+):(\d+): (.*)")
_COMPREHENSION = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CompileError(Exception):
    """A CEL expression that does not compile: what is wrong, and where (1-based line and column)."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.message = message
        self.line = line
        self.column = column


class EvaluationError(Exception):
    """An expression that failed on an object, or returned something other than a bool."""


@dataclass(frozen=True)
class Expression:
    source: str
    program: Any  # cel.Program (the library ships no type stubs)
    variables: frozenset[str] = frozenset()  # what it reads (``namespace`` as ``namespaceObject``)
    # Per PRUNABLE variable, the field paths it reads (``("spec", "providerRef", "name")``); a
    # variable missing here is read as a whole (see ``field_paths``).
    paths: Mapping[str, frozenset[tuple[str, ...]]] = field(default_factory=dict)

    def evaluate(self, context: Any) -> bool:
        """The expression's value on ``context`` (a ``cel.Context`` built by ``activation``)."""
        try:
            value = self.program.execute(context)
        except KeyError as exc:
            raise EvaluationError(f"no such key: {exc.args[0] if exc.args else exc}") from None
        except BaseException as exc:  # plain RuntimeError/TypeError/ValueError, or a Rust panic
            if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                raise
            raise EvaluationError(f"{type(exc).__name__}: {exc}") from None
        if not isinstance(value, bool):
            raise EvaluationError(f"the expression must evaluate to true or false, got {type(value).__name__} "
                                  f"{_show(value)}")
        return value


def activation(variables: dict[str, Any]) -> Any:
    """The variables as a ``cel.Context``: converted once, shared by every rule run on one object
    (converting an object is most of what evaluating a rule costs)."""
    return Activation().bind(variables)


class Activation:
    """A ``cel.Context`` reused from object to object (one per batch and thread): ``bind``
    converts only the variables whose value is not the very object bound last time, so the
    provider every Agent of a batch shares, the request and the namespace are converted once.
    (The library converts about a microsecond per string; an Agent is a few dozen.)"""

    def __init__(self) -> None:
        self._context = cel.Context()
        self._bound: dict[str, Any] = {}

    def bind(self, variables: dict[str, Any]) -> Any:
        changed = {}
        for name, value in variables.items():
            key = _ALIAS if name == _RESERVED else name
            if key not in self._bound or self._bound[key] is not value:
                changed[key] = value
                self._bound[key] = value
        if changed:
            self._context.update(changed)
        return self._context


def compile_expression(source: str) -> Expression:
    rewritten, shifts = _rewrite(source)
    try:
        program = cel.compile(rewritten)
    except BaseException as exc:  # ValueError, or a Rust panic (a BaseException) on odd input
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        raise _parse_error(str(exc), shifts) from None
    _check_names(source, program)
    return Expression(source=source, program=program, variables=frozenset(program.variables()) & VARIABLES,
                      paths=field_paths(source))


# --- what an expression reads ----------------------------------------------------------------------

PRUNABLE = ("object", "oldObject")
"""Variables converted per object: only the fields the rules read are handed to CEL."""
_CHAIN = re.compile(r"(?<![A-Za-z0-9_.])(object|oldObject)((?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*)")
_SEGMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def field_paths(source: str) -> dict[str, frozenset[tuple[str, ...]]]:
    """For ``object`` and ``oldObject``, the field paths ``source`` selects, when every use of the
    variable is a plain selection (``object.spec.binary``, ``has(object.metadata.labels)``,
    ``object.metadata.labels["a"]``, ``object.metadata.name.startsWith("x")`` — a method call
    is not a field). A bare use (``object``, ``object["spec"]``, ``object.?spec``) reads it whole:
    the variable is left out. Converting an object for CEL costs about a microsecond per string
    in the library, so an Agent a rule reads three fields of is converted in a tenth of the time."""
    found: dict[str, set[tuple[str, ...]]] = {}
    whole: set[str] = set()
    for start, end in _code_spans(source):
        for match in _CHAIN.finditer(source, start, end):
            name, chain = match.group(1), _SEGMENT.findall(match.group(2))
            if chain and re.match(r"\s*\(", source[match.end():end]):
                chain = chain[:-1]  # object.metadata.name.startsWith(...): a method, not a field
            if not chain:
                whole.add(name)
            else:
                found.setdefault(name, set()).add(tuple(chain))
    return {name: frozenset(paths) for name, paths in found.items() if name not in whole}


Trie = dict[str, Any]
"""Field paths as nested dicts; ``None`` below a key means "this subtree, whole"."""


def trie(paths: Iterable[tuple[str, ...]]) -> Trie:
    root: Trie = {}
    for path in sorted(paths, key=len):  # shorter first: a prefix takes its subtree whole
        node = root
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if child is None:
                break
            node = child
        else:
            node[path[-1]] = None
    return root


def prune(value: Any, selected: Trie | None) -> Any:
    """``value`` with only the fields ``selected`` names (a subtree that is not a map, whole)."""
    if selected is None or not isinstance(value, Mapping):
        return value
    return {k: prune(value[k], sub) for k, sub in selected.items() if k in value}


# --- positions -----------------------------------------------------------------------------------

def _parse_error(text: str, shifts: dict[int, list[int]]) -> CompileError:
    found = _POSITION.search(text)
    if not found:
        return CompileError(text.splitlines()[0] if text else "does not parse", 1, 1)
    line, column, message = int(found.group(1)), int(found.group(2)), found.group(3).strip()
    # The library's columns are 0-based in its caret line but printed 1-based after "<input>:L:".
    column -= _SHIFT * sum(1 for at in shifts.get(line, []) if at < column)
    message = message.replace(_ALIAS, _RESERVED)
    return CompileError(message, line, max(column, 1))


def _position(source: str, offset: int) -> tuple[int, int]:
    line = source.count("\n", 0, offset) + 1
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


def _code_spans(source: str) -> list[tuple[int, int]]:
    """(start, end) of the parts of ``source`` outside string literals."""
    spans: list[tuple[int, int]] = []
    i, start, n = 0, 0, len(source)
    while i < n:
        ch = source[i]
        if ch in "\"'":
            spans.append((start, i))
            quote = source[i:i + 3] if source[i:i + 3] in ('"""', "'''") else ch
            raw = i > 0 and source[i - 1] in "rR"
            j = i + len(quote)
            while j < n and not source.startswith(quote, j):
                j += 2 if source[j] == "\\" and not raw else 1
            i = start = min(j + len(quote), n)
            continue
        i += 1
    spans.append((start, n))
    return spans


def _identifiers(source: str) -> list[tuple[int, str]]:
    """Identifiers outside strings that are not field selections (``x.name``): (offset, name)."""
    found: list[tuple[int, str]] = []
    for start, end in _code_spans(source):
        for match in _IDENT.finditer(source, start, end):
            before = source[:match.start()].rstrip()
            if before.endswith(".") or (before.endswith("?.")):
                continue
            if match.start() > 0 and source[match.start() - 1].isdigit():
                continue  # a number's suffix (1u) or exponent
            found.append((match.start(), match.group()))
    return found


def _rewrite(source: str) -> tuple[str, dict[int, list[int]]]:
    """``source`` with the identifier ``namespace`` spelled ``namespaceObject``, and per line the
    1-based columns (in the rewritten text) where each rewrite ends."""
    out, last = [], 0
    shifts: dict[int, list[int]] = {}
    for offset, name in _identifiers(source):
        if name != _RESERVED:
            continue
        out.append(source[last:offset])
        out.append(_ALIAS)
        last = offset + len(_RESERVED)
        line, column = _position(source, offset)
        earlier = _SHIFT * len(shifts.get(line, []))
        shifts.setdefault(line, []).append(column + earlier + len(_ALIAS) - 1)
    out.append(source[last:])
    return "".join(out), shifts


# --- names ---------------------------------------------------------------------------------------

def _check_names(source: str, program: Any) -> None:
    bound = set(_COMPREHENSION.findall(source))
    allowed = VARIABLES | _TYPE_NAMES | bound
    unknown = [name for name in program.variables() if name not in allowed]
    if unknown:
        name = unknown[0]
        shown = _RESERVED if name == _ALIAS else name
        line, column = _first(source, shown)
        known = ", ".join(sorted((VARIABLES - {_ALIAS}) | {_RESERVED}))
        raise CompileError(f'undeclared reference to "{shown}": the variables are {known}', line, column)
    functions = [f for f in program.functions() if not f.startswith(("_", "!", "-", "@")) and f not in FUNCTIONS]
    if functions:
        name = functions[0]
        line, column = _first(source, name, call=True)
        raise CompileError(f'unknown function "{name}": CEL\'s core functions are {", ".join(sorted(FUNCTIONS))}',
                           line, column)


def _first(source: str, name: str, *, call: bool = False) -> tuple[int, int]:
    for start, end in _code_spans(source):
        pattern = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])" + (r"\s*\(" if call else ""))
        match = pattern.search(source, start, end)
        if match:
            return _position(source, match.start())
    return 1, 1


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"
