"""Running out of file descriptors: recognise it, answer 503 with ``Retry-After``, log it once.

At the process's open-file limit every ``open()``, ``accept()`` and new database connection fails
at once and keeps failing until something closes. Reporting each failure with a traceback turned
one condition into tens of megabytes of log in seconds, and a 500 told clients nothing useful.
So: a store operation that cannot open a file or connection for lack of descriptors raises
``ServiceUnavailable`` carrying ``retryAfterSeconds`` (the server adds the ``Retry-After`` header),
and ``ThrottledLog`` says so at most once per interval, counting what it left out.

SQLite reports the condition only as "unable to open database file" (no errno): ``confirm`` tells
it apart from a real path problem by trying to open ``/dev/null``.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

from joch.api import errors

EXHAUSTED = (errno.EMFILE, errno.ENFILE)
RETRY_AFTER_SECONDS = 1


class ThrottledLog:
    """A warning logged at most once per ``interval`` seconds; later ones are counted, and the
    count is reported with the next one logged."""

    def __init__(self, logger: logging.Logger, interval: float = 60.0) -> None:
        self._logger = logger
        self._interval = interval
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._suppressed = 0

    def warning(self, message: str) -> bool:
        """Log ``message`` unless one was logged within the interval; True when it was logged."""
        with self._lock:
            now = time.monotonic()
            if now - self._last < self._interval:
                self._suppressed += 1
                return False
            self._last, suppressed, self._suppressed = now, self._suppressed, 0
        more = f" ({suppressed} more since the last report)" if suppressed else ""
        self._logger.warning("%s%s", message, more)
        return True


log = logging.getLogger("joch.resources")
_reported = ThrottledLog(log)


def is_exhausted(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in EXHAUSTED


def confirm() -> bool:
    """True when this process cannot open a file right now for lack of descriptors."""
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
    except OSError as exc:
        return exc.errno in EXHAUSTED
    os.close(fd)
    return False


def unavailable(what: str) -> errors.JochError:
    """The 503 for an operation that failed for lack of descriptors; reported once per minute."""
    _reported.warning(f"out of file descriptors: {what} failed; answering 503 until some are free "
                      "(raise the open-file limit, ulimit -n, or lower --max-watches)")
    return errors.retry_after(
        errors.ServiceUnavailable(f"the server is out of file descriptors ({what} failed); try again shortly"),
        RETRY_AFTER_SECONDS,
    )
