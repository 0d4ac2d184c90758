"""Cutting a run's log as Kubernetes' PodLogOptions do: ``tailLines`` (the last N lines, then, when
following, what follows) and ``limitBytes`` (stop after N bytes).

A runtime streams a log forwards from a byte offset (``Runtime.logs``), so the last lines are found
by reading to the current end while keeping only the last N in memory (a log may be gigabytes), and
a follower then continues from exactly the byte where that read stopped: a log only grows, so
nothing is shown twice and nothing is skipped.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator


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


def limited(chunks: Iterable[bytes], limit: int) -> Iterator[bytes]:
    """At most ``limit`` bytes of the stream; ends (without reading further) once they are out.
    Empty chunks (a follower's keep-alive, see ``Runtime.logs``) pass through."""
    left = limit
    for chunk in chunks:
        if len(chunk) >= left:
            if left:
                yield chunk[:left]
            return
        left -= len(chunk)
        yield chunk
