"""Telling a full disk apart from other failures, for the runner and the local runtime.

A write that fails with ``ENOSPC`` (or ``EDQUOT``, a quota: the same to the user) ends a run
``Failed`` with reason ``DiskFull`` and a message naming the file that could not be written and the
space left, instead of a traceback and a runner that vanished. When nobody saw the failing write (a
runner that died before it could record anything), a filesystem with less than ``LOW_SPACE`` free
is taken as the cause. Standard library only: the runner imports this on every start.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

LOW_SPACE = 1024 * 1024
"""Below this many free bytes a filesystem counts as full."""
REASON = "DiskFull"
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_full_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _FULL


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes on the filesystem that holds (or would hold) ``path``, for an unprivileged user;
    None if unknown."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent  # not created yet: its nearest existing ancestor holds it
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_full(path: str | os.PathLike[str]) -> bool:
    free = free_bytes(path)
    return free is not None and free < LOW_SPACE


def describe(path: str | os.PathLike[str], *, doing: str = "cannot write") -> str:
    """``the disk is full: cannot write PATH (N bytes free on its filesystem)``."""
    where = Path(path)
    free = free_bytes(where)
    left = f" ({free} bytes free on its filesystem)" if free is not None else ""
    return f"the disk is full: {doing} {where}{left}"
