"""Reading the ``-f`` inputs of apply, create and delete: files, directories and ``-`` (stdin).

Apply is atomic across *all* inputs, so every ``-f`` goes to the server in ONE request: the
sources' texts are joined with ``---`` into one stream and sent verbatim. Verbatim matters: the
server reports YAML traps by quoting what the user wrote (``"on"``, not ``true``) and refuses
duplicate keys, both of which a parse-and-re-serialize round trip here would destroy.

The server names documents by their index in the stream it received (``documents[4]``, or
``documents[0].items[2]`` for an item of a ``kind: List``). To translate that back, ``Bundle``
composes the joined stream exactly as the server does (one index per ``---`` section, empty ones
included) and maps each document's start line to the source and the document's index *within
that source*. A translated reference reads like the server's own labels for files it reads
itself (``documents[3] (Agent/coder in agents.yaml:14)``), so ``joch apply`` and
``joch server --apply`` describe the same document the same way. Each source is also parsed on
its own first, so a YAML syntax error names the file and the line in it, before anything is sent.

A directory contributes its ``*.yaml``, ``*.yml`` and ``*.json`` files in name order (not
recursively, like kubectl without ``-R``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from joch.api import errors

STDIN = "-"
EXTENSIONS = (".yaml", ".yml", ".json")
SEPARATOR = "\n---\n"
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Source:
    """A file's text. ``origin`` is set when the text was rewritten (``with_namespace``): the
    original (index, line) of each of its documents, so labels still point into the file."""

    name: str
    text: str
    origin: tuple[tuple[int, int], ...] | None = None

    def located(self) -> dict[int, tuple[int, int, Any]]:
        """Start line in ``text`` → (index, line in the original file, data), per document."""
        out = {}
        for index, line, data in _sections(self.text, self.name):
            original = self.origin[index] if self.origin and index < len(self.origin) else (index, line)
            out[line] = (*original, data)
        return out


@dataclass(frozen=True)
class Document:
    """One object of a source: ``index`` counts the source's ``---`` sections from 0."""

    source: str
    index: int
    line: int
    obj: Any
    item: int | None = None

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind") or "") if isinstance(self.obj, dict) else ""

    @property
    def name(self) -> str:
        meta = self.obj.get("metadata") if isinstance(self.obj, dict) else None
        if not isinstance(meta, dict):
            return ""
        return str(meta.get("name") or meta.get("generateName") or "")

    @property
    def label(self) -> str:
        """``documents[3] (Agent/coder in agents.yaml:14)``, as the server labels documents."""
        ref = f"documents[{self.index}]" + ("" if self.item is None else f".items[{self.item}]")
        return f"{ref} ({self.kind or '?'}/{self.name or '?'} in {self.source}:{self.line})"


_LABELLED_FIELD = re.compile(r"^(documents\[\d+\](?:\.items\[\d+\])? \([^()]*\))\.")


def readable_field(field: str) -> str:
    """``documents[3] (Agent/x in a.yaml:4).spec.y`` → ``documents[3] (Agent/x in a.yaml:4): spec.y``."""
    return _LABELLED_FIELD.sub(r"\1: ", field)


def read(paths: list[str], stdin: TextIO) -> list[Source]:
    sources: list[Source] = []
    for path in _expand(paths):
        if path == STDIN:
            sources.append(Source("stdin", stdin.read()))
        else:
            sources.append(Source(path, _read_file(path)))
    return sources


def documents(sources: list[Source]) -> list[Document]:
    """Every object of every source, ``kind: List`` expanded (for create and delete)."""
    out: list[Document] = []
    for source in sources:
        json_array = source.text.lstrip().startswith("[")  # the server expands those, as kubectl does
        for index, line, data in _sections(source.text, source.name):
            out += _objects(source.name, index, line, data, json_array=json_array)
    return out


class Bundle:
    """The joined stream sent to the server, and the map from its indexes back to sources."""

    def __init__(self, sources: list[Source]) -> None:
        sources = [_as_list(s) if len(sources) > 1 else s for s in sources]
        located = [s.located() for s in sources]
        self.text = SEPARATOR.join(s.text.rstrip("\n") for s in sources) + "\n"
        self.count = sum(1 for docs in located for *_, data in docs.values() if data is not None)
        self._by_index: dict[int, tuple[str, int, int, Any]] = {}
        starts = _line_starts(sources)
        for index, line, data in _sections(self.text, "the joined manifests"):
            number = next(n for n, first in reversed(list(enumerate(starts))) if first <= line)
            local_line = line - starts[number] + 1
            local_index, original_line, _ = located[number].get(local_line, (index, local_line, data))
            self._by_index[index] = (sources[number].name, local_index, original_line, data)

    def document(self, index: int, item: int | None = None) -> Document | None:
        found = self._by_index.get(index)
        if found is None:
            return None
        name, local_index, line, data = found
        obj = _item_of(data, item) if item is not None else data
        return Document(source=name, index=local_index, line=line, obj=obj, item=item)


def _line_starts(sources: list[Source]) -> list[int]:
    """The 1-based line of the joined stream where each source's text begins."""
    starts, line = [], 1
    for source in sources:
        starts.append(line)
        line += source.text.rstrip("\n").count("\n") + SEPARATOR.count("\n")
    return starts


def _as_list(source: Source) -> Source:
    """A JSON array joined into a YAML stream would be one sequence document, which the server
    refuses; wrapped in a ``List`` on the same lines, its items keep their ``items[j]`` names."""
    if not source.text.lstrip().startswith("["):
        return source
    return Source(source.name, '{"apiVersion": "v1", "kind": "List", "items": ' + source.text.rstrip() + "}",
                  source.origin)


def _is_list(data: Any) -> bool:
    """A JSON array, or a ``kind: List`` (or ``FooList``) with items: the server expands both."""
    if isinstance(data, list):
        return True
    return isinstance(data, dict) and str(data.get("kind", "")).endswith("List") and isinstance(data.get("items"), list)



def _members(data: Any) -> list[Any]:
    if not _is_list(data):
        return [data]
    return list(data) if isinstance(data, list) else list(data["items"])


def _item_of(data: Any, item: int) -> Any:
    items = data.get("items") if isinstance(data, dict) else data
    return items[item] if isinstance(items, list) and 0 <= item < len(items) else None


def _sections(text: str, name: str) -> Iterator[tuple[int, int, Any]]:
    """(index, start line, data) of every ``---`` section, empty ones (data None) included."""
    loader = _Loader(text)
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # check_node() said there is one; kept for the type checker
                return
            yield index, node.start_mark.line + 1, loader.construct_document(node)
            index += 1
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise errors.BadRequest(f"{name}: invalid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise errors.BadRequest(f"{name}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def _objects(source: str, index: int, line: int, data: Any, *, json_array: bool) -> list[Document]:
    if data is None:
        return []
    if not _is_list(data) or (isinstance(data, list) and not json_array):
        return [_checked(Document(source=source, index=index, line=line, obj=data))]
    members = _members(data)
    return [_checked(Document(source=source, index=index, line=line, obj=o, item=j)) for j, o in enumerate(members)]


def _checked(doc: Document) -> Document:
    if not isinstance(doc.obj, dict):
        raise errors.BadRequest(f"{doc.label}: expected an object with apiVersion and kind")
    return doc


def _expand(paths: list[str]) -> list[str]:
    out: list[str] = []
    for raw in paths:
        path = Path(raw)
        if raw == STDIN:
            out.append(raw)
        elif path.is_dir():
            out += [str(p) for p in sorted(path.iterdir()) if p.suffix in EXTENSIONS and p.is_file()]
        elif path.exists():
            out.append(raw)
        else:
            raise errors.BadRequest(f'the path "{raw}" does not exist')
    return out


def _read_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.BadRequest(f'cannot read "{path}": {exc}') from None
