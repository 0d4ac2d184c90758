"""The runtime adapter contract, and the resolved run that ``joch runner`` executes.

Every runtime runs the same wrapper, ``joch runner``, around the agent: the local runtime as a
supervised process per run, the Kubernetes runtime as the container of a Job. The run controller
renders the provider's templates into a ``RunnerSpec`` (argv, env, input files, outputs, git
coordinates, deadline) and hands it to ``Runtime.submit``; the runner prepares the workspace,
starts the agent in its own process group, enforces the deadline, and durably records what
happened (``RunState``) so a server that crashed can re-adopt the run instead of starting it again.

Contracts (every adapter, every test):

* ``submit`` is idempotent per ``(uid, attempt)``: a second call for a run that was submitted
  already (by this process or one that died) returns the existing reference and starts nothing.
* Secret values are handed to ``submit`` separately and only ever reach the agent's environment:
  never the spec file, the state record, the log (the runner redacts them) or the reference.
* ``status`` never raises for a run it knows: a runner that vanished without recording an end is
  ``Lost`` (reason ``RunnerLost``), and its agent's process group is killed.
* ``cancel`` asks the runner to stop: SIGTERM to the agent's process group, SIGKILL after the grace
  period; the record then ends ``Cancelled``. Cancelling a finished run does nothing.
* ``subscribe`` callbacks fire (from a runtime thread) whenever a run's state may have changed:
  the agent started, ended, or the runner vanished. They carry the run's identity only.
* A reference's ``type`` is the runtime's: ``for_type`` picks the runtime of a type (the spec's
  ``placement.type`` for a new attempt), so a server with several (``routing.Runtimes``) follows
  each run on the one that started it.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

Ref = dict[str, Any]
"""An adapter's handle on a submitted run, stored in ``AgentRun.status.runtimeRef`` (JSON; no secrets)."""

SPEC_VERSION = "runner.joch.dev/v1"
RUN_TOKEN_ENV = "JOCH_RUN_TOKEN"  # noqa: S105 - a variable's name
"""The agent's variable holding its run's token (a secret: the runner passes it with the others)."""
API_URL_ENV = "JOCH_API_URL"
"""The agent's variable holding the Joch server's URL as the runtime reaches it (``--api-url``)."""
LOG_IDLE_SECONDS = 1.0
"""How long a followed log iterator may go without yielding (``b""`` when the agent is quiet)."""


@dataclass(frozen=True)
class RunId:
    namespace: str
    name: str
    uid: str
    attempt: int = 1


@dataclass(frozen=True)
class GitSource:
    url: str
    ref: str = "HEAD"
    path: str = "."


@dataclass(frozen=True)
class InputFile:
    path: str  # relative to the workspace's inputs directory
    content: str


@dataclass(frozen=True)
class Output:
    name: str
    path: str  # relative to the workspace's outputs directory
    optional: bool = False


@dataclass(frozen=True)
class Workspace:
    """Where a run's files are, as the agent sees them (template context ``workspace``)."""

    root: str      # the checkout (its own repository, borrowing the mirror's objects) or an empty directory
    #                when the run names no repository
    path: str      # root joined with ``execution.coordinates.git.path``: the agent's working directory
    inputs: str    # input files are written here
    outputs: str   # the agent writes its output artifacts here
    home: str = ""  # the attempt's own HOME (XDG_* below it); the provider's configFiles are written here

    def context(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class ConfigFile:
    """A tool configuration file the runner writes into the attempt's HOME before the agent starts
    (Codex's ``.codex/config.toml``, say): ``path`` is relative to HOME, ``content`` already rendered."""

    path: str
    content: str
    mode: int = 0o600


@dataclass(frozen=True)
class SuccessPolicy:
    """When an agent that exited 0 has succeeded (the provider's ``spec.successPolicy``).

    * ``require_changes``: an empty ``changes.patch`` fails the run ``NoChanges``;
    * ``failure_patterns``: Python regular expressions searched in each log line (after redaction);
      a match fails the run ``FailurePattern`` naming the pattern and the line;
    * ``required_artifacts``: output names that must have been stored (``MissingOutput``);
    * ``agent_result``: the agent's own final result, as its ``output_format`` parser reads it
      (Claude Code's ``is_error``), counts: an error result fails the run ``AgentReportedError``."""

    require_changes: bool = False
    failure_patterns: tuple[str, ...] = ()
    required_artifacts: tuple[str, ...] = ()
    agent_result: bool = True


@dataclass(frozen=True)
class PatchPolicy:
    """What ``changes.patch`` leaves out (the provider's ``spec.patch``): ``exclude`` are git
    pathspec globs relative to the worktree root (``.aider*``, ``**/.aider.tags.cache.v4/**``);
    a changed file over ``max_file_bytes`` is left out and listed in the record's ``omitted``."""

    exclude: tuple[str, ...] = ()
    max_file_bytes: int | None = None


@dataclass(frozen=True)
class Resume:
    """Continue an earlier attempt instead of starting over: run in attempt ``attempt``'s worktree,
    with a copy of its HOME (the CLI's session store), the argv already rendered with the session
    id (``session_id``) the CLI's resume option takes."""

    attempt: int
    session_id: str


@dataclass(frozen=True)
class Network:
    """The sandboxed agent's network: ``on`` (the host's), ``off`` (loopback of its own only), or
    ``limited`` (only ``allow``: ``host`` or ``host:port`` entries, through a proxy the runner runs)."""

    mode: Literal["on", "off", "limited"] = "on"
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """Where an attempt runs, for the runtime that places it (the runner ignores it): ``type`` the
    runtime (the run's ``spec.runtime.type``, else its Agent's), ``image`` the container image (the
    run's ``workload.image``, else the provider's; None: the runtime's default), ``resources``
    (``cpu``, ``memory``, ``ephemeralStorage`` as Kubernetes quantities), ``service_account`` (the
    runtime config's ``serviceAccountName``, one the Agent's ``security.allowedServiceAccounts`` allows)."""

    type: str = "local"
    image: str | None = None
    resources: Mapping[str, str] = field(default_factory=dict)
    service_account: str | None = None


@dataclass(frozen=True)
class RunnerSpec:
    run: RunId
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: tuple[str, ...] = ()  # names of env vars whose values come from the runner's environment
    input_files: tuple[InputFile, ...] = ()
    outputs: tuple[Output, ...] = ()
    git: GitSource | None = None
    timeout_seconds: float = 3600.0
    grace_seconds: float = 10.0
    max_log_bytes: int | None = None       # the log keeps the first and last halves of this (None: all)
    max_artifact_bytes: int | None = None  # a larger output (or changes.patch) is refused (None: no limit)
    config_files: tuple[ConfigFile, ...] = ()  # written into the attempt's HOME before the agent starts
    output_format: str | None = None       # which parser reads the agent's output (joch.runtime.agentoutput)
    success: SuccessPolicy = field(default_factory=SuccessPolicy)
    patch: PatchPolicy = field(default_factory=PatchPolicy)
    version_args: tuple[str, ...] = ("--version",)  # how to ask the CLI its version (() : do not ask)
    resume: Resume | None = None
    network: Network = field(default_factory=Network)
    manifest_hash: str | None = None       # the compiled Agent manifest's hash, for the record
    placement: Placement = field(default_factory=Placement)

    def to_json(self) -> str:
        body = asdict(self)
        body["apiVersion"] = SPEC_VERSION
        return json.dumps(body, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunnerSpec:
        body = json.loads(text)
        if body.pop("apiVersion", None) != SPEC_VERSION:
            raise ValueError(f"not a {SPEC_VERSION} runner spec")
        git = body.pop("git")
        resume = body.pop("resume", None)
        success = body.pop("success", None) or {}
        patch = body.pop("patch", None) or {}
        network = body.pop("network", None) or {}
        placement = body.pop("placement", None) or {}
        return cls(
            run=RunId(**body.pop("run")),
            argv=tuple(body.pop("argv")),
            env=dict(body.pop("env")),
            secret_env=tuple(body.pop("secret_env")),
            input_files=tuple(InputFile(**f) for f in body.pop("input_files")),
            outputs=tuple(Output(**o) for o in body.pop("outputs")),
            git=GitSource(**git) if git else None,
            config_files=tuple(ConfigFile(**f) for f in body.pop("config_files", None) or ()),
            success=SuccessPolicy(require_changes=bool(success.get("require_changes", False)),
                                  failure_patterns=tuple(success.get("failure_patterns") or ()),
                                  required_artifacts=tuple(success.get("required_artifacts") or ()),
                                  agent_result=bool(success.get("agent_result", True))),
            patch=PatchPolicy(exclude=tuple(patch.get("exclude") or ()), max_file_bytes=patch.get("max_file_bytes")),
            version_args=tuple(body.pop("version_args", ("--version",))),
            resume=Resume(**resume) if resume else None,
            network=Network(mode=network.get("mode", "on"), allow=tuple(network.get("allow") or ())),
            placement=Placement(type=str(placement.get("type") or "local"), image=placement.get("image"),
                                resources=dict(placement.get("resources") or {}),
                                service_account=placement.get("service_account")),
            **body,
        )


RunnerPhase = Literal["Preparing", "Running", "Succeeded", "Failed", "Cancelled", "Lost"]
FINISHED: frozenset[str] = frozenset({"Succeeded", "Failed", "Cancelled", "Lost"})


@dataclass(frozen=True)
class ArtifactRecord:
    name: str
    path: str          # relative to the run's artifact directory (what ``open_artifact`` serves)
    sha256: str
    size: int


@dataclass(frozen=True)
class RefusedArtifact:
    """An output the runner did not store, and why (``message``: over the size limit, say)."""

    name: str
    path: str
    size: int
    message: str


@dataclass(frozen=True)
class Sandbox:
    """How the agent was confined: ``mode`` ``bwrap`` or ``none``; ``user`` the uid it ran as;
    ``network`` ``on``, ``off`` or ``limited``; ``reason`` why it was not sandboxed (``none``)."""

    mode: str
    user: int | None = None
    network: str = "on"
    reason: str | None = None


@dataclass(frozen=True)
class Invocation:
    """What ran, for the record (``status.invocation``): the argv as rendered (secrets redacted,
    long arguments shortened), the environment's variable names (never values), the executable's
    resolved path, its ``--version`` output (first line) and sha256."""

    argv: tuple[str, ...]
    env: tuple[str, ...]
    executable: str | None = None
    version: str | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Session:
    """The agent CLI's own session (Claude Code's ``session_id``, Codex's thread id), as its output
    parser saw it; ``resumed_from`` is the attempt this one continued (None: it started over)."""

    id: str | None = None
    resumed_from: int | None = None


@dataclass(frozen=True)
class RunState:
    """What the runner recorded. ``reason`` is one of ``Completed`` (exit 0), ``AgentFailed``
    (non-zero exit), ``DeadlineExceeded``, ``Cancelled``, ``WorkspaceError`` (checkout failed),
    ``StartError`` (the binary could not be started), ``DiskFull`` (a write of the run's files failed
    for want of space; the message names the file), ``ArtifactTooLarge`` (a required output over the
    artifact size limit), ``NoChanges``, ``FailurePattern``, ``AgentReportedError`` (the success
    policy), ``RunnerLost``; ``message`` says it for a person (``agent exited with code 3``). Times
    are epoch seconds; ``started_at`` is when the agent process was spawned. ``base_commit`` is the
    commit the worktree started from; ``omitted`` lists files ``changes.patch`` left out (too large)."""

    phase: RunnerPhase
    reason: str | None = None
    message: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    pid: int | None = None
    artifacts: tuple[ArtifactRecord, ...] = ()
    refused: tuple[RefusedArtifact, ...] = ()
    base_commit: str | None = None
    invocation: Invocation | None = None
    sandbox: Sandbox | None = None
    session: Session | None = None
    omitted: tuple[RefusedArtifact, ...] = ()

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED


class Runtime(abc.ABC):
    type: str

    @abc.abstractmethod
    def workspace(self, run: RunId, git: GitSource | None, *, resume: Resume | None = None) -> Workspace:
        """The paths the run will have; pure (creates nothing), so templates can render first. With
        ``resume`` (the attempt's ``RunnerSpec.resume``) the workspace is the continued attempt's."""

    @abc.abstractmethod
    def submit(self, spec: RunnerSpec, *, secrets: Mapping[str, str] | None = None) -> Ref: ...

    @abc.abstractmethod
    def status(self, ref: Ref) -> RunState: ...

    @abc.abstractmethod
    def cancel(self, ref: Ref) -> None: ...

    @abc.abstractmethod
    def logs(self, ref: Ref, *, follow: bool = False, offset: int = 0) -> Iterator[bytes]:
        """The agent's combined stdout and stderr (secrets redacted) from byte ``offset``; with
        ``follow`` the iterator ends only when the run has finished and everything was read.

        While following an agent that writes nothing, the iterator yields ``b""`` at least every
        ``LOG_IDLE_SECONDS``: the server reads it in a thread it cannot interrupt, and gives that
        thread back (and stops reading) at the next yield after the client went away. An iterator
        that blocked until the next output would keep a thread polling per disconnected follower
        for as long as the agent stayed quiet."""

    @abc.abstractmethod
    def open_artifact(self, ref: Ref, name: str) -> tuple[ArtifactRecord, BinaryIO]:
        """An output artifact (or ``changes.patch``) by name; ``KeyError`` when there is none."""

    @abc.abstractmethod
    def cleanup(self, ref: Ref, *, keep_records: bool = True) -> None:
        """Remove the attempt's workspace; with ``keep_records=False`` (the run is being deleted)
        also the logs, records and artifacts of every attempt of the run."""

    @abc.abstractmethod
    def subscribe(self, callback: Callable[[RunId], None]) -> None: ...

    def storage_problem(self) -> str | None:
        """Why runs cannot write their logs and artifacts now (a full disk, named), or None;
        readiness asks this."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background threads; running agents keep running (they are re-adopted later)."""

    def for_type(self, type: str) -> Runtime | None:
        """The runtime that runs attempts placed on ``type`` (``Placement.type``): this one when it
        is of that type, else None (``joch.runtime.routing`` holds several)."""
        return self if type == self.type else None

    def reports(self) -> Any:
        """Where runners that report over HTTP (``joch.runtime.reports``) have their reports kept
        (a ``ReportStore``), and who is told they arrived: ``(store, on_report)``; None when no
        runner of this runtime reports (the local runtime reads its runners' files)."""
        return None


def own_ref(ref: Any, uid: str, attempt: Any) -> Ref | None:
    """``status.runtimeRef`` of the run whose uid is ``uid``, as a runtime may be given it; None when
    there is none. Status is written by API clients too, so a reference whose ``id`` is not
    ``<uid>/<N>`` (another run's) is replaced by the run's own attempt's (``attempt``, its
    ``status.attempt``), with nothing else taken from it: as written, it would have this run report,
    stream or, when it is deleted, remove another run's files."""
    if not isinstance(ref, dict) or not ref:
        return None
    if is_own_ref(ref, uid):
        return ref
    n = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 1 else 1
    own: Ref = {"type": ref.get("type"), "id": f"{uid}/{n}"}
    if ref.get("pending"):
        own["pending"] = True
    return own


def is_own_ref(ref: Ref, uid: str) -> bool:
    """Whether ``ref``'s ``id`` is ``<uid>/<N>``: an attempt of the run whose uid is ``uid`` (a
    reference without an ``id`` is for its runtime to read, or to refuse as malformed)."""
    if "id" not in ref:
        return True
    owner, _, number = str(ref.get("id") or "").rpartition("/")
    return owner == uid and number.isdigit()


def run_dir_name(run: RunId) -> Path:
    """A run attempt's directory below the runtime's root: stable, unique per uid and attempt."""
    return Path(run.uid) / str(run.attempt)
