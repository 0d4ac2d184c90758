"""Single sign-on in the console: the authorization-code flow with PKCE, run by the page in Chromium
against a local OpenID provider (``support.oidc``), ends signed in with the ID token as the bearer."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from e2e.console.conftest import JOCH
from support import ports, stop_server, wait_ready
from support.oidc import CLIENT_ID, Issuer, local_issuer


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    with local_issuer() as running:
        running.login = {"sub": "alice", "groups": ["console-users"]}
        yield running


@pytest.fixture(scope="module")
def server(issuer: Issuer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder: Path = tmp_path_factory.mktemp("console-oidc")
    port = ports.free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
    proc = subprocess.Popen(
        [str(JOCH), "server", "--data-dir", str(folder / "data"), "--port", str(port), "--sandbox", "none",
         "--no-controllers", "--oidc-issuer-url", issuer.url, "--oidc-client-id", CLIENT_ID,
         "--oidc-username-prefix", "-", "--oidc-groups-claim", "groups"],
        stdout=(folder / "server.log").open("a"), stderr=subprocess.STDOUT, cwd=folder, env=env)
    try:
        wait_ready(base, proc)
        yield base
    finally:
        stop_server(proc)


def test_config_names_the_issuer_and_the_csp_lets_the_page_reach_it(issuer: Issuer, server: str) -> None:
    with httpx.Client(base_url=server) as client:
        assert client.get("/console/config.json").json()["oidc"] == {"issuer": issuer.url, "clientId": CLIENT_ID}
        csp = client.get("/console/").headers["content-security-policy"]
    assert f"connect-src 'self' {issuer.url};" in csp


def test_single_sign_on_signs_the_user_in_with_the_id_token(issuer: Issuer, server: str, page: Any) -> None:
    page.goto(f"{server}/console/")
    page.get_by_role("button", name="Sign in with single sign-on").click()
    page.locator("#user").wait_for()
    assert page.locator("#user").inner_text() == "alice"
    assert page.url == f"{server}/console/#/runs"  # the code and state are gone from the address
    token = page.evaluate("sessionStorage.getItem('joch.token')")
    assert token.count(".") == 2  # the ID token is the bearer token
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {token}"}) as client:
        assert client.get("/v1/whoami").json()["username"] == "alice"
    assert issuer.codes == {}  # the code was exchanged (and can be exchanged only once)


def test_an_answer_not_started_here_is_refused(server: str, page: Any) -> None:
    page.goto(f"{server}/console/?code=forged&state=forged")
    error = page.locator("#sign-in-error")
    error.get_by_text("does not belong to a sign-in started here").wait_for()
    assert "code=" not in page.url
