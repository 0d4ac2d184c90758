"""``OutputWatch``: the agent's output cut into lines for its output parser and the failure patterns."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from joch.runtime import runner
from joch.runtime.agentoutput import Observation


class Lines:
    """A parser that remembers every line it is given."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.finished = False

    def feed(self, line: str) -> Observation | None:
        self.lines.append(line)
        if line.startswith("usage "):
            return Observation(usage=[{"id": line.split()[1]}])
        if line.startswith("session "):
            return Observation(session_id=line.removeprefix("session "))
        if line == "fail":
            raise ValueError("bad line")
        return None

    def finish(self) -> Observation | None:
        self.finished = True
        return Observation(error="the end says it failed")


def watch(parser: Lines | None, *patterns: str) -> tuple[runner.OutputWatch, list[Any], list[str]]:
    usage: list[Any] = []
    sessions: list[str] = []
    w = runner.OutputWatch(parser, [re.compile(p) for p in patterns], on_usage=usage.extend,
                           on_session=sessions.append)
    return w, usage, sessions


def test_lines_are_whole_whatever_the_reads() -> None:
    parser = Lines()
    w, usage, sessions = watch(parser)
    for chunk in (b"one\r\ntw", b"o\n", b"", b"usage u1\nsess", b"ion s-9\n\nlast without newline"):
        w.feed(chunk)
    assert parser.lines == ["one", "two", "usage u1", "session s-9", ""]
    w.finish()
    assert parser.lines[-1] == "last without newline" and parser.finished
    assert (usage, sessions, w.error) == ([{"id": "u1"}], ["s-9"], "the end says it failed")


def test_a_long_line_is_cut_and_the_next_one_read() -> None:
    parser = Lines()
    w, _, _ = watch(parser, "^after$")
    w.feed(b"x" * (runner.MAX_LINE_BYTES + 10))
    w.feed(b"y" * 100 + b"\nafter\n")
    assert [len(line) for line in parser.lines] == [runner.MAX_LINE_BYTES, 5]
    assert w.failure == 'a line of its output matched the failure pattern "^after$": after'


def test_a_failing_parser_is_not_asked_again_and_patterns_still_apply() -> None:
    parser = Lines()
    w, _, sessions = watch(parser, "boom")
    w.feed(b"fail\nsession s-1\nboom " + b"z" * 400 + b"\n")
    assert parser.lines == ["fail"] and sessions == [] and w.parser is None
    assert w.failure is not None and w.failure.endswith("z" * 295 + "…")
    w.finish()
    assert not parser.finished


def test_without_a_parser_or_patterns_nothing_is_kept() -> None:
    w, _, _ = watch(None)
    w.feed(b"a" * 100)
    assert not w._line  # nothing to read it for: no copy is made


def test_a_session_id_that_would_read_as_an_option_or_more_is_not_taken() -> None:
    # Whatever the agent runs can print a line that looks like the CLI's session event; its id
    # lands in the resumed attempt's argv (`codex exec resume ID`), so it must not become a flag.
    parser = Lines()
    w, _, sessions = watch(parser)
    for forged in ("--dangerously-bypass-approvals-and-sandbox", "-c", "../../etc", "a b", "x/y", "s\u00e9", "",
                   "a" * 201):
        w.feed(f"session {forged}\n".encode())
    w.feed(b"session 0199a213-81c0-7800-8aa1-bbab2a035a53\nsession ses_3f2a.B:c-1\n")
    assert sessions == ["0199a213-81c0-7800-8aa1-bbab2a035a53", "ses_3f2a.B:c-1"]


def test_a_pattern_that_backtracks_catastrophically_is_given_up_not_the_runner(
        capsys: pytest.CaptureFixture[str]) -> None:
    # On every line the agent prints: a pattern that takes forever on a crafted line would hold the
    # runner (and the deadline it enforces) as long as the agent likes.
    w, _, _ = watch(None, r"^(a+)+$", "boom")
    started = time.monotonic()
    w.feed(b"a" * 40 + b"!\n")
    assert time.monotonic() - started < 5
    assert w.failure is None and [p.pattern for p in w.patterns] == ["boom"]
    assert 'the failure pattern "^(a+)+$" took more than' in capsys.readouterr().err
    w.feed(b"a" * 40 + b"!\nboom\n")  # the others still apply
    assert w.failure is not None and w.failure.endswith(": boom")


def test_a_matched_line_reaches_the_status_without_its_terminal_escapes() -> None:
    # The failure message is the run's status.message, which `joch describe run` prints to a terminal.
    w, _, _ = watch(None, "failed")
    w.feed(b"\x1b]0;pwned\x07\x1b[2J it failed\xe2\x80\xae\n")
    assert w.failure is not None and "\x1b" not in w.failure and "\u202e" not in w.failure
    assert w.failure.endswith(": \\x1b]0;pwned\\x07\\x1b[2J it failed\\u202e")
    assert runner._printable("codex-cli 0.169.0") == "codex-cli 0.169.0"
