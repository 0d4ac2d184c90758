"""The ``joch`` typer application: arguments and options only; behaviour lives in sibling modules.

Errors are reported in exactly one place, ``reported``, which ``command`` wraps around every
command: a ``JochError`` becomes ``error: <message>`` plus one ``  - <field>: <message>`` line per
cause on stderr, and the process exits with the error's ``exit_code`` (the table in ``joch --help``
is generated from the error classes). A user error never shows a traceback; a traceback is a bug.

Help text is rendered as Markdown (typer + rich): paragraphs reflow to the terminal, and nothing in
a help string is mistaken for rich markup (``[NAME]`` stays literal).

Like kubectl, ``--server`` and ``-n`` work before or after the command name. They are declared on
the root callback (which also reads ``JOCH_SERVER``/``JOCH_NAMESPACE``) and again on each command;
a value given after the command wins, then the root value or environment, then the default.
"""

from __future__ import annotations

import enum
import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer

import joch
from joch.api import errors
from joch.api.meta import DEFAULT_NAMESPACE
from joch.cli import applying, manifests, reading, serving
from joch.cli.client import Client, server_url

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


def exit_codes_help() -> str:
    """The exit-code table, generated from the error classes so it cannot drift from them."""
    reasons: dict[int, list[str]] = {0: []}
    for cls in errors.JochError.__subclasses__():
        reasons.setdefault(cls.exit_code, []).append(cls.reason)
    lines = []
    for code in sorted(reasons):
        detail = f" ({', '.join(sorted(set(reasons[code])))})" if reasons[code] else ""
        lines.append(f"- **{code}** {_MEANING.get(code, 'error')}{detail}")
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
    typer.echo(f"error: {exc.message}", err=True)
    for cause in exc.causes:
        prefix = f"{manifests.readable_field(cause.field)}: " if cause.field else ""
        typer.echo(f"  - {prefix}{cause.message}", err=True)


def warn(text: str) -> None:
    typer.echo(f"Warning: {text}", err=True)


app = typer.Typer(
    name="joch",
    help="Joch: a control plane for fleets of AI coding agents.",
    epilog=exit_codes_help(),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def command(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``app.command`` with error reporting; every command is registered through this."""

    def register(fn: Callable[P, R]) -> Callable[P, R]:
        app.command(name)(reported(fn))
        return fn

    return register


class Output(enum.StrEnum):
    wide = "wide"
    yaml = "yaml"
    json = "json"
    name = "name"


class ApplyOutput(enum.StrEnum):
    yaml = "yaml"
    json = "json"
    name = "name"


class DryRun(enum.StrEnum):
    none = "none"
    server = "server"


ServerOption = Annotated[
    str | None,
    typer.Option("--server", "-s", help="Joch server URL (env JOCH_SERVER; default http://127.0.0.1:8080).",
                 show_default=False),
]
NamespaceOption = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Namespace (env JOCH_NAMESPACE; default: default).",
                 show_default=False),
]
FilenameOption = Annotated[
    list[str] | None,
    typer.Option("--filename", "-f", show_default=False,
                 help="A file, a directory (its .yaml, .yml and .json files) or - for stdin. Repeatable."),
]


@dataclass(frozen=True)
class Settings:
    server: str | None
    namespace: str | None


@app.callback()
def root(
    ctx: typer.Context,
    server: Annotated[str | None, typer.Option("--server", "-s", envvar="JOCH_SERVER", show_default=False,
                                               help="Joch server URL (default http://127.0.0.1:8080).")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", envvar="JOCH_NAMESPACE",
                                                  show_default=False,
                                                  help="Namespace (default: default).")] = None,
) -> None:
    ctx.obj = Settings(server=server, namespace=namespace)


def _settings(ctx: typer.Context) -> Settings:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Settings) else Settings(server=None, namespace=None)


def _explicit_namespace(ctx: typer.Context, namespace: str | None) -> str | None:
    return namespace or _settings(ctx).namespace


def _namespace(ctx: typer.Context, namespace: str | None) -> str:
    return _explicit_namespace(ctx, namespace) or DEFAULT_NAMESPACE


@contextmanager
def _client(ctx: typer.Context, server: str | None) -> Iterator[Client]:
    client = Client(base_url=server_url(server or _settings(ctx).server), on_warning=warn)
    try:
        yield client
    finally:
        client.close()


def _read(filenames: list[str] | None) -> list[manifests.Source]:
    if not filenames:
        raise errors.BadRequest("must specify one of -f/--filename")
    return manifests.read(filenames, sys.stdin)


def _documents(filenames: list[str] | None, namespace: str | None) -> list[manifests.Document]:
    docs = manifests.documents(_read(filenames))
    applying.check_namespaces(docs, namespace)
    return docs


@command("server")
def server_command(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Directory of the embedded SQLite store.")] = Path(
        ".joch"
    ),
    store: Annotated[str | None, typer.Option("--store", envvar="JOCH_STORE", show_default=False,
                                              help="Store URL (sqlite:///path or postgresql://...); "
                                                   "default sqlite:///DATA_DIR/joch.db.")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8080,
    apply_paths: Annotated[list[str] | None, typer.Option("--apply", show_default=False,
                                                          help="Manifests to apply at start. Repeatable.")] = None,
) -> None:
    """Run the Joch API server (embedded SQLite in DATA_DIR unless --store is given)."""
    serving.run(data_dir=data_dir, store=store, host=host, port=port, apply_paths=apply_paths)


@command("apply")
def apply_command(
    ctx: typer.Context,
    filenames: FilenameOption = None,
    dry_run: Annotated[DryRun, typer.Option("--dry-run", help="server: validate and report, write nothing.")] = (
        DryRun.none
    ),
    output: Annotated[ApplyOutput | None, typer.Option("--output", "-o", show_default=False,
                                                       help="Print objects as yaml, json or name.")] = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Create or update resources from manifests, all or nothing.

    Every -f goes to the server in one request: if any document is rejected, nothing is written,
    and every problem is listed by file, document, kind/name and field path."""
    sources = _read(filenames)
    with _client(ctx, server) as client:
        applying.apply(client, sources, namespace=_explicit_namespace(ctx, namespace),
                       dry_run=dry_run is DryRun.server, output=output.value if output else None, warn=warn)


@command("create")
def create_command(
    ctx: typer.Context,
    filenames: FilenameOption = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Create resources from manifests, one request per document (metadata.generateName works).

    Not atomic: creation stops at the first error and the objects created before it remain.
    Use `joch apply` for all-or-nothing."""
    docs = _documents(filenames, _explicit_namespace(ctx, namespace))
    with _client(ctx, server) as client:
        applying.create(client, docs, default_namespace=_namespace(ctx, namespace))


def _scope(ctx: typer.Context, namespace: str | None, all_namespaces: bool) -> reading.Scope:
    return reading.Scope(namespace=_namespace(ctx, namespace), all_namespaces=all_namespaces)


GET_KIND_HELP = "Kind, plural, short name or plural.group; KIND/NAME; several as agents,ap; or all."


@command("get")
def get_command(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(help=GET_KIND_HELP)],
    names: Annotated[list[str] | None, typer.Argument(help="Names of objects.", show_default=False)] = None,
    namespace: NamespaceOption = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A", help="List in all namespaces.")] = False,
    output: Annotated[Output | None, typer.Option("--output", "-o", show_default=False,
                                                  help="wide, yaml, json or name.")] = None,
    selector: Annotated[str | None, typer.Option("--selector", "-l", show_default=False,
                                                 help="Label selector, e.g. team=core,tier!=test.")] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="After listing, print changes as they happen.")] = (
        False
    ),
    server: ServerOption = None,
) -> None:
    """List resources as a table, or print objects as YAML/JSON."""
    kind, object_names = reading.split_kind(kind, names or [])
    if object_names and all_namespaces:
        raise errors.BadRequest("a resource cannot be retrieved by name across all namespaces")
    request = reading.GetRequest(
        kind=kind, names=object_names, scope=_scope(ctx, namespace, all_namespaces),
        output=output.value if output else None, selector=selector, watch=watch,
    )
    with _client(ctx, server) as client:
        reading.get(client, request)


@command("describe")
def describe_command(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(help="Kind, plural, short name or plural.group; or KIND/NAME.")],
    names: Annotated[list[str] | None, typer.Argument(help="Names of objects.", show_default=False)] = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Show an object in detail: metadata, spec, status, conditions and events."""
    kind, object_names = reading.split_kind(kind, names or [])
    if not object_names:
        raise errors.BadRequest("you must specify the name of the resource to describe")
    with _client(ctx, server) as client:
        reading.describe(client, kind=kind, names=object_names, scope=_scope(ctx, namespace, False))


@command("delete")
def delete_command(
    ctx: typer.Context,
    kind: Annotated[str | None, typer.Argument(help="Kind, plural, short name or plural.group; or KIND/NAME.",
                                               show_default=False)] = None,
    names: Annotated[list[str] | None, typer.Argument(help="Names of objects.", show_default=False)] = None,
    filenames: FilenameOption = None,
    ignore_not_found: Annotated[bool, typer.Option("--ignore-not-found",
                                                   help="Treat a missing object as deleted.")] = False,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Delete objects by kind and name, or those named in manifests (-f).

    Continues after a failure and exits with the first failure's code."""
    with _client(ctx, server) as client:
        failure = _delete(ctx, client, kind, names or [], filenames, namespace, ignore_not_found)
    if failure is not None:
        raise typer.Exit(failure.exit_code)


def _delete(
    ctx: typer.Context, client: Client, kind: str | None, names: list[str], filenames: list[str] | None,
    namespace: str | None, ignore_not_found: bool,
) -> errors.JochError | None:
    if filenames:
        if kind:
            raise errors.BadRequest("give either -f or KIND NAME..., not both")
        return applying.delete_documents(
            client, _documents(filenames, _explicit_namespace(ctx, namespace)),
            default_namespace=_namespace(ctx, namespace),
            ignore_not_found=ignore_not_found, report=report,
        )
    if not kind:
        raise errors.BadRequest("you must specify a KIND and NAME..., or -f")
    kind, object_names = reading.split_kind(kind, names)
    if not object_names:
        raise errors.BadRequest(f'you must specify the name of the {kind} to delete (or use -f)')
    rt = client.discovery.resolve(kind)
    return applying.delete_names(
        client, rt, object_names, namespace=_namespace(ctx, namespace) if rt.namespaced else None,
        ignore_not_found=ignore_not_found, report=report,
    )


@command("api-resources")
def api_resources_command(ctx: typer.Context, server: ServerOption = None) -> None:
    """List the resource types the server serves, with their short names."""
    with _client(ctx, server) as client:
        reading.api_resources(client)


@command("version")
def version_command(ctx: typer.Context, server: ServerOption = None) -> None:
    """Print the client version, then the server's (exit code 7 when it cannot be reached)."""
    typer.echo(f"Client Version: {joch.__version__}")
    with _client(ctx, server) as client:
        info = client.get_json("/version") or {}
    version = info.get("gitVersion") or info.get("version") or info
    typer.echo(f"Server Version: {version}")


def main() -> None:
    app()
