"""``/joch run`` comment commands: ``/joch run [agent=NAME] [key=value ...]``.

Only the first line that starts with the command counts (a quoted reply, ``> /joch run``, does not
start with it); the rest of that line is split like a shell would (``shlex``), so a value with spaces
is quoted: ``/joch run agent=demo "text=fix the login page"``. ``agent`` names the agent; every other
``key=value`` is a run parameter. Anything else on the line is an error whose message shows the syntax,
so a person who mistyped learns what to write instead of seeing nothing happen.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")


class CommandError(ValueError):
    """A command line that is not ``/joch run [agent=NAME] [key=value ...]``; the message says why."""


@dataclass(frozen=True)
class Command:
    agent: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)


def syntax(command: str = "/joch run") -> str:
    return f'{command} [agent=NAME] [key=value ...] (quote a value with spaces: "key=some value")'


def parse_command(text: str, command: str = "/joch run") -> Command | None:
    """The command in a comment body, or None when no line starts with it."""
    line = _command_line(text, command)
    if line is None:
        return None
    try:
        tokens = shlex.split(line, comments=False, posix=True)
    except ValueError as exc:
        raise CommandError(f"cannot read {line.strip()!r}: {exc}; write {syntax(command)}") from None
    agent: str | None = None
    parameters: dict[str, str] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or not _KEY.match(key):
            raise CommandError(f"{token!r} is not key=value: write {syntax(command)}")
        if key == "agent":
            if not value:
                raise CommandError(f"agent= names no agent: write {syntax(command)}")
            if agent is not None:
                raise CommandError(f"agent is given twice: write {syntax(command)}")
            agent = value
            continue
        if key in parameters:
            raise CommandError(f"parameter {key!r} is given twice: write {syntax(command)}")
        parameters[key] = value
    return Command(agent=agent, parameters=parameters)


def _command_line(text: str, command: str) -> str | None:
    for raw in text.splitlines():
        line = raw.strip()
        if line == command:
            return ""
        if line.startswith(command) and line[len(command)].isspace():
            return line[len(command):]
    return None
