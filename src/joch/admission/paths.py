"""Local paths in manifests: relative to the manifest's directory, sent as absolute paths.

A repository written as a local path (``execution.coordinates.git.url: ../..``) is meaningful only
where the manifest was written; the server runs in another working directory, possibly on another
host. So a relative path never reaches the API (its schema rejects one, see
``kinds.relative_local_path``): whoever reads the manifest from a file resolves it against that
file's directory — ``joch apply -f`` and ``joch create -f`` in the CLI (editing the text it sends,
see ``joch.cli.manifests.with_absolute_paths``), ``joch server --apply`` here — and stdin against
the current directory. ``~`` is expanded as a shell would. Which fields hold such paths is declared
per kind in ``kinds.LOCAL_PATHS``; ``absolute`` is the one spelling both clients produce, so a
file applied by either is ``unchanged`` when applied by the other.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from joch.admission.documents import STDIN, Document
from joch.api.kinds import LOCAL_PATHS, relative_local_path

FieldPath = tuple[str, ...]


def absolute(path: str, base: Path) -> str:
    """``path`` (relative to ``base``, or ``~/…``) as a normalized absolute path."""
    return os.path.normpath((base / Path(path).expanduser()).resolve())


def base_of(source: str) -> Path:
    """The directory relative paths in ``source`` (a file name, or ``-``) are relative to."""
    return Path.cwd() if source in (STDIN, "stdin") else Path(source).resolve().parent


def relative_fields(obj: Any) -> Iterator[tuple[FieldPath, str]]:
    """(field path, value) of every local-path field of ``obj`` that holds a relative path."""
    if not isinstance(obj, dict):
        return
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    group = api_version.rpartition("/")[0] if isinstance(api_version, str) else ""
    for path in LOCAL_PATHS.get(f"{group}/{kind}", ()):
        value: Any = obj
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str) and value and relative_local_path(value):
            yield path, value


def resolved(doc: Document) -> Document:
    """``doc`` with every relative local path made absolute against its source's directory."""
    found = list(relative_fields(doc.obj))
    if not found:
        return doc
    obj = copy.deepcopy(doc.obj)
    base = base_of(doc.source)
    for path, value in found:
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = absolute(value, base)
    return dataclasses.replace(doc, obj=obj)
