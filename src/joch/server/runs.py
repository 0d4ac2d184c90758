"""What a run needs over HTTP besides its object: its log, its artifacts, approval decisions, and the
compiled manifest of an agent.

Routes (``RUN`` is ``/apis/runtime.joch.dev/v1alpha1/namespaces/{namespace}/agentruns/{name}``)::

    GET  RUN/log?follow=&attempt=&tailLines=&limitBytes=
                                             text/plain, streamed; also /v1/namespaces/{ns}/executions/{name}/log
    GET  RUN/artifacts                       {"kind": "ArtifactList", "items": status.artifacts}
    GET  RUN/artifacts/{artifact}            the bytes (attachment; Digest and X-Content-SHA256 headers)
    POST /v1/namespaces/{ns}/approvals/{name}/decide   {"decision": "approve"|"deny", "reason"}
    GET  /v1/namespaces/{ns}/agents/{name}/manifest    the CompiledAgentManifest
    POST /v1/namespaces/{ns}/agentruns/render          a RenderedRun: what an AgentRun body would execute

Logs and artifacts come from the runtime the app was built with (``create_app(runtime=...)``, kept
on ``app.state.runtime``), addressed by the run's ``status.runtimeRef``. A server without a runtime
answers those two with a 503 naming the cause; everything else works without one.

Decisions:

* **Following a run that has not started waits before answering.** ``follow=true`` watches the run
  (the store's watch, from the revision just read) until it has a ``runtimeRef``, then streams. A
  run that ends before it ever started (an invalid spec, a denied approval, cancelled while queued)
  has no log: that is a 400 naming the phase and reason (at once if it had ended when asked), and a
  run deleted meanwhile is a 404, both as Status bodies, which is why the wait comes before the
  response starts rather than inside it. While waiting, the handler checks every second whether the
  client went away. Without ``follow``, a run with no ``runtimeRef`` is a 400 naming its phase.
* **A log stream reads the runtime in a thread of its own,** not the shared threadpool: a follower
  of a quiet agent blocks in ``Runtime.logs`` until the next bytes, and forty such followers would
  otherwise take every thread the synchronous routes run on. When the client goes away, that
  thread is abandoned; it ends when the runtime's iterator next returns, which is within
  ``LOG_IDLE_SECONDS`` even while the agent is quiet (the iterator yields ``b""`` then), and the
  iterator is then closed by garbage collection.
* **A follower takes a watch slot** (``joch.server.limits``) for as long as it stays, waiting
  included: past ``--max-watches`` open watches and followed logs, ``follow=true`` is a 429 with
  ``Retry-After``, as a watch is. Reading a log without ``follow`` takes none.
* ``tailLines=N`` and ``limitBytes=N`` cut the log as Kubernetes' PodLogOptions do
  (``joch.runtime.logtail``): the last N lines (read to the current end here, so the client is sent
  only those; with ``follow``, what the agent writes afterwards follows them, from the exact byte
  where the tail ended), and at most N bytes in all (the stream ends there, a follower included).
* ``attempt=N`` reads an earlier attempt's log. The contract has no call for "the reference of
  attempt N", so it is derived from the latest one when that says which attempt it is: an
  ``attempt`` field, or an ``id`` of the form ``<run uid>/<attempt>`` (the local runtime's, whose
  other fields only describe the live runner). A runtime whose references say neither serves the
  latest attempt only (400 otherwise).
* A run whose ``runtimeRef`` names another runtime type than the server's is a 400 saying so.
* **Artifacts are served from the runtime, listed from the status.** The list is
  ``status.artifacts`` as the run controller recorded it; a download asks the runtime by name
  (so ``changes.patch`` is served even if a controller did not list it), and the runtime's own
  record supplies the digest headers. The file name in ``Content-Disposition`` is the artifact's
  name, which is unique within a run.
* **A decision is written once, by whoever is authenticated.** ``decide`` reads the Approval and
  writes its status in one store transaction, together with the audit record of the decision
  (verb ``approve`` or ``deny``, kind ``Approval``), and retries the whole transaction when the
  Approval was written in between. ``decidedBy`` is the authenticated user of the request
  (``joch.api.identity.current_user``; ``system:anonymous`` under ``--auth none``), never the
  body's: a body ``decidedBy`` naming anyone else is a 422 ``Invalid`` (cause ``decidedBy``,
  ``FieldValueForbidden``), one naming the caller is accepted as redundant. An approval that is no
  longer ``Pending`` (decided, or expired) or is past ``spec.expiresAt`` is a 409 ``Conflict``
  naming who decided it and when, or when it expired. With ``spec.separationOfDuties`` the run's
  creator (its ``joch.dev/created-by`` annotation) and the Approval's ``requestedBy`` get a 403
  ``Forbidden`` naming the rule (audited as a ``denied`` decision, outside the rolled-back
  transaction) — under ``--auth none`` everyone is ``system:anonymous``, so such an Approval can
  only be decided once authentication is on. Who may decide at all is RBAC's
  (the ``approver`` role), checked before the handler runs. A decision other than
  ``approve``/``deny``, or a field of the wrong type, is a 422 ``Invalid`` with a cause per field.
* **An agent that does not compile is a 422 ``Invalid``** whose causes are the compiler's problems
  (``reason`` is the compiler's reason, e.g. ``ProviderNotFound``): the agent exists (a missing one
  is a 404) but its manifest cannot be built from what the store holds now. A compiled manifest is
  answered with its content hash as the ``ETag``.
* **Rendering a run starts nothing** (``joch render run -f run.yaml``). The body is an AgentRun as
  ``create`` takes it; it is admitted (every schema problem a 422 at its path) but never stored, its
  agent compiled, and its provider's templates rendered as attempt 1 would render them: argv, the
  working directory, the environment (values of the provider's ``envTemplate`` and the Agent's
  ``env``, which hold no secrets; only the *names* of variables that come from Secrets), config
  files and input files with their rendered content, outputs, the effective parameters and the
  provider's policies. Workspace paths are the runtime's for a run whose uid is ``dry-run`` (or
  ``<workspace>``-style placeholders on a server without a runtime). A template that fails is a 422
  whose cause names it (``AgentProvider/codex spec.argsTemplate[3].when``), an undeclared parameter
  one at ``spec.parameters.NAME``. It takes the right to create AgentRuns
  (``joch.server.auth.requests``): it shows what such a user could run anyway.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, Query
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from joch.admission.validation import AdmissionOptions, admit, validate_status
from joch.api import errors, kinds
from joch.api.audit import AuditEntry
from joch.api.errors import Cause
from joch.api.identity import ANONYMOUS, UserInfo, current_user
from joch.api.meta import now
from joch.api.secrets import key_names as secret_keys
from joch.compiler import manifest as compiler
from joch.compiler import render as rendering
from joch.controllers import approvals
from joch.controllers.invocations import git_source
from joch.runtime import logtail
from joch.runtime.base import RunId, Runtime, Workspace, is_own_ref
from joch.runtime.workspace import WorkspaceError, subpath
from joch.server import limits, resources, wire
from joch.server import watch as watching
from joch.server.options import ServerOptions
from joch.server.resources import ContentType
from joch.server.schemas import UNAVAILABLE, KindSchemas, error_responses
from joch.store.base import Obj, Store, WatchOptions, Writer

logger = logging.getLogger("joch.server")

RUNS = f"/apis/{kinds.AGENT_RUN.group}/{kinds.AGENT_RUN.version}/namespaces/{{namespace}}/{kinds.AGENT_RUN.plural}"
FINISHED = frozenset({"Succeeded", "Failed", "Cancelled"})
DECISIONS = {"approve": "Approved", "deny": "Denied"}
DECISION_FIELDS = frozenset({"decision", "reason", "decidedBy", "apiVersion", "kind"})
DECIDE_ATTEMPTS = 5
DISCONNECT_CHECK_SECONDS = 1.0
CHUNK_BYTES = 64 * 1024
TEXT = "text/plain; charset=utf-8"
OCTETS = "application/octet-stream"
TAGS: list[str | Enum] = ["runs"]

Follow = Annotated[bool, Query(alias="follow", description="stream until the run ends; wait for it to start")]
Attempt = Annotated[int | None, Query(alias="attempt", ge=1, description="an earlier attempt (default: the latest)")]
TailLines = Annotated[int | None, Query(alias="tailLines", ge=0, description=(
    "only the last N lines of the log (then, with follow, what follows); as Kubernetes' PodLogOptions"))]
LimitBytes = Annotated[int | None, Query(alias="limitBytes", ge=1, description=(
    "end the log after N bytes; as Kubernetes' PodLogOptions"))]


@dataclass(frozen=True)
class LogCut:
    """``tailLines`` and ``limitBytes`` of a log request (None: not given)."""

    tail_lines: int | None = None
    limit_bytes: int | None = None


def phase_of(run: Obj) -> str:
    return str((run.get("status") or {}).get("phase") or "Pending")


def runtime_ref(run: Obj) -> dict[str, Any] | None:
    """The run's runtime reference once its process was started; a ``pending`` reference (the
    controller recorded the intent to start and has not heard back from the runtime) is not one yet."""
    ref = (run.get("status") or {}).get("runtimeRef")
    if not isinstance(ref, dict) or not ref or ref.get("pending"):
        return None
    if not is_own_ref(ref, str(run["metadata"].get("uid") or "")):
        # Status is written by API clients too: a reference to another run's attempt would serve
        # that run's log and artifacts.
        name = run["metadata"]["name"]
        raise errors.BadRequest(f'run "{name}": its status.runtimeRef is malformed for this run: id '
                                f'"{ref.get("id")}" is not "<its uid>/<attempt>"', kind=kinds.AGENT_RUN.plural,
                                name=name)
    return ref


class RunRoutes:
    """The handlers; ``state`` is the app's, so the runtime is looked up when a request needs it."""

    def __init__(self, store: Store, state: State, admission: AdmissionOptions | None = None) -> None:
        self.store = store
        self.state = state
        self.admission = admission or AdmissionOptions()

    def runtime(self, run: Obj, ref: dict[str, Any] | None) -> Runtime:
        """The runtime that holds ``ref`` (any runtime while the run has none yet)."""
        runtime: Runtime | None = getattr(self.state, "runtime", None)
        if runtime is None:
            raise errors.ServiceUnavailable(
                "this server was started without a runtime, so it cannot read run logs or artifacts; "
                "ask the server that runs the controllers (`joch server`)"
            )
        kind = (ref or {}).get("type")
        chosen = runtime.for_type(kind) if kind else runtime
        if chosen is None:
            name = run["metadata"]["name"]
            raise errors.BadRequest(f'run "{name}" ran on the {kind} runtime, and this server reads the '
                                    f"{runtime.type} runtime", kind=kinds.AGENT_RUN.plural, name=name)
        return chosen

    # --- logs ---------------------------------------------------------------------------------------

    async def log(self, request: Request, namespace: str, name: str, follow: bool, attempt: int | None,
                  cut: LogCut = LogCut()) -> Response:
        if not follow:
            chunks = await self._log_chunks(request, namespace, name, False, attempt, cut)
            return StreamingResponse(_in_own_thread(chunks), media_type=TEXT)
        # A follower holds a socket, a reader thread and (while it waits for the start) a store
        # watch for as long as the run lasts: it takes one of the watch slots (429 past the cap).
        slots: limits.WatchSlots = self.state.watch_slots
        release = slots.acquire()
        try:
            chunks = await self._log_chunks(request, namespace, name, True, attempt, cut)
        except BaseException:
            release()
            raise
        return watching.streaming(_in_own_thread(chunks), release, media_type=TEXT)

    async def _log_chunks(
        self, request: Request, namespace: str, name: str, follow: bool, attempt: int | None, cut: LogCut
    ) -> Iterator[bytes]:
        run = await run_in_threadpool(self.store.get, kinds.AGENT_RUN, namespace, name)
        ref = runtime_ref(run)
        if ref is None and phase_of(run) in FINISHED:
            raise errors.BadRequest(_never_started(run), kind=kinds.AGENT_RUN.plural, name=name)
        if ref is None and not follow:
            raise errors.BadRequest(
                f'run "{name}" has not started (phase {phase_of(run)}); use --follow to wait',
                kind=kinds.AGENT_RUN.plural, name=name,
            )
        runtime = self.runtime(run, ref)  # before any waiting: a server without one says so at once
        if ref is None:
            run = await self._started(request, run)
            ref = runtime_ref(run) or {}
            runtime = self.runtime(run, ref)
        try:
            target = _attempt_ref(run, ref, attempt)
            await run_in_threadpool(runtime.status, target)  # a reference it cannot read fails here, as a 400
            if cut.tail_lines is None:
                chunks = await run_in_threadpool(runtime.logs, target, follow=follow)
            else:
                chunks = _tailed(runtime, target, cut.tail_lines, follow=follow)
            return chunks if cut.limit_bytes is None else logtail.limited(chunks, cut.limit_bytes)
        except ValueError as exc:  # a status.runtimeRef this runtime cannot read (written by hand?)
            raise errors.BadRequest(f'run "{name}": {exc}', kind=kinds.AGENT_RUN.plural, name=name) from None

    async def _started(self, request: Request, run: Obj) -> Obj:
        """The run once it has a ``runtimeRef``; a Status error if it ends or vanishes first."""
        m = run["metadata"]
        options = WatchOptions(namespace=m["namespace"], field_selector=f"metadata.name={m['name']}",
                               resource_version=m["resourceVersion"])
        watch = await run_in_threadpool(self.store.watch, kinds.AGENT_RUN, options)
        async with aclosing(watching.follow(watch, timeout=None, idle=DISCONNECT_CHECK_SECONDS)) as events:
            async for event in events:
                if event is None:
                    if await request.is_disconnected():
                        raise ClientDisconnect()
                    continue
                if event.type == "ERROR":
                    raise errors.from_status(event.object)
                if event.type == "DELETED":
                    raise errors.NotFound(f'run "{m["name"]}" was deleted before it started',
                                          kind=kinds.AGENT_RUN.plural, name=m["name"])
                if event.type == "BOOKMARK":
                    continue
                run = event.object
                if runtime_ref(run) is not None:
                    return run
                if phase_of(run) in FINISHED:
                    raise errors.BadRequest(_never_started(run), kind=kinds.AGENT_RUN.plural, name=m["name"])
        raise errors.ServiceUnavailable("the server is shutting down; follow the log again once it is back")

    # --- artifacts ----------------------------------------------------------------------------------

    def artifacts(self, namespace: str, name: str) -> Response:
        run = self.store.get(kinds.AGENT_RUN, namespace, name)
        items = (run.get("status") or {}).get("artifacts") or []
        return wire.json_response({"kind": "ArtifactList", "apiVersion": kinds.AGENT_RUN.api_version,
                                   "metadata": {}, "items": items})

    def artifact(self, namespace: str, name: str, artifact: str) -> Response:
        run = self.store.get(kinds.AGENT_RUN, namespace, name)
        ref = runtime_ref(run)
        if ref is None:
            raise errors.NotFound(f'run "{name}" has no artifact "{artifact}": it has not started '
                                  f"(phase {phase_of(run)})", kind="artifacts", name=artifact)
        try:
            record, stream = self.runtime(run, ref).open_artifact(ref, artifact)
        except KeyError:
            listed = [str(a.get("name")) for a in (run.get("status") or {}).get("artifacts") or []]
            if artifact in listed:  # the status names it, the runtime has no file: say that, not "it has it"
                has = "the runtime holds no file for it (its files were removed?)"
            else:
                has = f"its artifacts are {', '.join(listed)}" if listed else "it has none"
            raise errors.NotFound(f'run "{name}" has no artifact "{artifact}"; {has}',
                                  kind="artifacts", name=artifact) from None
        except ValueError as exc:  # a status.runtimeRef this runtime cannot read (written by hand?)
            raise errors.BadRequest(f'run "{name}": {exc}', kind=kinds.AGENT_RUN.plural, name=name) from None
        headers = {"Content-Disposition": content_disposition(artifact),
                   "X-Content-SHA256": record.sha256, "Digest": f"sha-256={_b64_digest(record.sha256)}"}
        return StreamingResponse(_read_chunks(stream), media_type=OCTETS, headers=headers,
                                 background=BackgroundTask(stream.close))

    # --- approvals ----------------------------------------------------------------------------------

    def decide(self, namespace: str, name: str, body: bytes, content_type: str | None) -> Response:
        user = current_user() or ANONYMOUS
        decision, reason = _decision(name, wire.decode_object(body, content_type, allow_yaml=False), user)
        attempt = 0
        while True:
            attempt += 1
            try:
                with self.store.transaction() as w:
                    current = w.get(kinds.APPROVAL, namespace, name)
                    status = _decided(w, current, decision, reason, user)
                    try:
                        out = w.update_status(kinds.APPROVAL, {**current, "status": status})
                    except errors.Conflict as exc:  # written in between (a controller, or another decision)
                        raise _Retry() from exc
                    spec = current.get("spec") or {}
                    run = (spec.get("runRef") or {}).get("name")
                    w.audit(AuditEntry(
                        verb=decision, kind=kinds.APPROVAL.kind, namespace=namespace, name=name, decision="allowed",
                        reason=f'{status["phase"].lower()} {spec.get("action") or "dispatch"} of run "{run}"'
                               + (f": {reason}" if reason else "")))
                return wire.json_response(out)
            except errors.Forbidden as exc:
                # A refused decision is audited too, in a transaction of its own (the one above rolled back).
                self.store.audit(AuditEntry(verb=decision, kind=kinds.APPROVAL.kind, namespace=namespace, name=name,
                                            decision="denied", reason=exc.message))
                raise
            except _Retry:
                if attempt >= DECIDE_ATTEMPTS:
                    raise errors.Conflict(f'approval "{name}" kept changing while it was being decided; try again',
                                          kind=kinds.APPROVAL.plural, name=name) from None

    # --- compiled manifests -------------------------------------------------------------------------

    def manifest(self, namespace: str, name: str) -> Response:
        agent = self.store.get(kinds.AGENT, namespace, name)
        compiled = compiler.compile_agent(compiler.store_reader(self.store), agent)
        if compiled.problems or compiled.manifest is None:
            causes = [Cause("", message, reason) for reason, message in compiled.problems]
            listing = "[" + ", ".join(c.message for c in causes) + "]" if causes else "the compiler produced nothing"
            raise errors.Invalid(f'agent "{name}" cannot be compiled: {listing}', kind=kinds.AGENT.plural,
                                 name=name, causes=causes)
        response = wire.json_response(compiled.manifest)
        response.headers["ETag"] = f'"{compiled.hash}"'
        return response


    # --- rendering a run without running it -----------------------------------------------------------

    def render(self, namespace: str, body: bytes, content_type: str | None) -> Response:
        run = self._admitted_run(namespace, wire.decode_object(body, content_type))
        name = run["metadata"]["name"]
        spec = run["spec"]
        agent_name = spec["agentRef"]["name"]
        agent = self.store.get(kinds.AGENT, namespace, agent_name)
        compiled = compiler.compile_agent(compiler.store_reader(self.store), agent)
        if compiled.problems or compiled.manifest is None:
            causes = [Cause("spec.agentRef.name", message, reason) for reason, message in compiled.problems]
            raise errors.Invalid(f'agent "{agent_name}" cannot be compiled: '
                                 + "[" + ", ".join(c.message for c in causes) + "]",
                                 kind=kinds.AGENT_RUN.plural, name=name, causes=causes)
        manifest = compiled.manifest
        inline = (spec.get("implementation") or {}).get("inline")
        implementation = inline if inline is not None else self.store.get(
            kinds.IMPLEMENTATION_SPEC, namespace, spec["implementationRef"]["name"])["spec"]
        workspace = self._workspace(run)
        try:
            context = rendering.build_context(manifest, run=run, attempt=1, implementation=implementation,
                                              workspace=workspace.context())
            invocation = rendering.render_invocation(manifest, context)
        except (rendering.TemplateError, rendering.ParameterError) as exc:
            reason = exc.reason
            raise errors.Invalid(f"the run cannot be rendered: {exc}", kind=kinds.AGENT_RUN.plural, name=name,
                                 causes=[Cause(exc.path, exc.message, reason)]) from None
        return wire.json_response(self._rendered(run, manifest, compiled.hash, workspace, invocation))

    def _admitted_run(self, namespace: str, obj: dict[str, Any]) -> Obj:
        """The body as admission would store it (nothing is stored): a name is made up when it has
        none, and an ``idempotencyKey`` is left out (another run may hold it; this one never exists)."""
        meta = dict(obj.get("metadata") or {}) if isinstance(obj.get("metadata"), dict) else {}
        if meta.get("namespace") not in (None, "", namespace):
            raise errors.BadRequest(f'the body\'s metadata.namespace "{meta["namespace"]}" is not the namespace of the '
                                    f'request, "{namespace}"')
        meta["namespace"] = namespace
        if not meta.get("name"):
            meta["name"] = f"{meta.pop('generateName', None) or 'render-'}dry-run"
        spec = dict(obj["spec"]) if isinstance(obj.get("spec"), dict) else obj.get("spec")
        if isinstance(spec, dict):
            spec.pop("idempotencyKey", None)
        if obj.get("kind") not in (None, kinds.AGENT_RUN.kind):
            raise errors.BadRequest(f'render takes an AgentRun, not a {obj.get("kind")}')
        body = {"apiVersion": kinds.AGENT_RUN.api_version, "kind": kinds.AGENT_RUN.kind, **obj, "metadata": meta,
                "spec": spec}
        return admit(self.store, body, old=None, options=self.admission).obj

    def _workspace(self, run: Obj) -> Workspace:
        source = git_source(run)  # as the run controller hands it to the runtime
        runtime: Runtime | None = getattr(self.state, "runtime", None)
        if runtime is None:
            try:  # what a runtime's workspace refuses (the run would fail InvalidPath), placeholders or not
                subpath(Path("/"), source.path if source is not None else ".")
            except WorkspaceError as exc:
                raise errors.Invalid(f"the run cannot be rendered: {exc}", kind=kinds.AGENT_RUN.plural,
                                     name=run["metadata"]["name"], causes=[Cause(
                                         "spec.execution.coordinates.git.path", str(exc), "FieldValueInvalid")]
                                     ) from None
            sub = "" if source is None or source.path in ("", ".") else "/" + source.path
            return Workspace(root="<workspace>", path=f"<workspace>{sub}", inputs="<inputs>", outputs="<outputs>",
                             home="<home>")
        meta = run["metadata"]
        try:
            return runtime.workspace(RunId(meta["namespace"], meta["name"], uid="dry-run", attempt=1), source)
        except ValueError as exc:
            raise errors.Invalid(f"the run cannot be rendered: {exc}", kind=kinds.AGENT_RUN.plural, name=meta["name"],
                                 causes=[Cause("spec.execution.coordinates.git", str(exc), "FieldValueInvalid")]
                                 ) from None

    def _rendered(self, run: Obj, manifest: dict[str, Any], digest: str | None, workspace: Workspace,
                  invocation: rendering.Invocation) -> dict[str, Any]:
        namespace, name = run["metadata"]["namespace"], run["metadata"]["name"]
        secret_env = [{"name": env, "secret": secret, "key": key} for env, secret, key in invocation.secret_env]
        allowed = set((manifest["spec"].get("security") or {}).get("allowedSecrets") or [])
        for i, secret in enumerate(run["spec"].get("secrets") or []):
            # as the run controller would fail the run (InvalidSpec): not allowed, or missing
            if secret not in allowed:
                raise errors.Invalid(f'the run cannot be rendered: Secret "{secret}" is not allowed for its Agent',
                                     kind=kinds.AGENT_RUN.plural, name=name, causes=[Cause(
                                         f"spec.secrets[{i}]", f'Secret "{secret}" is not in the Agent\'s '
                                         "spec.security.allowedSecrets", "SecretNotAllowed")])
            try:
                stored = self.store.get(kinds.SECRET, namespace, secret)
            except errors.NotFound:
                raise errors.Invalid(f'the run cannot be rendered: Secret "{secret}" not found',
                                     kind=kinds.AGENT_RUN.plural, name=name, causes=[Cause(
                                         f"spec.secrets[{i}]", f'Secret "{secret}" not found in namespace '
                                         f'"{namespace}"', "MissingSecret")]) from None
            secret_env += [{"name": key, "secret": secret, "key": key} for key in secret_keys(stored)]
        provider = manifest["spec"]["provider"]
        network = (manifest["spec"].get("security") or {}).get("network") or {"mode": "on"}
        return {
            "apiVersion": kinds.AGENT_RUN.api_version, "kind": "RenderedRun",
            "metadata": {"name": run["metadata"]["name"], "namespace": namespace},
            "agent": run["spec"]["agentRef"]["name"], "provider": provider.get("name"),
            "compiledManifestHash": digest,
            "argv": list(invocation.argv),
            "workingDir": workspace.path,
            "workspace": workspace.context(),
            "env": dict(sorted(invocation.env.items())),
            "secretEnv": sorted(secret_env, key=lambda e: e["name"]),
            "parameters": dict(sorted(invocation.parameters.items())),
            "configFiles": [{"path": path, "absolutePath": f"{workspace.home}/{path}", "mode": f"{mode:04o}",
                             "content": content} for path, content, mode in invocation.config_files],
            "inputFiles": [{"path": path, "absolutePath": f"{workspace.inputs}/{path}", "content": content}
                           for path, content in invocation.input_files],
            "outputs": [{"name": n, "path": p, "optional": o} for n, p, o in invocation.outputs],
            "outputFormat": invocation.output_format,
            "versionArgs": list(invocation.version_args),
            "resumable": invocation.resumable,
            "successPolicy": dict(invocation.success),
            "patch": dict(invocation.patch),
            "network": network,
        }


def _attempt_ref(run: Obj, ref: dict[str, Any], attempt: int | None) -> dict[str, Any]:
    """The reference of ``attempt`` of the run, given the reference of its latest one."""
    current = ref_attempt(run, ref)
    if attempt is None or attempt == current:
        return ref
    name = run["metadata"]["name"]
    latest = max(int((run.get("status") or {}).get("attempt") or 1), current or 1)
    if attempt > latest:
        raise errors.BadRequest(f'run "{name}" has no attempt {attempt}: its latest is attempt {latest}',
                                kind=kinds.AGENT_RUN.plural, name=name)
    if isinstance(ref.get("attempt"), int):
        return {**ref, "attempt": attempt}
    if current is not None:  # an id "<uid>/<attempt>": per-attempt fields (a pid, a directory) do not carry over
        return {"type": ref.get("type"), "id": f"{run['metadata']['uid']}/{attempt}"}
    raise errors.BadRequest(f'run "{name}": its runtime reference does not say which attempt it is, so only the '
                            "latest attempt's log can be read (leave out attempt)",
                            kind=kinds.AGENT_RUN.plural, name=name)


def ref_attempt(run: Obj, ref: dict[str, Any]) -> int | None:
    """The attempt a runtime reference addresses: its ``attempt``, or N in an ``id`` of the form
    ``<run uid>/N`` (the local runtime's); None when it does not say."""
    if isinstance(ref.get("attempt"), int):
        return int(ref["attempt"])
    prefix = f"{run['metadata'].get('uid')}/"
    ident = str(ref.get("id") or "")
    suffix = ident[len(prefix):]
    return int(suffix) if ident.startswith(prefix) and suffix.isdigit() else None


def _never_started(run: Obj) -> str:
    status = run.get("status") or {}
    why = ": ".join(str(v) for v in (status.get("reason"), status.get("message")) if v)
    return (f'run "{run["metadata"]["name"]}" ended {phase_of(run)} before it started'
            + (f" ({why})" if why else "") + "; it has no log")


class _Retry(Exception):
    """The Approval was written between reading and deciding it: read it again."""


def _decided(w: Writer, current: Obj, decision: str, reason: str | None, user: UserInfo) -> dict[str, Any]:
    """The status ``decision`` by ``user`` gives ``current``, or the error that forbids it."""
    name = current["metadata"]["name"]
    status = dict(current.get("status") or {})
    if status.get("phase") not in (None, "Pending"):
        raise errors.Conflict(_already_decided(current), kind=kinds.APPROVAL.plural, name=name)
    expires = approvals.expires_at(current)
    if expires is not None and expires <= dt.datetime.now(dt.UTC):
        raise errors.Conflict(f'approval "{name}" expired at {current["spec"]["expiresAt"]}; it can no longer be '
                              "decided", kind=kinds.APPROVAL.plural, name=name)
    _check_separation(w, current, user)
    status.update(phase=DECISIONS[decision], decidedBy=user.name, decidedAt=now())
    if reason:
        status["reason"] = reason
    else:
        status.pop("reason", None)
    return validate_status(kinds.APPROVAL, {**current, "status": status})


def _check_separation(w: Writer, approval: Obj, user: UserInfo) -> None:
    """``spec.separationOfDuties``: neither the run's creator nor the Approval's requester decides it."""
    spec = approval.get("spec") or {}
    if not spec.get("separationOfDuties"):
        return
    name = approval["metadata"]["name"]
    run_name = str((spec.get("runRef") or {}).get("name") or "")
    try:
        run: Obj | None = w.get(kinds.AGENT_RUN, approval["metadata"].get("namespace"), run_name)
    except errors.NotFound:
        run = None
    creator = approvals.creator_of(run) if run is not None else None
    if user.name == creator:
        role = f'created run "{run_name}"'
    elif user.name == spec.get("requestedBy"):
        role = f'requested approval "{name}"'
    else:
        return
    ref = spec.get("policyRef") or {}
    rule = (f' (Policy "{ref.get("name")}"' + (f' rule "{ref["rule"]}"' if ref.get("rule") else "") + ")"
            if ref.get("name") else "")
    raise errors.Forbidden(
        f'approval "{name}" requires separation of duties (spec.separationOfDuties: true{rule}): user "{user.name}" '
        f"{role} and cannot decide it; another approver must", kind=kinds.APPROVAL.plural, name=name)


def _already_decided(approval: Obj) -> str:
    name = approval["metadata"]["name"]
    status = approval.get("status") or {}
    phase = str(status.get("phase"))
    if phase == "Expired":
        expires = (approval.get("spec") or {}).get("expiresAt")
        return f'approval "{name}" expired' + (f" at {expires}" if expires else "") + "; it can no longer be decided"
    at = f" at {status['decidedAt']}" if status.get("decidedAt") else ""
    by = status.get("decidedBy") or "an unknown user"
    return f'approval "{name}" was already {phase.lower()} by {by}{at}; a decision cannot be changed'


def _decision(name: str, body: dict[str, Any], user: UserInfo) -> tuple[str, str | None]:
    causes: list[Cause] = []
    decision = body.get("decision")
    if decision is None:
        causes.append(Cause("decision", 'Required value: "approve" or "deny"', "FieldValueRequired"))
    elif not isinstance(decision, str) or decision not in DECISIONS:
        causes.append(Cause("decision", f'Unsupported value: {_json(decision)}: supported values: "approve", "deny"',
                            "FieldValueNotSupported"))
    for field, limit in (("reason", 1024), ("decidedBy", 253)):
        value = body.get(field)
        if value is not None and not isinstance(value, str):
            causes.append(Cause(field, f"expected a string, got {_json(value)}", "FieldValueInvalid"))
        elif isinstance(value, str) and len(value) > limit:
            causes.append(Cause(field, f"must be at most {limit} characters, got {len(value)}", "FieldValueTooLong"))
        elif isinstance(value, str) and any(ch in value for ch in "\r\n\t\x00"):
            # it is shown in tables and event messages: a line break would forge a row
            causes.append(Cause(field, "must be a single line of text", "FieldValueInvalid"))
    claimed = body.get("decidedBy")
    if isinstance(claimed, str) and claimed.strip() and claimed.strip() != user.name and not any(
            c.field == "decidedBy" for c in causes):
        # The decider is whoever is authenticated; a body naming someone else is refused, not ignored,
        # so a script that thinks it decides as another user learns that it does not.
        causes.append(Cause("decidedBy", f'Forbidden: the decision is recorded as made by the authenticated user '
                            f'"{user.name}", not "{claimed.strip()}"; leave decidedBy out', "FieldValueForbidden"))
    for field in sorted(set(body) - DECISION_FIELDS):
        causes.append(Cause(field, f'unknown field "{field}"', "FieldValueNotSupported"))
    if causes:
        listing = ", ".join(f"{c.field}: {c.message}" for c in causes)
        raise errors.Invalid(f'invalid decision for approval "{name}": [{listing}]', kind=kinds.APPROVAL.plural,
                             name=name, causes=causes)
    reason = body.get("reason") or None
    return str(decision), reason


def _json(value: Any) -> str:
    return wire.dumps(value).decode()


def content_disposition(filename: str) -> str:
    """``attachment; filename="x"``, or RFC 6266's ``filename*`` for a name that needs escaping."""
    quoted = urllib.parse.quote(filename)
    if quoted == filename:
        return f'attachment; filename="{filename}"'
    return f"attachment; filename*=utf-8''{quoted}"


def _b64_digest(sha256_hex: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(sha256_hex)).decode()
    except ValueError:
        return sha256_hex


def _read_chunks(stream: BinaryIO) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK_BYTES):
        yield chunk


def _next(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


def _tailed(runtime: Runtime, ref: dict[str, Any], count: int, *, follow: bool) -> Iterator[bytes]:
    """The last ``count`` lines of the log as it is now, then (``follow``) everything written after them."""
    lines, size = logtail.last_lines(runtime.logs(ref, follow=False), count)
    if lines:
        yield b"".join(lines)
    if follow:
        yield from runtime.logs(ref, follow=True, offset=size)


async def _in_own_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` read in a thread outside the shared pool (see the module docstring)."""
    limiter = anyio.CapacityLimiter(1)
    while True:
        try:
            chunk = await anyio.to_thread.run_sync(_next, chunks, abandon_on_cancel=True, limiter=limiter)
        except Exception:
            logger.exception("reading a run log failed")
            return  # the status line is sent already: end the body; the cause is in the server log
        if chunk is None:
            return
        if chunk:
            yield chunk


def install(app: FastAPI, store: Store, options: ServerOptions, schemas: KindSchemas) -> None:
    h = RunRoutes(store, app.state, options.admission)
    read_body = wire.body_reader(options.max_body_bytes)
    scope = resources.namespace_scope

    async def log(request: Request, name: str, follow: Follow = False, attempt: Attempt = None,
                  tail_lines: TailLines = None, limit_bytes: LimitBytes = None,
                  namespace: str | None = Depends(scope)) -> Response:
        return await h.log(request, namespace or "", name, follow, attempt, LogCut(tail_lines, limit_bytes))

    def artifacts(name: str, namespace: str | None = Depends(scope)) -> Response:
        return h.artifacts(namespace or "", name)

    def artifact(name: str, artifact: str, namespace: str | None = Depends(scope)) -> Response:
        return h.artifact(namespace or "", name, artifact)

    def decide(name: str, namespace: str | None = Depends(scope), body: bytes = Depends(read_body),
               content_type: ContentType = None) -> Response:
        return h.decide(namespace or "", name, body, content_type)

    def manifest(name: str, namespace: str | None = Depends(scope)) -> Response:
        return h.manifest(namespace or "", name)

    def render(namespace: str | None = Depends(scope), body: bytes = Depends(read_body),
               content_type: ContentType = None) -> Response:
        return h.render(namespace or "", body, content_type)

    log_doc = schemas.responses(200, {"type": "string"}, "the run's log (streamed with follow=true)",
                                media_type=TEXT)
    log_doc.update(error_responses(UNAVAILABLE))
    for path in (f"{RUNS}/{{name}}/log", "/v1/namespaces/{namespace}/executions/{name}/log"):
        app.add_api_route(path, log, methods=["GET"], tags=TAGS, summary="Read or follow a run's log",
                          responses=log_doc, name=f"log:{path}", response_class=Response)
    app.add_api_route(f"{RUNS}/{{name}}/artifacts", artifacts, methods=["GET"], tags=TAGS,
                      summary="List a run's artifacts", responses=schemas.responses(200, None, "an ArtifactList"))
    artifact_doc = schemas.responses(200, None, "the artifact's bytes", media_type=OCTETS)
    artifact_doc.update(error_responses(UNAVAILABLE))
    app.add_api_route(f"{RUNS}/{{name}}/artifacts/{{artifact}}", artifact, methods=["GET"], tags=TAGS,
                      summary="Download a run's artifact", responses=artifact_doc, response_class=Response)
    decision_body = {"requestBody": {"required": True, "content": {wire.JSON: {"schema": {
        "type": "object", "required": ["decision"],
        "properties": {"decision": {"type": "string", "enum": sorted(DECISIONS)}, "reason": {"type": "string"},
                       "decidedBy": {"type": "string", "description": (
                           "optional; if given it must be the authenticated user's name (the server "
                           "records who is authenticated, never a name from the body)")}}}}}}}
    app.add_api_route("/v1/namespaces/{namespace}/approvals/{name}/decide", decide, methods=["POST"], tags=TAGS,
                      summary="Approve or deny an approval (once)", openapi_extra=decision_body,
                      responses=schemas.responses(200, schemas.object(kinds.APPROVAL), "the decided Approval",
                                                  body=True))
    app.add_api_route("/v1/namespaces/{namespace}/agents/{name}/manifest", manifest, methods=["GET"], tags=TAGS,
                      summary="The agent's compiled manifest (422 listing the problems if it does not compile)",
                      responses=schemas.responses(200, None, "a CompiledAgentManifest"))
    app.add_api_route("/v1/namespaces/{namespace}/agentruns/render", render, methods=["POST"], tags=TAGS,
                      summary="Render an AgentRun without running it: argv, env names, config and input files",
                      responses=schemas.responses(200, None, "a RenderedRun", body=True),
                      openapi_extra=resources.request_body(schemas.object(kinds.AGENT_RUN), wire.JSON,
                                                           "application/yaml"))

