"""The process commands: ``joch server``, ``joch controller`` and the hidden ``joch runner``, with their
options (declared once, shared by server and controller)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from joch.api import errors
from joch.cli import (
    serving,
)
from joch.cli.app import (
    command,
)

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
LogFormatOption = Annotated[
    str, typer.Option("--log-format", envvar="JOCH_LOG_FORMAT", metavar="text|json",
                      help="Log lines on stderr: text, or JSON objects (time, level, logger, message, and "
                           "request_id, run_uid, trace_id where they apply). Traces are configured by the "
                           "standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT...), off without them."),
]
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
    metrics_public: Annotated[bool, typer.Option(
        "--metrics-public", help="Serve /metrics without a token (for a Prometheus on a trusted network). "
        "Otherwise, with authentication on, scraping takes a token of an admin of every namespace or of a "
        "member of group system:monitoring.")] = False,
    api_url: ApiUrlOption = None,
    agent_user: AgentUserOption = None,
    kube_config: KubeConfigOption = None,
    kube_in_cluster: KubeInClusterOption = False,
    kube_context: KubeContextOption = None,
    kube_namespace: KubeNamespaceOption = None,
    kube_image: KubeImageOption = None,
    kube_api_url: KubeApiUrlOption = None,
    kube_service_account: KubeServiceAccountOption = None,
    log_format: LogFormatOption = "text",
    workers: Annotated[int, typer.Option(
        "--workers", envvar="JOCH_SERVER_WORKERS", metavar="N",
        help="Server processes sharing the port (one per core serves the most requests). The first applies "
             "--apply/--apply-missing and runs the controllers; the others serve HTTP only.")] = 1,
) -> None:
    """Run the Joch API server (embedded SQLite in DATA_DIR unless --store is given), and the controllers.

    Without --token-file or --oidc-issuer-url the server does not authenticate (every caller may do
    everything), which it allows only on a loopback --host."""
    from joch.server.auth import options as auth_options  # no web stack: plain dataclasses

    serving.configure_logs(log_format)
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
    code = serving.run(data_dir=data_dir, store=store, host=host, port=port, apply_paths=apply_paths,
                       apply_missing=apply_missing, controllers=options if controllers else None,
                       allowed_hosts=(*(allowed_hosts or ()), *serving.kube_hosts(options.kubernetes)),
                       allowed_origins=allowed_origins or (), limits=limits, auth=auth,
                       audit_retention=serving.retention_seconds(audit_retention), secret_key_file=secret_key_file,
                       metrics_public=metrics_public, workers=workers)
    if code:
        raise typer.Exit(code)


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
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", metavar="PORT", show_default=False,
        help="Serve the controllers' Prometheus metrics at http://--metrics-host:PORT/metrics, without "
             "authentication (default: not served).")] = None,
    metrics_host: Annotated[str, typer.Option(
        "--metrics-host", metavar="ADDR", help="Address --metrics-port listens on (0.0.0.0 for a scraper "
        "on another host).")] = "127.0.0.1",
    log_format: LogFormatOption = "text",
) -> None:
    """Run only the controllers (no HTTP API) until SIGINT or SIGTERM.

    Replicas sharing a store elect one leader through a Lease; the others wait to take over.
    """
    serving.configure_logs(log_format)
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
                            secret_key_file=secret_key_file,
                            metrics_address=(metrics_host, metrics_port) if metrics_port is not None else None)




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
