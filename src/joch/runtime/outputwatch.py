"""The agent's output as the runner reads it for itself (``OutputWatch``), line by line after
redaction: each line goes to the provider's output parser (``agentoutput``: usage, the CLI's session
id, its own verdict) and is searched for the success policy's failure patterns, each search bounded
in time (``bounded_search``). Standard library only, like the runner: it loads in every run.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from joch.runtime import agentoutput
from joch.runtime.usage import say as _say

MAX_LINE_BYTES = 1 << 20    # a longer output line is cut before the output parser and failure patterns see it
PATTERN_SECONDS = 0.5       # the longest a failure pattern may search one line before it is given up


def printable(text: str) -> str:
    """``text`` with its control characters written out (``\\x1b``): what the agent printed or named
    (its CLI's version line, a line of its output, a file name) reaches the run's status, which
    ``joch describe run`` prints to a terminal, where an escape sequence would be obeyed."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                   for c in text)


class OutputWatch:
    """The agent's output as the runner reads it for itself, line by line after redaction: each line
    goes to the provider's output parser (``agentoutput``: usage, the CLI's session id, its own
    verdict) and is searched for the success policy's failure patterns. A line that does not end
    within ``MAX_LINE_BYTES`` is cut there (the log keeps it whole); a parser that fails is reported
    on the runner's stderr and not asked again, and the run goes on."""

    def __init__(self, parser: agentoutput.Parser | None, patterns: Sequence[re.Pattern[str]], *,
                 on_usage: Callable[[list[dict[str, Any]]], None], on_session: Callable[[str], None]) -> None:
        self.parser = parser
        self.patterns = tuple(patterns)
        self.on_usage = on_usage
        self.on_session = on_session
        self.failure: str | None = None  # the first line a failure pattern matched, said for a person
        self.error: str | None = None    # the CLI's own final verdict, when it says it failed
        self._line = bytearray()
        self._cut = False
        self._said_bad_session = False

    def feed(self, data: bytes) -> None:
        if self.parser is None and not self.patterns:
            return
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self._hold(data[start:end])
            self._complete()
            start = end + 1
        self._hold(data[start:])

    def finish(self) -> None:
        if self._line or self._cut:
            self._complete()
        if self.parser is not None:
            self._ask(self.parser.finish)

    def _hold(self, piece: bytes) -> None:
        room = MAX_LINE_BYTES - len(self._line)
        if len(piece) > room:
            piece, self._cut = piece[:room], True
        self._line += piece

    def _complete(self) -> None:
        line = self._line.decode(errors="replace").removesuffix("\r")
        self._line.clear()
        self._cut = False
        if self.failure is None:
            for pattern in self.patterns:
                found = bounded_search(pattern, line, PATTERN_SECONDS)
                if found is None:  # too slow: on every line of the agent's, it would hold up the runner
                    self.patterns = tuple(p for p in self.patterns if p is not pattern)
                    _say(f'joch runner: the failure pattern "{pattern.pattern}" took more than {PATTERN_SECONDS:g} s '
                         "on one line of the agent's output (a pattern that backtracks, such as (a+)+); it is not "
                         "applied to the rest of the output (successPolicy.failurePatterns)")
                elif found:
                    shown = printable(line if len(line) <= 300 else line[:300] + "…")
                    self.failure = f'a line of its output matched the failure pattern "{pattern.pattern}": {shown}'
                    break
        if self.parser is not None:
            parser = self.parser
            self._ask(lambda: parser.feed(line))

    def _ask(self, call: Callable[[], agentoutput.Observation | None]) -> None:
        try:
            seen = call()
        except Exception as exc:  # noqa: BLE001 - a parser's bug must not end the run
            _say(f"joch runner: the output parser failed ({type(exc).__name__}: {exc}); the rest of the output is "
                 "not parsed")
            self.parser = None
            return
        if seen is None:
            return
        if seen.usage:
            self.on_usage(seen.usage)
        if seen.session_id:
            if agentoutput.valid_session_id(seen.session_id):
                self.on_session(seen.session_id)
            elif not self._said_bad_session:
                self._said_bad_session = True
                _say(f"joch runner: ignored a session id that is not one (it would be passed to a resumed attempt's "
                     f"command line): {seen.session_id[:100]!r}")
        if seen.error:
            self.error = seen.error


class _TooSlow(Exception):
    pass


def bounded_search(pattern: re.Pattern[str], line: str, seconds: float) -> bool | None:
    """Whether ``pattern`` matches somewhere in ``line``; None when it takes more than ``seconds``
    (a pattern that backtracks catastrophically would otherwise stop the runner, and with it the
    deadline, for as long as it likes: the ``re`` engine takes signals, so SIGALRM ends it). Unbounded
    outside the main thread, where no signal handler can be set."""
    if threading.current_thread() is not threading.main_thread():
        return pattern.search(line) is not None
    armed = True

    def expire(signum: int, frame: FrameType | None) -> None:
        if armed:
            raise _TooSlow

    previous = signal.signal(signal.SIGALRM, expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            found = pattern.search(line) is not None
        finally:
            armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _TooSlow:
        return None
    finally:
        signal.signal(signal.SIGALRM, previous)
    return found
