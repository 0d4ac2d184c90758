"""``joch logs --tail N``: the last N lines of a run's log, then (with ``-f``) what follows.

The server streams a run's log from its start; the lines to skip are dropped here, as they arrive,
keeping only the last N in memory (a log may be gigabytes). With ``--follow`` the log is first read
to its current end (the last N lines printed), then followed, skipping the bytes already read: a
log only grows, so the followed stream begins with exactly those bytes. A run that has not started
has nothing to skip: it is followed from its first byte, as ``--tail`` asks for the last lines of a
log that was empty. ``--tail -1`` (kubectl's default) prints everything.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator

import typer

from joch.api import errors
from joch.cli import runs
from joch.cli.client import Client


def last_lines(chunks: Iterable[bytes], count: int) -> tuple[list[bytes], int]:
    """The last ``count`` lines of the stream (a final line without its newline counts), and its length."""
    kept: collections.deque[bytes] = collections.deque(maxlen=count or 1)
    partial = bytearray()  # appended in place: a long line without a newline must not be copied per chunk
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if b"\n" not in chunk:
            partial += chunk
            continue
        lines = chunk.split(b"\n")
        partial += lines[0]
        kept.append(bytes(partial) + b"\n")
        kept.extend(line + b"\n" for line in lines[1:-1])
        partial = bytearray(lines[-1])
    if partial:
        kept.append(bytes(partial))
    return (list(kept) if count else []), size


def _skip(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    for chunk in chunks:
        if size >= len(chunk):
            size -= len(chunk)
            continue
        yield chunk[size:]
        size = 0


def logs(client: Client, namespace: str, name: str, *, tail: int, follow: bool, attempt: int | None) -> None:
    if tail < 0:
        runs.logs(client, namespace, name, follow=follow, attempt=attempt)
        return
    params = {"attempt": str(attempt)} if attempt is not None else {}
    path = runs.log_path(namespace, name)
    try:
        lines, size = last_lines(client.stream_bytes(path, {**params, "follow": "false"}), tail)
    except errors.BadRequest:
        if not follow:
            raise
        lines, size = [], 0  # not started yet: the whole log is new
    for line in lines:
        typer.echo(line, nl=False)
    if follow:
        for chunk in _skip(client.stream_bytes(path, {**params, "follow": "true"}), size):
            typer.echo(chunk, nl=False)
