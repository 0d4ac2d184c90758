"""Joch's MCP server driven by the MCP SDK's own client, over stdio (``joch mcp``) and over streamable
HTTP (``/mcp`` on ``joch server``), against one real ``joch server`` process with token auth on:
users ``admin`` (``system:masters``) and ``viewer`` (bound to the viewer role).

Over each transport the client lists the tools, creates a run of the quickstart's demo agent, waits
for Succeeded and reads its patch (tool and resource). A viewer's token cannot decide an approval
(a tool error naming what is forbidden, word for word the CLI's), ``/mcp`` without a token is a 401
and from a web page of another origin a 403, and errors read as the CLI prints them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextResourceContents

from integration.runtime.helpers import Repo
from joch.mcp.server import MAX_TEXT_BYTES
from joch.server.testing import live_server
from joch.store import open_store
from support import ports, stop_server, token_file, wait_ready
from support.jochserver import repository

JOCH = Path(sys.executable).with_name("joch")
QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart"
USERS = {"admin": "system:masters", "viewer": ""}
TOOLS = {"joch_list_resources", "joch_get_resource", "joch_apply_resources", "joch_delete_resource", "joch_explain",
         "joch_create_run", "joch_wait_run", "joch_run_status", "joch_run_log", "joch_list_artifacts",
         "joch_read_patch", "joch_list_approvals", "joch_decide_approval", "joch_audit_query", "joch_cost"}
GATE = {"apiVersion": "joch.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "gate"},
        "spec": {"selector": {"kinds": ["AgentRun"]}, "rules": [
            {"name": "main-needs-approval", "phase": "dispatch", "action": "requireApproval",
             "expression": 'has(run.spec.execution.coordinates.git.ref) && run.spec.execution.coordinates.git.ref '
                           '== "main"',
             "message": "runs on main need a second pair of eyes"}]}}
VIEWERS = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "RoleBinding", "metadata": {"name": "viewers"},
           "roleRef": {"apiGroup": "ops.joch.dev", "kind": "Role", "name": "viewer"},
           "subjects": [{"kind": "User", "name": "viewer"}]}
T = TypeVar("T")


def token_of(user: str) -> str:
    return f"tok-{user}-mcp-7d2e"


@dataclass
class Server:
    base: str
    repo: Path
    folder: Path
    log: Path

    def env(self, user: str | None) -> dict[str, str]:
        """The environment of a ``joch`` process acting as ``user`` (no token for None)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
        env.update(JOCH_SERVER=self.base, JOCH_CONFIG=str(self.folder / "no-config.yaml"))
        if user is not None:
            env["JOCH_TOKEN"] = token_of(user)
        return env

    def cli(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(JOCH), *args], capture_output=True, text=True, env=self.env(user), timeout=60,
                              check=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("mcp")
    tokens = folder / "tokens.csv"
    token_file(tokens, USERS, token_of)
    repo = Repo(repository(folder / "repo"))
    port = ports.free_port()
    s = Server(f"http://127.0.0.1:{port}", repo.path, folder, folder / "server.log")
    env = s.env(None)
    env["PATH"] = f"{JOCH.parent}{os.pathsep}{env.get('PATH', '')}"  # joch-demo-agent, the quickstart's agent
    proc = subprocess.Popen(
        [str(JOCH), "server", "--data-dir", str(folder / "data"), "--port", str(port), "--sandbox", "none",
         "--token-file", str(tokens)],
        stdout=s.log.open("a"), stderr=subprocess.STDOUT, text=True, cwd=folder, env=env)
    try:
        wait_ready(s.base, proc)
        documents = [json.dumps(VIEWERS), json.dumps(GATE)]
        documents += [(QUICKSTART / f"{name}.yaml").read_text() for name in ("provider", "agent", "implementation")]
        r = httpx.post(f"{s.base}/v1/resources/apply", content="\n---\n".join(documents), timeout=30,
                       headers={"content-type": "application/yaml", "authorization": f"Bearer {token_of('admin')}"})
        assert r.status_code == 200, r.text
        yield s
    finally:
        stop_server(proc)
    assert "Traceback" not in s.log.read_text(), s.log.read_text()


def over_stdio(server: Server, user: str | None) -> Client:
    """The SDK's client running ``joch mcp`` with ``user``'s token and the server in its environment."""
    return Client(StdioServerParameters(command=str(JOCH), args=["mcp"], env=server.env(user)))


@asynccontextmanager
async def over_http(server: Server, user: str | None) -> AsyncIterator[Client]:
    """The SDK's client on ``/mcp`` with ``user``'s bearer token."""
    headers = {"Authorization": f"Bearer {token_of(user)}"} if user else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0)) as http, \
            Client(streamable_http_client(f"{server.base}/mcp", http_client=http)) as client:
        yield client


def run(fn: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(fn)


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured content; a tool error fails the test with its text."""
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult), result
    assert not result.is_error, (tool, result.content)
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


async def failure(client: Client, tool: str, **arguments: Any) -> CallToolResult:
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult) and result.is_error, result
    return result


def text_of(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def demo_run_to_its_patch(client: Client, server: Server) -> str:
    """List the tools, run the demo agent, wait for Succeeded, read the patch (tool and resource)."""
    assert TOOLS <= {tool.name for tool in (await client.list_tools()).tools}
    created = await call(client, "joch_create_run", agent="demo", spec="hello-readme", repo=str(server.repo))
    name = created["name"]
    assert name.startswith("demo-") and created["phase"] in ("Pending", "Queued", None), created
    ended = await call(client, "joch_wait_run", name=name, timeout_seconds=90)
    assert (ended["phase"], ended["finished"]) == ("Succeeded", True), (ended, server.log.read_text()[-3000:])
    patch = (await call(client, "joch_read_patch", name=name))["patch"]
    assert "+Hello from Joch" in patch, patch
    read = await client.read_resource(f"joch://runs/default/{name}/patch")
    assert [c.text for c in read.contents if isinstance(c, TextResourceContents)] == [patch]
    names = [a["name"] for a in (await call(client, "joch_list_artifacts", name=name))["items"]]
    assert "changes.patch" in names and "summary" in names, names
    return str(name)


def test_over_stdio_joch_mcp_runs_the_demo_agent_and_reads_its_patch(server: Server) -> None:
    async def scenario() -> str:
        async with over_stdio(server, "admin") as client:
            return await demo_run_to_its_patch(client, server)

    name = run(scenario)
    # Made as the context's user, so audited as admin.
    rows = json.loads(server.cli("admin", "audit", "--kind", "AgentRun", "--name", name, "-o", "json").stdout)
    assert any(r["actor"] == "admin" and r["verb"] == "create" for r in rows["items"]), rows


def test_over_http_mcp_runs_the_demo_agent_reads_its_log_and_the_audit_names_the_caller(server: Server) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with over_http(server, "admin") as client:
            name = await demo_run_to_its_patch(client, server)
            log = await call(client, "joch_run_log", name=name, tail_lines=5)
            audit = await call(client, "joch_audit_query", kind="AgentRun", name=name)
            return log, audit

    log, audit = run(scenario)
    assert 0 < log["lines"] <= 5, log
    assert any(r["actor"] == "admin" and r["verb"] == "create" for r in audit["items"]), audit


def test_a_viewer_cannot_decide_an_approval_and_hears_what_the_cli_says(server: Server) -> None:
    async def held_run() -> str:
        async with over_http(server, "admin") as client:
            created = await call(client, "joch_create_run", agent="demo", spec="hello-readme", repo=str(server.repo),
                                 ref="main", name="gated")
            deadline = time.monotonic() + 60
            while (await call(client, "joch_run_status", name=created["name"]))["phase"] != "AwaitingApproval":
                assert time.monotonic() < deadline, server.log.read_text()[-3000:]
                await anyio.sleep(0.2)
            return str(created["name"])

    run(held_run)

    async def as_viewer() -> tuple[dict[str, Any], CallToolResult]:
        async with over_http(server, "viewer") as client:
            pending = await call(client, "joch_list_approvals")  # reading is what a viewer may do
            approval = next(a["name"] for a in pending["items"] if a["run"] == "gated")
            return pending, await failure(client, "joch_decide_approval", name=approval, decision="approve",
                                          reason="looks fine")

    pending, refused = run(as_viewer)
    approval = next(a["name"] for a in pending["items"] if a["run"] == "gated")
    said = server.cli("viewer", "approve", "approval", approval, "--reason", "looks fine")
    assert said.returncode == 4 and said.stderr.startswith("error: "), said
    assert text_of(refused) == said.stderr.rstrip("\n")
    assert 'User "viewer" cannot update resource "approvals/decide"' in text_of(refused), text_of(refused)
    assert refused.structured_content is not None and refused.structured_content["reason"] == "Forbidden"

    async def as_admin() -> dict[str, Any]:
        async with over_stdio(server, "admin") as client:
            await call(client, "joch_decide_approval", name=approval, decision="approve", reason="looked")
            return await call(client, "joch_wait_run", name="gated", timeout_seconds=90)

    assert run(as_admin)["phase"] == "Succeeded"


def test_mcp_needs_a_valid_token_and_refuses_web_pages_of_other_origins(server: Server) -> None:
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    for token in (None, "not-a-token"):
        sent = {**headers, **({"Authorization": f"Bearer {token}"} if token else {})}
        r = httpx.post(f"{server.base}/mcp", json=hello, headers=sent, timeout=10)
        assert r.status_code == 401 and r.json()["reason"] == "Unauthorized", r.text
    r = httpx.post(f"{server.base}/mcp", json=hello, timeout=10,
                   headers={**headers, "Authorization": f"Bearer {token_of('admin')}", "Origin": "https://evil.example"})
    assert r.status_code == 403 and "cross-origin" in r.json()["message"], r.text

    async def without_token() -> CallToolResult:
        async with over_stdio(server, None) as client:
            return await failure(client, "joch_list_resources", kind="agents")

    refused = run(without_token)
    assert text_of(refused).startswith("error: Unauthorized: ") and "JOCH_TOKEN" in text_of(refused)


def test_errors_read_as_the_cli_prints_them_and_a_dry_run_writes_nothing(server: Server) -> None:
    agent = "apiVersion: joch.dev/v1alpha1\nkind: Agent\nmetadata: {name: dry}\nspec: {providerRef: {name: demo-agent}}"

    async def scenario() -> tuple[CallToolResult, CallToolResult, dict[str, Any], CallToolResult, dict[str, Any]]:
        async with over_http(server, "admin") as client:
            missing = await failure(client, "joch_get_resource", kind="agent", name="nobody")
            unknown = await failure(client, "joch_list_resources", kind="gizmos")
            dry = await call(client, "joch_apply_resources", manifests=agent, dry_run=True)
            after = await failure(client, "joch_get_resource", kind="ag", name="dry")
            schema = await call(client, "joch_explain", kind="Agent", field="spec.providerRef")
            return missing, unknown, dry, after, schema

    missing, unknown, dry, after, schema = run(scenario)
    said = server.cli("admin", "get", "agent", "nobody")
    assert said.returncode == 3 and text_of(missing) == said.stderr.rstrip("\n"), (text_of(missing), said.stderr)
    assert 'resource type "gizmos"' in text_of(unknown), text_of(unknown)
    assert dry["dryRun"] is True and len(dry["items"]) == 1, dry
    assert "not found" in text_of(after), text_of(after)
    assert "name" in schema["schema"].get("properties", {}), schema


def test_apply_list_delete_the_agent_manifest_resource_and_the_prompts(server: Server) -> None:
    agent = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "short-lived"},
             "spec": {"providerRef": {"name": "demo-agent"}}}

    async def scenario() -> tuple[list[str], dict[str, Any], list[str], str, str]:
        async with over_stdio(server, "admin") as client:
            await call(client, "joch_apply_resources", manifests=json.dumps(agent))
            listed = [row["name"] for row in (await call(client, "joch_list_resources", kind="agents"))["items"]]
            manifest = await client.read_resource("joch://agents/default/short-lived/manifest")
            deleted = await call(client, "joch_delete_resource", kind="agent", name="short-lived")
            after = [row["name"] for row in (await call(client, "joch_list_resources", kind="agents"))["items"]]
            prompt = await client.get_prompt("joch_triage_run", {"name": "broken"})
            text = "".join(getattr(m.content, "text", "") for m in prompt.messages)
            return listed, deleted, after, "".join(getattr(c, "text", "") for c in manifest.contents), text

    listed, deleted, after, manifest, prompt = run(scenario)
    assert "short-lived" in listed and "short-lived" not in after and "demo" in after, (listed, after)
    assert deleted == {"deleted": "agent.joch.dev/short-lived"}
    assert json.loads(manifest)["kind"] == "CompiledAgentManifest", manifest[:300]
    assert '"broken"' in prompt and "joch_run_log" in prompt, prompt


def test_a_resource_uri_naming_no_object_is_refused_in_the_cli_words_not_an_unexpected_error(server: Server) -> None:
    async def scenario() -> list[str]:
        said = []
        async with over_http(server, "admin") as client:
            for uri in ("joch://runs/default/a%2Fb/log", "joch://agents/default/x%2Fy/manifest"):
                with pytest.raises(MCPError) as refused:
                    await client.read_resource(uri)
                said.append(str(refused.value))
        return said

    slash, dots = run(scenario)
    assert 'invalid name "a/b"' in slash and "error: " in slash, slash
    assert 'invalid name "x/y"' in dots, dots
    assert "Traceback" not in server.log.read_text()


def test_mcp_takes_post_only_so_a_get_holds_no_idle_stream_open(server: Server) -> None:
    auth = {"Authorization": f"Bearer {token_of('admin')}"}
    for method, accept in (("GET", "text/event-stream"), ("DELETE", "application/json")):
        r = httpx.request(method, f"{server.base}/mcp", headers={**auth, "Accept": accept}, timeout=5)
        assert r.status_code == 405 and r.headers["allow"] == "POST", (method, r.status_code, r.text)
        assert r.json()["reason"] == "MethodNotAllowed" and "POST only" in r.json()["message"], r.text


def test_a_message_over_the_size_limit_is_a_413_status_and_a_smaller_one_is_served(server: Server) -> None:
    auth = {"Authorization": f"Bearer {token_of('admin')}", "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json"}
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t" * 1000, "version": "1"}}}
    ok = httpx.post(f"{server.base}/mcp", headers=auth, json=hello, timeout=10)
    assert ok.status_code == 200 and ok.json()["result"]["serverInfo"], ok.text
    big = json.dumps({**hello, "params": {**hello["params"], "padding": "x" * (4 * 1024 * 1024)}}).encode()

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit is found while reading
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]

    for content in (big, chunked()):
        r = httpx.post(f"{server.base}/mcp", headers=auth, content=content, timeout=10)
        assert r.status_code == 413 and r.json()["kind"] == "Status", r.text
        assert r.json()["reason"] == "RequestEntityTooLarge" and "4194304 bytes" in r.json()["message"], r.text


def test_joch_mcp_ends_at_once_on_ctrl_c_and_on_eof(server: Server) -> None:
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    for ending in ("ctrl-c", "eof"):
        proc = subprocess.Popen([str(JOCH), "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=server.env("admin"))
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(hello).encode() + b"\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["result"]["serverInfo"]["name"] == "joch"
            if ending == "ctrl-c":
                proc.send_signal(signal.SIGINT)  # stdin stays open, as in a terminal
            else:
                proc.stdin.close()
            code = proc.wait(timeout=10)
        finally:
            proc.kill()
            proc.wait()
        assert code == (-signal.SIGINT if ending == "ctrl-c" else 0), (ending, code)
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read(), ending


NOISY = ("for i in range(30000): print(f'line {i} ' + 'x' * 60)\n"
         "open('big.txt', 'w').writelines(f'{i} ' + 'y' * 60 + '\\n' for i in range(30000))\n"
         "print('the end')")
"""An agent printing ~2 MB and writing a ~2 MB file into the repository (so into changes.patch)."""


def test_a_log_and_a_patch_of_megabytes_come_back_cut_to_a_bounded_size(server: Server) -> None:
    """A run printing ~2 MB and writing a ~2 MB file: the tools and resources answer at most
    MAX_TEXT_BYTES of either, the log's end and the patch's start, and say so."""
    provider = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "noisy"},
                "spec": {"binary": sys.executable, "argsTemplate": ["-c", NOISY]}}
    agent = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "noisy"},
             "spec": {"providerRef": {"name": "noisy"}}}

    async def scenario() -> tuple[dict[str, Any], str, str, CallToolResult]:
        async with over_http(server, "admin") as client:
            await call(client, "joch_apply_resources", manifests=json.dumps(provider) + "\n---\n" + json.dumps(agent))
            name = (await call(client, "joch_create_run", agent="noisy", text="be loud", repo=str(server.repo)))["name"]
            assert (await call(client, "joch_wait_run", name=name, timeout_seconds=90))["phase"] == "Succeeded"
            log = await call(client, "joch_run_log", name=name, tail_lines=0)
            resources = []
            for part in ("log", "patch"):
                read = await client.read_resource(f"joch://runs/default/{name}/{part}")
                resources.append("".join(c.text for c in read.contents if isinstance(c, TextResourceContents)))
            too_much = await failure(client, "joch_read_patch", name=name, max_chars=MAX_TEXT_BYTES + 1)
            return log, resources[0], resources[1], too_much

    log, log_text, patch_text, too_much = run(scenario)
    assert log["truncated"] and len(log["log"]) <= MAX_TEXT_BYTES and log["log"].endswith("the end"), log["lines"]
    assert log["log"].startswith("line "), log["log"][:100]  # the partial first line is left out
    assert len(log_text) <= MAX_TEXT_BYTES + 100 and log_text.startswith("[joch: the log is larger"), log_text[:100]
    assert len(patch_text) <= MAX_TEXT_BYTES + 100 and patch_text.startswith("diff --git"), patch_text[:100]
    assert patch_text.endswith("this is its first part]"), patch_text[-100:]
    assert "less than or equal to 1000000" in text_of(too_much), text_of(too_much)


RUN_GETS = ('joch_http_requests_total{code="200",method="GET",'
            'route="/apis/runtime.joch.dev/v1alpha1/namespaces/{namespace}/agentruns/{name}"} ')


def test_a_wait_whose_client_hung_up_stops_polling(server: Server) -> None:
    """Stateless, nothing told the tool its client had gone: it polled the run for the whole timeout."""
    admin = {"Authorization": f"Bearer {token_of('admin')}"}
    sleepy = [{"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "sleepy"},
               "spec": {"binary": sys.executable, "argsTemplate": ["-c", "import time; time.sleep(120)"]}},
              {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "sleepy"},
               "spec": {"providerRef": {"name": "sleepy"}}}]
    r = httpx.post(f"{server.base}/v1/resources/apply", content="\n---\n".join(map(json.dumps, sleepy)), timeout=30,
                   headers={**admin, "content-type": "application/yaml"})
    assert r.status_code == 200, r.text

    def run_gets() -> float:
        text = httpx.get(f"{server.base}/metrics", headers=admin, timeout=10).text
        return sum(float(line.removeprefix(RUN_GETS)) for line in text.splitlines() if line.startswith(RUN_GETS))

    async def start() -> str:
        async with over_http(server, "admin") as client:
            created = await call(client, "joch_create_run", agent="sleepy", text="wait", repo=str(server.repo))
            return str(created["name"])

    name = run(start)
    wait = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "joch_wait_run", "arguments": {"name": name, "timeout_seconds": 60}}}
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.base}/mcp", json=wait, timeout=1.5, headers={
                **admin, "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"})
        time.sleep(0.5)
        before = run_gets()
        time.sleep(2)  # four polls, were it still waiting
        assert run_gets() - before == 0
    finally:
        server.cli("admin", "delete", "run", name)


def test_approvals_are_listed_up_to_a_limit(server: Server) -> None:
    async def scenario() -> dict[str, Any]:
        async with over_http(server, "admin") as client:
            many = []
            for i in range(3):  # one Approval per run
                held = await call(client, "joch_create_run", agent="demo", text="x", repo=str(server.repo))
                many.append({"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "Approval",
                             "metadata": {"name": f"many-{i}"}, "spec": {"runRef": {"name": held["name"]}}})
            await call(client, "joch_apply_resources", manifests="\n---\n".join(map(json.dumps, many)))
            return await call(client, "joch_list_approvals", limit=2)

    listed = run(scenario)
    assert len(listed["items"]) == 2 and listed["more"] is True, listed


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18"])
def test_a_client_of_an_older_protocol_version_is_answered_in_it(server: Server, version: str) -> None:
    """What an SDK 1.x client sends by hand: initialize with its version, then a call carrying it."""
    headers = {"Authorization": f"Bearer {token_of('viewer')}", "Accept": "application/json, text/event-stream"}
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}}
    r = httpx.post(f"{server.base}/mcp", json=hello, headers=headers, timeout=10)
    assert r.status_code == 200 and r.json()["result"]["protocolVersion"] == version, r.text
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "joch_list_resources", "arguments": {"kind": "agents"}}}
    r = httpx.post(f"{server.base}/mcp", json=listing, headers={**headers, "MCP-Protocol-Version": version}, timeout=10)
    assert r.status_code == 200 and not r.json()["result"].get("isError"), r.text
    assert "demo" in {row["name"] for row in r.json()["result"]["structuredContent"]["items"]}, r.text


def test_arguments_that_do_not_fit_a_tool_are_refused_field_by_field(server: Server) -> None:
    async def scenario() -> CallToolResult:
        async with over_http(server, "admin") as client:
            return await failure(client, "joch_list_resources", limit=-1, all_namespaces="maybe")

    refused = run(scenario)
    assert text_of(refused) == ("error: invalid arguments to joch_list_resources\n"
                                "  - kind: Field required\n"
                                "  - all_namespaces: Input should be a valid boolean, unable to interpret input\n"
                                "  - limit: Input should be greater than or equal to 1"), text_of(refused)
    assert refused.structured_content is not None and refused.structured_content["reason"] == "BadRequest"


def test_a_write_through_mcp_is_audited_with_the_mcp_client_address(server: Server) -> None:
    agent = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "from-afar"},
             "spec": {"providerRef": {"name": "demo-agent"}}}

    async def scenario() -> dict[str, Any]:
        transport = httpx2.AsyncHTTPTransport(local_address="127.0.0.7")  # another loopback address
        async with httpx2.AsyncClient(transport=transport, timeout=httpx2.Timeout(60.0),
                                      headers={"Authorization": f"Bearer {token_of('admin')}"}) as http, \
                Client(streamable_http_client(f"{server.base}/mcp", http_client=http)) as client:
            await call(client, "joch_apply_resources", manifests=json.dumps(agent))
            return await call(client, "joch_audit_query", kind="Agent", name="from-afar")

    rows = run(scenario)["items"]
    assert [(r["actor"], r["sourceIP"]) for r in rows] == [("admin", "127.0.0.7")], rows


def test_an_app_served_without_its_lifespan_answers_503_on_mcp_not_a_traceback(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    try:
        with live_server(store) as live:  # uvicorn with --lifespan off, as embedders and most tests run it
            r = live.http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status_code == 503 and "lifespan" in r.json()["message"], r.text
    finally:
        store.close()


LAZY_SDK = """
import logging, sys, threading
from starlette.testclient import TestClient
from joch.server.app import create_app
from joch.store import open_store

started = []
sdk = logging.getLogger("mcp.server.streamable_http_manager")
sdk.setLevel(logging.INFO)
sdk.addFilter(lambda record: started.append(record.getMessage()) and False)
store = open_store(sys.argv[1])
message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
headers = {"Accept": "application/json, text/event-stream"}
with TestClient(create_app(store), base_url="http://127.0.0.1") as client:
    assert client.get("/readyz").status_code == 200
    print("before", "mcp.server" in sys.modules)
    answers = []
    firsts = [threading.Thread(target=lambda: answers.append(client.post("/mcp", json=message, headers=headers)))
              for _ in range(3)]
    for t in firsts: t.start()
    for t in firsts: t.join()
    print("after", "mcp.server" in sys.modules)
    print("tools", sorted(len(a.json()["result"]["tools"]) > 5 for a in answers))
    assert client.post("/mcp", json=message, headers=headers).status_code == 200
    print("managers started", started.count("StreamableHTTP session manager started"))
store.close()
"""


def test_the_sdk_is_imported_by_the_first_mcp_request_not_by_the_start(sqlite_url: str) -> None:
    # Importing the MCP SDK took a second of CPU before every server answered /readyz; the suite and
    # every `joch server` paid it, asked over MCP or not. Three first requests at once start it once.
    done = subprocess.run([sys.executable, "-c", LAZY_SDK, sqlite_url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["before False", "after True", "tools [True, True, True]",
                                           "managers started 1"], done.stdout
