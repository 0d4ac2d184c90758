"""The v1alpha1 kinds: their spec/status schemas and their registry declarations.

Field names follow DESIGN.md §3 and the Jangar seed (``providerRef``, ``argsTemplate``,
``execution.coordinates.git``, ``implementationRef`` or ``implementation.inline``). Maps that a
provider may extend freely (``parameters``, ``runtime.config``) are typed as open dicts; everything
else forbids unknown fields so a typo is an error naming the field.

Rules a schema cannot state — uniqueness across list items, names the registry must know — live
on the spec as ``CheckedSpec.problems``: (path below ``spec``, message, reason) triples that
admission reports as causes at their paths, next to the schema's own errors. (A pydantic validator
could only report them at the model, not at ``spec.rules[2].name``.)

Secrets behave as in Kubernetes: ``spec.data`` values are base64 (checked: a plain-text value is an
error that points to ``stringData``), and ``spec.stringData`` is write-only convenience — admission
encodes it into ``data`` (a key in both takes the ``stringData`` value) and never stores it. The
change log keeps only a Secret's newest change and leaves ``data`` out of its DELETED event, so a
value that was changed or deleted cannot be replayed by a watch (``sensitive`` in the registry).

Cost: a ``Model`` (model.joch.dev) prices tokens per million; ``Agent.spec.modelRoute`` names one (a
reference admission warns about while it is missing). ``AgentRun.spec.budgetUsd`` (else the Agent's
``defaults.budgetUsd``) is what a run reserves and may spend; its ``status.costUsd`` and
``status.usage`` are what it reported. A ``Budget`` (ops.joch.dev) caps spend per UTC period; which
runs it counts, and how, is ``joch.controllers.budgets``; how usage is metered, ``metering``.

Beyond Kubernetes, ``data`` is never returned at all: the store seals it (``joch.store.sealing``) and
reads show ``status.keys`` (each key and its size) instead — see ``joch.api.secrets``.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import posixpath
import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, PrivateAttr, Tag, model_validator

from joch.api.errors import NotFound
from joch.api.meta import (
    Bool,
    Condition,
    ConditionedStatus,
    Int,
    LocalObjectReference,
    Model,
    NonNegativeInt,
    Number,
    PositiveInt,
    Str,
    parse_time,
)
from joch.api.registry import REGISTRY, Column, KindInfo, Reference, register
from joch.api.writeback import RunWriteBack, WriteBack

JOCH = "joch.dev"
RUNTIME = "runtime.joch.dev"
OPS = "ops.joch.dev"
MODELS = "model.joch.dev"
V1ALPHA1 = "v1alpha1"

RuntimeType = Literal["local", "kubernetes", "argo", "temporal", "custom"]


Problem = tuple[tuple[str | int, ...], str, str]
"""A rule the schema cannot state, broken: (path below ``spec``, message, Kubernetes cause reason)."""


# --- shared pieces -------------------------------------------------------------------------------

class CheckedSpec(Model):
    """A spec with rules beyond its schema; admission runs ``problems`` after the schema passed."""

    def problems(self) -> Iterator[Problem]:
        return iter(())


ENV_NAME = re.compile(r"^[\x20-\x3c\x3e-\x7e]+$")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def env_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an agent's environment variable (Kubernetes' rule: printable ASCII
    without ``=``; the operating system cannot carry a name with ``=`` in it), or None."""
    if ENV_NAME.match(name):
        return None
    return (f'invalid environment variable name "{name}": use printable ASCII characters other than "=" '
            "(e.g. API_TOKEN)")


def path_problem(path: str, where: str) -> str | None:
    """Why ``path`` cannot name a file below ``where`` (relative, and ``..`` may not leave it), or None."""
    normal = posixpath.normpath(path.replace("\\", "/"))
    if "\0" in path or posixpath.isabs(normal) or normal in (".", "..") or normal.startswith("../"):
        return (f'path "{path}" must be relative to the {where} directory and stay inside it (no leading "/", '
                'no ".." that leaves it)')
    return None


class EnvVar(Model):
    name: Str = Field(min_length=1)
    value: Str = ""


class Resources(Model):
    cpu: Str | Number | None = None
    memory: Str | None = None
    ephemeralStorage: Str | None = None


class RuntimeSpec(Model):
    type: RuntimeType = "local"
    config: dict[str, Any] = Field(default_factory=dict)


class Workload(Model):
    image: Str | None = None
    resources: Resources | None = None
    volumes: list[dict[str, Any]] = Field(default_factory=list)


# --- joch.dev/Agent ------------------------------------------------------------------------------

class AgentDefaults(Model):
    timeoutSeconds: PositiveInt = 3600
    retryLimit: NonNegativeInt = 0
    budgetUsd: Number | None = Field(default=None, ge=0)
    # Values for the provider's declared parameters, between the provider's defaults and the run's
    # spec.parameters (a run overrides them).
    parameters: dict[Str, Str] = Field(default_factory=dict)


NetworkMode = Literal["on", "off", "limited"]
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
                   r"[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::(\d{1,5}))?$")


def host_problem(entry: str) -> str | None:
    """Why ``entry`` is not ``host`` or ``host:port`` (a name, an IPv4 address or a bracketed IPv6
    address; a port from 1 to 65535), or None."""
    match = _HOST.match(entry)
    if match is None or (match.group(1) is not None and not 1 <= int(match.group(1)) <= 65535):
        return (f'"{entry}" is not a host or host:port (e.g. "api.openai.com", "api.openai.com:443", '
                '"127.0.0.1:9999", "[::1]:8080"); no scheme, path or wildcard')
    return None


class AgentNetwork(Model):
    """The agent's network in the sandbox: ``on`` (the host's), ``off`` (none but its own loopback),
    ``limited`` (only the ``allow`` entries, ``host`` or ``host:port``, through a proxy)."""

    mode: NetworkMode = "on"
    allow: list[Str] = Field(default_factory=list)


class AgentSecurity(Model):
    allowedSecrets: list[Str] = Field(default_factory=list)
    allowedServiceAccounts: list[Str] = Field(default_factory=list)
    network: AgentNetwork | None = None  # None: mode on


class AgentSpec(CheckedSpec):
    providerRef: LocalObjectReference
    description: Str | None = None
    modelRoute: Str | None = None
    systemPrompt: Str | None = None
    tools: list[LocalObjectReference] = Field(default_factory=list)
    mcpServers: list[LocalObjectReference] = Field(default_factory=list)
    memoryRef: LocalObjectReference | None = None
    policies: list[LocalObjectReference] = Field(default_factory=list)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    resources: Resources | None = None
    env: list[EnvVar] = Field(default_factory=list)
    defaults: AgentDefaults = Field(default_factory=AgentDefaults)
    security: AgentSecurity = Field(default_factory=AgentSecurity)
    requiresApproval: Bool = False
    # The dispatch Approval of a run of this agent: when it expires unanswered (none: never) and
    # whether the run's creator is barred from deciding it.
    approvalTimeoutSeconds: PositiveInt | None = None
    approvalSeparationOfDuties: Bool | None = None
    maxConcurrentRuns: PositiveInt | None = None
    # What runs of this agent write back to the issue they came from (a TriggerRule's writeBack wins).
    writeBack: WriteBack | None = None

    def problems(self) -> Iterator[Problem]:
        for i, env in enumerate(self.env):
            if (problem := env_name_problem(env.name)) is not None:
                yield (("env", i, "name"), problem, "FieldValueInvalid")
        for name in self.defaults.parameters:
            if (problem := parameter_name_problem(name)) is not None:
                yield (("defaults", "parameters", name), problem, "FieldValueInvalid")
        network = self.security.network or AgentNetwork()
        for i, entry in enumerate(network.allow):
            if (problem := host_problem(entry)) is not None:
                yield (("security", "network", "allow", i), problem, "FieldValueInvalid")
        if network.allow and network.mode != "limited":
            yield (("security", "network", "allow"), f'allow only applies to mode "limited" (mode is '
                   f'"{network.mode}"): set mode: limited, or remove allow', "FieldValueInvalid")


class AgentStatus(ConditionedStatus):
    compiledManifestHash: Str | None = None


# --- joch.dev/AgentProvider ----------------------------------------------------------------------

ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
CHANGES_PATCH = "changes.patch"


class InputFile(Model):
    path: Str = Field(min_length=1)
    content: Str


class OutputArtifact(Model):
    name: Str = Field(min_length=1)
    path: Str = Field(min_length=1)
    optional: Bool = False


class SecretKeyRef(Model):
    name: Str = Field(min_length=1)
    key: Str = Field(min_length=1)


class SecretEnv(Model):
    name: Str = Field(min_length=1)
    secretRef: SecretKeyRef


OUTPUT_FORMATS = ("claude-code", "codex", "aider", "gemini", "opencode")
"""The ``outputFormat`` values: the keys of ``joch.runtime.agentoutput.FORMATS`` (a test keeps them
equal; the api layer may not import the runtime)."""
OutputFormat = Literal["claude-code", "codex", "aider", "gemini", "opencode"]
PARAMETER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def parameter_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a provider parameter (templates read it as ``parameters.<name>``), or None."""
    if PARAMETER_NAME.match(name):
        return None
    return (f'invalid parameter name "{name}": use letters, digits and "_", not starting with a digit '
            "(templates read it as parameters.<name>), e.g. baseUrl")


class ConditionalArgs(Model):
    """An ``argsTemplate`` item included only when ``when`` holds: ``when`` is a Jinja expression
    (no braces) evaluated in the template context; truthy → every element of ``args`` is rendered
    and passed, falsy → none. A parameter that is not set is undefined, which is falsy here
    (``when: parameters.baseUrl``); ``parameters.baseUrl is defined`` says the same explicitly."""

    when: Str = Field(min_length=1)
    args: list[Str] = Field(min_length=1)


def _arg_kind(value: Any) -> str:
    return "conditional[]" if isinstance(value, dict) or isinstance(value, ConditionalArgs) else "str"


ArgTemplate = Annotated[Annotated[Str, Tag("str")] | Annotated[ConditionalArgs, Tag("conditional[]")],
                        Discriminator(_arg_kind)]
"""An ``argsTemplate`` item: a string, or ``{when, args}``. (The tags keep admission's error paths
plain: ``spec.argsTemplate[2]``, ``spec.argsTemplate[3].when``.)"""


class ProviderParameter(Model):
    name: Str = Field(min_length=1)
    default: Str | None = None
    description: Str | None = None


class ConfigFile(Model):
    """A tool configuration file written into the attempt's own HOME before the agent starts;
    ``path`` is relative to HOME, ``path`` and ``content`` are templates."""

    path: Str = Field(min_length=1)
    content: Str
    mode: Annotated[Int, Field(ge=0, le=0o777)] = 0o600


class SuccessPolicy(Model):
    """When an agent that exited 0 has succeeded: see ``joch.runtime.base.SuccessPolicy``."""

    requireChanges: Bool = False
    failurePatterns: list[Str] = Field(default_factory=list)
    requiredArtifacts: list[Str] = Field(default_factory=list)
    agentResult: Bool = True


class PatchPolicy(Model):
    """What ``changes.patch`` leaves out: git pathspec globs (relative to the worktree root), and
    any changed file over ``maxFileBytes`` (listed in ``status.omitted``)."""

    exclude: list[Str] = Field(default_factory=list)
    maxFileBytes: PositiveInt | None = None


class AgentProviderSpec(CheckedSpec):
    binary: Str = Field(min_length=1)
    versionArgs: list[Str] | None = None  # None: ["--version"]; []: do not ask
    parameters: list[ProviderParameter] = Field(default_factory=list)
    argsTemplate: list[ArgTemplate] = Field(default_factory=list)
    envTemplate: dict[Str, Str] = Field(default_factory=dict)
    inputFiles: list[InputFile] = Field(default_factory=list)
    outputArtifacts: list[OutputArtifact] = Field(default_factory=list)
    secretEnv: list[SecretEnv] = Field(default_factory=list)
    configFiles: list[ConfigFile] = Field(default_factory=list)
    outputFormat: OutputFormat | None = None
    resumable: Bool | None = None
    successPolicy: SuccessPolicy | None = None
    patch: PatchPolicy | None = None
    workload: Workload | None = None

    def problems(self) -> Iterator[Problem]:
        yield from self._parameter_problems()
        yield from self._policy_problems()
        for i, config in enumerate(self.configFiles):
            if "{" not in config.path and (problem := path_problem(config.path, "HOME")) is not None:
                yield (("configFiles", i, "path"), problem, "FieldValueInvalid")
        # Artifact names become download file names and URL segments, and the runtime adds its own
        # "changes.patch": a name must be a plain, unique file name that is not that one.
        first: dict[str, int] = {}
        for i, output in enumerate(self.outputArtifacts):
            if not ARTIFACT_NAME.match(output.name) or output.name in (".", ".."):
                yield (("outputArtifacts", i, "name"), f'invalid artifact name "{output.name}": use letters, '
                       "digits, '.', '-' and '_' (it names the downloaded file)", "FieldValueInvalid")
            elif output.name == CHANGES_PATCH:
                yield (("outputArtifacts", i, "name"), f'"{CHANGES_PATCH}" is the name of the workspace diff every '
                       "run collects; give this output another name", "FieldValueInvalid")
            elif output.name in first:
                yield (("outputArtifacts", i, "name"), f'duplicate artifact name "{output.name}" (spec.'
                       f"outputArtifacts[{first[output.name]}] has it already)", "FieldValueDuplicate")
            first.setdefault(output.name, i)
        # Paths are checked here rather than when the run starts: a run must not fail on what
        # admission could have said (the runtime checks them again, without trusting this).
        for i, output in enumerate(self.outputArtifacts):
            if (problem := path_problem(output.path, "outputs")) is not None:
                yield (("outputArtifacts", i, "path"), problem, "FieldValueInvalid")
        for i, item in enumerate(self.inputFiles):
            if (problem := path_problem(item.path, "inputs")) is not None:
                yield (("inputFiles", i, "path"), problem, "FieldValueInvalid")
        for name in self.envTemplate:
            if (problem := env_name_problem(name)) is not None:
                yield (("envTemplate", name), problem, "FieldValueInvalid")
        for i, env in enumerate(self.secretEnv):
            if (problem := env_name_problem(env.name)) is not None:
                yield (("secretEnv", i, "name"), problem, "FieldValueInvalid")

    def _parameter_problems(self) -> Iterator[Problem]:
        first: dict[str, int] = {}
        for i, parameter in enumerate(self.parameters):
            if (problem := parameter_name_problem(parameter.name)) is not None:
                yield (("parameters", i, "name"), problem, "FieldValueInvalid")
            elif parameter.name in first:
                yield (("parameters", i, "name"), f'duplicate parameter "{parameter.name}" (spec.parameters'
                       f"[{first[parameter.name]}] declares it already)", "FieldValueDuplicate")
            first.setdefault(parameter.name, i)

    def _policy_problems(self) -> Iterator[Problem]:
        success = self.successPolicy or SuccessPolicy()
        for i, pattern in enumerate(success.failurePatterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                yield (("successPolicy", "failurePatterns", i), f'"{pattern}" is not a Python regular expression: '
                       f"{exc}", "FieldValueInvalid")
        outputs = [o.name for o in self.outputArtifacts]
        for i, name in enumerate(success.requiredArtifacts):
            if name not in outputs:
                known = f"the outputs are {', '.join(outputs)}" if outputs else "there are no outputArtifacts"
                yield (("successPolicy", "requiredArtifacts", i), f'"{name}" names no output artifact ({known})',
                       "FieldValueInvalid")
        for i, pattern in enumerate((self.patch or PatchPolicy()).exclude):
            normal = posixpath.normpath(pattern)
            if not pattern or "\0" in pattern or pattern.startswith(":"):
                yield (("patch", "exclude", i), f'"{pattern}" is not a path glob (git pathspec magic such as '
                       '":(exclude)" is added for you; write the glob only, e.g. ".aider*")', "FieldValueInvalid")
            elif posixpath.isabs(normal) or normal == ".." or normal.startswith("../"):
                # git refuses a pathspec outside the worktree, and every run would get no changes.patch
                yield (("patch", "exclude", i), f'"{pattern}" leaves the worktree: a glob is relative to the '
                       'repository\'s root, e.g. ".aider*" or "**/node_modules/**"', "FieldValueInvalid")


class AgentProviderStatus(ConditionedStatus):
    pass


# --- joch.dev/ImplementationSpec -----------------------------------------------------------------

class ImplementationSource(Model):
    provider: Literal["github", "linear", "manual", "custom"]
    externalId: Str | None = None
    url: Str | None = None


class ImplementationSpecSpec(Model):
    text: Str = Field(min_length=1)
    summary: Str | None = None
    description: Str | None = None
    acceptanceCriteria: list[Str] = Field(default_factory=list)
    labels: list[Str] = Field(default_factory=list)
    source: ImplementationSource | None = None


class ImplementationSpecStatus(ConditionedStatus):
    syncedAt: Str | None = None
    sourceVersion: Str | None = None


# --- joch.dev/Policy -----------------------------------------------------------------------------

class PolicySelector(Model):
    """Which objects a Policy's rules see (every field that is set must match): ``kinds`` (a kind,
    plural or short name), ``matchLabels`` on the object, ``environments`` (names of Environments
    whose ``spec.namespaces`` include the object's namespace)."""

    matchLabels: dict[Str, Str] = Field(default_factory=dict)
    kinds: list[Str] = Field(default_factory=list)
    environments: list[Str] = Field(default_factory=list)


class PolicyRule(Model):
    name: Str = Field(min_length=1)
    # writeBack: evaluated before each WriteIntent is sent (``object`` is the intent, ``run`` its run).
    phase: Literal["admission", "dispatch", "writeBack"] = "admission"
    expression: Str = Field(min_length=1)
    action: Literal["deny", "requireApproval", "warn"] = "deny"
    message: Str | None = None


class PolicySpec(CheckedSpec):
    """CEL rules (``joch.policy`` compiles and evaluates them; admission compiles every rule when
    the Policy is applied). ``separationOfDuties``: an Approval a dispatch rule of this Policy asks
    for may not be decided by the run's creator."""

    selector: PolicySelector = Field(default_factory=PolicySelector)
    rules: list[PolicyRule] = Field(min_length=1)
    separationOfDuties: Bool = False

    def problems(self) -> Iterator[Problem]:
        first: dict[str, int] = {}
        for i, rule in enumerate(self.rules):
            if rule.action == "requireApproval" and rule.phase == "admission":
                yield (("rules", i, "action"), f'rule "{rule.name}": requireApproval only applies when a run is '
                       "dispatched or writes back (a human approves the run, not a write): set phase: dispatch "
                       "or writeBack, or use action deny or warn at admission", "FieldValueNotSupported")
            if rule.name in first:
                yield (("rules", i, "name"), f'duplicate rule name "{rule.name}" (spec.rules[{first[rule.name]}] '
                       "has it already): rule names must be unique within a Policy", "FieldValueDuplicate")
            first.setdefault(rule.name, i)
        for i, name in enumerate(self.selector.kinds):
            if not _known_kind(name):
                yield (("selector", "kinds", i), _unknown_kind(name), "FieldValueNotSupported")


def _known_kind(name: str) -> bool:
    try:
        REGISTRY.resolve(name)
    except NotFound:
        return False
    return True


def _unknown_kind(name: str) -> str:
    kinds = sorted(info.kind for info in REGISTRY)
    names = sorted({n for info in REGISTRY for n in (info.kind, *info.names())})
    match = difflib.get_close_matches(name, names, n=1)
    hint = f'did you mean "{match[0]}"? ' if match else ""
    return (f'unknown kind "{name}": {hint}the known kinds are {", ".join(kinds)} '
            "(a kind, its plural or a short name)")


class PolicyStatus(ConditionedStatus):
    pass


# --- runtime.joch.dev/AgentRun -------------------------------------------------------------------

_SCP_LIKE = re.compile(r"^[^/]+:")  # git's [user@]host:path: a colon before any slash


def relative_local_path(url: str) -> bool:
    """Whether a repository ``url`` is a local path relative to some working directory: not a URL
    (``scheme://``), not git's scp-like ``host:path``, not absolute. Such a path means something
    only where it was written (a manifest's directory, the user's shell), never on the server;
    the CLI and ``joch server --apply`` resolve it there, and the API refuses it."""
    return "://" not in url and not url.startswith("/") and not _SCP_LIKE.match(url)


def _absolute_repository(url: str) -> str:
    if relative_local_path(url):
        raise ValueError(
            f'"{url}" is a relative path, which the server cannot resolve (its working directory is not '
            "yours): give an absolute path or a URL (https://, ssh://, file://); joch apply -f resolves "
            "a relative path against the manifest's directory, joch run --repo against yours")
    return url


LOCAL_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "runtime.joch.dev/AgentRun": (("spec", "execution", "coordinates", "git", "url"),),
}
"""Per kind (``KindInfo.key``), the fields holding a local path that clients resolve against the
directory of the manifest they read it from (see ``relative_local_path``)."""


def _repository_url(url: str) -> str:
    # What the runner would refuse only once the run started (runtime.workspace.url_problem): a
    # "transport::address" picks a git remote helper (ext:: runs a command), "-x" reads as an option.
    if url.startswith("-"):
        raise ValueError(f'repository URL "{url}" cannot start with "-"')
    if "::" in url.split("/", 1)[0]:
        raise ValueError(f'repository URL "{url}" names a git transport helper; use https://, ssh://, git://, '
                         "host:path or a path")
    return url


class GitCoordinates(Model):
    url: Annotated[Str, Field(min_length=1), AfterValidator(_repository_url), AfterValidator(_absolute_repository)]
    ref: Str = "HEAD"
    path: Str = "."


class Coordinates(Model):
    git: GitCoordinates | None = None
    workspace: dict[str, Any] = Field(default_factory=dict)


class Execution(Model):
    coordinates: Coordinates


class InlineImplementation(Model):
    inline: ImplementationSpecSpec


class AgentRunSpec(Model):
    agentRef: LocalObjectReference
    implementationRef: LocalObjectReference | None = None
    implementation: InlineImplementation | None = None
    execution: Execution | None = None
    workload: Workload | None = None
    runtime: RuntimeSpec | None = None
    runtimeOverrides: dict[str, Any] = Field(default_factory=dict)
    parameters: dict[Str, Str] = Field(default_factory=dict)
    secrets: list[Str] = Field(default_factory=list)
    input: dict[str, Any] = Field(default_factory=dict)
    timeoutSeconds: PositiveInt | None = None
    # What the run may spend (USD): reserved against every Budget that applies before it is queued,
    # and its own cap while it runs (the Agent's defaults.budgetUsd when left out).
    budgetUsd: Number | None = Field(default=None, ge=0)
    idempotencyKey: Str | None = Field(default=None, min_length=1, max_length=253)
    ttlSecondsAfterFinished: NonNegativeInt | None = None
    # Desired state, like Argo's ``spec.shutdown``: ``joch cancel run`` sets it and the run
    # controller stops the agent and ends the run Cancelled.
    cancel: Bool = False

    @model_validator(mode="after")
    def _one_implementation(self) -> AgentRunSpec:
        if (self.implementationRef is None) == (self.implementation is None):
            raise ValueError(
                "set exactly one of spec.implementationRef or spec.implementation.inline"
            )
        return self


class Artifact(Model):
    name: Str
    path: Str
    sha256: Str | None = None
    size: Int | None = None
    url: Str | None = None


class TokenUsage(Model):
    inputTokens: NonNegativeInt = 0
    outputTokens: NonNegativeInt = 0
    cachedTokens: NonNegativeInt = 0


class RunInvocation(Model):
    """What ran (the runner's record): argv as rendered (secrets redacted, long arguments shortened),
    the environment's variable names (never values), the executable's path, version and sha256."""

    argv: list[Str] = Field(default_factory=list)
    env: list[Str] = Field(default_factory=list)
    executable: Str | None = None
    version: Str | None = None
    sha256: Str | None = None


class RunSandbox(Model):
    """How the agent was confined: ``mode`` bwrap or none (``reason`` why none), the uid it ran as,
    its network."""

    mode: Str
    user: Int | None = None
    network: Str | None = None
    reason: Str | None = None


class RunSession(Model):
    """The agent CLI's own session id; ``attempt`` the attempt that recorded it; ``resumedFromAttempt``
    the attempt whose session (and worktree) the current attempt continued (absent: it started over)."""

    id: Str | None = None
    attempt: Int | None = None
    resumedFromAttempt: Int | None = None


class OmittedFile(Model):
    """A changed file ``changes.patch`` left out (over the provider's ``patch.maxFileBytes``)."""

    path: Str
    size: Int | None = None
    message: Str | None = None


RunPhase = Literal["Pending", "AwaitingApproval", "Queued", "Running", "Succeeded", "Failed", "Cancelled"]


class AgentRunStatus(ConditionedStatus):
    phase: RunPhase | None = None
    reason: Str | None = None
    message: Str | None = None
    runtimeRef: dict[str, Any] | None = None
    startedAt: Str | None = None
    finishedAt: Str | None = None
    attempt: Int | None = None
    specHash: Str | None = None
    artifacts: list[Artifact] = Field(default_factory=list)
    costUsd: Number | None = None
    usage: TokenUsage | None = None
    exitCode: Int | None = None
    compiledManifestHash: Str | None = None
    invocation: RunInvocation | None = None
    baseCommit: Str | None = None
    sandbox: RunSandbox | None = None
    session: RunSession | None = None
    omitted: list[OmittedFile] = Field(default_factory=list)
    writeBack: RunWriteBack | None = None


# --- runtime.joch.dev/Approval -------------------------------------------------------------------

CREATED_BY = "joch.dev/created-by"
"""The annotation naming the user who created an AgentRun. Admission writes it from the
authenticated user of the request (never from the body) and keeps it unchanged on every update."""

ApprovalAction = Literal["dispatch", "tool-use", "secret-access", "write-back", "release", "escalation"]


def _rfc3339(value: str) -> str:
    try:
        parsed = parse_time(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None or "T" not in value.upper():
        raise ValueError(f'"{value}" is not an RFC 3339 time: write it as "2026-01-31T17:00:00Z" '
                         "(a date, 'T', a time, and 'Z' or an offset such as +02:00)")
    return value


class ApprovalPolicyRef(Model):
    """The Policy rule that asked for the approval (absent: the Agent's ``requiresApproval``)."""

    namespace: Str | None = None
    name: Str = Field(min_length=1)
    rule: Str | None = None


class ApprovalSpec(Model):
    runRef: LocalObjectReference
    action: ApprovalAction = "dispatch"
    # Set by admission from the authenticated user (by the run controller: the run's creator);
    # whatever a request body says here is replaced.
    requestedBy: Str | None = None
    reason: Str | None = None
    expiresAt: Annotated[Str, AfterValidator(_rfc3339)] | None = None
    separationOfDuties: Bool = False
    policyRef: ApprovalPolicyRef | None = None


class ApprovalStatus(ConditionedStatus):
    phase: Literal["Pending", "Approved", "Denied", "Expired"] | None = None
    decidedBy: Str | None = None
    decidedAt: Str | None = None
    reason: Str | None = None


# --- model.joch.dev/Model ------------------------------------------------------------------------

class ModelPricing(Model):
    """USD per million tokens. Cached input tokens cost ``cachedInputPerMillionUsd`` (the input price
    when left out); see ``joch.controllers.metering`` for how a usage event is priced."""

    inputPerMillionUsd: Number = Field(ge=0)
    outputPerMillionUsd: Number = Field(ge=0)
    cachedInputPerMillionUsd: Number | None = Field(default=None, ge=0)


class ModelSpec(Model):
    provider: Str = Field(min_length=1)
    modelId: Str = Field(min_length=1)  # the id the provider reports in its usage (e.g. gpt-5-codex)
    pricing: ModelPricing


class ModelStatus(ConditionedStatus):
    pass


# --- ops.joch.dev/Budget -------------------------------------------------------------------------

TEAM_LABEL = "joch.dev/team"
"""The Agent label a Budget's ``scope.team`` matches."""


class BudgetScope(Model):
    """Which runs a Budget counts: all three narrow (left out: any). ``namespace`` only means
    something in a Budget in ``joch-system``; elsewhere a Budget counts its own namespace's runs."""

    namespace: Str | None = Field(default=None, min_length=1)
    agent: Str | None = Field(default=None, min_length=1)
    team: Str | None = Field(default=None, min_length=1)


class BudgetSpec(Model):
    scope: BudgetScope = Field(default_factory=BudgetScope)
    period: Literal["day", "week", "month", "total"]
    limitUsd: Number = Field(ge=0)
    onExceed: Literal["deny", "hold"] = "deny"


class BudgetStatus(ConditionedStatus):
    spendUsd: Number | None = None        # metered in the current period
    reservedUsd: Number | None = None     # what runs in flight may still spend of their reservations
    remainingUsd: Number | None = None    # limitUsd - spendUsd, never below 0
    runsCounted: NonNegativeInt | None = None
    periodStart: Str | None = None
    periodEnd: Str | None = None


# --- ops.joch.dev/Secret and Event ---------------------------------------------------------------

def _base64(value: str) -> str:
    try:
        # Go's decoder, which Kubernetes uses, skips line breaks: wrapped base64 is fine
        base64.b64decode(value.replace("\n", "").replace("\r", ""), validate=True)
    except binascii.Error:
        # The value is not echoed: it is a secret, and errors are answered, logged and audited.
        raise ValueError(
            f'must be base64-encoded (e.g. "aGVsbG8=" for "hello"), got {len(value)} characters that are not; put '
            "plain text under spec.stringData instead, which is encoded into data for you"
        ) from None
    return value


Base64 = Annotated[Str, AfterValidator(_base64)]


class SecretSpec(CheckedSpec):
    type: Str = "Opaque"
    data: dict[Str, Base64] = Field(default_factory=dict)
    stringData: dict[Str, Str] | None = None
    _string_keys: set[str] = PrivateAttr(default_factory=set)

    @model_validator(mode="after")
    def _encode_string_data(self) -> SecretSpec:
        if self.stringData:
            encoded = {k: base64.b64encode(v.encode()).decode() for k, v in self.stringData.items()}
            self._string_keys = set(self.stringData)
            self.data = {**self.data, **encoded}
        self.stringData = None  # write-only, as in Kubernetes: never stored, never shown
        return self

    def problems(self) -> Iterator[Problem]:
        # Kubernetes' rule for Secret keys; it also makes every key a valid environment variable name
        # (AgentRun.spec.secrets passes each key of a Secret to the agent as one).
        for key in self.data:
            if not SECRET_KEY.match(key):
                where = "stringData" if key in self._string_keys else "data"
                yield ((where, key), f'invalid key "{key}": a Secret key must consist of letters, digits, "-", '
                       '"_" or "." (at most 253 characters)', "FieldValueInvalid")


class SecretKeyStatus(Model):
    name: Str
    size: NonNegativeInt


class SecretStatus(Model):
    # The store's account of the sealed values (``joch.api.secrets``): what reads show of spec.data.
    keys: list[SecretKeyStatus] = Field(default_factory=list)


class ObjectReference(Model):
    apiVersion: Str | None = None
    kind: Str
    name: Str
    namespace: Str | None = None
    uid: Str | None = None


class EventSource(Model):
    component: Str | None = None
    host: Str | None = None


class EventSpec(Model):
    involvedObject: ObjectReference
    reason: Str
    message: Str = ""
    type: Literal["Normal", "Warning"] = "Normal"
    count: PositiveInt = 1
    firstTimestamp: Str | None = None
    lastTimestamp: Str | None = None
    source: EventSource | None = None


class EventStatus(Model):
    pass


# --- ops.joch.dev/Team and Environment -----------------------------------------------------------

class TeamSpec(Model):
    """Who belongs to a team (user names, groups) and the namespaces it works in."""

    description: Str | None = None
    members: list[Str] = Field(default_factory=list)
    groups: list[Str] = Field(default_factory=list)
    namespaces: list[Str] = Field(default_factory=list)


class EnvironmentSpec(CheckedSpec):
    """A stage (``dev``, ``staging``, ``prod``: the Environment's name) and the namespaces in it.
    Policies select by it (``selector.environments``) and see it as ``namespace.environment``."""

    description: Str | None = None
    namespaces: list[Str] = Field(default_factory=list)

    def problems(self) -> Iterator[Problem]:
        first: dict[str, int] = {}
        for i, name in enumerate(self.namespaces):
            if name in first:
                yield (("namespaces", i), f'duplicate namespace "{name}" (spec.namespaces[{first[name]}] has it '
                       "already)", "FieldValueDuplicate")
            first.setdefault(name, i)


class TeamStatus(Model):
    pass


class EnvironmentStatus(Model):
    pass


# --- ops.joch.dev/Lease --------------------------------------------------------------------------

class LeaseSpec(Model):
    """coordination.k8s.io/v1 Lease: who holds leadership and until when (times are RFC 3339 with
    microseconds, Kubernetes' MicroTime)."""

    holderIdentity: Str | None = None
    leaseDurationSeconds: PositiveInt = 15
    acquireTime: Str | None = None
    renewTime: Str | None = None
    leaseTransitions: NonNegativeInt = 0


class LeaseStatus(Model):
    pass


# --- ops.joch.dev/RoleBinding -------------------------------------------------------------------

BUILTIN_ROLES = ("viewer", "editor", "approver", "admin")
"""The roles a RoleBinding can name; what each allows is ``joch.server.auth.rbac``'s."""
CLUSTER_NAMESPACE = "joch-system"
"""RoleBindings in this namespace grant their role in every namespace (and cluster-wide)."""


class RoleRef(Model):
    """rbac.authorization.k8s.io's roleRef, naming one of Joch's built-in roles."""

    apiGroup: Literal["ops.joch.dev"] = "ops.joch.dev"
    kind: Literal["Role"] = "Role"
    name: Literal["viewer", "editor", "approver", "admin"]


class Subject(Model):
    """A user or group as authentication names it (a token file's user, an OIDC claim, with its
    prefix), or a ``Team`` (ops.joch.dev): its ``members`` and ``groups`` at the time of the request."""

    kind: Literal["User", "Group", "Team"]
    name: Str = Field(min_length=1)
    apiGroup: Literal["rbac.authorization.k8s.io", "ops.joch.dev"] | None = None


class RoleBindingSpec(CheckedSpec):
    """rbac.authorization.k8s.io/v1 RoleBinding's ``roleRef`` and ``subjects``, top-level keys of the
    object as in Kubernetes (the kind is registered with ``body="top"``; it has no ``spec`` or ``status``)."""

    roleRef: RoleRef
    subjects: list[Subject] = Field(default_factory=list)

    def problems(self) -> Iterator[Problem]:
        seen: set[tuple[str, str]] = set()
        for i, subject in enumerate(self.subjects):
            key = (subject.kind, subject.name)
            if key in seen:
                yield (("subjects", i), f'{subject.kind} "{subject.name}" is listed twice', "FieldValueDuplicate")
            seen.add(key)


# --- registrations -------------------------------------------------------------------------------

READY = Column("READY", "status.conditions[type=Ready].status")
AGE = Column("AGE", "metadata.creationTimestamp")

AGENT = register(KindInfo(
    group=JOCH, version=V1ALPHA1, kind="Agent", plural="agents", short_names=("ag",),
    spec_model=AgentSpec, status_model=AgentStatus,
    references=(Reference("spec.providerRef.name", "AgentProvider", missing="warn"),
                # Runs of it work without the Model; only the usage it would price is not recorded.
                Reference("spec.modelRoute", "Model", missing="warn",
                          until="usage its runs report without a model of their own is not recorded")),
    columns=(Column("PROVIDER", "spec.providerRef.name"), READY,
             Column("RUNTIME", "spec.runtime.type", wide=True), AGE),
))
AGENT_PROVIDER = register(KindInfo(
    group=JOCH, version=V1ALPHA1, kind="AgentProvider", plural="agentproviders", short_names=("ap",),
    spec_model=AgentProviderSpec, status_model=AgentProviderStatus,
    columns=(Column("BINARY", "spec.binary"), AGE),
))
IMPLEMENTATION_SPEC = register(KindInfo(
    group=JOCH, version=V1ALPHA1, kind="ImplementationSpec", plural="implementationspecs",
    short_names=("impl", "is"), spec_model=ImplementationSpecSpec, status_model=ImplementationSpecStatus,
    columns=(Column("SUMMARY", "spec.summary"), Column("SOURCE", "spec.source.provider"), AGE),
))
POLICY = register(KindInfo(
    group=JOCH, version=V1ALPHA1, kind="Policy", plural="policies", short_names=("pol",),
    spec_model=PolicySpec, status_model=PolicyStatus,
    columns=(Column("RULES", "spec.rules[*].name"), AGE),
))
AGENT_RUN = register(KindInfo(
    group=RUNTIME, version=V1ALPHA1, kind="AgentRun", plural="agentruns", short_names=("run", "runs", "ar"),
    spec_model=AgentRunSpec, status_model=AgentRunStatus,
    references=(
        Reference("spec.agentRef.name", "Agent"),
        Reference("spec.implementationRef.name", "ImplementationSpec"),
    ),
    columns=(Column("AGENT", "spec.agentRef.name"), Column("PHASE", "status.phase"),
             Column("COST", "status.costUsd", type="number", description="USD metered so far (status.costUsd)."),
             Column("REASON", "status.reason", wide=True), Column("ATTEMPT", "status.attempt", wide=True),
             AGE),
    initial_phase="Pending",
))
APPROVAL = register(KindInfo(
    group=RUNTIME, version=V1ALPHA1, kind="Approval", plural="approvals", short_names=("apr",),
    spec_model=ApprovalSpec, status_model=ApprovalStatus,
    references=(Reference("spec.runRef.name", "AgentRun"),),
    columns=(Column("RUN", "spec.runRef.name"), Column("ACTION", "spec.action"),
             Column("PHASE", "status.phase"), Column("REQUESTED-BY", "spec.requestedBy"),
             Column("DECIDED-BY", "status.decidedBy"), Column("EXPIRES", "spec.expiresAt", wide=True),
             Column("REASON", "spec.reason", wide=True), AGE),
))
MODEL = register(KindInfo(
    group=MODELS, version=V1ALPHA1, kind="Model", plural="models", short_names=("mdl",),
    spec_model=ModelSpec, status_model=ModelStatus,
    columns=(Column("PROVIDER", "spec.provider"), Column("MODEL ID", "spec.modelId"),
             Column("INPUT USD/M", "spec.pricing.inputPerMillionUsd", type="number"),
             Column("OUTPUT USD/M", "spec.pricing.outputPerMillionUsd", type="number"),
             Column("CACHED USD/M", "spec.pricing.cachedInputPerMillionUsd", type="number", wide=True), AGE),
))
BUDGET = register(KindInfo(
    group=OPS, version=V1ALPHA1, kind="Budget", plural="budgets", short_names=("bud",),
    spec_model=BudgetSpec, status_model=BudgetStatus,
    columns=(Column("SPEND", "status.spendUsd", type="number"), Column("LIMIT", "spec.limitUsd", type="number"),
             Column("REMAINING", "status.remainingUsd", type="number"), Column("PERIOD", "spec.period"),
             Column("ON EXCEED", "spec.onExceed", wide=True),
             Column("RUNS", "status.runsCounted", wide=True, type="integer"), AGE),
))
SECRET = register(KindInfo(
    group=OPS, version=V1ALPHA1, kind="Secret", plural="secrets", short_names=("sec",),
    spec_model=SecretSpec, status_model=SecretStatus, spec_required=False, categories=(),
    history="latest", sensitive=("spec.data",),
    columns=(Column("TYPE", "spec.type"), Column("KEYS", "status.keys[*].name"), AGE),
))
EVENT = register(KindInfo(
    group=OPS, version=V1ALPHA1, kind="Event", plural="events", short_names=("ev",),
    spec_model=EventSpec, status_model=EventStatus, categories=(),
    columns=(Column("TYPE", "spec.type"), Column("REASON", "spec.reason"),
             Column("OBJECT", "spec.involvedObject.name"), Column("MESSAGE", "spec.message"), AGE),
))
TEAM = register(KindInfo(
    group=OPS, version=V1ALPHA1, kind="Team", plural="teams", short_names=("tm",), namespaced=False,
    spec_model=TeamSpec, status_model=TeamStatus,
    columns=(Column("MEMBERS", "spec.members[*]"), Column("NAMESPACES", "spec.namespaces[*]"), AGE),
))
ENVIRONMENT = register(KindInfo(
    group=OPS, version=V1ALPHA1, kind="Environment", plural="environments", short_names=("env",),
    namespaced=False, spec_model=EnvironmentSpec, status_model=EnvironmentStatus,
    columns=(Column("NAMESPACES", "spec.namespaces[*]"), AGE),
))
LEASE = register(KindInfo(
    group=OPS, version=V1ALPHA1, kind="Lease", plural="leases",
    spec_model=LeaseSpec, status_model=LeaseStatus, categories=(),
    history="latest",  # renewed every few seconds: renewals must not crowd user objects out of the log
    columns=(Column("HOLDER", "spec.holderIdentity"), Column("RENEWED", "spec.renewTime"), AGE),
))

ROLE_BINDING = register(KindInfo(
    group=OPS, version=V1ALPHA1, kind="RoleBinding", plural="rolebindings", short_names=("rb",),
    spec_model=RoleBindingSpec, status_model=None, body="top", categories=(),
    columns=(Column("ROLE", "roleRef.name"), Column("SUBJECTS", "subjects[*].name"), AGE),
))

__all__ = ["AGENT", "AGENT_PROVIDER", "AGENT_RUN", "APPROVAL", "BUDGET", "CREATED_BY", "ENVIRONMENT", "EVENT",
           "IMPLEMENTATION_SPEC", "LEASE", "MODEL", "POLICY", "ROLE_BINDING", "SECRET", "TEAM", "TEAM_LABEL",
           "CheckedSpec", "Condition", "Problem"]
