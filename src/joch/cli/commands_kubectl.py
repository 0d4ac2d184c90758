"""kubectl parity commands: ``edit``, ``patch``, ``label``, ``wait`` and ``completion``."""

from __future__ import annotations

from typing import Annotated

import typer

from joch.api import errors
from joch.cli import (
    completing,
    reading,
    runs,
)
from joch.cli.app import (
    APPLY_OUTPUTS,
    ApplyOutputOption,
    NamespaceOption,
    ServerOption,
    _client,
    _one_of,
    _scope,
    command,
    report,
    warn,
)
from joch.cli.client import Client
from joch.cli.resolve import ResourceType


def _one_object(ctx: typer.Context, client: Client, args: list[str], namespace: str | None, *,
                verb: str) -> tuple[ResourceType, str | None, str]:
    """The one object ``TYPE NAME`` or ``TYPE/NAME`` names, and the namespace of its path."""
    selected = reading.resolve(client, reading.targets(args, verb=verb))
    named = [(rt, name) for rt, names in selected for name in names]
    if len(named) != 1:
        raise errors.BadRequest(f"joch {verb} takes one object: TYPE NAME or TYPE/NAME (got {len(named)})")
    rt, name = named[0]
    return rt, _scope(ctx, namespace, False).for_path(rt), name


ObjectArgument = Annotated[list[str], typer.Argument(metavar="TYPE NAME | TYPE/NAME", help="The object.",
                                                     autocompletion=completing.kinds)]


@command("edit")
def edit_command(
    ctx: typer.Context,
    target: ObjectArgument,
    output: Annotated[str, typer.Option("--output", "-o", metavar="yaml|json", help="Edit as yaml or json.")
                      ] = "yaml",
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Edit an object in $JOCH_EDITOR, $KUBE_EDITOR or $EDITOR (default vi), and replace it with what is saved.

    A file that does not parse, or that the server rejects, is opened again with the error at the
    top; saving it unchanged then gives up with that error, keeping a copy of the edits."""
    from joch.cli import editing

    shown = _one_of("--output", output, ("yaml", "json")) or "yaml"
    with _client(ctx, server) as client:
        rt, ns, name = _one_object(ctx, client, target, namespace, verb="edit")
        failure = editing.edit(client, rt, ns, name, output=shown, report=report)
    if failure is not None:
        raise typer.Exit(failure.exit_code)


@command("patch")
def patch_command(
    ctx: typer.Context,
    target: ObjectArgument,
    patch: Annotated[str | None, typer.Option("--patch", "-p", metavar="PATCH", show_default=False,
                                              help="The patch, JSON or YAML.")] = None,
    patch_file: Annotated[str | None, typer.Option("--patch-file", metavar="FILE", show_default=False,
                                                   help="A file holding the patch.")] = None,
    patch_type: Annotated[str, typer.Option("--type", metavar="merge|json",
                                            help="merge (RFC 7386) or json (RFC 6902, a list of operations).")
                          ] = "merge",
    subresource: Annotated[str | None, typer.Option("--subresource", metavar="status", show_default=False,
                                                    help="Patch the status subresource instead of the object.")
                           ] = None,
    output: ApplyOutputOption = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Change fields of an object with a merge patch (a JSON object of the fields to change; null removes one)
    or a JSON patch (a list of add/remove/replace/move/copy/test operations)."""
    from joch.cli import editing

    chosen = _one_of("--type", patch_type, tuple(editing.PATCH_TYPES)) or "merge"
    shown = _one_of("--output", output, APPLY_OUTPUTS)
    body = editing.patch_body(patch, patch_file, chosen)
    with _client(ctx, server) as client:
        rt, ns, name = _one_object(ctx, client, target, namespace, verb="patch")
        editing.patch(client, rt, ns, name, body=body, patch_type=chosen, output=shown,
                      subresource=_one_of("--subresource", subresource, ("status",)))


@command("label")
def label_command(
    ctx: typer.Context,
    args: Annotated[list[str], typer.Argument(metavar="TYPE NAME... KEY=VALUE... KEY-...",
                                              help="Objects (TYPE NAME... or TYPE/NAME...), then labels to set "
                                                   "(KEY=VALUE) or remove (KEY-).",
                                              autocompletion=completing.kinds)],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Change a label that has another value.")] = False,
    selector: Annotated[str | None, typer.Option("--selector", "-l", show_default=False,
                                                 help="Label the objects of TYPE this selector selects.")] = None,
    all_objects: Annotated[bool, typer.Option("--all", help="Label every object of TYPE in the namespace.")] = False,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Add, change (--overwrite) or remove labels of objects.

    Continues after a failure and exits with the first failure's code."""
    from joch.cli import editing

    words, changes = editing.split_label_args(args)
    if not changes.set and not changes.remove:
        raise errors.BadRequest("at least one label update is required: KEY=VALUE or KEY-")
    if not words:
        raise errors.BadRequest("you must specify the type of resource to label")
    with _client(ctx, server) as client:
        objects = _objects(ctx, client, words, namespace, selector, all_objects, verb="label")
        failure = runs.each(objects, lambda o: editing.label(client, o[0], o[1], o[2], changes, overwrite=overwrite,
                                                             warn=warn), report=report)
    if failure is not None:
        raise typer.Exit(failure.exit_code)


def _objects(ctx: typer.Context, client: Client, words: list[str], namespace: str | None, selector: str | None,
             all_objects: bool, *, verb: str) -> list[tuple[ResourceType, str | None, str]]:
    """``TYPE NAME...``, ``TYPE/NAME...``, or ``TYPE -l SELECTOR`` / ``TYPE --all``: each object once."""
    from joch.cli import waiting

    wanted = reading.targets(words, verb=verb)
    named = any(names for _, names in wanted)
    if named and (selector or all_objects):
        raise errors.BadRequest("name cannot be provided when a selector or --all is specified")
    if not named and not (selector or all_objects):
        raise errors.BadRequest(f"you must name objects (TYPE NAME or TYPE/NAME), or give -l or --all to {verb}")
    out = []
    for rt, names in reading.resolve(client, wanted):
        ns = _scope(ctx, namespace, False).for_path(rt)
        for name in names or waiting.selected(client, rt, ns, selector):
            out.append((rt, ns, name))
    return out


@command("wait")
def wait_command(
    ctx: typer.Context,
    args: Annotated[list[str], typer.Argument(metavar="TYPE NAME... | TYPE/NAME...", help="The objects to wait for.",
                                              autocompletion=completing.kinds)],
    for_: Annotated[str, typer.Option("--for", metavar="CONDITION", show_default=False,
                                      help="condition=NAME[=VALUE], jsonpath=.path[=VALUE] (e.g. "
                                           "jsonpath=.status.phase=Succeeded), delete or create.")],
    timeout: Annotated[str, typer.Option("--timeout", metavar="DURATION",
                                         help="How long to wait for each: 30s, 5m, 1h; 0 checks once.")] = "30s",
    selector: Annotated[str | None, typer.Option("--selector", "-l", show_default=False,
                                                 help="Wait for the objects of TYPE this selector selects.")] = None,
    all_objects: Annotated[bool, typer.Option("--all", help="Wait for every object of TYPE.")] = False,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Wait until objects meet a condition: a status condition, a JSONPath value, deletion or creation.

    Prints TYPE/NAME condition met for each; exit code 1 when the time runs out."""
    from joch.cli import waiting

    condition = waiting.parse(for_)
    seconds = waiting.duration(timeout)
    with _client(ctx, server) as client:
        objects = _objects(ctx, client, args, namespace, selector, all_objects, verb="wait")
        try:
            for rt, ns, name in objects:
                waiting.wait(client, rt, ns, [name], condition, timeout=seconds)
        except waiting.TimedOut as exc:
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(waiting.TIMEOUT_EXIT_CODE) from None


@command("completion")
def completion_command(
    shell: Annotated[str, typer.Argument(metavar="bash|zsh|fish", help="The shell.")],
) -> None:
    """Print the shell completion script: `source <(joch completion bash)`, or put it in the shell's
    completion directory. Completes commands, options, resource types and object names (from the server)."""
    typer.echo(completing.script(shell), nl=False)
