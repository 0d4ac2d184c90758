"""Where a field of a manifest is written: its line and column in the YAML (or JSON) text.

A rejected batch names every problem by document and field path (``extra["documents"]``: index,
item, and causes at paths like ``spec.rules[0].expression``, see ``joch.admission.apply``). An
editor wants the line, so the console's apply page can put the message next to it.

Design decisions:

* **The same numbering as the loader.** The text is composed with the loader ``documents`` uses,
  one node per ``---`` section, empty sections counted, so ``documents[i]`` here is the document
  the cause names; an item of a ``kind: List`` is under ``items``, one of a top-level JSON array is
  the array's element. Composing builds nodes with marks and nothing else: it is only done for a
  request that already failed, never on the write path.
* **Paths are matched, not parsed.** ``diagnostics.format_path`` spells a key as written
  (``labels[app.kubernetes.io/name]``, ``on`` rather than ``true``), and a node's key keeps the
  text as written, so each step matches the path against the spelling of the keys actually there
  (the longest that fits). A ``[0]`` is an index in a list and a key ``"0"`` in a mapping.
* **Where a field is.** A mapping entry is at its key, a list item at the item, a document at its
  first node. A field that is not written (a required field left out, a default a Policy read)
  is shown at its closest written ancestor, with ``exact`` False; text that does not compose has
  no positions at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from joch.admission import documents
from joch.admission.diagnostics import format_path
from joch.api import errors


@dataclass(frozen=True)
class Position:
    """1-based ``line`` and ``column``; ``exact`` False when the field itself is not written and
    this is its closest written ancestor."""

    line: int
    column: int
    exact: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "column": self.column, "exact": self.exact}


class Positions:
    """The positions of fields in ``text``, composed once, on first use."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._roots: list[Node] | None = None

    def of(self, *, index: int, item: int | None = None, field: str = "") -> Position | None:
        """Where ``field`` (a path as ``format_path`` spells it, relative to the object) of
        ``documents[index]`` (``.items[item]``) is written; None when the document is not found."""
        roots = self._composed()
        if not 0 <= index < len(roots):
            return None
        node = _object_node(roots[index], item)
        if node is None:
            return None
        at, exact, rest, first = node, True, field, True
        while rest:
            step = _step(node, rest, first=first)
            if step is None:
                exact = False
                break
            node, at, rest = step
            first = False
        return Position(at.start_mark.line + 1, at.start_mark.column + 1, exact)

    def _composed(self) -> list[Node]:
        if self._roots is None:
            self._roots = list(_compose(self.text))
        return self._roots


def locate(details: Any, text: str) -> None:
    """Add ``line``, ``column`` and ``exact`` to every cause of ``details`` (the per-document list
    of a rejected batch, ``extra["documents"]``) whose field is found in ``text``."""
    if not isinstance(details, list):
        return
    positions = Positions(text)
    for detail in details:
        index, item = detail.get("index"), detail.get("item")
        if not isinstance(index, int):
            continue
        for cause in detail.get("causes") or []:
            found = positions.of(index=index, item=item if isinstance(item, int) else None,
                                 field=str(cause.get("field") or ""))
            if found is not None:
                cause.update(found.to_dict())


# --- composing -----------------------------------------------------------------------------------

def _compose(text: str) -> Iterator[Node]:
    """One node per document, numbered as ``documents.load_documents`` numbers them; nothing when
    the text is not YAML (or JSON) after all."""
    try:
        documents.check_nesting(text)
    except errors.BadRequest:
        return
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        while loader.check_node():
            node: Node | None = loader.get_node()
            if node is None:  # check_node() said there is one; kept for the type checker
                return
            yield node
    except (yaml.YAMLError, RecursionError):
        return
    finally:
        loader.dispose()


def _object_node(root: Node, item: int | None) -> Node | None:
    if item is None:
        return root
    if isinstance(root, SequenceNode):  # a top-level JSON array
        items: Node | None = root
    else:
        items = _value(root, "items")
    if isinstance(items, SequenceNode) and 0 <= item < len(items.value):
        child: Node = items.value[item]
        return child
    return None


def _value(node: Node, key: str) -> Node | None:
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode) and key_node.value == key:
                found: Node = value_node
                return found
    return None


def _step(node: Node, rest: str, *, first: bool) -> tuple[Node, Node, str] | None:
    """(the child ``rest`` starts with, the node marking where it is written, what is left of
    ``rest``), or None when no child of ``node`` is the next step of the path."""
    if isinstance(node, SequenceNode) and rest.startswith("["):
        close = rest.find("]")
        text = rest[1:close] if close > 0 else ""
        if text.isdigit() and int(text) < len(node.value):
            child: Node = node.value[int(text)]
            return child, child, rest[close + 1:]
        return None
    if not isinstance(node, MappingNode):
        return None
    best: tuple[Node, Node, str] | None = None
    for key_node, value_node in node.value:
        if not isinstance(key_node, ScalarNode):
            continue
        spelled = format_path((key_node.value,))
        if not spelled.startswith("[") and not first:
            spelled = f".{spelled}"
        after = rest[len(spelled):]
        if rest.startswith(spelled) and after[:1] in ("", ".", "[") and (best is None or len(after) < len(best[2])):
            best = (value_node, key_node, after)
    return best
