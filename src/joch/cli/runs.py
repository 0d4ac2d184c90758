"""The run commands: ``run``, ``logs``, ``cancel``, ``approve``/``deny``, ``artifacts`` and ``render run``.

They address two fixed kinds, AgentRun and Approval, so their paths are built from the constants
below instead of asking the server's discovery first (one round trip less per command). The kind a
user types is matched against those kinds' names as kubectl would (``run``, ``runs``, ``ar``,
``agentrun.runtime.joch.dev``, ``apr``; ``TYPE/NAME`` too).

Decisions:

* ``run --repo`` takes a URL (``scheme://…`` or scp-style ``[user@]host:path``, which is git's rule:
  a colon before the first slash) or a local directory, which is sent as an absolute path: the run
  executes in the server's runtime, whose working directory is not the user's. What git reads as a
  remote is never turned into a local path, even where a directory of that name exists here.
* ``run --follow`` ends with the run, and its exit code says how the run ended: 0 ``Succeeded``,
  ``FAILED_EXIT_CODE`` (8) ``Failed``, ``CANCELLED_EXIT_CODE`` (9) ``Cancelled`` — codes above the
  error table's, so a script can tell "the run failed" from "joch could not ask" (1-7).
* ``cancel`` on a finished run says so and writes nothing (exit 0): the outcome the user wanted,
  a run that is not running, already holds.
* ``approve run NAME`` decides the run's one pending Approval (``spec.runRef.name``); with several
  pending, it names them and decides none.
* ``render run -f run.yaml`` sends the one AgentRun in the file to the server's render route
  (``joch.server.runs``), which starts nothing, and prints the RenderedRun it answers: the argv,
  working directory, environment (values only of the provider's and Agent's plain entries; variables
  that come from Secrets by name), config and input files with their content. A relative
  repository path in the file is resolved against the file's directory, as ``apply -f`` does.
* ``artifacts --download DIR`` writes each file under a temporary name, checks its sha256 against
  the run's record, and only then renames it to the artifact's name: a file that does not match is
  removed and reported, and never left where a later step could read it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import typer

from joch.api import errors
from joch.api.runs import RunRequest, agent_run
from joch.cli import printers, reading
from joch.cli.client import Client
from joch.cli.resolve import ResourceType

Obj = dict[str, Any]
Reporter = Callable[[errors.JochError], None]
T = TypeVar("T")

RUNS = ResourceType(group="runtime.joch.dev", version="v1alpha1", kind="AgentRun", plural="agentruns",
                    singular="agentrun", namespaced=True, short_names=("run", "runs", "ar"))
APPROVALS = ResourceType(group="runtime.joch.dev", version="v1alpha1", kind="Approval", plural="approvals",
                         singular="approval", namespaced=True, short_names=("apr",))
RUN_WORDS = frozenset([*RUNS.aliases(), "execution", "executions"])
MERGE_PATCH = "application/merge-patch+json"
FINISHED = ("Succeeded", "Failed", "Cancelled")
FAILED_EXIT_CODE = 8
CANCELLED_EXIT_CODE = 9
EXIT_CODES = {"Succeeded": 0, "Failed": FAILED_EXIT_CODE, "Cancelled": CANCELLED_EXIT_CODE}
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_SCP = re.compile(r"^(?:[^/@:\s]+@)?[^/:\s]{2,}:")  # git's scp-like syntax; one letter is a Windows drive


@dataclass(frozen=True)
class NewRun:
    """What ``joch run`` was asked for, before it becomes an AgentRun."""

    agent: str
    repo: str
    spec: str | None = None
    text: str | None = None
    ref: str | None = None
    path: str | None = None
    name: str | None = None
    timeout: int | None = None
    idempotency_key: str | None = None
    params: list[str] = field(default_factory=list)


def run_object(new: NewRun) -> Obj:
    """The AgentRun ``joch run`` creates; usage mistakes are ``BadRequest`` (exit code 2)."""
    if (new.spec is None) == (new.text is None):
        raise errors.BadRequest("give exactly one of --spec NAME (an ImplementationSpec) or --text TEXT")
    text = None
    if new.text is not None:
        text = sys.stdin.read() if new.text == "-" else new.text
        if not text or not text.strip():
            raise errors.BadRequest("--text is empty: say what the agent should do (or --text - to read stdin)")
    obj = agent_run(RunRequest(
        agent=new.agent, repo_url=repo_url(new.repo), spec=new.spec, text=text, ref=new.ref, path=new.path,
        name=new.name, timeout_seconds=new.timeout, idempotency_key=new.idempotency_key,
        parameters=parameters(new.params)))
    _check_utf8(obj, "")
    return obj


def _check_utf8(value: object, path: str) -> None:
    """Text that is not UTF-8 (a Latin-1 file on stdin, bytes in an argument) arrives as lone
    surrogates; it cannot be sent as JSON, so say which input it was instead of failing later."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_utf8(k, path)
            _check_utf8(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            shown = value.encode("utf-8", "backslashreplace").decode()[:60]
            flag = f"--param {path.split('.', 2)[2]}" if path.startswith("spec.parameters.") else _FLAG.get(path, path)
            raise errors.BadRequest(f'{flag} is not valid UTF-8 text ("{shown}"): convert it '
                                    "first, e.g. iconv -f latin1 -t utf-8") from None


_FLAG = {"spec.implementation.inline.text": "--text", "spec.execution.coordinates.git.url": "--repo",
         "spec.execution.coordinates.git.ref": "--ref", "spec.execution.coordinates.git.path": "--path",
         "metadata.name": "--name", "spec.idempotencyKey": "--idempotency-key"}


def repo_url(repo: str) -> str:
    """A URL as given; a local directory as an absolute path (the runtime has another cwd)."""
    if _URL.match(repo) or _SCP.match(repo):
        return repo
    path = Path(repo).expanduser()
    try:
        found = path.is_dir()
    except (OSError, ValueError):
        found = False
    if not found:
        raise errors.BadRequest(f'--repo "{repo}" is neither a URL nor a directory: give a git URL '
                                "(https://host/org/repo.git, git@host:org/repo.git) or a local checkout")
    return str(path.resolve())


def parameters(given: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise errors.BadRequest(f'--param must be KEY=VALUE (got "{item}")')
        out[key.strip()] = value
    return out


def render_path(namespace: str) -> str:
    return f"/v1/namespaces/{namespace}/agentruns/render"


def render(client: Client, obj: Obj, namespace: str) -> Obj:
    """The server's rendering of the AgentRun ``obj`` (nothing is created or started)."""
    rendered = client.request("POST", render_path(namespace), json_body=obj)
    if not isinstance(rendered, dict):
        raise client.not_joch(f"POST {render_path(namespace)} answered JSON that is not an object")
    return rendered


def create(client: Client, obj: Obj, namespace: str) -> Obj:
    created = client.request("POST", RUNS.path(namespace=namespace), json_body=obj)
    if not isinstance(created, dict):
        raise client.not_joch(f"POST {RUNS.path(namespace=namespace)} answered JSON that is not an object")
    typer.echo(f"{printers.object_name(RUNS, created)} created")
    return created


# --- naming: KIND NAME..., TYPE/NAME... ------------------------------------------------------------

def named(args: list[str], *, verb: str, kinds: tuple[ResourceType, ...]) -> tuple[ResourceType, list[str]]:
    """The one kind (of ``kinds``) and the names ``KIND NAME...`` or ``TYPE/NAME...`` give."""
    wanted = reading.targets(args, verb=verb)
    found: dict[ResourceType, list[str]] = {}
    for word, names in wanted:
        rt = _kind(word, verb=verb, kinds=kinds)
        found.setdefault(rt, []).extend(names)
    if len(found) > 1:
        kinds_given = " and ".join(r.plural for r in found)
        raise errors.BadRequest(f"joch {verb} takes names of one kind at a time, not {kinds_given}")
    rt, names = next(iter(found.items()))
    if not names:
        raise errors.BadRequest(f"you must specify the name of the {rt.singular} to {verb}: "
                                f"joch {verb} {rt.short_names[0] if rt.short_names else rt.singular} NAME")
    return rt, names


def _kind(word: str, *, verb: str, kinds: tuple[ResourceType, ...]) -> ResourceType:
    lower = word.lower()
    for rt in kinds:
        if lower in (RUN_WORDS if rt == RUNS else frozenset(rt.aliases())):
            return rt
    words = [rt.singular if rt != RUNS else "run" for rt in kinds]
    raise errors.BadRequest(f'joch {verb} works on {" or ".join(words)} objects, not "{word}": '
                            f"joch {verb} {'|'.join(words)} NAME")


def log_target(args: list[str]) -> str:
    """``NAME``, ``run NAME`` or ``run/NAME``: the run whose log ``joch logs`` prints."""
    if len(args) == 1 and "/" not in args[0]:
        return args[0]
    _, names = named(args, verb="logs", kinds=(RUNS,))
    if len(names) > 1:
        raise errors.BadRequest(f"joch logs prints one run's log at a time, not {len(names)}")
    return names[0]


def each(items: Iterable[T], act: Callable[[T], None], *, report: Reporter) -> errors.JochError | None:
    """``act`` on every item, reporting each failure and going on, as ``delete`` does; the first."""
    first: errors.JochError | None = None
    for item in items:
        try:
            act(item)
        except errors.ServiceUnavailable:
            raise
        except errors.JochError as exc:
            report(exc)
            first = first or exc
    return first


# --- logs, cancel ----------------------------------------------------------------------------------

def log_path(namespace: str, name: str) -> str:
    return RUNS.path(namespace=namespace, name=name) + "/log"


def logs(client: Client, namespace: str, name: str, *, follow: bool, attempt: int | None,
         tail: int | None = None, limit_bytes: int | None = None) -> None:
    """Print the log as the server cuts it: ``tail`` and ``limit_bytes`` are its ``tailLines`` and
    ``limitBytes`` (kubectl's ``--tail`` and ``--limit-bytes``), so only what is printed is sent."""
    params = {"follow": "true" if follow else "false"}
    if attempt is not None:
        params["attempt"] = str(attempt)
    if tail is not None:
        params["tailLines"] = str(tail)
    if limit_bytes is not None:
        params["limitBytes"] = str(limit_bytes)
    for chunk in client.stream_bytes(log_path(namespace, name), params):
        typer.echo(chunk, nl=False)


def cancel(client: Client, namespace: str, name: str) -> None:
    path = RUNS.path(namespace=namespace, name=name)
    run = client.get_object(path)
    phase = phase_of(run)
    if phase in FINISHED:
        typer.echo(f"{RUNS.qualified_kind}/{name} already finished ({phase}); nothing to cancel")
        return
    client.request("PATCH", path, content=json.dumps({"spec": {"cancel": True}}), content_type=MERGE_PATCH)
    typer.echo(f"{RUNS.qualified_kind}/{name} cancel requested")


def phase_of(run: Obj) -> str:
    return str((run.get("status") or {}).get("phase") or "Pending")


# --- approvals -------------------------------------------------------------------------------------

def decide(client: Client, namespace: str, name: str, *, approve: bool, reason: str | None) -> None:
    body: Obj = {"decision": "approve" if approve else "deny"}
    if reason:
        body["reason"] = reason
    client.request("POST", f"/v1/namespaces/{namespace}/approvals/{name}/decide", json_body=body)
    typer.echo(f"{APPROVALS.qualified_kind}/{name} {'approved' if approve else 'denied'}")


def pending_approval(client: Client, namespace: str, run: str) -> str:
    """The name of the run's one pending Approval."""
    listing = client.get_object(APPROVALS.path(namespace=namespace))
    pending = sorted(
        str(a["metadata"]["name"]) for a in listing.get("items") or []
        if ((a.get("spec") or {}).get("runRef") or {}).get("name") == run
        and (a.get("status") or {}).get("phase") in (None, "Pending")
    )
    if len(pending) == 1:
        return pending[0]
    if pending:
        raise errors.Conflict(f'run "{run}" has {len(pending)} pending approvals ({", ".join(pending)}): decide '
                              f"one by name, e.g. joch approve approval {pending[0]}")
    found = client.get_object(RUNS.path(namespace=namespace, name=run))  # a 404 names a missing run
    raise errors.NotFound(f'run "{run}" has no pending approval (phase {phase_of(found)})',
                          kind=APPROVALS.plural, name=run)


# --- artifacts -------------------------------------------------------------------------------------

def artifact_list(client: Client, namespace: str, name: str) -> list[Obj]:
    body = client.get_object(RUNS.path(namespace=namespace, name=name) + "/artifacts")
    return [a for a in body.get("items") or [] if isinstance(a, dict)]


def artifact_rows(artifacts: list[Obj]) -> list[str]:
    headers = ["NAME", "SIZE", "SHA256", "PATH"]
    rows = [[printers.text(a.get(k)) for k in ("name", "size", "sha256", "path")] for a in artifacts]
    return printers.render_table(headers, rows)


def print_artifacts(client: Client, namespace: str, name: str) -> None:
    artifacts = artifact_list(client, namespace, name)
    if not artifacts:
        typer.echo(f'No artifacts for run "{name}" in {namespace} namespace.', err=True)
        return
    for line in artifact_rows(artifacts):
        typer.echo(line)


def download(
    client: Client, namespace: str, name: str, directory: Path, *, report: Reporter
) -> errors.JochError | None:
    artifacts = artifact_list(client, namespace, name)
    if not artifacts:
        typer.echo(f'No artifacts for run "{name}" in {namespace} namespace.', err=True)
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.BadRequest(f'--download "{directory}": cannot create the directory ({exc.strerror})') from None
    base = RUNS.path(namespace=namespace, name=name) + "/artifacts/"
    return each(artifacts, lambda artifact: _download_one(client, base, directory, artifact), report=report)


def _download_one(client: Client, base: str, directory: Path, artifact: Obj) -> None:
    name = str(artifact.get("name"))
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise errors.BadRequest(f'artifact "{name}": the name is not a plain file name, so it is not written')
    # An artifact named "summary" at outputs/summary.md is saved as summary.md: the name says what
    # it is, the path's suffix what opens it.
    suffix = PurePosixPath(str(artifact.get("path") or "")).suffix
    file_name = name if PurePosixPath(name).suffix or not suffix.replace(".", "").isalnum() else name + suffix
    target = directory / file_name
    partial = directory / f".{file_name}.part"
    digest = hashlib.sha256()
    size = 0
    try:
        with partial.open("wb") as out:
            for chunk in client.stream_bytes(base + name):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise errors.BadRequest(f'artifact "{name}": cannot write {partial} ({exc.strerror})') from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    expected = artifact.get("sha256")
    if expected and digest.hexdigest() != expected:
        partial.unlink(missing_ok=True)
        raise errors.Internal(f'artifact "{name}": the downloaded bytes have sha256 {digest.hexdigest()}, the run '
                              f"recorded {expected}; the file was removed (download it again)")
    os.replace(partial, target)
    checked = "sha256 verified" if expected else "no sha256 recorded to verify"
    typer.echo(f"{target} ({size} bytes, {checked})")

