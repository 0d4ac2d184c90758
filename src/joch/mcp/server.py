"""The MCP server: Joch's tools, resources and prompts, each a thin layer over the HTTP API.

``create(connect)`` builds an ``MCPServer`` (the official SDK) whose every tool, resource and prompt
asks ``connect`` for the caller's ``Api`` (``joch.mcp.api``) with the headers of the MCP request
(``None`` over stdio): the stdio server answers one fixed caller, ``/mcp`` the bearer token of each
request. Nothing here reads a store or decides anything: the API authorises, admits and audits.

Every tool has an input schema (its annotated parameters), answers structured content (a JSON
object; the SDK adds the same as text) and reports a failure as an MCP tool error (``is_error``)
whose text is the CLI's for the same ``Status`` (``errors.report_lines``: ``error: ...`` and one
line per cause) and whose structured content is the ``Status`` itself.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.context import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp_types import CallToolResult, InputRequiredResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

from joch import __version__
from joch.api import REGISTRY, errors, kinds
from joch.api.registry import KindInfo
from joch.api.runs import RunRequest, agent_run
from joch.mcp.api import Api, Excerpt, segment

Connect = Callable[[Mapping[str, str] | None], Api]
Obj = dict[str, Any]
ToolFn = Callable[..., Awaitable[Obj]]

FINISHED = ("Succeeded", "Failed", "Cancelled")
PATCH = "changes.patch"
GVK = "x-kubernetes-group-version-kind"
MAX_WAIT_SECONDS = 1800
MAX_TEXT_BYTES = 1_000_000
"""The most of a log or patch a tool or resource answers: more would swamp an MCP client (and the
model reading it), and reading a whole 64 MiB log to answer its end would cost this process as much."""
POLL_SECONDS = 0.5
INSTRUCTIONS = (
    "Joch runs AI coding agents as Kubernetes-style resources. Each tool acts as the user whose "
    "credentials this server holds: what they may not do is refused with the server's message. "
    "Kinds: Agent, AgentProvider, ImplementationSpec, AgentRun (run), Approval, Policy, Budget, Model, ..."
)

Namespace = Annotated[str, Field(description="The namespace.")]
Kind = Annotated[str, Field(description="A kind, plural or short name: Agent, agents, ag, runs, approvals, ...")]
Name = Annotated[str, Field(description="The object's name.")]
RunName = Annotated[str, Field(description="The AgentRun's name.")]

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


def tool_error(exc: errors.JochError) -> CallToolResult:
    """The MCP tool error for ``exc``: the CLI's text, and the ``Status`` as structured content."""
    text = "\n".join(errors.report_lines(exc))
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=exc.to_status(),
                          is_error=True)


class _Server(MCPServer):
    """The SDK's server, with arguments that do not fit a tool's schema refused as the API refuses
    a body that does not fit: ``error: invalid arguments ...`` and a line per field, not pydantic's
    report (the argument model's name and a link to pydantic's documentation)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None,
                        ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            causes = [errors.Cause(".".join(str(part) for part in problem["loc"]), problem["msg"])
                      for problem in exc.__cause__.errors(include_url=False)]
            return tool_error(errors.BadRequest(f"invalid arguments to {name}", causes=causes))


def _answering_errors(fn: ToolFn) -> ToolFn:
    """``fn`` with a ``JochError`` turned into ``tool_error`` (the SDK passes a ``CallToolResult`` on)."""

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Obj:
        try:
            return await fn(*args, **kwargs)
        except errors.JochError as exc:
            return tool_error(exc)  # type: ignore[return-value]  # the SDK sends a CallToolResult as is

    return call


@contextmanager
def _root_logging_left_alone() -> Iterator[None]:
    """``MCPServer()`` calls ``logging.basicConfig`` (a rich handler on the root logger at INFO), which
    would change what ``joch server`` logs and how; with a handler present, basicConfig does nothing."""
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        yield
    finally:
        root.removeHandler(placeholder)


def kind_info(kind: str) -> KindInfo:
    return REGISTRY.resolve(kind.strip())


def resource_path(info: KindInfo, namespace: str | None, name: str | None = None) -> str:
    base = f"/apis/{info.group}/{info.version}" if info.group else f"/api/{info.version}"
    if info.namespaced and namespace:
        base += f"/namespaces/{segment(namespace, 'namespace')}"
    base += f"/{info.plural}"
    return f"{base}/{segment(name, 'name')}" if name else base


def run_path(namespace: str, name: str) -> str:
    return resource_path(kinds.AGENT_RUN, namespace, name)


def row(obj: Obj) -> Obj:
    """One line of a listing: enough to choose an object, then ``joch_get_resource`` it."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    out: Obj = {"name": meta.get("name"), "created": meta.get("creationTimestamp")}
    if meta.get("namespace"):
        out["namespace"] = meta["namespace"]
    if meta.get("labels"):
        out["labels"] = meta["labels"]
    for key in ("phase", "reason"):
        if isinstance(status, dict) and status.get(key):
            out[key] = status[key]
    return out


def run_summary(run: Obj) -> Obj:
    meta = run.get("metadata") or {}
    status = run.get("status") or {}
    summary: Obj = {"name": meta.get("name"), "namespace": meta.get("namespace"),
                    "agent": ((run.get("spec") or {}).get("agentRef") or {}).get("name"),
                    "phase": status.get("phase"), "finished": status.get("phase") in FINISHED}
    for key in ("reason", "message", "startTime", "completionTime", "attempt", "cost", "artifacts", "conditions"):
        if status.get(key) not in (None, "", []):
            summary[key] = status[key]
    return summary


def run_object(*, agent: str, repo: str, spec: str | None, text: str | None, ref: str | None, path: str | None,
               name: str | None, timeout_seconds: int | None) -> Obj:
    """The AgentRun ``joch run`` would create for the same choices (``repo`` as given: a URL or a
    path on the server's machine, which is where the run executes)."""
    if (spec is None) == (text is None) or (text is not None and not text.strip()):
        raise errors.BadRequest("give exactly one of spec (an ImplementationSpec's name) or text (what to do)")
    return agent_run(RunRequest(agent=agent, repo_url=repo, spec=spec, text=text, ref=ref, path=path, name=name,
                                timeout_seconds=timeout_seconds))


def tail(end: Excerpt, lines: int) -> Obj:
    """The last ``lines`` lines (0: all) of a log's ``end``; its first line is a partial one when the
    end is not the whole log, and is left out."""
    kept = end.text.splitlines()
    if end.truncated:
        kept = kept[1:]
    shown = kept[-lines:] if lines > 0 else kept
    return {"log": "\n".join(shown), "lines": len(shown), "truncated": end.truncated or len(shown) < len(kept)}


def cut_note(excerpt: Excerpt, what: str, *, last: bool) -> str:
    """``excerpt`` (the ``last`` or first part of ``what``) as a resource's text, saying where it was cut."""
    if not excerpt.truncated:
        return excerpt.text
    note = f"[joch: {what} is larger than {MAX_TEXT_BYTES} bytes; this is its {'last' if last else 'first'} part]"
    return f"{note}\n{excerpt.text}" if last else f"{excerpt.text}\n{note}"


def field_schema(schema: Obj, path: list[str], kind: str) -> Obj:
    """The sub-schema at ``path`` (``spec.providerRef``); a missing field is a NotFound naming it."""
    node = schema
    for i, part in enumerate(path):
        properties = node.get("properties") or (node.get("items") or {}).get("properties") or {}
        if part not in properties:
            where = ".".join([kind, *path[:i]])
            known = ", ".join(sorted(properties)) or "none"
            raise errors.NotFound(f'field "{part}" does not exist in {where} (its fields: {known})', kind=kind)
        node = properties[part]
    return node


def create(connect: Connect) -> MCPServer:
    """The MCP server; ``connect(headers)`` is the caller's ``Api`` (``headers`` None over stdio)."""
    with _root_logging_left_alone():
        server: MCPServer = _Server("joch", version=__version__, instructions=INSTRUCTIONS)

    def api(ctx: Context) -> Api:
        return connect(ctx.headers)

    def tool(name: str, annotations: ToolAnnotations) -> Callable[[ToolFn], ToolFn]:
        def register(fn: ToolFn) -> ToolFn:
            server.add_tool(_answering_errors(fn), name=name, annotations=annotations, structured_output=True)
            return fn

        return register

    # --- resources of any kind ----------------------------------------------------------------------

    @tool("joch_list_resources", READ_ONLY)
    async def list_resources(
        ctx: Context, kind: Kind, namespace: Namespace = "default",
        all_namespaces: Annotated[bool, Field(description="Every namespace (namespace is ignored).")] = False,
        label_selector: Annotated[str | None, Field(description="e.g. app=web,tier!=db")] = None,
        limit: Annotated[int, Field(ge=1, le=1000, description="At most this many objects.")] = 100,
    ) -> Obj:
        """List objects of a kind (name, namespace, phase, labels, creation time), like `joch get KIND`."""
        info = kind_info(kind)
        params = {"limit": str(limit), **({"labelSelector": label_selector} if label_selector else {})}
        listing = await api(ctx).object(resource_path(info, None if all_namespaces else namespace), params)
        items = [row(o) for o in listing.get("items") or [] if isinstance(o, dict)]
        more = bool((listing.get("metadata") or {}).get("continue"))
        return {"kind": f"{info.kind}List", "items": items, "more": more}

    @tool("joch_get_resource", READ_ONLY)
    async def get_resource(ctx: Context, kind: Kind, name: Name, namespace: Namespace = "default") -> Obj:
        """One object, in full (spec and status), like `joch get KIND NAME -o json`."""
        return await api(ctx).object(resource_path(kind_info(kind), namespace, name))

    @tool("joch_apply_resources", WRITES)
    async def apply(
        ctx: Context,
        manifests: Annotated[str, Field(description="One or more YAML or JSON documents (YAML separated by ---).")],
        namespace: Annotated[str | None, Field(description="The namespace of documents that name none.")] = None,
        dry_run: Annotated[bool, Field(description="Admit and validate only; write nothing.")] = False,
    ) -> Obj:
        """Apply manifests atomically, as `joch apply -f`: all documents are admitted (schema, references,
        policies) and written together, or none is. Use dry_run to see what would happen."""
        params = {k: v for k, v in (("dryRun", "All" if dry_run else ""), ("namespace", namespace or "")) if v}
        result = await api(ctx).json("POST", "/v1/resources/apply", params=params, content=manifests,
                                     content_type="application/yaml")
        return result if isinstance(result, dict) else {"result": result}

    @tool("joch_delete_resource", DESTRUCTIVE)
    async def delete_resource(ctx: Context, kind: Kind, name: Name, namespace: Namespace = "default") -> Obj:
        """Delete one object, like `joch delete KIND NAME`."""
        info = kind_info(kind)
        await api(ctx).json("DELETE", resource_path(info, namespace, name))
        return {"deleted": f"{info.kind.lower()}.{info.group}/{name}" if info.group else f"{info.kind.lower()}/{name}"}

    @tool("joch_explain", READ_ONLY)
    async def explain(
        ctx: Context, kind: Kind,
        field: Annotated[str | None, Field(description="A dotted field path, e.g. spec.providerRef")] = None,
    ) -> Obj:
        """The schema of a kind, or of one of its fields, from the server's OpenAPI document (`joch explain`)."""
        info = kind_info(kind)
        where = f"apis/{info.group}/{info.version}" if info.group else f"api/{info.version}"
        document = await api(ctx).object(f"/openapi/v3/{where}")
        wanted = {"group": info.group, "version": info.version, "kind": info.kind}
        for schema in (document.get("components") or {}).get("schemas", {}).values():
            if isinstance(schema, dict) and wanted in schema.get(GVK, []):
                path = [p for p in (field or "").split(".") if p]
                return {"kind": info.kind, "apiVersion": info.api_version, "field": field or "",
                        "schema": field_schema(schema, path, info.kind)}
        raise errors.NotFound(f"the server's OpenAPI document /openapi/v3/{where} has no schema for {info.kind}",
                              kind=info.kind)

    # --- runs --------------------------------------------------------------------------------------

    @tool("joch_create_run", WRITES)
    async def create_run(
        ctx: Context,
        agent: Annotated[str, Field(description="The Agent to run.")],
        repo: Annotated[str, Field(description="The git repository: a URL, or a path on the server's machine.")],
        spec: Annotated[str | None, Field(description="An ImplementationSpec's name (or give text).")] = None,
        text: Annotated[str | None, Field(description="What the agent should do (or give spec).")] = None,
        ref: Annotated[str | None, Field(description="The branch, tag or commit to start from.")] = None,
        path: Annotated[str | None, Field(description="A subdirectory of the repository to work in.")] = None,
        name: Annotated[str | None, Field(description="The run's name (default: AGENT-xxxxx).")] = None,
        timeout_seconds: Annotated[int | None, Field(ge=1, description="Stop the run after this long.")] = None,
        namespace: Namespace = "default",
    ) -> Obj:
        """Start an AgentRun of an Agent on a repository, like `joch run`; then joch_wait_run."""
        obj = run_object(agent=agent, repo=repo, spec=spec, text=text, ref=ref, path=path, name=name,
                         timeout_seconds=timeout_seconds)
        created = await api(ctx).json("POST", resource_path(kinds.AGENT_RUN, namespace), body=obj)
        return run_summary(created if isinstance(created, dict) else {})

    @tool("joch_wait_run", READ_ONLY)
    async def wait_run(
        ctx: Context, name: RunName, namespace: Namespace = "default",
        timeout_seconds: Annotated[int, Field(ge=1, le=MAX_WAIT_SECONDS, description="Give up after this long "
                                              "(the run goes on); finished is false then.")] = 300,
    ) -> Obj:
        """Wait until a run has finished (Succeeded, Failed or Cancelled) or the timeout passes."""
        caller = api(ctx)
        deadline = time.monotonic() + timeout_seconds
        while True:
            summary = run_summary(await caller.object(run_path(namespace, name)))
            if summary["finished"] or time.monotonic() >= deadline:
                return summary
            await anyio.sleep(POLL_SECONDS)

    @tool("joch_run_status", READ_ONLY)
    async def run_status(ctx: Context, name: RunName, namespace: Namespace = "default") -> Obj:
        """A run's phase, reason, times, cost, artifacts and conditions."""
        return run_summary(await api(ctx).object(run_path(namespace, name)))

    @tool("joch_run_log", READ_ONLY)
    async def run_log(
        ctx: Context, name: RunName, namespace: Namespace = "default",
        tail_lines: Annotated[int, Field(ge=0, description="The last N lines; 0: as many as fit in 1 MB.")] = 200,
    ) -> Obj:
        """The end of a run's log (what the agent printed), like `joch logs run NAME --tail N`."""
        return tail(await api(ctx).excerpt(run_path(namespace, name) + "/log", MAX_TEXT_BYTES, last=True), tail_lines)

    @tool("joch_list_artifacts", READ_ONLY)
    async def list_artifacts(ctx: Context, name: RunName, namespace: Namespace = "default") -> Obj:
        """The files a run produced (name, size, sha256), e.g. changes.patch and summary.md."""
        listing = await api(ctx).object(run_path(namespace, name) + "/artifacts")
        return {"items": listing.get("items") or []}

    @tool("joch_read_patch", READ_ONLY)
    async def read_patch(
        ctx: Context, name: RunName, namespace: Namespace = "default",
        max_chars: Annotated[int, Field(ge=1, le=MAX_TEXT_BYTES, description="Return at most this much of the "
                                        "patch (bytes of UTF-8).")] = 200_000,
    ) -> Obj:
        """The run's changes.patch: the diff of what the agent changed in the repository."""
        patch = await api(ctx).excerpt(f"{run_path(namespace, name)}/artifacts/{PATCH}", max_chars)
        return {"name": PATCH, "patch": patch.text, "truncated": patch.truncated}

    # --- approvals, audit, spend -------------------------------------------------------------------

    @tool("joch_list_approvals", READ_ONLY)
    async def list_approvals(
        ctx: Context, namespace: Namespace = "default",
        pending_only: Annotated[bool, Field(description="Only approvals not decided yet.")] = True,
        limit: Annotated[int, Field(ge=1, le=1000, description="At most this many, pending first.")] = 100,
    ) -> Obj:
        """Approvals (which run each holds back, its phase and who decided), pending first."""
        listing = await api(ctx).object(resource_path(kinds.APPROVAL, namespace))
        items = []
        for obj in listing.get("items") or []:
            phase = (obj.get("status") or {}).get("phase") or "Pending"
            if pending_only and phase != "Pending":
                continue
            items.append({**row(obj), "phase": phase, "run": ((obj.get("spec") or {}).get("runRef") or {}).get("name"),
                          **{k: v for k, v in (obj.get("status") or {}).items() if k in ("decidedBy", "reason")}})
        items.sort(key=lambda item: (item["phase"] != "Pending", str(item.get("name"))))
        return {"items": items[:limit], "more": len(items) > limit}

    @tool("joch_decide_approval", WRITES)
    async def decide_approval(
        ctx: Context, name: Annotated[str, Field(description="The Approval's name.")],
        decision: Annotated[Literal["approve", "deny"], Field(description="approve or deny.")],
        reason: Annotated[str | None, Field(description="Why, recorded with the decision.")] = None,
        namespace: Namespace = "default",
    ) -> Obj:
        """Approve or deny a pending Approval (once), as `joch approve|deny approval NAME`. The decision is
        recorded as made by the calling user; approving lets the run it holds back start."""
        body = {"decision": decision, **({"reason": reason} if reason else {})}
        decided = await api(ctx).json("POST", f"/v1/namespaces/{segment(namespace, 'namespace')}/approvals/"
                                      f"{segment(name, 'name')}/decide", body=body)
        return {**row(decided if isinstance(decided, dict) else {}), "decision": decision}

    @tool("joch_audit_query", READ_ONLY)
    async def audit(
        ctx: Context,
        namespace: Annotated[str | None, Field(description="Only this namespace (default: every one).")] = None,
        since: Annotated[str | None, Field(description="A duration back (1h, 7d) or an RFC 3339 time.")] = None,
        until: Annotated[str | None, Field(description="As since.")] = None,
        actor: Annotated[str | None, Field(description="Only what this user did.")] = None,
        verb: Annotated[str | None, Field(description="create, apply, update, delete, approve, deny, ...")] = None,
        kind: Annotated[str | None, Field(description="Only this kind.")] = None,
        name: Annotated[str | None, Field(description="Only objects of this name.")] = None,
        decision: Annotated[Literal["allowed", "denied"] | None, Field(description="allowed or denied.")] = None,
        limit: Annotated[int, Field(ge=1, le=500, description="At most this many rows, newest first.")] = 100,
    ) -> Obj:
        """The audit log, newest first: who did what to which object, allowed or denied (`joch audit`)."""
        given = {"namespace": namespace, "since": since, "until": until, "actor": actor, "verb": verb, "kind": kind,
                 "name": name, "decision": decision, "limit": str(limit)}
        page = await api(ctx).object("/v1/audit", {k: v for k, v in given.items() if v})
        return {"items": page.get("items") or []}

    @tool("joch_cost", READ_ONLY)
    async def cost(
        ctx: Context,
        by: Annotated[Literal["agent", "namespace", "team", "model"], Field(description="How to group.")] = "agent",
        since: Annotated[str | None, Field(description="30m, 24h, 7d or an RFC 3339 time (default: all).")] = None,
        namespace: Annotated[str | None, Field(description="Only this namespace (default: every one).")] = None,
    ) -> Obj:
        """Metered spend (USD and tokens) summed by agent, namespace, team or model (`joch cost`)."""
        path = "/v1/cost" if namespace is None else f"/v1/namespaces/{segment(namespace, 'namespace')}/cost"
        return await api(ctx).object(path, {"by": by, **({"since": since} if since else {})})

    _resources(server, api)
    _prompts(server)
    return server


def _resources(server: MCPServer, api: Callable[[Context], Api]) -> None:
    async def read(ctx: Context, path: Callable[[], str], excerpt: Callable[[Api, str], Awaitable[str]] | None = None,
                   ) -> str:
        """The text at ``path()`` (or the ``excerpt`` of it); a bad name in the URI (the SDK decodes
        ``%2F`` to ``/``) is a ``ResourceError`` in the CLI's words like any refusal, not an
        unexpected exception."""
        try:
            caller = api(ctx)
            return await excerpt(caller, path()) if excerpt else await caller.text(path())
        except errors.JochError as exc:
            raise ResourceError("\n".join(errors.report_lines(exc))) from None

    async def log_end(caller: Api, path: str) -> str:
        return cut_note(await caller.excerpt(path, MAX_TEXT_BYTES, last=True), "the log", last=True)

    async def patch_start(caller: Api, path: str) -> str:
        return cut_note(await caller.excerpt(path, MAX_TEXT_BYTES), "the patch", last=False)

    @server.resource("joch://runs/{namespace}/{name}/log", name="run-log", mime_type="text/plain",
                     description="A run's log: what the agent printed (its last 1 MB).")
    async def run_log(namespace: str, name: str, ctx: Context) -> str:
        return await read(ctx, lambda: run_path(namespace, name) + "/log", log_end)

    @server.resource("joch://runs/{namespace}/{name}/patch", name="run-patch", mime_type="text/x-diff",
                     description="A run's changes.patch: the diff of what the agent changed (its first 1 MB).")
    async def run_patch(namespace: str, name: str, ctx: Context) -> str:
        return await read(ctx, lambda: f"{run_path(namespace, name)}/artifacts/{PATCH}", patch_start)

    @server.resource("joch://agents/{namespace}/{name}/manifest", name="agent-manifest",
                     mime_type="application/json",
                     description="An Agent's compiled manifest: provider, defaults and policies resolved.")
    async def agent_manifest(namespace: str, name: str, ctx: Context) -> str:
        return await read(ctx, lambda: f"/v1/namespaces/{segment(namespace, 'namespace')}/agents/"
                                       f"{segment(name, 'name')}/manifest")


def _prompts(server: MCPServer) -> None:
    @server.prompt(name="joch_triage_run", title="Triage a failed run")
    def triage_run(name: str, namespace: str = "default") -> str:
        """Find out why a run failed and what to change."""
        return (
            f'The Joch AgentRun "{name}" in namespace "{namespace}" did not succeed. Find out why:\n'
            f"1. joch_run_status: its phase, reason, message and conditions.\n"
            f"2. joch_run_log (tail_lines 200): the agent's own output; look for the first error.\n"
            f"3. joch_list_artifacts, and joch_read_patch if there is a changes.patch: what it changed.\n"
            f"4. joch_get_resource for its Agent (spec.agentRef) and the AgentProvider that Agent names, "
            f"and joch_list_resources events, for misconfiguration (binary, args, secrets, budget, policy).\n"
            f"Then say in a few lines: what failed, the evidence (quote the log lines), and the smallest fix "
            f"(a manifest change to apply with joch_apply_resources dry_run first, or a re-run with a clearer text)."
        )

    @server.prompt(name="joch_write_agent", title="Write an Agent for a CLI")
    def write_agent(cli: str, purpose: str = "implement changes in a git repository") -> str:
        """Write the AgentProvider and Agent manifests that run a coding CLI under Joch."""
        return (
            f'Write Joch manifests that run the command-line coding agent "{cli}" to {purpose}.\n'
            "1. joch_explain AgentProvider and Agent (and their spec fields) for the schema.\n"
            "2. An AgentProvider: spec.binary (the executable), spec.argsTemplate (one argv element each; "
            "templates such as {{ workspace.inputs }}/implementation.md, no shell), spec.inputFiles "
            "(e.g. implementation.md from {{ implementation.text }}), spec.outputArtifacts, and env "
            "from Secrets by name (never a literal key).\n"
            "3. An Agent: spec.providerRef naming it, spec.runtime, spec.defaults (timeoutSeconds, retryLimit).\n"
            "4. joch_apply_resources with dry_run true; fix every diagnostic it lists; then apply for real.\n"
            "5. Try it: joch_create_run with a small text, joch_wait_run, joch_read_patch.\n"
            "Answer with the final YAML and what the dry run said."
        )
