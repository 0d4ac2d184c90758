"""The CLI against a server that authenticates: contexts in the config file, their precedence,
tokens sent as bearer tokens, 401/403 reported in one line, ``joch auth whoami`` and ``can-i``."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from joch.api.namespaces import NAMESPACE, namespace_object
from joch.cli.main import app
from joch.server import ServerOptions
from joch.server.auth.options import AuthOptions
from joch.server.testing import LiveServer, live_server
from joch.store import Store, open_store

TOKENS = """\
admin-token,alice,u1,system:masters
viewer-token,victor,u2
"""
BINDING = """\
apiVersion: ops.joch.dev/v1alpha1
kind: RoleBinding
metadata: {name: viewers, namespace: team-a}
roleRef: {kind: Role, name: viewer}
subjects: [{kind: User, name: victor}]
"""
PROVIDER = """\
apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata: {name: p}
spec: {binary: echo}
"""


@dataclass
class Cli:
    server: LiveServer
    config: Path
    tmp: Path

    def __call__(self, *args: str, **env: str | None) -> tuple[int, str, str]:
        environ: dict[str, str | None] = {"JOCH_CONFIG": str(self.config), "JOCH_SERVER": None, "JOCH_TOKEN": None,
                                          "JOCH_NAMESPACE": None, **env}
        result = CliRunner().invoke(app, list(args), env=environ)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, result.stdout, result.stderr

    def file(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.write_text(text)
        return str(path)


@pytest.fixture
def cli(sqlite_url: str, tmp_path: Path) -> Iterator[Cli]:
    store: Store = open_store(sqlite_url)
    store.create(NAMESPACE, namespace_object("team-a"))  # the namespace the tests write into
    tokens = tmp_path / "tokens.csv"
    tokens.write_text(TOKENS)
    try:
        with live_server(store, ServerOptions(auth=AuthOptions(token_file=tokens))) as server:
            yield Cli(server, tmp_path / "config" / "joch.yaml", tmp_path)
    finally:
        store.close()


def test_contexts_are_written_0600_listed_switched_and_viewed_with_tokens_redacted(cli: Cli) -> None:
    assert cli("config", "current-context")[0] == 3  # none yet
    code, out, _ = cli("config", "set-context", "prod", "--server", cli.server.url, "--token", "admin-token",
                       "-n", "team-a")
    assert (code, out) == (0, 'Context "prod" created.\n')
    assert cli("config", "set-context", "other", "--server", "http://127.0.0.1:1")[1] == 'Context "other" created.\n'
    assert stat.S_IMODE(os.stat(cli.config).st_mode) == 0o600
    assert cli("config", "use-context", "prod")[1] == 'Switched to context "prod".\n'
    assert cli("config", "current-context")[1] == "prod\n"
    code, out, _ = cli("config", "get-contexts")
    lines = out.splitlines()
    assert lines[0].split() == ["CURRENT", "NAME", "SERVER", "NAMESPACE"]
    assert lines[1].split() == ["*", "prod", cli.server.url, "team-a"] and lines[2].split()[0] == "other"
    viewed = yaml.safe_load(cli("config", "view")[1])
    assert viewed["current-context"] == "prod"
    assert viewed["contexts"][0] == {"name": "prod", "context": {"server": cli.server.url, "token": "REDACTED",
                                                                 "namespace": "team-a"}}
    assert "admin-token" not in cli("config", "view")[1] and "admin-token" in cli("config", "view", "--raw")[1]
    code, _, err = cli("config", "use-context", "nope")
    assert code == 3 and 'no context exists with the name: "nope"' in err
    assert cli("config", "set-context", "prod", "--token", "viewer-token")[1] == 'Context "prod" modified.\n'
    assert yaml.safe_load(cli.config.read_text())["contexts"][0]["context"]["namespace"] == "team-a"  # kept


def test_the_current_context_supplies_server_token_and_namespace(cli: Cli) -> None:
    cli("config", "set-context", "prod", "--server", cli.server.url, "--token", "admin-token", "-n", "team-a")
    cli("config", "use-context", "prod")
    code, out, err = cli("apply", "-f", cli.file("p.yaml", PROVIDER))
    assert code == 0, err
    code, out, _ = cli("get", "agentproviders", "-o", "name")
    assert out == "agentprovider.joch.dev/p\n"  # in team-a, the context's namespace
    assert cli("get", "agentproviders", "-n", "default", "-o", "name")[1] == ""
    code, out, _ = cli("auth", "whoami")
    assert out == "Username: alice\nGroups:   system:masters, system:authenticated\n"


def test_flags_win_over_the_environment_which_wins_over_the_context(cli: Cli) -> None:
    cli("config", "set-context", "prod", "--server", "http://127.0.0.1:1", "--token", "viewer-token")
    cli("config", "use-context", "prod")
    url = cli.server.url
    assert cli("auth", "whoami", JOCH_SERVER=url)[1].startswith("Username: victor")
    assert cli("auth", "whoami", JOCH_SERVER=url, JOCH_TOKEN="admin-token")[1].startswith("Username: alice")
    flags = cli("--token", "viewer-token", "auth", "whoami", "--server", url, JOCH_TOKEN="admin-token")
    assert flags[1].startswith("Username: victor")
    code, _, err = cli("auth", "whoami")  # the context's server, which is not there
    assert code == 7 and "cannot reach the Joch server at http://127.0.0.1:1" in err


def test_401_and_403_are_one_line_and_exit_code_4(cli: Cli) -> None:
    url = cli.server.url
    code, out, err = cli("get", "agents", JOCH_SERVER=url)
    assert code == 4 and out == ""
    assert err.startswith(f"error: Unauthorized: the server at {url} needs a valid bearer token; give it with "
                          "--token, JOCH_TOKEN or a context")
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert cli("--token", "wrong", "get", "agents", JOCH_SERVER=url)[0] == 4
    code, _, err = cli("--token", "viewer-token", "apply", "-f", cli.file("p.yaml", PROVIDER), JOCH_SERVER=url)
    assert code == 4
    assert 'User "victor" cannot create resource "agentproviders" in API group "joch.dev" in the namespace ' \
           '"default"' in err


def test_auth_can_i_answers_yes_or_no_per_role(cli: Cli) -> None:
    url = cli.server.url
    assert cli("--token", "admin-token", "apply", "-f", cli.file("rb.yaml", BINDING), JOCH_SERVER=url)[0] == 0
    code, out, _ = cli("auth", "can-i", "list", "agents", "-n", "team-a", JOCH_SERVER=url, JOCH_TOKEN="viewer-token")
    assert (code, out) == (0, "yes\n")
    code, out, _ = cli("auth", "can-i", "create", "agents", "-n", "team-a", JOCH_SERVER=url,
                       JOCH_TOKEN="viewer-token")
    assert code == 1 and out.startswith('no - agents.joch.dev is forbidden: User "victor" cannot create')
    code, out, _ = cli("auth", "can-i", "update", "approvals/decide", "-n", "team-a", JOCH_SERVER=url,
                       JOCH_TOKEN="admin-token")
    assert (code, out) == (0, "yes\n")


def test_role_bindings_in_the_kubernetes_shape_through_get_describe_and_apply(cli: Cli) -> None:
    env = {"JOCH_SERVER": cli.server.url, "JOCH_TOKEN": "admin-token"}
    code, out, err = cli("apply", "-f", cli.file("rb.yaml", BINDING), **env)
    assert code == 0, err
    code, out, _ = cli("get", "rolebindings", "-n", "team-a", **env)
    assert out.split("\n")[0].split() == ["NAME", "ROLE", "SUBJECTS", "AGE"] and out.split("\n")[1].split()[:3] == [
        "viewers", "viewer", "victor"]
    code, out, _ = cli("describe", "rb", "viewers", "-n", "team-a", **env)
    assert code == 0 and "roleRef:\n" in out and "subjects:\n  - kind:  User\n    name:  victor\n" in out
    assert "Spec:" not in out
    code, got, _ = cli("get", "rb", "viewers", "-n", "team-a", "-o", "yaml", **env)
    assert "spec" not in yaml.safe_load(got) and yaml.safe_load(got)["roleRef"]["name"] == "viewer"
    code, out, err = cli("apply", "-f", cli.file("got.yaml", got), **env)
    assert (code, out) == (0, "rolebinding.ops.joch.dev/viewers unchanged\n"), err
    nested = BINDING.replace("roleRef:", "spec:\n  roleRef:").replace("subjects:", "  subjects:")
    code, _, err = cli("apply", "-f", cli.file("nested.yaml", nested), **env)
    assert code != 0 and "spec" in err and "move them out of spec" in err, err


def test_the_server_refuses_a_non_loopback_address_without_an_authenticator(
    tmp_path: Path, joch_binary: Path, closed_port: int,
) -> None:
    def run_joch(*args: str) -> tuple[int, str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
        proc = subprocess.run([str(joch_binary), *args], capture_output=True, text=True, env=env, timeout=60,
                              check=False)
        return proc.returncode, proc.stdout, proc.stderr

    def free_port() -> int:
        return closed_port

    code, _, err = run_joch("server", "--host", "0.0.0.0", "--port", str(free_port()), "--data-dir",
                            str(tmp_path / "data"), "--sandbox", "none")
    assert code == 2 and "Traceback" not in err
    assert err.startswith("error: refusing to listen on every address of this machine (0.0.0.0) without "
                          "authentication")
    assert "--token-file FILE" in err and "--oidc-issuer-url URL --oidc-client-id ID" in err
    tokens = tmp_path / "tokens.csv"
    tokens.write_text("t1,alice,1\nt2\n")
    code, _, err = run_joch("server", "--host", "0.0.0.0", "--port", str(free_port()), "--data-dir",
                            str(tmp_path / "data"), "--sandbox", "none", "--token-file", str(tokens))
    assert code == 2 and err.startswith(f'error: --token-file "{tokens}" line 2 has 1 field(s): write token,user,uid')
    code, _, err = run_joch("server", "--oidc-client-id", "joch", "--sandbox", "none")
    assert code == 2 and err.startswith("error: --oidc-client-id given without --oidc-issuer-url")
