"""kubectl's JSONPath templates (``-o jsonpath=``, ``--sort-by``, ``custom-columns``, ``wait --for=jsonpath``).

kubectl's dialect is a *template*: literal text with ``{...}`` actions in it. An action is an
expression (``{.metadata.name}``, ``{.items[*].spec.agentRef.name}``, ``{$.kind}``), a string
literal (``{"\\n"}``, ``{"\\t"}``), or a ``{range EXPR}...{end}`` block whose body is rendered once
per value, with ``.``/``@`` meaning that value. Each expression is evaluated by ``jsonpath_ng.ext``
(filters such as ``[?(@.type=="Ready")]``, slices, ``..``, ``*``) once translated: kubectl's leading
``.`` or ``@`` becomes ``$`` applied to the current value, and a key with escaped dots
(``.metadata.labels.app\\.kubernetes\\.io/name``) becomes a quoted field.

Values print as kubectl prints them: strings bare, numbers and booleans as JSON, lists and maps as
compact JSON, several results separated by one space, a missing key as nothing (kubectl's default
``--allow-missing-template-keys=true``). A template that does not parse is a ``BadRequest`` naming
the template and what is wrong, exit code 2 — never a traceback.

``relaxed`` is kubectl's ``RelaxedJSONPathExpression`` for the places that take one expression:
``.a.b``, ``{.a.b}`` and ``a.b`` all mean the same.

``jsonpath_ng`` is imported on first use, so commands that print no template do not pay for it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from joch.api import errors

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")

Finder = Callable[[Any, Any], list[Any]]  # (current, root) -> the values found


@dataclass
class _Node:
    text: str | None = None  # a literal
    expr: Finder | None = None  # an expression to print
    body: list[_Node] = field(default_factory=list)  # a range's body (expr: what it ranges over)
    ranged: bool = False


class Template:
    """A parsed kubectl JSONPath template; ``render(data)`` is the printed text."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._nodes = _parse(source)

    def render(self, data: Any) -> str:
        out: list[str] = []
        _render(self._nodes, data, data, out)
        return "".join(out)


def template(source: str) -> Template:
    return Template(source)


def relaxed(expression: str, *, what: str) -> Finder:
    """One expression as ``--sort-by`` and ``custom-columns`` take it: ``.a.b``, ``{.a.b}`` or ``a.b``."""
    text = expression.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if not text:
        raise errors.BadRequest(f"{what}: an empty JSONPath expression; give one such as .metadata.name")
    if text[0] not in ".$@[":
        text = "." + text
    return _compile(text, source=expression, what=what)


def first(finder: Finder, data: Any) -> Any:
    found = finder(data, data)
    return found[0] if found else None


def show(value: Any) -> str:
    """A value as kubectl's JSONPath prints it."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _render(nodes: list[_Node], current: Any, root: Any, out: list[str]) -> None:
    for node in nodes:
        if node.text is not None:
            out.append(node.text)
        elif node.ranged and node.expr is not None:
            for item in _items(node.expr(current, root)):
                _render(node.body, item, root, out)
        elif node.expr is not None:
            out.append(" ".join(show(v) for v in node.expr(current, root)))


def _items(found: list[Any]) -> list[Any]:
    """What ``{range X}`` iterates: the values found, or the elements of the one list found."""
    if len(found) == 1 and isinstance(found[0], list):
        return list(found[0])
    return found


def _parse(source: str) -> list[_Node]:
    root: list[_Node] = []
    stack: list[list[_Node]] = [root]
    at = 0
    while at < len(source):
        opening = source.find("{", at)
        if opening < 0:
            stack[-1].append(_Node(text=source[at:]))
            break
        if opening > at:
            stack[-1].append(_Node(text=source[at:opening]))
        closing = _closing(source, opening)
        action = source[opening + 1:closing].strip()
        at = closing + 1
        if action == "end":
            if len(stack) == 1:
                raise _bad(source, "{end} without a {range}")
            stack.pop()
        elif action.startswith("range ") or action == "range":
            expression = action[len("range"):].strip()
            if not expression:
                raise _bad(source, "{range} needs an expression, e.g. {range .items[*]}")
            node = _Node(expr=_compile(expression, source=source), ranged=True)
            stack[-1].append(node)
            stack.append(node.body)
        elif action.startswith('"'):
            stack[-1].append(_Node(text=_string(action, source)))
        elif action:
            stack[-1].append(_Node(expr=_compile(action, source=source)))
    if len(stack) > 1:
        raise _bad(source, "a {range} has no {end}")
    return root


def _closing(source: str, opening: int) -> int:
    """The ``}`` ending the action at ``opening``: brackets and quoted strings may hold braces."""
    depth, quote, at = 0, "", opening + 1
    while at < len(source):
        ch = source[at]
        if quote:
            if ch == "\\":
                at += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "}" and depth <= 0:
            return at
        at += 1
    raise _bad(source, f"unclosed action at offset {opening}: every {{ needs its }}")


def _string(action: str, source: str) -> str:
    if len(action) < 2 or not action.endswith('"'):
        raise _bad(source, f"unterminated string {action}")
    body = action[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def _compile(expression: str, *, source: str, what: str = "") -> Finder:
    text = expression.strip()
    anchored_at_root = text.startswith("$")
    path = _translate(text[1:] if text[:1] in "$@" else text)
    try:
        compiled = _parser()("$" + ("" if path in ("", ".") else path))
    except Exception as exc:  # noqa: BLE001  # jsonpath_ng's lexer and parser raise plain Exception subclasses
        raise _bad(source, f"{exc}", what=what) from None

    def find(current: Any, root: Any) -> list[Any]:
        try:
            return [m.value for m in compiled.find(root if anchored_at_root else current)]
        except RecursionError:  # jsonpath_ng walks a long path recursively: .a.b.c... thousands deep
            raise _bad(source, "the path is too deeply nested", what=what) from None

    return find


def _translate(path: str) -> str:
    """kubectl's path after ``$``/``@`` in jsonpath_ng's spelling: keys with escaped dots or other
    characters jsonpath_ng does not take bare are quoted; brackets and ``..`` are left as they are."""
    out: list[str] = []
    at = 0
    while at < len(path):
        ch = path[at]
        if ch == "[":
            end = _bracket_end(path, at)
            out.append(path[at:end + 1])
            at = end + 1
        elif ch == ".":
            if path.startswith("..", at):
                out.append("..")
                at += 2
            else:
                out.append(".")
                at += 1
        else:
            key: list[str] = []
            while at < len(path) and path[at] not in ".[":
                if path[at] == "\\" and at + 1 < len(path):
                    at += 1
                key.append(path[at])
                at += 1
            name = "".join(key)
            out.append(name if _PLAIN_KEY.fullmatch(name) or name == "*" else json.dumps(name))
    return "".join(out)


def _bracket_end(path: str, opening: int) -> int:
    depth, quote = 0, ""
    for at in range(opening, len(path)):
        ch = path[at]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                return at
    return len(path) - 1


@functools.cache
def _parser() -> Callable[[str], Any]:
    from jsonpath_ng.ext import parser

    return parser.parse


def _bad(source: str, problem: str, *, what: str = "") -> errors.BadRequest:
    where = f"{what}: " if what else ""
    return errors.BadRequest(f"{where}error parsing JSONPath template {source!r}: {problem}")
