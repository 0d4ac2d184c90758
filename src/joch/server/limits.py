"""What one server process may hold open: watch streams and file descriptors.

* **Watch slots.** Every open watch stream (``?watch=1``, the ``/v1`` Server-Sent Events, a log
  followed with ``follow=true``) holds a
  socket, a subscription to the change feed and its buffer for as long as the client stays. With
  no cap, 1,100 watches against a 1,024-descriptor limit left no descriptor for the database or
  ``accept()``: the requests around them failed with 500s. ``WatchSlots`` counts the open streams;
  past ``ServerOptions.max_watches`` a new watch is refused with a 429 ``TooManyRequests`` Status
  and ``Retry-After``, as the apiserver's max-in-flight filter refuses, so clients back off and
  retry rather than take the server down. A slot is taken before the watch is opened and given
  back when its stream ends, however it ends.
* **The default cap follows the descriptor limit** (``default_max_watches``): one descriptor per
  watch, half of what is left after a reserve for the database, the runtime's logs and pipes, and
  ordinary requests.
* **``raise_fd_limit``**: ``joch server`` raises its soft open-file limit to the hard limit (capped
  at ``FD_LIMIT_CAP``) at start, as most servers do, since the distributions' soft default of 1,024
  is far below what a watch-serving process needs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from joch.api import errors

log = logging.getLogger("joch.server")

FD_LIMIT_CAP = 65_536
FD_RESERVE = 256
MIN_WATCHES = 16
RETRY_AFTER_SECONDS = 5


def fd_limit() -> int | None:
    """The soft open-file limit of this process (None where there is none to read)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def raise_fd_limit(cap: int = FD_LIMIT_CAP) -> int | None:
    """Raise the soft open-file limit to the hard one (at most ``cap``); the limit now in force."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:  # e.g. a sandbox that forbids it: keep what we have
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
            return soft
        log.info("raised the open-file limit from %d to %d", soft, target)
        return target
    return None if soft == resource.RLIM_INFINITY else soft


def default_max_watches(limit: int | None = None) -> int:
    """Half the descriptors left after ``FD_RESERVE``, at least ``MIN_WATCHES``."""
    limit = limit if limit is not None else fd_limit()
    if limit is None:
        return FD_LIMIT_CAP // 2
    return max(MIN_WATCHES, (limit - FD_RESERVE) // 2)


class WatchSlots:
    """Counts open watch streams; ``acquire`` refuses one past ``limit`` (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._open = 0

    @property
    def open(self) -> int:
        return self._open

    def acquire(self) -> Callable[[], None]:
        """Take a slot; the returned function gives it back (calling it again does nothing)."""
        with self._lock:
            if self._open >= self.limit:
                raise errors.retry_after(errors.TooManyRequests(
                    f"too many open watches and followed logs: this server serves at most {self.limit} at once "
                    "(joch server --max-watches); try again later"), RETRY_AFTER_SECONDS)
            self._open += 1
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if not released.is_set():
                    released.set()
                    self._open -= 1

        return release
