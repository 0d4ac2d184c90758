"""Reading manifests: multi-document YAML or JSON text, files, directories and stdin.

Design decisions:

* A ``Document`` remembers where it came from: ``index`` is the 0-based position of the document
  in its source stream (empty documents are skipped but still counted, so ``documents[3]`` is the
  fourth ``---`` section of that file), ``line`` is the 1-based line it starts on, and ``item`` is
  its position inside a ``kind: List`` (``documents[0].items[2]``). Every message about a document
  is built by ``Document.label``, so the CLI, the server and admission speak about documents alike.
* YAML goes through ``CSafeLoader`` (``SafeLoader`` when libyaml is missing). Duplicate keys are
  an error, because PyYAML silently keeps the last one and a control plane must not guess which of
  two values a user meant.
* YAML 1.1 reads unquoted ``on``/``no``/``yes`` as booleans and ``1.10`` as the float ``1.1``.
  Admission rejects those in string fields, never coercing them; to tell the user what they wrote
  (``"on"``, not ``true``), every plain scalar that did not load as a string is recorded with its
  source text in ``Document.raw``, keyed by its path in the object.
* Text that looks like JSON is parsed as JSON first (exact types, no YAML 1.1 surprises); a
  ``kind: List`` (or ``FooList`` with ``items``, what ``get -o json`` prints) expands into its
  items, and so does a top-level JSON array.
* Aliases are allowed, but a document whose aliases expand to more than ``MAX_NODES`` nodes, or
  that refers to itself, is refused before anything walks it.
* Mappings and lists may nest at most ``MAX_DEPTH`` (64) levels deep, counting the document itself
  as level 1; deeper input is a ``BadRequest`` naming the source, the document and the line.
  libyaml's composer recurses in C and a few thousand ``[`` (or ``- - -``) crash the process, so
  ``check_nesting`` runs *before* the composer sees the text. It is cheap for ordinary manifests:
  an upper bound on the depth is computed at C speed (flow brackets per ``---`` section, plus twice
  the longest run of indentation and ``- ``/``? ``/``: `` indicators that starts a line: a block
  collection nests inside another only at a deeper column, or at the same one for a list that is
  a mapping's value). Only text whose bound exceeds the limit is scanned exactly — YAML as parser
  events (libyaml's parser is iterative), JSON token by token — and only then can it be refused.
  Python's JSON parser recurses too; its ``RecursionError`` is reported the same way.
  Aliases cannot make the composer recurse, but they can make the *loaded* object deeper, so the
  walk over each document's nodes enforces the same limit. The CLI calls ``check_nesting`` before
  composing YAML of its own.
* A JSON ``\\ud800``-style escape (or a YAML one, with the pure-Python loader) can produce a lone
  UTF-16 surrogate, which no UTF-8 store can hold. ``check_surrogates`` refuses it with the field
  path; it walks the object only when the text contains such an escape.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from joch.api import errors

FieldPath = tuple[Hashable, ...]
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
MAX_NODES = 500_000
MAX_DEPTH = 64
STDIN = "-"

_TYPED_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("bool", "int", "float", "null", "timestamp")
)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_DOCUMENT_MARKER = re.compile(r"^(?:---|\.\.\.)(?=\s|$)", re.M)
_BLOCK_RUNS = [re.compile(rf"^[ \t?:-]{{{n + 1},}}", re.M) for n in range((MAX_DEPTH - 4) // 2 + 1)]
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_SURROGATE_ESCAPE = re.compile(r"\\(?:u|U0000)[dD][89a-fA-F]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


@dataclass(frozen=True)
class RawScalars:
    """Source text of the plain scalars YAML did not load as strings, by path in the object."""

    values: dict[FieldPath, str] = field(default_factory=dict)
    keys: dict[FieldPath, str] = field(default_factory=dict)

    def under(self, prefix: FieldPath) -> RawScalars:
        """The entries below ``prefix``, re-rooted there (for the items of a List)."""
        n = len(prefix)
        return RawScalars(
            values={p[n:]: t for p, t in self.values.items() if p[:n] == prefix},
            keys={p[n:]: t for p, t in self.keys.items() if p[:n] == prefix},
        )


@dataclass(frozen=True)
class Document:
    index: int
    source: str
    obj: dict[str, Any]
    line: int | None = None
    item: int | None = None
    raw: RawScalars = field(default_factory=RawScalars, compare=False, repr=False)

    @property
    def ref(self) -> str:
        """``documents[3]``, or ``documents[0].items[2]`` for an item of a List."""
        base = f"documents[{self.index}]"
        return base if self.item is None else f"{base}.items[{self.item}]"

    @property
    def where(self) -> str:
        """``quickstart.yaml:14``, or just the source when the line is unknown."""
        name = "stdin" if self.source == STDIN else self.source
        return name if self.line is None else f"{name}:{self.line}"

    def label(self) -> str:
        """``documents[3] (Agent/coder in quickstart.yaml:14)``: how messages name a document."""
        kind = self.obj.get("kind")
        metadata = self.obj.get("metadata")
        name = None
        if isinstance(metadata, dict):
            name = metadata.get("name") or metadata.get("generateName")
        what = f"{_short(kind) if isinstance(kind, str) else '?'}/{_short(name) if isinstance(name, str) else '?'}"
        return f"{self.ref} ({what} in {self.where})"


def _short(text: str, limit: int = 100) -> str:
    """A kind or name as a label quotes it: every cause repeats the label, so never at length."""
    return text if len(text) <= limit else f"{text[:limit]}…"


def load_documents(text: str, source: str = STDIN) -> list[Document]:
    """Every object in ``text``: YAML documents, a JSON object, or a List, expanded."""
    parsed = _load_json(text, source)
    if isinstance(parsed, list):
        return [_item(d, j, index=0, source=source, line=None, raw=RawScalars())
                for j, d in enumerate(parsed)]
    if parsed is not None:
        return _expand(parsed, index=0, source=source, line=None, raw=RawScalars())
    docs: list[Document] = []
    for index, line, data, raw in _load_yaml(text, source):
        if data is not None:
            docs.extend(_expand(data, index=index, source=source, line=line, raw=raw))
    return docs


def load_paths(paths: list[str]) -> list[Document]:
    """Documents from files, directories (their ``*.yaml``/``*.yml``/``*.json``, sorted, not
    recursive) and ``-`` for stdin, in the order given."""
    docs: list[Document] = []
    for path in paths:
        for source, text in _read(path):
            docs.extend(load_documents(text, source))
    return docs


def check_nesting(text: str, source: str = STDIN) -> None:
    """Refuse YAML or JSON ``text`` whose mappings and lists nest deeper than ``MAX_DEPTH``:
    ``errors.BadRequest`` naming ``source``, the document and the line. Call it before handing text
    to a YAML composer (``yaml.compose``, ``Loader.get_node``, ``yaml.load``), which recurses in C
    and crashes the process on deep input. Cheap unless the text could nest that deep."""
    if not _may_nest_too_deeply(text):
        return
    if _looks_like_json(text):
        try:
            json.loads(text)
        except RecursionError:
            _check_json_depth(text, source)
            raise _too_deep(source, 0, None) from None
        except ValueError:
            pass  # not JSON: YAML flow style, scanned as YAML below
        else:
            _check_json_depth(text, source)
            return
    _check_yaml_depth(text, source)


def check_surrogates(value: Any, text: str, source: str = STDIN, ref: str = "documents[0]") -> None:
    """Refuse a lone UTF-16 surrogate anywhere in ``value`` (a key or a string) parsed from
    ``text``: ``errors.BadRequest`` naming the field, below ``ref`` (``""`` for a bare object).
    Free unless ``text`` has such an escape."""
    if _SURROGATE_ESCAPE.search(text):
        _refuse_surrogates(value, source, ref)


def _refuse_surrogates(value: Any, source: str, ref: str) -> None:
    found = _lone_surrogate(value)
    if found is None:
        return
    path, bad = found
    from joch.admission.diagnostics import format_path  # diagnostics imports this module

    field_path = format_path(path)
    where = f"{ref}.{field_path}" if ref and field_path[:1] not in ("", "[") else f"{ref}{field_path}"
    message = (f"{_display(source)}: {where} holds a lone UTF-16 surrogate (\\u{ord(bad):04x}), which is "
               "not a character and cannot be stored as UTF-8; send the text as UTF-8, or escape a "
               "character beyond U+FFFF as a surrogate pair (\\ud83d\\ude00)")
    raise errors.BadRequest(message, causes=[errors.Cause(where, message, "FieldValueInvalid")])


# --- reading -------------------------------------------------------------------------------------

def _read(path: str) -> Iterator[tuple[str, str]]:
    if path == STDIN:
        yield STDIN, sys.stdin.read()
        return
    p = Path(path)
    if p.is_dir():
        for child in sorted(p.iterdir()):
            if child.is_file() and child.suffix in MANIFEST_SUFFIXES:
                yield str(child), _read_file(child)
    elif p.is_file():
        yield path, _read_file(p)
    else:
        raise errors.NotFound(f'the path "{path}" does not exist')


def _read_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise errors.BadRequest(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise errors.BadRequest(f"{path}: {exc.strerror or exc}") from exc


# --- JSON ----------------------------------------------------------------------------------------

def _load_json(text: str, source: str) -> Any:
    """The parsed JSON value, or None when ``text`` is not JSON (it is then read as YAML)."""
    if not _looks_like_json(text):
        return None
    try:
        value = json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError:
        return None
    except _DuplicateKey as exc:
        raise errors.BadRequest(f'{_display(source)}: duplicate key "{exc.key}" in a JSON object') from None
    except RecursionError:
        _check_json_depth(text, source)
        raise _too_deep(source, 0, None) from None
    if _may_nest_too_deeply(text):
        _check_json_depth(text, source)
    check_surrogates(value, text, source, "documents[0].items" if isinstance(value, list) else "documents[0]")
    return value


def _looks_like_json(text: str) -> bool:
    return text.lstrip().startswith(("{", "["))


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


# --- YAML ----------------------------------------------------------------------------------------

_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[valid-type,misc]
    """A safe loader that refuses duplicate keys in a mapping."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise ConstructorError(
                    None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                )
            seen.add(key)
        result: dict[Hashable, Any] = super().construct_mapping(node, deep=deep)
        return result


def _load_yaml(text: str, source: str) -> Iterator[tuple[int, int, Any, RawScalars]]:
    check_nesting(text, source)
    escapes = _SURROGATE_ESCAPE.search(text) is not None
    loader = _Loader(text)
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            data = loader.construct_document(node)
            raw = RawScalars()
            _walk(loader, node, (), raw, _Budget(source, index))
            if escapes:
                _refuse_surrogates(data, source, f"documents[{index}]")
            yield index, node.start_mark.line + 1, data, raw
            index += 1
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, source) from exc
    except yaml.YAMLError as exc:
        raise errors.BadRequest(f"{_display(source)}: invalid YAML: {exc}") from exc
    except RecursionError as exc:
        raise errors.BadRequest(f"{_display(source)}: the YAML is nested too deeply") from exc
    finally:
        loader.dispose()


def _yaml_error(exc: yaml.MarkedYAMLError, source: str) -> errors.BadRequest:
    """The message names the line and column; ``details.line`` and ``column`` repeat them for
    an editor."""
    mark = exc.problem_mark or exc.context_mark
    at = {"line": mark.line + 1, "column": mark.column + 1} if mark is not None else {}
    where = f"line {at['line']}, column {at['column']}" if at else "somewhere"
    problem = exc.problem or exc.context or "invalid YAML"
    context = f" ({exc.context})" if exc.context and exc.problem else ""
    hint = next((h for text, h in _YAML_HINTS if text in problem), "")
    return errors.BadRequest(f"{_display(source)}: invalid YAML at {where}: {problem}{context}{hint}", extra=at)


_YAML_HINTS = (
    ("mapping values are not allowed", "; a value containing \": \" must be quoted"),
    ("cannot start any token", "; indent with spaces, not tabs, and quote a value starting with @ or `"),
    ("found undefined alias", "; an unquoted value starting with * is an alias — quote it"),
)


def _display(source: str) -> str:
    return "stdin" if source == STDIN else source


@dataclass
class _Budget:
    """Bounds the walk of a document's node graph: aliases expanded, no cycles."""

    source: str
    index: int
    nodes: int = 0
    stack: set[int] = field(default_factory=set)

    def fail(self, why: str) -> errors.BadRequest:
        return errors.BadRequest(f"{_display(self.source)}: documents[{self.index}] {why}")


def _walk(loader: _Loader, node: Node, path: FieldPath, raw: RawScalars, budget: _Budget) -> None:
    budget.nodes += 1
    if budget.nodes > MAX_NODES:
        raise budget.fail(f"expands to more than {MAX_NODES} nodes (through aliases); refusing it")
    if isinstance(node, ScalarNode):
        if not node.style and node.tag in _TYPED_TAGS:  # libyaml says "", PyYAML None
            raw.values[path] = node.value
        return
    if len(path) >= MAX_DEPTH:  # only aliases get here: check_nesting bounded the text itself
        raise _too_deep(budget.source, budget.index, node.start_mark.line + 1, " through aliases")
    if id(node) in budget.stack:
        raise budget.fail("refers to itself through an alias; a manifest must be a tree")
    budget.stack.add(id(node))
    if isinstance(node, SequenceNode):
        for i, child in enumerate(node.value):
            _walk(loader, child, (*path, i), raw, budget)
    elif isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                continue
            key = loader.construct_object(key_node)
            if not key_node.style and key_node.tag in _TYPED_TAGS:
                raw.keys[(*path, key)] = key_node.value
            _walk(loader, value_node, (*path, key), raw, budget)
    budget.stack.discard(id(node))


# --- nesting and characters ----------------------------------------------------------------------

def _may_nest_too_deeply(text: str) -> bool:
    """Whether an upper bound on the depth of ``text`` (see the module docstring) exceeds
    ``MAX_DEPTH``: flow brackets, plus twice the longest run of indentation and indicators that
    starts a line, plus slack. C-speed string scans, no Python loop over the text."""
    flow = text.count("[") + text.count("{")
    if not _bound_exceeded(text, flow):
        return False
    if flow:
        # libyaml ends a document at a column-0 "---" or "..." even inside a flow collection
        return _bound_exceeded(text, max(part.count("[") + part.count("{") for part in _DOCUMENT_MARKER.split(text)))
    return True


def _bound_exceeded(text: str, flow: int) -> bool:
    room = (MAX_DEPTH - 4 - flow) // 2  # the longest line-start run that keeps the bound in the limit
    return room < 0 or _BLOCK_RUNS[room].search(text) is not None


def _check_yaml_depth(text: str, source: str) -> None:
    """Refuse YAML nested deeper than ``MAX_DEPTH`` with Joch's own message, whatever libyaml does.

    libyaml looks ahead over a run of flow openers before it emits the first event, and since
    PyYAML 6.0.4 it refuses deep nesting itself ("exceeded maximum nesting depth") before this scan
    sees depth ``MAX_DEPTH``. When the fast scan stops on a YAML error, the pure-Python parser scans
    again: it emits events as it goes (a simple key looks ahead at most 1,024 characters), so it
    reaches the bound after a few kilobytes, whatever follows. Only invalid YAML pays for it.
    """
    try:
        _scan_depth(text, source, _BaseLoader)
    except yaml.YAMLError:
        if _BaseLoader is yaml.SafeLoader:
            return  # the loader reports it; its composer gets no deeper than this scan did
        try:
            _scan_depth(text, source, yaml.SafeLoader)
        except yaml.YAMLError:
            return


def _scan_depth(text: str, source: str, loader: type[yaml.SafeLoader]) -> None:
    depth = index = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                raise _too_deep(source, index, mark.line + 1 if mark is not None else None)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.DocumentEndEvent):
            index += 1


def _check_json_depth(text: str, source: str) -> None:
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        char = text[token.start()]
        if char == '"':
            continue
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_deep(source, 0, text.count("\n", 0, token.start()) + 1)
        else:
            depth -= 1


def _too_deep(source: str, index: int, line: int | None, how: str = "") -> errors.BadRequest:
    return errors.BadRequest(
        f"{_where(source, index, line)}: mappings and lists nest more than {MAX_DEPTH} levels "
        f"deep{how}; Joch accepts at most {MAX_DEPTH} — flatten the data, or keep it in a file the "
        "object points to"
    )


def _lone_surrogate(value: Any) -> tuple[FieldPath, str] | None:
    """The path of the first key or string holding a lone surrogate, and that surrogate."""
    stack: list[tuple[Any, FieldPath]] = [(value, ())]
    while stack:
        current, path = stack.pop()
        if isinstance(current, str):
            bad = _SURROGATE.search(current)
            if bad:
                return path, bad.group()
        elif isinstance(current, dict):
            for key, child in current.items():
                bad = _SURROGATE.search(key) if isinstance(key, str) else None
                if bad:
                    return (*path, key), bad.group()
                stack.append((child, (*path, key)))
        elif isinstance(current, list):
            stack.extend((child, (*path, i)) for i, child in enumerate(current))
    return None


# --- documents -----------------------------------------------------------------------------------

def _expand(data: Any, *, index: int, source: str, line: int | None, raw: RawScalars) -> list[Document]:
    if not isinstance(data, dict):
        raise errors.BadRequest(
            f"{_where(source, index, line)} is {_describe(data)}, "
            "not a mapping; every document must be one object with apiVersion and kind"
        )
    if _is_list(data):
        return [_item(d, j, index=index, source=source, line=line, raw=raw.under(("items", j)))
                for j, d in enumerate(data["items"])]
    return [Document(index=index, source=source, obj=data, line=line, raw=raw)]


def _item(
    data: Any, item: int, *, index: int, source: str, line: int | None, raw: RawScalars
) -> Document:
    if not isinstance(data, dict):
        raise errors.BadRequest(
            f"{_where(source, index, line, item)} is {_describe(data)}, not a mapping"
            "; every item must be one object with apiVersion and kind"
        )
    return Document(index=index, source=source, obj=data, line=line, item=item, raw=raw)


def _where(source: str, index: int, line: int | None, item: int | None = None) -> str:
    ref = f"documents[{index}]" if item is None else f"documents[{index}].items[{item}]"
    at = "" if line is None else f" (line {line})"
    return f"{_display(source)}: {ref}{at}"


def _is_list(data: dict[str, Any]) -> bool:
    kind = data.get("kind")
    return isinstance(kind, str) and kind.endswith("List") and isinstance(data.get("items"), list)


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    names = {list: "a list", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), f"a {type(value).__name__}")
