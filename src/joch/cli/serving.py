"""``joch server``: turning command-line choices into a call to ``joch.server.serve``.

The web stack is imported only here and only when the command runs, so every other command
starts without loading FastAPI and uvicorn. Problems a user can fix are reported as ``JochError``
before the server starts, instead of as uvicorn log lines or a traceback: a data directory that
cannot be created, a port outside 1-65535 (``socket.bind`` would raise ``OverflowError``), a port
already taken (checked by binding it once; uvicorn would log and exit with its own code 3, which
here means "not found"), and a store URL the store layer refuses (``open_store`` raises
``ValueError`` for those), and an ``--allowed-host`` or ``--allowed-origin`` that is not a host name or
an origin (``joch.server.guard`` says which, and refuses ``*`` and ``null`` as origins).

``joch controller`` runs the same controllers as ``joch server`` without the web stack: it opens the
store, campaigns for the leader lease and runs the controllers until SIGINT or SIGTERM, then stops
them, releases the lease and exits 0. Both commands build their ``ControllerOptions`` in
``controller_options``; ``--lease-duration`` sets the renew deadline and retry period in
client-go's proportions (15 : 10 : 2), so one flag cannot make an inconsistent trio.
``--max-log-bytes`` and ``--max-artifact-bytes`` take bytes or a Kubernetes-style quantity
(``64Mi``, ``1Gi``, ``500M``); ``0`` means no limit.

``joch server --workers N`` (N > 1) makes the first process a supervisor after the same checks: it binds
the port and starts N server processes with its own arguments (``joch.cli.supervising``); in those,
``run`` finds its role in the environment and serves the connections the supervisor hands it.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from joch.api import audit as audits
from joch.api import errors
from joch.cli import supervising
from joch.controllers.options import ControllerOptions, default_identity
from joch.runtime.kubernetes.settings import KubeSettings
from joch.telemetry import logs, tracing

if TYPE_CHECKING:
    from joch.server.auth.options import AuthOptions
    from joch.store.sealing import KeyRing


def store_source(store: str | None, store_file: Path | None) -> str | None:
    """The store URL from ``--store`` or ``--store-file`` (its first line).

    Every process of the server's user can read the server's ``/proc/<pid>/cmdline`` and ``environ``
    (its environment as it was started: unsetting a variable later does not change it), agents
    included. A password in ``--store`` or ``JOCH_STORE`` is therefore warned about; a file (or
    libpq's ``~/.pgpass``/``PGPASSFILE`` with a URL without a password) keeps it out of both."""
    if store and store_file is not None:
        raise errors.BadRequest("give the store URL once: --store (JOCH_STORE) or --store-file (JOCH_STORE_FILE)")
    if store_file is not None:
        try:
            lines = store_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise errors.BadRequest(f'cannot read --store-file "{store_file}": '
                                    f"{getattr(exc, 'strerror', None) or exc}") from None
        url = lines[0].strip() if lines else ""
        if not url:
            raise errors.BadRequest(f'--store-file "{store_file}" is empty: write the store URL on its first line')
        return url
    if store and _password(store):
        logs.notice("warning: the store URL in --store/JOCH_STORE has a password, which every process of this user "
                    "(agents too) can read in /proc: use --store-file, or ~/.pgpass (PGPASSFILE) and a URL without it")
    return store


def _password(url: str) -> bool:
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return False


def store_url(*, data_dir: Path, store: str | None) -> str:
    if store:
        _check_sqlite_directory(store)
        return store
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.BadRequest(f'cannot create the data directory "{data_dir}": {exc.strerror or exc}') from None
    return f"sqlite:///{data_dir.resolve() / 'joch.db'}"


def _check_sqlite_directory(url: str) -> None:
    """A typo in a ``--store sqlite:///…`` path must not quietly create a new, empty store (and its
    directories) that a server then leads as if nothing were wrong."""
    if not url.startswith("sqlite:"):
        return
    parts = urlsplit(url)
    path = (parts.netloc + parts.path) if parts.netloc else parts.path
    if path.startswith("//"):
        path = path[1:]
    directory = Path(path).parent
    if path and not directory.is_dir():
        raise errors.BadRequest(f'the directory "{directory}" of the SQLite store in --store does not exist: '
                                f"create it (mkdir -p {directory}) or fix the URL")


MAX_PORT = 65535


def check_port(host: str, port: int, flag: str = "--port") -> None:
    if not 1 <= port <= MAX_PORT:
        raise errors.BadRequest(f"{flag} must be between 1 and {MAX_PORT} (got {port})")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except (OSError, UnicodeError) as exc:  # UnicodeError: a --host that is not a valid name
            taken = isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE
            hint = "is another `joch server` running?" if flag == "--port" else f"choose another {flag}"
            why = f"the address is already in use ({hint})" if taken else (
                getattr(exc, "strerror", None))
            raise errors.BadRequest(f"cannot listen on {host}:{port}: {why or exc}") from None


_SIZE = re.compile(r"(\d+)([KMGT]i?|k)?")
_UNITS = {"k": 1000, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
          "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
MIN_LOG_BYTES = 1024


def parse_size(flag: str, text: str) -> int | None:
    """Bytes from ``1048576``, ``64Mi``, ``1Gi``, ``500M``; None for ``0`` (no limit)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise errors.BadRequest(f"{flag} must be a number of bytes, optionally with a suffix Ki, Mi, Gi, Ti "
                                f"(or k, M, G, T), such as 64Mi; 0 means no limit (got {text!r})")
    size = int(match.group(1)) * _UNITS.get(match.group(2) or "", 1)
    return size or None


def controller_options(
    *, data_dir: Path, max_concurrent_runs: int | None, max_concurrent_runs_per_namespace: int | None,
    lease_duration: float, identity: str | None, max_log_bytes: str = "64Mi", max_artifact_bytes: str = "1Gi",
    sandbox: str = "none", store_file: Path | None = None, api_url: str | None = None,
    secret_key_file: Path | None = None, agent_user: str | None = None, kubernetes: KubeSettings | None = None,
) -> ControllerOptions:
    for flag, value in (("--max-concurrent-runs", max_concurrent_runs),
                        ("--max-concurrent-runs-per-namespace", max_concurrent_runs_per_namespace)):
        if value is not None and value < 1:
            raise errors.BadRequest(f"{flag} must be at least 1 (got {value})")
    if not lease_duration > 0:
        raise errors.BadRequest(f"--lease-duration must be a positive number of seconds (got {lease_duration:g})")
    if identity is not None and not identity.strip():
        raise errors.BadRequest("--identity must not be empty")
    log_limit = parse_size("--max-log-bytes", max_log_bytes)
    if log_limit is not None and log_limit < MIN_LOG_BYTES:
        raise errors.BadRequest(f"--max-log-bytes must be at least {MIN_LOG_BYTES} (1Ki), or 0 for no limit "
                                f"(got {max_log_bytes})")
    sandbox, sandbox_reason = _sandbox(sandbox)
    if agent_user is not None:
        from joch.runtime.sandbox import SandboxError, parse_agent_user

        try:
            agent_user = str(parse_agent_user(agent_user))
        except SandboxError as exc:
            raise errors.BadRequest(str(exc)) from None
    if api_url is not None and not api_url.startswith(("http://", "https://")):
        raise errors.BadRequest(f'--api-url must be an http:// or https:// URL (got "{api_url}")')
    return ControllerOptions(
        api_url=api_url.rstrip("/") if api_url else None,
        sandbox=sandbox, sandbox_hide=_secret_files(store_file, secret_key_file), sandbox_reason=sandbox_reason,
        agent_user=agent_user,
        data_dir=data_dir, identity=identity or default_identity(), lease_duration=lease_duration,
        renew_deadline=lease_duration * 10 / 15, retry_period=lease_duration * 2 / 15,
        max_concurrent_runs=max_concurrent_runs, max_concurrent_runs_per_namespace=max_concurrent_runs_per_namespace,
        max_log_bytes=log_limit, max_artifact_bytes=parse_size("--max-artifact-bytes", max_artifact_bytes),
        kubernetes=kubernetes,
    )


def kube_hosts(settings: KubeSettings | None) -> tuple[str, ...]:
    """The host of ``--kube-api-url``: run Pods send it in ``Host``, so the server accepts it
    (a Service's DNS name is no ``--allowed-host`` a user should have to repeat)."""
    host = urlsplit(settings.api_url).hostname if settings is not None and settings.api_url else None
    return (host,) if host else ()


def kube_settings(*, kubeconfig: Path | None, in_cluster: bool, context: str | None, namespace: str | None,
                  image: str | None, api_url: str | None, service_account: str | None) -> KubeSettings | None:
    """``--kube-*``: the Kubernetes runtime's settings, or None when neither ``--kube-config`` nor
    ``--kube-in-cluster`` enables it."""
    if kubeconfig is None and not in_cluster:
        given = [flag for flag, value in (("--kube-context", context), ("--kube-namespace", namespace),
                                          ("--kube-image", image), ("--kube-api-url", api_url),
                                          ("--kube-service-account", service_account)) if value]
        if given:
            raise errors.BadRequest(f"{', '.join(given)}: only the Kubernetes runtime uses this; enable it with "
                                    "--kube-config FILE or --kube-in-cluster")
        return None
    if kubeconfig is not None and not kubeconfig.is_file():
        raise errors.BadRequest(f'--kube-config: "{kubeconfig}" is not a file')
    if api_url is not None and not api_url.startswith(("http://", "https://")):
        raise errors.BadRequest(f'--kube-api-url must be an http:// or https:// URL (got "{api_url}")')
    settings = KubeSettings(api_url=(api_url or "").rstrip("/"), kubeconfig=kubeconfig, context=context,
                            namespace=namespace, service_account=service_account)
    return replace(settings, image=image) if image else settings


def _sandbox(choice: str) -> tuple[str, str | None]:
    """``--sandbox``: ``bwrap`` is checked now (a server that cannot keep that promise does not start);
    ``auto`` becomes ``bwrap`` where bubblewrap works, else ``none`` with a warning. With the reason
    for ``none`` that each run's status gives (``status.sandbox.reason``)."""
    from joch.runtime.sandbox import sandbox_problem

    if choice not in ("auto", "bwrap", "none"):
        raise errors.BadRequest(f'--sandbox must be auto, bwrap or none (got "{choice}")')
    if choice == "none":
        return choice, "the server was started with --sandbox none"
    problem = sandbox_problem()
    if problem is None:
        return "bwrap", None
    if choice == "bwrap":
        raise errors.BadRequest(f"--sandbox bwrap: {problem}; install bubblewrap, or choose --sandbox auto or none")
    logs.notice(f"warning: agents run without a sandbox ({problem}): they can read what this user can, other runs' "
                "files and this server's environment included; --sandbox none silences this")
    return "none", f"--sandbox auto: {problem}"


def _secret_files(store_file: Path | None, secret_key_file: Path | None = None) -> tuple[Path, ...]:
    """Files a sandboxed agent must not read besides the data dir: the store URL's file, libpq's
    password file and the Secret key file."""
    candidates = [store_file, Path(os.environ.get("PGPASSFILE") or Path.home() / ".pgpass"), secret_key_file]
    return tuple(path.resolve() for path in candidates if path is not None and path.exists())


@dataclass(frozen=True)
class ServerLimits:
    """The ``joch server`` flags that bound what one request or client may take (see
    ``joch.server.options.ServerOptions``); ``max_watches`` None derives it from the fd limit."""

    max_watches: int | None = None
    watch_buffer_events: int = 10_000
    max_apply_documents: int = 1000
    max_apply_bytes: int = 16 * 1024 * 1024

    def check(self) -> None:
        for flag, value in (("--max-watches", self.max_watches), ("--watch-buffer-events", self.watch_buffer_events),
                            ("--max-apply-documents", self.max_apply_documents),
                            ("--max-apply-bytes", self.max_apply_bytes)):
            if value is not None and value < 1:
                raise errors.BadRequest(f"{flag} must be at least 1 (got {value})")


def secret_keys(*, key_file: Path | None, data_dir: Path) -> KeyRing:
    """The Secret key ring of ``joch server`` and ``joch controller`` (``sealing.load_ring``):
    ``--secret-key-file``, else ``JOCH_SECRET_KEY``, else ``DATA_DIR/secret.key``, generated on the
    first start. ``JOCH_SECRET_KEY`` is readable in ``/proc`` by every process of this user (agents
    too, without a sandbox), so using it is warned about, as a store password in ``--store`` is."""
    from joch.store import sealing  # lazy: commands other than these do not load the store

    env_value = os.environ.get(sealing.ENV) if key_file is None else None
    if env_value:
        logs.notice(f"warning: {sealing.ENV} is readable by every process of this user (agents too) in /proc: "
                    "prefer --secret-key-file (a file the sandbox hides from agents)")
    ring, note = sealing.load_ring(key_file=key_file, env_value=env_value, data_dir=data_dir)
    if note:
        logs.notice(note)
    return ring


def run(
    *, data_dir: Path, store: str | None, host: str, port: int, apply_paths: list[str] | None,
    controllers: ControllerOptions | None = None, allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (), apply_missing: list[str] | None = None, limits: ServerLimits | None = None,
    auth: AuthOptions | None = None,
    audit_retention: float = 90 * 86400.0,
    secret_key_file: Path | None = None,
    metrics_public: bool = False,
    workers: int = 1,
) -> int:
    """Serve until stopped; the exit code (not 0 only when ``--workers``' first worker failed to start,
    which said why on stderr)."""
    if workers < 1:
        raise errors.BadRequest(f"--workers must be at least 1 (got {workers})")
    role = supervising.worker_role()  # set when a --workers supervisor started this process
    limits = limits or ServerLimits()
    limits.check()
    from joch import server  # lazy: only this command needs the web stack
    from joch.server import guard
    from joch.server.auth import tokenfile
    from joch.server.auth.options import AuthOptions

    options = server.ServerOptions(
        allowed_hosts=_checked("--allowed-host", allowed_hosts, guard.normalize_host),
        allowed_origins=_checked("--allowed-origin", allowed_origins, guard.normalize_origin),
        max_watches=limits.max_watches, watch_buffer_events=limits.watch_buffer_events,
        max_apply_documents=limits.max_apply_documents, max_apply_bytes=limits.max_apply_bytes,
        auth=auth or AuthOptions(),
        audit_retention=audit_retention,
        metrics_public=metrics_public,
    )
    if auth is not None and auth.token_file is not None:
        tokenfile.TokenFile(auth.token_file)  # a malformed file stops the start here, naming the line
    if role is None:  # a worker serves the socket its supervisor bound
        check_port(host, port)
    url = store_url(data_dir=data_dir, store=store)
    keys = secret_keys(key_file=secret_key_file, data_dir=data_dir)
    if role is None and workers > 1:
        return _supervise(host, port, workers)
    try:
        with _tracing("joch-server"):
            server.serve(store_url=url, host=host, port=port, apply_paths=apply_paths or None,
                         controllers=controllers, options=options, apply_missing_paths=apply_missing or None,
                         secret_keys=keys, log_format=logs.current_format(),
                         handoff=role.handoff if role else None, primary=role.primary if role else True,
                         on_ready=role.ready if role else None)
    except ValueError as exc:
        raise errors.BadRequest(str(exc)) from None
    return 0


def _supervise(host: str, port: int, workers: int) -> int:
    """``--workers`` above 1: this process binds the port and runs ``workers`` server processes with
    this command's own arguments (``joch.cli.supervising``)."""
    import sys

    from joch.server.serving import runtime_url

    try:
        sock = supervising.bind(host, port)
    except OSError as exc:  # taken since check_port looked
        raise errors.BadRequest(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return supervising.Supervisor(workers=workers, sock=sock, argv=sys.argv[1:], url=runtime_url(host, port)).run()


def configure_logs(log_format: str) -> None:
    """``--log-format``, first thing: the notes before the start (``logs.notice``) are in it too."""
    try:
        logs.configure(log_format)
    except ValueError as exc:
        raise errors.BadRequest(str(exc)) from None


def retention_seconds(text: str) -> float:
    """``--audit-retention``: a duration (``90d``, ``720h``); ``0`` keeps audit rows forever."""
    try:
        return audits.parse_duration(text)
    except ValueError as exc:
        raise errors.BadRequest(f"--audit-retention: {exc}") from None


def _checked(flag: str, values: Sequence[str], normalize: Callable[[str], str]) -> tuple[str, ...]:
    try:
        return tuple(normalize(value) for value in values)
    except ValueError as exc:
        raise errors.BadRequest(f"{flag} {exc}") from None


def run_controllers(
    *, data_dir: Path, store: str | None, options: ControllerOptions, secret_key_file: Path | None = None,
    metrics_address: tuple[str, int] | None = None,
) -> None:
    """``joch controller``: run the controllers until SIGINT or SIGTERM; with ``metrics_address``
    (``--metrics-host``, ``--metrics-port``), serve their metrics there at ``/metrics``."""
    from joch.controllers import manager as managing
    from joch.controllers.assembly import build_runtime
    from joch.store import open_store
    from joch.telemetry import metrics

    if metrics_address is not None:
        check_port(*metrics_address, flag="--metrics-port")
    url = store_url(data_dir=data_dir, store=store)
    keys = secret_keys(key_file=secret_key_file, data_dir=data_dir)
    try:
        opened = open_store(url, secret_keys=keys)
    except ValueError as exc:
        raise errors.BadRequest(str(exc)) from None
    try:
        if metrics_address is not None:
            metrics.serve(*metrics_address)
        runtime = build_runtime(options)
        try:
            with _tracing("joch-controller"), managing.running(opened, runtime, options) as manager:
                with _stopping_on_signals(manager.request_stop):
                    manager.run()
        finally:
            runtime.close()
    finally:
        opened.close()


@contextmanager
def _tracing(service_name: str) -> Iterator[None]:
    """Traces for the block when the environment configures them (``joch.telemetry.tracing``),
    flushed at its end; a configuration Joch cannot honour is a ``BadRequest`` before anything starts."""
    try:
        started = tracing.setup(service_name=service_name)
    except ValueError as exc:
        raise errors.BadRequest(str(exc)) from None
    try:
        yield
    finally:
        if started:
            tracing.shutdown()


@contextmanager
def _stopping_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call ``stop`` (which must be signal-safe) instead of raising."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: stop()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
