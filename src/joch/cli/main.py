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
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from typer.core import TyperGroup

import joch
from joch.api import errors
from joch.cli import (
    access,
    applying,
    auditing,
    contexts,
    crds,
    explain,
    helptypes,
    manifests,
    namespaces,
    reading,
    runs,
    serving,
)
from joch.cli import completing as completing
from joch.cli import shaping as shaping
from joch.cli.client import Client, server_url
from joch.cli.namespaces import Namespace
from joch.cli.resolve import ResourceType

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
    line = headline(exc)
    typer.echo(f"error: {line}", err=True)
    for cause in exc.causes:
        if cause.message and cause.message in line:
            continue  # the headline already says it (e.g. a Conflict that names its document)
        prefix = f"{manifests.readable_field(cause.field)}: " if cause.field else ""
        typer.echo(f"  - {prefix}{cause.message}", err=True)


def headline(exc: errors.JochError) -> str:
    """The message, or with causes its first line without the causes it lists (they follow)."""
    if not exc.causes:
        return exc.message
    line = exc.message.strip().splitlines()[0] if exc.message.strip() else exc.reason
    shown = [f"{c.field}: {c.message}" if c.field else c.message for c in exc.causes]
    for listing in ("[" + ", ".join(shown) + "]", shown[0] if len(shown) == 1 else None):
        if listing and line.endswith(f": {listing}"):
            return line[: -len(listing) - 2]
    head, bracket, rest = line.partition(": [")  # the listing, after documents were relabelled
    if bracket and rest.endswith("]") and all(c.message in rest for c in exc.causes):
        return head
    return line


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


@contextmanager
def _client(ctx: typer.Context, server: str | None) -> Iterator[Client]:
    settings = _settings(ctx)
    context = contexts.current()
    url = server_url(server or settings.server, context_server=context.server if context else None,
                     context=context.name if context else "")
    client = Client(base_url=url, on_warning=warn, token=contexts.token(settings.token, context))
    try:
        yield client
    finally:
        client.close()


def _read(filenames: list[str] | None) -> list[manifests.Source]:
    if not filenames:
        raise errors.BadRequest("must specify one of -f/--filename")
    return manifests.read(filenames, sys.stdin)


DataDirOption = Annotated[
    Path, typer.Option("--data-dir", metavar="DIR",
                       help="Directory of the embedded SQLite store and of local runs' workspaces."),
]
StoreOption = Annotated[
    str | None,
    typer.Option("--store", envvar="JOCH_STORE", metavar="URL", show_default=False,
                 help="Store URL (sqlite:///path, postgresql://... or kubernetes://); default sqlite:///DATA_DIR/joch.db."),
]
StoreFileOption = Annotated[
    Path | None,
    typer.Option("--store-file", envvar="JOCH_STORE_FILE", metavar="FILE", show_default=False,
                 help="A file holding the store URL: keeps its password out of this process's command line and "
                      "environment, which every process of the same user (agents too) can read."),
]
SecretKeyFileOption = Annotated[
    Path | None,
    typer.Option("--secret-key-file", metavar="FILE", show_default=False,
                 help="The Secret encryption key ring: one base64 32-byte key per line, newest first (the first "
                      "encrypts, all decrypt). Default: JOCH_SECRET_KEY, else DATA_DIR/secret.key, generated "
                      "(mode 0600) on first start."),
]
MaxRunsOption = Annotated[
    int, typer.Option("--max-concurrent-runs", metavar="N", help="Runs executing at once, in all namespaces."),
]
MaxRunsPerNamespaceOption = Annotated[
    int | None, typer.Option("--max-concurrent-runs-per-namespace", metavar="N", show_default=False,
                             help="Runs executing at once in one namespace (default: no limit of its own)."),
]
LeaseDurationOption = Annotated[
    float, typer.Option("--lease-duration", metavar="SECONDS",
                        help="Leader lease: how long a replica that stopped renewing keeps it. Renewals happen "
                             "every 2/15 of it; a leader that cannot renew for 2/3 of it steps down."),
]
MaxLogBytesOption = Annotated[
    str, typer.Option("--max-log-bytes", metavar="SIZE",
                      help="A run's log keeps the first and last halves of this much output, with a line saying "
                           "how much was cut (bytes, or 64Mi, 1Gi; 0: no limit)."),
]
MaxArtifactBytesOption = Annotated[
    str, typer.Option("--max-artifact-bytes", metavar="SIZE",
                      help="A larger output artifact (or changes.patch) is not stored; the run lists it in "
                           "status.refusedArtifacts (bytes, or 512Mi, 1Gi; 0: no limit)."),
]
SandboxOption = Annotated[
    str, typer.Option("--sandbox", metavar="auto|bwrap|none",
                      help="Run agents under bubblewrap: bwrap (refuse to start without it), auto (when it works, "
                           "else warn), none."),
]
AgentUserOption = Annotated[
    str | None, typer.Option("--agent-user", metavar="NAME|UID[:GID]", show_default=False,
                             help="When the server runs as root: the user sandboxed agents run as (default nobody, "
                                  "65534); their worktree, outputs and HOME are given to it. root: no change. "
                                  "Without the sandbox agents run as the server's user."),
]
ApiUrlOption = Annotated[
    str | None, typer.Option("--api-url", metavar="URL", show_default=False,
                             help="The API server as agents on this machine reach it, for their usage callback "
                                  "(JOCH_API_URL). joch server: default from --host and --port."),
]
KubeConfigOption = Annotated[
    Path | None, typer.Option("--kube-config", metavar="FILE", show_default=False,
                              help="Enable the Kubernetes runtime (runs whose Agent or run says runtime.type: "
                                   "kubernetes become Jobs) with this kubeconfig.")]
KubeInClusterOption = Annotated[
    bool, typer.Option("--kube-in-cluster", help="Enable the Kubernetes runtime with the in-cluster configuration "
                                                 "(the server's Pod's service account).")]
KubeContextOption = Annotated[
    str | None, typer.Option("--kube-context", metavar="NAME", show_default=False,
                             help="The kubeconfig context (default: its current one).")]
KubeNamespaceOption = Annotated[
    str | None, typer.Option("--kube-namespace", metavar="NS", show_default=False,
                             help="Where run Jobs go (default: the context's namespace, in-cluster the server's).")]
KubeImageOption = Annotated[
    str | None, typer.Option("--kube-image", metavar="IMAGE", show_default=False,
                             help="The image of run Jobs whose provider and run name none (it must have joch and "
                                  "the agent CLI; default ghcr.io/joch-dev/joch:latest).")]
KubeApiUrlOption = Annotated[
    str | None, typer.Option("--kube-api-url", metavar="URL", show_default=False,
                             help="The Joch API as run Pods reach it, for their reports (default: --api-url).")]
KubeServiceAccountOption = Annotated[
    str | None, typer.Option("--kube-service-account", metavar="NAME", show_default=False,
                             help="The run Pods' service account when the Agent names none (default: none, no "
                                  "token mounted).")]
IdentityOption = Annotated[
    str | None, typer.Option("--identity", metavar="NAME", show_default=False,
                             help="This replica's name in the leader lease (default HOST/PID/RANDOM)."),
]


@command("server")
def server_command(
    data_dir: DataDirOption = Path(".joch"),
    store: StoreOption = None,
    store_file: StoreFileOption = None,
    secret_key_file: SecretKeyFileOption = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (1-65535).")] = 8080,
    apply_paths: Annotated[list[str] | None, typer.Option("--apply", metavar="PATH", show_default=False,
                                                          help="Manifests to apply at start. Repeatable.")] = None,
    apply_missing: Annotated[list[str] | None, typer.Option(
        "--apply-missing", metavar="PATH", show_default=False,
        help="Manifests whose objects are created at start if they do not exist yet; existing ones are left "
             "as they are (a restart keeps your edits). Repeatable.")] = None,
    controllers: Annotated[bool, typer.Option("--controllers/--no-controllers",
                                              help="Run the controllers in this process (they run agents; "
                                                   "with several replicas, one leads).")] = True,
    max_concurrent_runs: MaxRunsOption = 10,
    max_concurrent_runs_per_namespace: MaxRunsPerNamespaceOption = None,
    lease_duration: LeaseDurationOption = 15.0,
    identity: IdentityOption = None,
    max_log_bytes: MaxLogBytesOption = "64Mi",
    max_artifact_bytes: MaxArtifactBytesOption = "1Gi",
    allowed_hosts: Annotated[list[str] | None, typer.Option(
        "--allowed-host", metavar="NAME", show_default=False,
        help="Another name clients use in Host to reach the server (a DNS alias, a proxy's name); "
             "localhost, IP addresses and --host are always accepted. Repeatable; * accepts any.")] = None,
    allowed_origins: Annotated[list[str] | None, typer.Option(
        "--allowed-origin", metavar="ORIGIN", show_default=False,
        help="A web origin (https://app.example.com) whose pages may use the API from a browser; "
             "pages from other origins are refused. Repeatable.")] = None,
    sandbox: SandboxOption = "auto",
    max_watches: Annotated[int | None, typer.Option(
        "--max-watches", metavar="N", show_default=False,
        help="Open watch streams and followed logs served at once; more are refused with 429 "
             "(default: from the open-file limit).",
    )] = None,
    watch_buffer_events: Annotated[int, typer.Option(
        "--watch-buffer-events", metavar="N",
        help="Events a watcher may leave unread before it is cut off (410).")] = 10_000,
    max_apply_documents: Annotated[int, typer.Option(
        "--max-apply-documents", metavar="N", help="Objects in one apply or create request (413 past it).")] = 1000,
    max_apply_bytes: Annotated[int, typer.Option(
        "--max-apply-bytes", metavar="BYTES",
        help="Bytes of body in one apply or create request (413 past it).")] = 16 * 1024 * 1024,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", metavar="FILE", show_default=False,
        help='Bearer tokens, one per line: token,user,uid,"group1,group2" (kube-apiserver\'s format; '
             "sha256:HEX instead of the token keeps it out of the file). Re-read when it changes. A user in "
             "group system:masters is admin everywhere.")] = None,
    oidc_issuer_url: Annotated[str | None, typer.Option(
        "--oidc-issuer-url", metavar="URL", show_default=False,
        help="Accept OIDC ID tokens of this issuer (its iss; https). Needs --oidc-client-id.")] = None,
    oidc_client_id: Annotated[str | None, typer.Option(
        "--oidc-client-id", metavar="ID", show_default=False, help="The audience (aud) OIDC tokens must have.")] = None,
    oidc_username_claim: Annotated[str, typer.Option(
        "--oidc-username-claim", metavar="CLAIM", help="The claim that names the user.")] = "sub",
    oidc_username_prefix: Annotated[str | None, typer.Option(
        "--oidc-username-prefix", metavar="PREFIX", show_default=False,
        help="Put in front of user names (default ISSUER#, none for the email claim; - for none).")] = None,
    oidc_groups_claim: Annotated[str | None, typer.Option(
        "--oidc-groups-claim", metavar="CLAIM", show_default=False,
        help="The claim listing the user's groups.")] = None,
    oidc_groups_prefix: Annotated[str | None, typer.Option(
        "--oidc-groups-prefix", metavar="PREFIX", show_default=False, help="Put in front of group names.")] = None,
    oidc_ca_file: Annotated[Path | None, typer.Option(
        "--oidc-ca-file", metavar="FILE", show_default=False,
        help="The CA (PEM) that signed the issuer's certificate (default: the system's).")] = None,
    oidc_signing_algs: Annotated[str | None, typer.Option(
        "--oidc-signing-algs", metavar="ALGS", show_default=False,
        help="Comma-separated JWS algorithms accepted (default RS256).")] = None,
    audit_retention: Annotated[str, typer.Option(
        "--audit-retention", metavar="DURATION",
        help="How long audit rows are kept (e.g. 90d, 720h); 0 keeps them forever. Pruned at start "
             "and hourly.")] = "90d",
    api_url: ApiUrlOption = None,
    agent_user: AgentUserOption = None,
    kube_config: KubeConfigOption = None,
    kube_in_cluster: KubeInClusterOption = False,
    kube_context: KubeContextOption = None,
    kube_namespace: KubeNamespaceOption = None,
    kube_image: KubeImageOption = None,
    kube_api_url: KubeApiUrlOption = None,
    kube_service_account: KubeServiceAccountOption = None,
) -> None:
    """Run the Joch API server (embedded SQLite in DATA_DIR unless --store is given), and the controllers.

    Without --token-file or --oidc-issuer-url the server does not authenticate (every caller may do
    everything), which it allows only on a loopback --host."""
    from joch.server.auth import options as auth_options  # no web stack: plain dataclasses

    auth = auth_options.AuthOptions(
        token_file=token_file,
        oidc=auth_options.oidc_options(
            issuer_url=oidc_issuer_url, client_id=oidc_client_id, username_claim=oidc_username_claim,
            username_prefix=oidc_username_prefix, groups_claim=oidc_groups_claim, groups_prefix=oidc_groups_prefix,
            ca_file=oidc_ca_file, signing_algs=oidc_signing_algs),
    )
    auth_options.check_exposure(host, auth)
    options = serving.controller_options(
        data_dir=data_dir, max_concurrent_runs=max_concurrent_runs, lease_duration=lease_duration,
        max_concurrent_runs_per_namespace=max_concurrent_runs_per_namespace, identity=identity,
        max_log_bytes=max_log_bytes, max_artifact_bytes=max_artifact_bytes,
        sandbox=sandbox if controllers else "none", store_file=store_file, api_url=api_url,
        secret_key_file=secret_key_file, agent_user=agent_user,
        kubernetes=serving.kube_settings(kubeconfig=kube_config, in_cluster=kube_in_cluster, context=kube_context,
                                         namespace=kube_namespace, image=kube_image, api_url=kube_api_url,
                                         service_account=kube_service_account),
    )
    store = serving.store_source(store, store_file)
    limits = serving.ServerLimits(max_watches=max_watches, watch_buffer_events=watch_buffer_events,
                                  max_apply_documents=max_apply_documents, max_apply_bytes=max_apply_bytes)
    serving.run(data_dir=data_dir, store=store, host=host, port=port, apply_paths=apply_paths,
                apply_missing=apply_missing, controllers=options if controllers else None,
                allowed_hosts=(*(allowed_hosts or ()), *serving.kube_hosts(options.kubernetes)),
                allowed_origins=allowed_origins or (), limits=limits, auth=auth,
                audit_retention=serving.retention_seconds(audit_retention), secret_key_file=secret_key_file)


@command("controller")
def controller_command(
    data_dir: DataDirOption = Path(".joch"),
    store: StoreOption = None,
    store_file: StoreFileOption = None,
    secret_key_file: SecretKeyFileOption = None,
    max_concurrent_runs: MaxRunsOption = 10,
    max_concurrent_runs_per_namespace: MaxRunsPerNamespaceOption = None,
    lease_duration: LeaseDurationOption = 15.0,
    identity: IdentityOption = None,
    max_log_bytes: MaxLogBytesOption = "64Mi",
    max_artifact_bytes: MaxArtifactBytesOption = "1Gi",
    sandbox: SandboxOption = "auto",
    api_url: ApiUrlOption = None,
    agent_user: AgentUserOption = None,
    kube_config: KubeConfigOption = None,
    kube_in_cluster: KubeInClusterOption = False,
    kube_context: KubeContextOption = None,
    kube_namespace: KubeNamespaceOption = None,
    kube_image: KubeImageOption = None,
    kube_api_url: KubeApiUrlOption = None,
    kube_service_account: KubeServiceAccountOption = None,
) -> None:
    """Run only the controllers (no HTTP API) until SIGINT or SIGTERM.

    Replicas sharing a store elect one leader through a Lease; the others wait to take over.
    """
    options = serving.controller_options(
        data_dir=data_dir, max_concurrent_runs=max_concurrent_runs, lease_duration=lease_duration,
        max_concurrent_runs_per_namespace=max_concurrent_runs_per_namespace, identity=identity,
        max_log_bytes=max_log_bytes, max_artifact_bytes=max_artifact_bytes,
        sandbox=sandbox, store_file=store_file, api_url=api_url, secret_key_file=secret_key_file,
        agent_user=agent_user,
        kubernetes=serving.kube_settings(kubeconfig=kube_config, in_cluster=kube_in_cluster, context=kube_context,
                                         namespace=kube_namespace, image=kube_image, api_url=kube_api_url,
                                         service_account=kube_service_account),
    )
    serving.run_controllers(data_dir=data_dir, store=serving.store_source(store, store_file), options=options,
                            secret_key_file=secret_key_file)


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


def _scope(ctx: typer.Context, namespace: str | None, all_namespaces: bool) -> reading.Scope:
    return reading.Scope(namespace=_namespace(ctx, namespace), all_namespaces=all_namespaces)


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
    namespace: NamespaceOption = None,
    server: ServerOption = None,
) -> None:
    """Print a run's log (the agent's stdout and stderr) as it arrives."""
    from joch.cli import tailing

    name = runs.log_target(target)
    with _client(ctx, server) as client:
        tailing.logs(client, _namespace(ctx, namespace).name, name, tail=tail, follow=follow, attempt=attempt)


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


@command("runner", hidden=True)  # started by runtimes, not by people
def runner_command(
    spec: Annotated[Path, typer.Option("--spec", metavar="PATH",
                                       help="The run's spec.json; its directory is the run directory.")],
    workspace: Annotated[Path | None, typer.Option("--workspace", metavar="PATH", show_default=False,
                                                   help="The workspace root (default: workspace/ in the run "
                                                        "directory).")] = None,
    cache: Annotated[Path | None, typer.Option("--cache", metavar="PATH", show_default=False,
                                               help="The repository mirrors (default: mirrors/ in the run "
                                                    "directory).")] = None,
    secrets_stdin: Annotated[bool, typer.Option("--secrets-stdin", help="Read the secret values as one JSON "
                                                "object from stdin instead of the environment.")] = False,
    sandbox: Annotated[str, typer.Option("--sandbox", metavar="bwrap|none",
                                         help="Run the agent under bubblewrap (bwrap), or not.")] = "none",
    hide: Annotated[list[Path] | None, typer.Option("--hide", metavar="PATH", show_default=False,
                                                    help="With --sandbox bwrap: a path the agent sees empty. "
                                                         "Repeatable.")] = None,
    api_url: Annotated[str | None, typer.Option("--api-url", metavar="URL", show_default=False,
                                                help="The Joch server, for the agent's usage callback.")] = None,
    agent_user: AgentUserOption = None,
    sandbox_reason: Annotated[str | None, typer.Option("--sandbox-reason", metavar="TEXT", show_default=False,
                                                       help="With --sandbox none: why, for the run's record.")
                              ] = None,
    report: Annotated[bool, typer.Option("--report", help="Also send the records, artifacts and log to the Joch "
                                         "API at --api-url (a Kubernetes Job's runner).")] = False,
    spec_json: Annotated[str | None, typer.Option("--spec-json", metavar="JSON", show_default=False,
                                                  help="The spec itself, written to --spec first.")] = None,
) -> None:
    """Execute one run attempt from a runner spec and record it (runtimes start this; see joch.runtime.runner)."""
    from joch.runtime import runner
    from joch.runtime.sandbox import SANDBOXES

    argv = ["--spec", str(spec)]
    argv += ["--workspace", str(workspace)] if workspace is not None else []
    argv += ["--cache", str(cache)] if cache is not None else []
    argv += ["--secrets-stdin"] if secrets_stdin else []
    if sandbox not in SANDBOXES:
        raise errors.BadRequest(f'--sandbox must be {" or ".join(SANDBOXES)} (got "{sandbox}")')
    argv += ["--sandbox", sandbox]
    for path in hide or ():
        argv += ["--hide", str(path)]
    argv += ["--api-url", api_url] if api_url else []
    argv += ["--agent-user", agent_user] if agent_user else []
    argv += ["--sandbox-reason", sandbox_reason] if sandbox_reason else []
    argv += ["--report"] if report else []
    argv += ["--spec-json", spec_json] if spec_json is not None else []
    raise typer.Exit(runner.main(argv))


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


def subcommand(group: typer.Typer, name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    def register(fn: Callable[P, R]) -> Callable[P, R]:
        group.command(name, cls=helptypes.Command)(reported(fn))
        return fn

    return register


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


# --- kubectl parity: edit, patch, label, wait, completion -------------------------------------------

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


def main() -> None:
    app()
