"""The ``joch`` typer application: arguments and options only; behaviour lives in sibling modules.

Errors are reported in exactly one place, ``reported``, which ``command`` wraps around every
command: a ``JochError`` becomes ``error: <message>`` plus one ``  - <field>: <message>`` line per
cause on stderr, and the process exits with the error's ``exit_code`` (the table in ``joch --help``
is generated from the error classes). A message that already ends with the list of its causes
(Kubernetes' ``X is invalid: [a: ..., b: ...]``) is cut before the list, so each cause is printed
once. A user error never shows a traceback; a traceback is a bug.

Usage errors found while parsing (an unknown option, a value that is not a number, a missing
argument) are reported the same way, ``error: ...`` and exit code 2, by ``Commands.main``, instead
of click's usage banner and a rich box. Options with a fixed set of values are plain strings
checked by ``_one_of``, so the message says what is allowed in the words the user typed.

Help text is rendered as Markdown (typer + rich): paragraphs reflow to the terminal, and nothing in
a help string is mistaken for rich markup (``[NAME]`` stays literal).

Like kubectl, ``--server`` and ``-n`` work before or after the command name. They are declared on
the root callback and again on each command; a value given after the command wins, then the root
value, then the environment (``JOCH_SERVER``, ``JOCH_NAMESPACE``), then the default. The
environment is read here, not by typer, because ``JOCH_NAMESPACE`` means something different from
``-n``: a default, which manifests naming another namespace override (see ``namespaces``).

Start-up time is part of the interface (every command pays it): the heavy libraries are imported
where they are used, not with the CLI: the web stack in ``serving``, httpx in ``client``, yaml in
``manifests`` and ``printers``, the admission package (for its YAML checks) in ``manifests``.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from typer.core import TyperGroup

from joch.api import errors
from joch.cli import (
    completing,
    contexts,
    helptypes,
    manifests,
    namespaces,
    reading,
    runs,
)
from joch.cli.client import Client, server_url
from joch.cli.namespaces import Namespace

_MEANING = {
    0: "success",
    1: "internal error",
    2: "invalid request or manifest",
    3: "not found",
    4: "not authenticated or not allowed",
    5: "conflict: already exists or changed since read",
    6: "expired resourceVersion or continue token",
    7: "server unreachable or unavailable",
}
USAGE_EXIT_CODE = errors.BadRequest.exit_code
OUTPUTS = ("wide", "yaml", "json", "name")
APPLY_OUTPUTS = ("yaml", "json", "name")
DRY_RUN = ("none", "server")


def exit_codes_help() -> str:
    """The exit-code table, generated from the error classes so it cannot drift from them."""
    reasons: dict[int, list[str]] = {0: []}
    for cls in errors.JochError.__subclasses__():
        reasons.setdefault(cls.exit_code, []).append(cls.reason)
    lines = []
    for code in sorted(reasons):
        detail = f" ({', '.join(sorted(set(reasons[code])))})" if reasons[code] else ""
        lines.append(f"- **{code}** {_MEANING.get(code, 'error')}{detail}")
    lines.append(f"- **{runs.FAILED_EXIT_CODE}** the run ended Failed (`run --follow`)")
    lines.append(f"- **{runs.CANCELLED_EXIT_CODE}** the run ended Cancelled (`run --follow`)")
    lines.append("- **10** a rule denied an object (`policy test`)")
    lines.append("- **1** also: `wait` timed out")
    lines.append("- **130** interrupted (Ctrl-C, e.g. to end `get -w`)")
    return "**Exit codes**\n\n" + "\n".join(lines)


P = ParamSpec("P")
R = TypeVar("R")


def reported(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a command; a ``JochError`` becomes the error lines and its exit code."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except errors.JochError as exc:
            report(exc)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(141) from None

    return run


def report(exc: errors.JochError) -> None:
    lines = errors.report_lines(exc)
    if _json_logs():
        logging.getLogger("joch").error("%s", "\n".join(lines))
    else:
        typer.echo("\n".join(lines), err=True)


def _json_logs() -> bool:
    """``joch server`` or ``joch controller`` writing JSON log lines (``--log-format json``): an error
    that stops it is one more of them, or a collector would take each line for a record of its own.
    Only those commands import ``joch.telemetry.logs``; the others do not load it to ask."""
    logs = sys.modules.get("joch.telemetry.logs")
    return logs is not None and logs.current_format() == "json"


def warn(text: str) -> None:
    typer.echo(f"Warning: {text}", err=True)


class Commands(helptypes.PlainTypes, TyperGroup):
    """Reports what click finds wrong with the command line as ``error: ...`` and exit code 2."""

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
        standalone_mode: bool = True, **extra: Any,
    ) -> Any:
        from joch.cli import completing

        if completing.asked():  # a shell asks for completions (``joch completion``)
            completing.init()
            complete_var, prog_name = completing.COMPLETE_VAR, "joch"
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as exc:  # click's UsageError and BadParameter, in typer >= 0.29
            typer.echo(f"error: {usage_error(exc)}", err=True)
            code = getattr(exc, "exit_code", USAGE_EXIT_CODE)
        except typer.Abort:
            code = 130
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


_EXPECTED = {"int_parsing": "must be a whole number", "float_parsing": "must be a number",
             "bool_parsing": "must be true or false"}


def usage_error(exc: typer.TyperException) -> str:
    """``--port must be a whole number (got "x")``-style text from a click exception."""
    if isinstance(exc, typer.BadParameter) and exc.param is not None and exc.message:
        opts = [o for o in getattr(exc.param, "opts", []) if o.startswith("--")]
        name = opts[0] if opts else (exc.param.name or "").upper()
        problems = getattr(exc.__cause__, "errors", None)  # typer checks values with pydantic
        problem = problems()[0] if callable(problems) and problems() else {}
        given = f' (got "{problem["input"]}")' if "input" in problem else ""
        if problem.get("type") in _EXPECTED:
            return f"{name} {_EXPECTED[problem['type']]}{given}"
        return f"invalid value for {name}: {exc.message.removeprefix('Value error, ').rstrip('.')}{given}"
    text = exc.format_message().strip().rstrip(".")
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def _one_of(option: str, value: str | None, allowed: tuple[str, ...]) -> str | None:
    if value is None or value in allowed:
        return value
    raise errors.BadRequest(f'{option} must be one of {", ".join(allowed)} (got "{value}")')


app = typer.Typer(
    name="joch",
    cls=Commands,
    help="Joch: a control plane for fleets of AI coding agents.",
    epilog=exit_codes_help(),
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def command(name: str, *, hidden: bool = False) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``app.command`` with error reporting; every command is registered through this."""

    def register(fn: Callable[P, R]) -> Callable[P, R]:
        app.command(name, cls=helptypes.Command, hidden=hidden)(reported(fn))
        return fn

    return register


ServerOption = Annotated[
    str | None,
    typer.Option("--server", "-s", metavar="URL", show_default=False,
                 help="Joch server URL (env JOCH_SERVER; else the current context's, see joch config; "
                      "default http://127.0.0.1:8080)."),
]
NamespaceOption = Annotated[
    str | None,
    typer.Option("--namespace", "-n", show_default=False,
                 help="Namespace. Default: JOCH_NAMESPACE, else the current context's, else default; "
                      "unlike -n, JOCH_NAMESPACE does not override a namespace written in a manifest."),
]
FilenameOption = Annotated[
    list[str] | None,
    typer.Option("--filename", "-f", metavar="PATH", show_default=False,
                 help="A file, a directory (its .yaml, .yml and .json files) or - for stdin. Repeatable."),
]
DryRunOption = Annotated[
    str, typer.Option("--dry-run", metavar="none|server", help="server: validate and report, write nothing."),
]
ApplyOutputOption = Annotated[
    str | None,
    typer.Option("--output", "-o", metavar="yaml|json|name", show_default=False,
                 help="Print objects as yaml, json or name."),
]
KindArgument = Annotated[str, typer.Argument(metavar="KIND", help="Kind, plural, short name or plural.group; "
                                             "or TYPE/NAME, several of them.", autocompletion=completing.kinds)]
NamesArgument = Annotated[list[str] | None, typer.Argument(metavar="NAME", help="Names of objects.",
                                                           show_default=False, autocompletion=completing.names)]


@dataclass(frozen=True)
class Settings:
    server: str | None
    namespace: str | None
    token: str | None = None


@app.callback()
def root(
    ctx: typer.Context,
    server: Annotated[str | None, typer.Option("--server", "-s", metavar="URL", show_default=False,
                                               help="Joch server URL (env JOCH_SERVER; else the current "
                                                    "context's, see joch config; default "
                                                    "http://127.0.0.1:8080).")] = None,
    namespace: NamespaceOption = None,
    token: Annotated[str | None, typer.Option("--token", metavar="TOKEN", show_default=False,
                                              help="Bearer token for the server (env JOCH_TOKEN; default: the "
                                                   "current context's, see joch config).")] = None,
) -> None:
    ctx.obj = Settings(server=server, namespace=namespace, token=token)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


def _settings(ctx: typer.Context) -> Settings:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Settings) else Settings(server=None, namespace=None)


def _namespace(ctx: typer.Context, namespace: str | None) -> Namespace:
    context = contexts.current()
    return namespaces.choose(namespace or _settings(ctx).namespace, context.namespace if context else None)


def _target(ctx: typer.Context, server: str | None) -> tuple[str, str | None]:
    """The server URL and the token a command talks to it with (flags, environment, then context)."""
    settings = _settings(ctx)
    context = contexts.current()
    url = server_url(server or settings.server, context_server=context.server if context else None,
                     context=context.name if context else "")
    return url, contexts.token(settings.token, context)


@contextmanager
def _client(ctx: typer.Context, server: str | None) -> Iterator[Client]:
    url, token = _target(ctx, server)
    client = Client(base_url=url, on_warning=warn, token=token)
    try:
        yield client
    finally:
        client.close()


def _read(filenames: list[str] | None) -> list[manifests.Source]:
    if not filenames:
        raise errors.BadRequest("must specify one of -f/--filename")
    return manifests.read(filenames, sys.stdin)



def _scope(ctx: typer.Context, namespace: str | None, all_namespaces: bool) -> reading.Scope:
    return reading.Scope(namespace=_namespace(ctx, namespace), all_namespaces=all_namespaces)



def subcommand(group: typer.Typer, name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    def register(fn: Callable[P, R]) -> Callable[P, R]:
        group.command(name, cls=helptypes.Command)(reported(fn))
        return fn

    return register

