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
recursively, like kubectl without ``-R``). ``-f ''`` is an error, not the current directory.

Before any text is composed, ``joch.admission.documents`` checks how deeply it nests: libyaml's
composer recurses once per level and crashes the process (SIGSEGV) on ``a: [[[[...`` a hundred
thousand deep, long before Python's recursion limit could turn that into an exception.

``with_namespace`` writes ``metadata.namespace`` into the text of documents that name none, for
``JOCH_NAMESPACE`` (a default, see ``namespaces``) when the batch also holds documents naming
other namespaces, which the server's ``?namespace=`` would reject. It inserts one key where the
composer says ``metadata`` begins and leaves every other byte as written; ``Source.origin``
keeps the original lines, so labels still point into the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from joch.api import errors

if TYPE_CHECKING:
    from yaml.nodes import MappingNode, Node

STDIN = "-"
EXTENSIONS = (".yaml", ".yml", ".json")
SEPARATOR = "\n---\n"


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


def read(paths: list[str], stdin: TextIO) -> list[Source]:
    """The sources, with relative local paths made absolute (``with_absolute_paths``)."""
    sources: list[Source] = []
    for path in _expand(paths):
        if path == STDIN:
            sources.append(with_absolute_paths(Source("stdin", _read_stdin(stdin)), Path.cwd()))
        else:
            sources.append(with_absolute_paths(Source(path, _read_file(path)), Path(path).resolve().parent))
    return sources


def with_absolute_paths(source: Source, base: Path) -> Source:
    """The source with every relative local path (``kinds.LOCAL_PATHS``: an AgentRun's
    ``execution.coordinates.git.url: ../..``) replaced by the absolute path it means from ``base``,
    the manifest's directory; the server cannot know that directory (see ``joch.admission.paths``).
    The scalar is replaced where it stands, as ``with_namespace`` inserts, so everything else in
    the text is sent as written."""
    if "AgentRun" not in source.text:  # the only kind with such a field; skips a second parse
        return source
    from joch.admission import paths

    json_array = source.text.lstrip().startswith("[")
    edits: list[tuple[int, int, str]] = []
    origin: list[tuple[int, int]] = []
    for index, line, data, node in _composed(source.text, source.name):
        origin.append((index, line))
        for _, obj, obj_node in _object_nodes(data, node, json_array=json_array):
            for field_path, value in paths.relative_fields(obj):
                scalar = _node_at(obj_node, field_path)
                if scalar is not None:
                    edits.append((scalar.start_mark.index, scalar.end_mark.index,
                                  json.dumps(paths.absolute(value, base))))
    if not edits:
        return source
    text = source.text
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return Source(source.name, text, source.origin or tuple(origin))


def _node_at(node: Node, path: tuple[str, ...]) -> Node | None:
    """The node at ``path`` (mapping keys) below ``node``, if each step is a mapping with the key."""
    from yaml.nodes import MappingNode, ScalarNode

    for key in path:
        if not isinstance(node, MappingNode):
            return None
        found = next((v for k, v in node.value if isinstance(k, ScalarNode) and k.value == key), None)
        if found is None:
            return None
        node = found
    return node if isinstance(node, ScalarNode) else None


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

    def documents(self) -> list[Document]:
        """Every object of the stream, lists expanded, labelled in its own source."""
        out: list[Document] = []
        for name, local_index, line, data in self._by_index.values():
            members = list(enumerate(_members(data))) if _is_list(data) else [(None, data)]
            out += [Document(source=name, index=local_index, line=line, obj=obj, item=item)
                    for item, obj in members if isinstance(obj, dict)]
        return out

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
    for index, line, data, _ in _composed(text, name):
        yield index, line, data


def _composed(text: str, name: str) -> Iterator[tuple[int, int, Any, Node | None]]:
    """(index, start line, data, node) of every ``---`` section."""
    import yaml  # lazy: only commands that read manifests need it

    from joch.admission import documents

    documents.check_nesting(text, name)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # check_node() said there is one; kept for the type checker
                return
            yield index, node.start_mark.line + 1, loader.construct_document(node), node
            index += 1
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise errors.BadRequest(f"{name}: invalid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise errors.BadRequest(f"{name}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()


Namespaced = Callable[[str, str], bool | None]


def with_namespace(source: Source, namespace: str, namespaced: Namespaced, *, why: str) -> Source:
    """The source with ``metadata.namespace: <namespace>`` added to every object of a namespaced
    kind (``namespaced(apiVersion, kind)``; None: unknown, left alone) that names no namespace."""
    json_array = source.text.lstrip().startswith("[")
    edits: list[tuple[int, str]] = []
    origin: list[tuple[int, int]] = []
    for index, line, data, node in _composed(source.text, source.name):
        origin.append((index, line))
        for item, obj, obj_node in _object_nodes(data, node, json_array=json_array):
            doc = Document(source=source.name, index=index, line=line, obj=obj, item=item)
            edit = _namespace_edit(source.text, doc, obj_node, namespace, namespaced, why=why)
            if edit is not None:
                edits.append(edit)
    if not edits:
        return source
    text = source.text
    for offset, insert in sorted(edits, reverse=True):
        text = text[:offset] + insert + text[offset:]
    return Source(source.name, text, tuple(origin))


def _object_nodes(data: Any, node: Node | None, *, json_array: bool) -> Iterator[tuple[int | None, Any, Node]]:
    """(item, object, its node) for the document and, for a List, each of its items."""
    from yaml.nodes import MappingNode, SequenceNode

    if node is None or data is None:
        return
    if isinstance(data, list) and json_array and isinstance(node, SequenceNode):
        yield from ((j, obj, n) for j, (obj, n) in enumerate(zip(data, node.value, strict=False)))
    elif _is_list(data) and isinstance(node, MappingNode):
        items = next((v for k, v in node.value if getattr(k, "value", None) == "items"), None)
        if isinstance(items, SequenceNode):
            yield from ((j, obj, n) for j, (obj, n) in enumerate(zip(data["items"], items.value, strict=False)))
    else:
        yield None, data, node


def _namespace_edit(
    text: str, doc: Document, node: Node, namespace: str, namespaced: Namespaced, *, why: str
) -> tuple[int, str] | None:
    from yaml.nodes import MappingNode

    obj = doc.obj
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict) or metadata.get("namespace"):
        return None
    if not namespaced(str(obj.get("apiVersion") or ""), doc.kind):
        return None
    meta_node = next((v for k, v in getattr(node, "value", []) if getattr(k, "value", None) == "metadata"), None)
    edit = _insertion(text, meta_node, namespace) if isinstance(meta_node, MappingNode) else None
    if edit is None or "namespace" in metadata:
        raise errors.BadRequest(
            f'{doc.label}: cannot give this document the namespace "{namespace}" ({why}) as it is written; '
            "set its metadata.namespace, or pass -n"
        )
    return edit


def _insertion(text: str, mapping: MappingNode, namespace: str) -> tuple[int, str] | None:
    """Where and what to insert so ``mapping`` gains the key first, or None if the text is not as
    the marks say (then nothing is guessed)."""
    entry = f"namespace: {json.dumps(namespace)}"
    if mapping.flow_style:
        at = mapping.start_mark.index
        if at >= len(text) or text[at] != "{":
            return None
        return at + 1, entry + (", " if mapping.value else "")
    if not mapping.value:
        return None
    at = mapping.value[0][0].start_mark.index
    line_start = max(text.rfind("\n", 0, at), text.rfind("\r", 0, at)) + 1
    indent = text[line_start:at]
    if at > len(text) or indent.strip(" "):
        return None
    newline = "\r\n" if "\r\n" in text else "\n"
    return at, entry + newline + indent


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
        if not raw:
            raise errors.BadRequest("must specify -f with a file, directory or - (got an empty filename)")
        if raw == STDIN:
            out.append(raw)
        elif path.is_dir():
            out += [str(p) for p in sorted(path.iterdir()) if p.suffix in EXTENSIONS and p.is_file()]
        elif path.exists():
            out.append(raw)
        else:
            raise errors.BadRequest(f'the path "{raw}" does not exist')
    return out


def _read_stdin(stdin: TextIO) -> str:
    """Bytes decoded here, strictly: the text layer may be set to smuggle bad bytes through as
    surrogates, which no YAML parser or server can take."""
    raw = getattr(stdin, "buffer", None)
    if raw is None:
        return stdin.read()
    try:
        return bytes(raw.read()).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise errors.BadRequest(f"cannot read stdin: it is not UTF-8 text ({exc})") from None


def _read_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.BadRequest(f'cannot read "{path}": {exc}') from None
