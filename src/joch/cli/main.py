"""The ``joch`` typer application's commands; the app, its error reporting and shared options live in
``app``, the process commands in ``commands_process`` and the kubectl-parity ones in ``commands_kubectl``.

Commands are listed in ``joch --help`` in the order they are registered: ``commands_process`` is imported
first (server, controller), then this module's commands, then ``commands_kubectl`` at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

import joch
from joch.api import errors
from joch.cli import (
    access,
    applying,
    auditing,
    completing,
    contexts,
    crds,
    explain,
    helptypes,
    manifests,
    namespaces,
    reading,
    runs,
    serving,
    shaping,
)
from joch.cli import commands_process as commands_process
from joch.cli.app import (
    APPLY_OUTPUTS,
    DRY_RUN,
    OUTPUTS,
    ApplyOutputOption,
    Commands,
    DryRunOption,
    FilenameOption,
    KindArgument,
    NamesArgument,
    NamespaceOption,
    ServerOption,
    _client,
    _namespace,
    _one_of,
    _read,
    _scope,
    app,
    command,
    reported,
    subcommand,
    warn,
)
from joch.cli.app import (
    exit_codes_help as exit_codes_help,
)
from joch.cli.app import (
    report as report,
)
from joch.cli.client import Client, server_url
from joch.cli.commands_process import DataDirOption, SecretKeyFileOption, StoreFileOption, StoreOption


@command("apply")
def apply_command(
    ctx: typer.Context,
    filenames: FilenameOption = None,
    dry_run: DryRunOption = "none",
    output: ApplyOutputOption = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Create or update resources from manifests, all or nothing.

    Every -f goes to the server in one request: if any document is rejected, nothing is written,
    and every problem is listed by file, document, kind/name and field path."""
    _write(ctx, filenames, dry_run, output, namespace, server, create=False)


@command("create")
def create_command(
    ctx: typer.Context,
    filenames: FilenameOption = None,
    dry_run: DryRunOption = "none",
    output: ApplyOutputOption = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Create resources from manifests, all or nothing; metadata.generateName is honoured.

    Like apply, every -f goes to the server in one request and nothing is written unless every
    document can be created; an object that exists already is an error."""
    _write(ctx, filenames, dry_run, output, namespace, server, create=True)


def _write(
    ctx: typer.Context, filenames: list[str] | None, dry_run: str, output: str | None, namespace: str | None,
    server: str | None, *, create: bool,
) -> None:
    dry = _one_of("--dry-run", dry_run, DRY_RUN) == "server"
    shown = _one_of("--output", output, APPLY_OUTPUTS)
    sources = _read(filenames)
    with _client(ctx, server) as client:
        applying.apply(client, sources, namespace=_namespace(ctx, namespace), dry_run=dry, output=shown,
                       warn=warn, create=create)



GET_KIND_HELP = ("Kind, plural, short name or plural.group; several as agents,ap; or all. Or TYPE/NAME, "
                 "several of them.")


@command("get")
def get_command(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(metavar="KIND", help=GET_KIND_HELP, autocompletion=completing.kinds)],
    names: NamesArgument = None,
    namespace: NamespaceOption = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A", help="List in all namespaces.")] = False,
    output: Annotated[str | None, typer.Option("--output", "-o", metavar="wide|yaml|json|name", show_default=False,
                                               help="wide, yaml, json or name; or jsonpath=TEMPLATE (kubectl's "
                                                    "JSONPath template) or custom-columns=HEADER:PATH,...")
                      ] = None,
    selector: Annotated[str | None, typer.Option("--selector", "-l", show_default=False,
                                                 help="Label selector, e.g. team=core,tier!=test.")] = None,
    field_selector: Annotated[str | None, typer.Option(
        "--field-selector", metavar="SELECTOR", show_default=False,
        help="Field selector, e.g. status.phase=Running,spec.agentRef.name=coder: metadata.name, "
             "metadata.namespace and the fields of the kind's columns.")] = None,
    sort_by: Annotated[str | None, typer.Option("--sort-by", metavar="JSONPATH", show_default=False,
                                                help="Sort by the value at a path, e.g. .metadata.creationTimestamp."
                                                )] = None,
    show_labels: Annotated[bool, typer.Option("--show-labels", help="Add a LABELS column.")] = False,
    show_managed_fields: Annotated[bool, typer.Option(
        "--show-managed-fields", help="Keep metadata.managedFields in -o yaml and -o json.")] = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="After listing, print changes as they happen.")] = (
        False
    ),
    server: ServerOption = None,
) -> None:
    """List resources as a table, or print objects as YAML/JSON, a JSONPath template or custom columns.

    With names, prints the objects found, then an error for each one that is not, and exits with
    the first error's code."""
    chosen = output if output is not None and shaping.is_output(output) else _one_of(
        "--output", output, (*OUTPUTS, "jsonpath=TEMPLATE", "custom-columns=SPEC"))
    request = reading.GetRequest(
        targets=reading.targets([kind, *(names or [])], verb="get"),
        scope=_scope(ctx, namespace, all_namespaces),
        output=chosen, selector=selector, watch=watch,
        field_selector=field_selector, sort_by=sort_by, show_labels=show_labels,
        show_managed_fields=show_managed_fields,
    )
    request.shape  # noqa: B018  # parsing the template is the check: a bad one fails before any request
    request.sorter  # noqa: B018
    if request.named and all_namespaces:
        raise errors.BadRequest("a resource cannot be retrieved by name across all namespaces")
    if request.named and (selector or field_selector):
        raise errors.BadRequest("name cannot be provided when a selector is specified (-l, --field-selector)")
    with _client(ctx, server) as client:
        failure = reading.get(client, request, report=report)
    if failure is not None:
        raise typer.Exit(failure.exit_code)


@command("audit")
def audit_command(
    ctx: typer.Context,
    since: Annotated[str | None, typer.Option("--since", metavar="TIME", show_default=False,
                                              help="Rows at or after: a duration back from now (1h, 30m, 7d) "
                                                   "or an RFC 3339 time.")] = None,
    until: Annotated[str | None, typer.Option("--until", metavar="TIME", show_default=False,
                                              help="Rows before: as --since.")] = None,
    actor: Annotated[str | None, typer.Option("--actor", metavar="USER", show_default=False,
                                              help="Only what this user did.")] = None,
    verb: Annotated[str | None, typer.Option("--verb", metavar="VERB", show_default=False,
                                             help="create, apply, update, patch, delete, approve, deny "
                                                  "(an Approval decision), ...")] = None,
    kind: Annotated[str | None, typer.Option("--kind", metavar="KIND", show_default=False,
                                             help="Kind, plural or short name.")] = None,
    name: Annotated[str | None, typer.Option("--name", metavar="NAME", show_default=False,
                                             help="Only rows about objects of this name.")] = None,
    decision: Annotated[str | None, typer.Option("--decision", metavar="allowed|denied", show_default=False,
                                                 help="Only allowed or only denied actions.")] = None,
    limit: Annotated[int, typer.Option("--limit", metavar="N", help="Print at most N rows (newest).")] = 500,
    namespace: NamespaceOption = None,
    all_namespaces: Annotated[bool, typer.Option(
        "--all-namespaces", "-A", help="Every namespace, and rows of no namespace (failed logins, "
                                       "cluster-scoped objects).")] = False,
    output: Annotated[str | None, typer.Option("--output", "-o", metavar="json|yaml", show_default=False,
                                               help="json or yaml instead of a table.")] = None,
    server: ServerOption = None,
) -> None:
    """Show the audit log, newest first: who did what to which object, allowed or denied.

    The log is append-only (the server keeps rows for joch server --audit-retention)."""
    request = auditing.AuditRequest(
        namespace=None if all_namespaces else _namespace(ctx, namespace).name, since=since, until=until,
        actor=actor, verb=verb, kind=kind, name=name, decision=_one_of("--decision", decision, ("allowed", "denied")),
        limit=limit, output=_one_of("--output", output, ("json", "yaml")),
    )
    with _client(ctx, server) as client:
        auditing.show(client, request)


@command("describe")
def describe_command(
    ctx: typer.Context,
    kind: KindArgument,
    names: NamesArgument = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Show objects in detail: metadata, spec, status, conditions and events."""
    wanted = reading.targets([kind, *(names or [])], verb="describe")
    if not any(object_names for _, object_names in wanted):
        raise errors.BadRequest("you must specify the name of the resource to describe")
    with _client(ctx, server) as client:
        failure = reading.describe(client, wanted, scope=_scope(ctx, namespace, False), report=report)
    if failure is not None:
        raise typer.Exit(failure.exit_code)


@command("delete")
def delete_command(
    ctx: typer.Context,
    kind: Annotated[str | None, typer.Argument(metavar="KIND", show_default=False,
                                               help="Kind, plural, short name or plural.group; or TYPE/NAME, "
                                                    "several of them.")] = None,
    names: NamesArgument = None,
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
    chosen = _namespace(ctx, namespace)
    if filenames:
        if kind:
            raise errors.BadRequest("give either -f or KIND NAME..., not both")
        docs = manifests.documents(_read(filenames))
        applying.check_namespaces(docs, chosen)
        return applying.delete_documents(client, docs, namespace=chosen, ignore_not_found=ignore_not_found,
                                         report=report)
    if not kind:
        raise errors.BadRequest("you must specify a KIND and NAME..., or -f")
    wanted = reading.targets([kind, *names], verb="delete")
    if not any(object_names for _, object_names in wanted):
        raise errors.BadRequest(f'you must specify the name of the {kind} to delete (or use -f)')
    return applying.delete_names(client, reading.resolve(client, wanted), namespace=chosen,
                                 ignore_not_found=ignore_not_found, report=report)


@command("api-resources")
def api_resources_command(ctx: typer.Context, server: ServerOption = None) -> None:
    """List the resource types the server serves, with their short names."""
    with _client(ctx, server) as client:
        reading.api_resources(client)


@command("version")
def version_command(ctx: typer.Context, server: ServerOption = None) -> None:
    """Print the client version, then the server's (exit code 7 when it cannot be reached)."""
    # Spelled as the server's gitVersion is (v0.1.0), as kubectl prints both, so the two compare at a glance.
    typer.echo(f"Client Version: v{joch.__version__}")
    with _client(ctx, server) as client:
        info = client.get_object("/version")
    version = info.get("jochVersion") or info.get("gitVersion") or info.get("version") or info
    typer.echo(f"Server Version: {version}")


@command("explain")
def explain_command(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(metavar="KIND[.FIELD...]",
                                          help="A kind (any name get accepts), then a dotted field path, "
                                               "e.g. agent.spec.providerRef.")],
    recursive: Annotated[bool, typer.Option("--recursive", help="Print every field below, names and types "
                                            "only.")] = False,
    server: ServerOption = None,
) -> None:
    """Describe a kind or one of its fields, from the server's OpenAPI schema (as kubectl explain)."""
    with _client(ctx, server) as client:
        typer.echo(explain.explain(client, target, recursive=recursive), nl=False)


@command("crds")
def crds_command(
    output_dir: Annotated[Path | None, typer.Option("--output-dir", metavar="DIR", show_default=False,
                                                    help="Write one file per CRD (<plural>.<group>.yaml) into "
                                                         "DIR instead of printing them.")] = None,
) -> None:
    """Print the CustomResourceDefinitions (apiextensions.k8s.io/v1) of Joch's kinds, generated from its
    kind registry; charts/agents/crds is this command's output."""
    from joch.api import REGISTRY

    if output_dir is None:
        typer.echo(crds.render(REGISTRY), nl=False)
        return
    for path in crds.write(output_dir, REGISTRY):
        typer.echo(f"wrote {path}")


# --- runs ------------------------------------------------------------------------------------------

ReasonOption = Annotated[str | None, typer.Option("--reason", metavar="TEXT", show_default=False,
                                                  help="Why; recorded on the Approval.")]


@command("run")
def run_command(
    ctx: typer.Context,
    agent: Annotated[str, typer.Option("--agent", metavar="NAME", show_default=False, help="The Agent to run.")],
    repo: Annotated[str, typer.Option("--repo", metavar="URL|DIR", show_default=False,
                                      help="Git URL, or a local checkout (sent as an absolute path).")],
    spec: Annotated[str | None, typer.Option("--spec", metavar="NAME", show_default=False,
                                             help="An ImplementationSpec to implement.")] = None,
    text: Annotated[str | None, typer.Option("--text", metavar="TEXT", show_default=False,
                                             help="What to implement, inline; - reads stdin.")] = None,
    ref: Annotated[str | None, typer.Option("--ref", show_default=False, help="Git ref (default HEAD).")] = None,
    path: Annotated[str | None, typer.Option("--path", metavar="PATH", show_default=False,
                                             help="Directory in the repository to work in.")] = None,
    name: Annotated[str | None, typer.Option("--name", metavar="NAME", show_default=False,
                                             help="The run's name (default: AGENT- and a random suffix).")] = None,
    timeout: Annotated[int | None, typer.Option("--timeout", min=1, show_default=False, metavar="SECONDS",
                                                help="Deadline (default: the agent's).")] = None,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key", metavar="KEY", show_default=False,
                                                        help="Runs with the same key start once.")] = None,
    params: Annotated[list[str] | None, typer.Option("--param", show_default=False, metavar="KEY=VALUE",
                                                     help="A parameter for the provider's templates (over the "
                                                          "Agent's defaults.parameters and the provider's "
                                                          "defaults). Repeatable.")] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Show phase and log until the run ends; exit 0 "
                                         "only if it succeeded (8 Failed, 9 Cancelled).")] = False,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Start an AgentRun: an agent on a repository, implementing a spec or an inline text."""
    new = runs.NewRun(agent=agent, repo=repo, spec=spec, text=text, ref=ref, path=path, name=name,
                      timeout=timeout, idempotency_key=idempotency_key, params=params or [])
    obj = runs.run_object(new)
    chosen = _namespace(ctx, namespace).name
    with _client(ctx, server) as client:
        created = runs.create(client, obj, chosen)
        if not follow:
            return
        from joch.cli import follow as following

        ended = following.follow(client, chosen, created["metadata"]["name"])
    for line in following.outcome(ended):
        typer.echo(line)
    code = runs.EXIT_CODES.get(runs.phase_of(ended), 1)
    if code:
        raise typer.Exit(code)


@command("render")
def render_command(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(metavar="run", help="What to render: run (an AgentRun).")],
    filenames: FilenameOption = None,
    output: Annotated[str, typer.Option("--output", "-o", metavar="yaml|json", help="Print as yaml or json.")
                      ] = "yaml",
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Render an AgentRun without running it: what its agent would execute.

    The server compiles the run's agent and renders its provider's templates as a first attempt
    would, and starts nothing: the argv, working directory, environment (values of the provider's
    envTemplate and the Agent's env; variables that come from Secrets by name only), config and
    input files with their rendered content, and the effective parameters. A template that fails
    is reported with the field that holds it (AgentProvider/codex spec.argsTemplate[3].when)."""
    if kind.lower() not in ("run", "runs", "agentrun", "agentruns", "ar"):
        raise errors.BadRequest(f'cannot render "{kind}": only runs can be rendered (joch render run -f run.yaml)')
    shown = _one_of("--output", output, ("yaml", "json"))
    docs = manifests.documents(_read(filenames))
    if len(docs) != 1 or docs[0].obj.get("kind") != "AgentRun":
        found = ", ".join(str(d.obj.get("kind")) for d in docs) or "no objects"
        raise errors.BadRequest(f"render run takes exactly one AgentRun; the files hold {found}")
    obj = docs[0].obj
    chosen = _namespace(ctx, namespace)
    written = (obj.get("metadata") or {}).get("namespace")
    if written and chosen.explicit and written != chosen.name:
        raise errors.BadRequest(f'the run\'s metadata.namespace is "{written}", and -n says "{chosen.name}"')
    with _client(ctx, server) as client:
        rendered = runs.render(client, obj, written if written and not chosen.explicit else chosen.name)
    from joch.cli import printers

    typer.echo(printers.dump(rendered, shown or "yaml"), nl=False)


@command("logs")
def logs_command(
    ctx: typer.Context,
    target: Annotated[list[str], typer.Argument(metavar="[run] NAME", help="A run: NAME, run NAME or run/NAME.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the run ends; wait for it to "
                                         "start.")] = False,
    attempt: Annotated[int | None, typer.Option("--attempt", min=1, metavar="N", show_default=False,
                                                help="An earlier attempt's log (default: the latest).")] = None,
    tail: Annotated[int, typer.Option("--tail", metavar="N", help="Only the last N lines (then, with -f, what "
                                      "follows); -1: all.")] = -1,
    limit_bytes: Annotated[int | None, typer.Option("--limit-bytes", min=1, metavar="N", show_default=False,
                                                    help="Stop after N bytes of log.")] = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Print a run's log (the agent's stdout and stderr) as it arrives."""
    name = runs.log_target(target)
    with _client(ctx, server) as client:
        runs.logs(client, _namespace(ctx, namespace).name, name, follow=follow, attempt=attempt,
                  tail=tail if tail >= 0 else None, limit_bytes=limit_bytes)


@command("cancel")
def cancel_command(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(metavar="run", help="run (or run/NAME).")],
    names: NamesArgument = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Ask runs to stop (sets spec.cancel); a finished run is left as it is."""
    _, chosen = runs.named([kind, *(names or [])], verb="cancel", kinds=(runs.RUNS,))
    ns = _namespace(ctx, namespace).name
    with _client(ctx, server) as client:
        failure = runs.each(chosen, lambda name: runs.cancel(client, ns, name), report=report)
    if failure is not None:
        raise typer.Exit(failure.exit_code)


def _decide(ctx: typer.Context, args: list[str], namespace: str | None, server: str | None, reason: str | None,
            *, approve: bool) -> None:
    verb = "approve" if approve else "deny"
    rt, chosen = runs.named(args, verb=verb, kinds=(runs.APPROVALS, runs.RUNS))
    ns = _namespace(ctx, namespace).name
    with _client(ctx, server) as client:
        def decide(name: str) -> None:
            approval = runs.pending_approval(client, ns, name) if rt == runs.RUNS else name
            runs.decide(client, ns, approval, approve=approve, reason=reason)

        failure = runs.each(chosen, decide, report=report)
    if failure is not None:
        raise typer.Exit(failure.exit_code)


@command("approve")
def approve_command(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(metavar="approval|run", help="approval NAME, or run NAME for the run's "
                                        "pending approval.")],
    names: NamesArgument = None,
    reason: ReasonOption = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Approve a pending Approval, so the run it holds back can start.

    The decision is recorded as yours: the server takes decidedBy from the user you authenticate as.
    `joch approve run NAME` decides the run's pending approval; with several pending it names them
    and decides none. An approval with separationOfDuties cannot be decided by the run's creator."""
    _decide(ctx, [kind, *(names or [])], namespace, server, reason, approve=True)


@command("deny")
def deny_command(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(metavar="approval|run", help="approval NAME, or run NAME for the run's "
                                        "pending approval.")],
    names: NamesArgument = None,
    reason: ReasonOption = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Deny a pending Approval; the run it holds back fails (ApprovalDenied).

    The decision is recorded as yours (decidedBy is the user you authenticate as); --reason says why.
    `joch deny run NAME --reason R` denies the run's pending approval."""
    _decide(ctx, [kind, *(names or [])], namespace, server, reason, approve=False)


policy_app = typer.Typer(
    name="policy", cls=Commands, help="Work with Policies offline.", no_args_is_help=True,
    rich_markup_mode="markdown", context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(policy_app)


@policy_app.command("test", cls=helptypes.Command)
@reported
def policy_test_command(
    ctx: typer.Context,
    filenames: FilenameOption = None,
    namespace: NamespaceOption = None,
    user: Annotated[str | None, typer.Option("--user", metavar="NAME", show_default=False,
                                             help="request.user the rules see (for an AgentRun's dispatch rules: its "
                                                  "creator). Default: empty.")] = None,
    groups: Annotated[list[str] | None, typer.Option("--group", metavar="GROUP", show_default=False,
                                                     help="A group in request.groups. Repeatable.")] = None,
) -> None:
    """Evaluate Policies against objects, offline: no server is asked.

    Give the Policies and the objects in the -f files, with what the objects refer to (an Agent's
    AgentProvider, a run's Agent) and any Environments. Prints per object each rule that applies
    to it: ALLOW, DENY, WARN or REQUIRE-APPROVAL, with the rule's message. Admission rules are
    evaluated for every object, dispatch rules for AgentRuns too.

    Exit code: 0 when nothing is denied, 10 when a rule denies an object, 2 when a document is
    invalid (a rule that does not compile names its line and column)."""
    from joch.admission.documents import load_documents
    from joch.cli import policies

    docs = [doc for source in _read(filenames) for doc in load_documents(source.text, source.name)]
    chosen = _namespace(ctx, namespace)
    code = policies.test(docs, namespace=chosen.name, explicit=chosen.explicit, user=user, groups=list(groups or []),
                         echo=typer.echo)
    if code:
        raise typer.Exit(code)


@command("artifacts")
def artifacts_command(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(metavar="run", help="run (or run/NAME).")],
    names: NamesArgument = None,
    download: Annotated[Path | None, typer.Option("--download", metavar="DIR", show_default=False,
                                                  help="Download every artifact into DIR, checking each "
                                                       "sha256.")] = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """List a run's output artifacts (NAME SIZE SHA256 PATH), or download them."""
    _, chosen = runs.named([kind, *(names or [])], verb="artifacts", kinds=(runs.RUNS,))
    if len(chosen) > 1:
        raise errors.BadRequest(f"joch artifacts reads one run at a time, not {len(chosen)}")
    ns = _namespace(ctx, namespace).name
    with _client(ctx, server) as client:
        if download is None:
            runs.print_artifacts(client, ns, chosen[0])
            return
        failure = runs.download(client, ns, chosen[0], download, report=report)
    if failure is not None:
        raise typer.Exit(failure.exit_code)



@command("cost")
def cost_command(
    ctx: typer.Context,
    by: Annotated[str, typer.Option("--by", metavar="agent|namespace|team|model",
                                    help="Group spend by Agent, namespace, team (the Agents' joch.dev/team label) "
                                         "or Model.")] = "agent",
    since: Annotated[str | None, typer.Option("--since", metavar="7d|24h|RFC3339", show_default=False,
                                              help="Only spend metered since then: 30m, 24h, 7d, 2w back from now, "
                                                   "or a time such as 2026-01-01T00:00:00Z (default: all).")] = None,
    namespace: NamespaceOption = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A", help="Sum every namespace.")] = False,
    output: Annotated[str | None, typer.Option("--output", "-o", metavar="json|yaml", show_default=False,
                                               help="Print the server's CostReport as json or yaml.")] = None,
    server: ServerOption = None,
) -> None:
    """Sum metered spend (USD and tokens) by agent, namespace, team or model.

    Spend is what runs reported through their callback (deleted runs included), priced by their
    Models; budgets count the same figures."""
    from joch.cli import costs

    shown = _one_of("--output", output, ("json", "yaml"))
    chosen = None if all_namespaces else _namespace(ctx, namespace).name
    with _client(ctx, server) as client:
        costs.show(client, by=by, since=since, namespace=chosen, output=shown)




# --- integrations: trigger rules and sources --------------------------------------------------------

trigger_app = typer.Typer(
    name="trigger", cls=Commands, help="Act on TriggerRules.", no_args_is_help=True,
    rich_markup_mode="markdown", context_settings={"help_option_names": ["-h", "--help"]},
)
sync_app = typer.Typer(
    name="sync", cls=Commands, help="Sync an ImplementationSource now.", no_args_is_help=True,
    rich_markup_mode="markdown", context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(trigger_app)
app.add_typer(sync_app)


@trigger_app.command("fire", cls=helptypes.Command)
@reported
def trigger_fire_command(
    ctx: typer.Context,
    rule: Annotated[str, typer.Argument(metavar="RULE", help="The TriggerRule.")],
    params: Annotated[list[str] | None, typer.Option("--param", "-p", metavar="KEY=VALUE", show_default=False,
                                                     help="A run parameter (over the rule's). Repeatable.")] = None,
    key: Annotated[str | None, typer.Option("--key", metavar="KEY", show_default=False,
                                            help="Dedupe key: firing the same key again starts nothing.")] = None,
    text: Annotated[str | None, typer.Option("--text", metavar="TEXT", show_default=False,
                                             help="What to implement, for a rule without an issue.")] = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Evaluate a TriggerRule now, as a manual event; print the decision and the run it started.

    Exit code 1 when the rule rejected the event (the reason is printed)."""
    from joch.cli import integrations

    with _client(ctx, server) as client:
        code = integrations.fire(client, _namespace(ctx, namespace).name, rule,
                                 parameters=runs.parameters(params or []), key=key, text=text)
    if code:
        raise typer.Exit(code)


@sync_app.command("source", cls=helptypes.Command)
@reported
def sync_source_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The ImplementationSource.")],
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the sync and print its outcome.")] = True,
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS", min=0.0,
                                           help="How long --wait waits.")] = 60.0,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Sync an ImplementationSource from its tracker now (sets joch.dev/sync-requested-at).

    Exit code 1 when the sync failed (the tracker's error is printed)."""
    from joch.cli import integrations

    with _client(ctx, server) as client:
        code = integrations.sync(client, _namespace(ctx, namespace).name, name, wait=wait, timeout=timeout)
    if code:
        raise typer.Exit(code)


# --- joch config: contexts ------------------------------------------------------------------------

class _Group(helptypes.PlainTypes, TyperGroup):
    pass


config_app = typer.Typer(cls=_Group, no_args_is_help=True, rich_markup_mode="markdown",
                         help="Contexts: named server, token and namespace settings in the config file "
                              "(JOCH_CONFIG, default ~/.config/joch/config.yaml, mode 0600). Flags win over "
                              "JOCH_SERVER/JOCH_TOKEN/JOCH_NAMESPACE, which win over the current context.")
auth_app = typer.Typer(cls=_Group, no_args_is_help=True, rich_markup_mode="markdown",
                       help="Who the server says you are, and what you may do.")
app.add_typer(config_app, name="config")
app.add_typer(auth_app, name="auth")



@subcommand(config_app, "set-context")
def set_context_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The context's name.")],
    server: Annotated[str | None, typer.Option("--server", metavar="URL", show_default=False,
                                               help="The server URL.")] = None,
    token: Annotated[str | None, typer.Option("--token", metavar="TOKEN", show_default=False,
                                              help="The bearer token.")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", metavar="NAMESPACE", show_default=False,
                                                  help="The default namespace.")] = None,
) -> None:
    """Create a context, or change the settings given of an existing one."""
    if server is not None:
        server_url(server)  # a malformed URL is refused now, not at the next command
    if namespace is not None:
        namespaces.choose(namespace)
    typer.echo(contexts.set_context(name, server=server, token=token, namespace=namespace))


@subcommand(config_app, "use-context")
def use_context_command(name: Annotated[str, typer.Argument(metavar="NAME", help="A context's name.")]) -> None:
    """Make NAME the current context."""
    typer.echo(contexts.use_context(name))


@subcommand(config_app, "current-context")
def current_context_command() -> None:
    """Print the current context's name."""
    typer.echo(contexts.current_name())


@subcommand(config_app, "get-contexts")
def get_contexts_command() -> None:
    """List the contexts; * marks the current one."""
    config = contexts.load()
    rows = [["CURRENT", "NAME", "SERVER", "NAMESPACE"]]
    for context in config.contexts.values():
        rows.append(["*" if context.name == config.current else "", context.name, context.server or "",
                     context.namespace or ""])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


@subcommand(config_app, "view")
def view_command(
    raw: Annotated[bool, typer.Option("--raw", help="Show tokens instead of REDACTED.")] = False,
) -> None:
    """Print the config file, tokens shown as REDACTED."""
    import yaml

    typer.echo(yaml.safe_dump(contexts.load().to_dict(raw=raw), sort_keys=False), nl=False)


# --- joch auth -------------------------------------------------------------------------------------

@subcommand(auth_app, "whoami")
def whoami_command(ctx: typer.Context, server: ServerOption = None) -> None:
    """Print the user name and groups the server authenticates you as."""
    with _client(ctx, server) as client:
        access.whoami(client)


@subcommand(auth_app, "can-i")
def can_i_command(
    ctx: typer.Context,
    verb: Annotated[str, typer.Argument(metavar="VERB", help="get, list, watch, create, update, patch or delete.")],
    resource: Annotated[str, typer.Argument(metavar="RESOURCE",
                                            help="Kind, plural or short name; RESOURCE/SUBRESOURCE (approvals/decide)"
                                                 " too.")],
    name: Annotated[str | None, typer.Argument(metavar="NAME", show_default=False, help="An object's name.")] = None,
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Say yes (exit 0) or no (exit 1) to whether you may do VERB on RESOURCE in the namespace."""
    with _client(ctx, server) as client:
        allowed = access.can_i(client, verb, resource, name, _namespace(ctx, namespace).name)
    if not allowed:
        raise typer.Exit(1)


admin = typer.Typer(name="admin", help="Operations on the store itself (run where the store and its key file are).",
                    no_args_is_help=True, rich_markup_mode="markdown",
                    context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(admin, name="admin")


@admin.command("rotate-secret-key", cls=helptypes.Command)
@reported
def rotate_secret_key_command(
    secret_key_file: SecretKeyFileOption = None,
    data_dir: DataDirOption = Path(".joch"),
    store: StoreOption = None,
    store_file: StoreFileOption = None,
) -> None:
    """Generate a new Secret encryption key, put it first in the key file (mode 0600; the old keys
    stay after it) and re-encrypt every Secret with it, in one transaction.

    The key file is --secret-key-file, else DATA_DIR/secret.key (the ring JOCH_SECRET_KEY names is
    written there when that file does not exist yet). A server reading the same file picks up the new
    ring by itself. With several replicas, give every replica the new file (or share it); one that
    took its keys from JOCH_SECRET_KEY needs the new ring there and a restart. Drop an old key from the
    file only after a rotation: a store still needing a removed key refuses to open, naming it."""
    from joch.cli import admin as admin_ops

    url = serving.store_url(data_dir=data_dir, store=serving.store_source(store, store_file))
    typer.echo(admin_ops.rotate_secret_key(key_file=secret_key_file, store_url=url, data_dir=data_dir))




def main() -> None:
    app()


from joch.cli import commands_kubectl as commands_kubectl  # noqa: E402  (registers after the commands above)
from joch.cli import commands_mcp as commands_mcp  # noqa: E402  (`joch mcp`, after the commands above)
