"""The console in a real browser: Playwright driving Debian's Chromium against a real ``joch server``.

``make browser-tools`` installs Chromium (Debian's ``chromium`` package) where apt is usable; Playwright's
own browser downloads are never used (``JOCH_CHROMIUM`` names another binary). Without Chromium these tests
skip, except under CI (``CI`` set), where a missing browser is a failure: the console is never untested there.

``console`` is one server per module with authentication on: a kube-apiserver token file of ``admin``
(``system:masters``), ``viewer``, ``editor`` and ``approver``, each bound to the role of that name, the
quickstart applied, and a git repository for runs. ``page`` is a fresh browser context per test (1280x800,
or ``phone`` for 390x844); when the test ends its screenshot is saved under ``test-artifacts/console/``
(``JOCH_TEST_ARTIFACTS`` moves the folder), pass or fail, so a person can look at what the test saw.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from integration.runtime.helpers import Repo
from support import ports, stop_server, token_file, wait_ready
from support.jochserver import repository

JOCH = Path(sys.executable).parent / "joch"
ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "examples" / "quickstart"
USERS = {"admin": "system:masters", "viewer": "", "editor": "", "approver": ""}
ARTIFACTS = Path(os.environ.get("JOCH_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "console"


def token_of(user: str) -> str:
    return f"console-{user}-7d3e91"


def chromium_binary() -> str | None:
    found = os.environ.get("JOCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return found if found and Path(found).exists() else None


@dataclass
class Console:
    """A running server: ``base`` is its URL; ``api(user)`` an HTTP client authenticated as ``user``."""

    base: str
    data_dir: Path
    log: Path
    repo: Path

    def api(self, user: str = "admin") -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=30, headers={"Authorization": f"Bearer {token_of(user)}"})

    def apply(self, *docs: dict[str, Any], user: str = "admin") -> httpx.Response:
        body = "\n---\n".join(json.dumps(d) for d in docs)
        with self.api(user) as client:
            return client.post("/v1/resources/apply", content=body, headers={"content-type": "application/yaml"})


def role_binding(user: str) -> dict[str, Any]:
    return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "RoleBinding",
            "metadata": {"name": f"{user}s", "namespace": "default"},
            "roleRef": {"apiGroup": "ops.joch.dev", "kind": "Role", "name": user},
            "subjects": [{"kind": "User", "name": user}]}


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    folder = tmp_path_factory.mktemp("console")
    tokens = folder / "tokens.csv"
    token_file(tokens, USERS, token_of)
    repo = Repo(repository(folder / "repo"))
    port = ports.free_port()
    c = Console(f"http://127.0.0.1:{port}", folder / "data", folder / "server.log", repo.path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
    server = subprocess.Popen(
        [str(JOCH), "server", "--data-dir", str(c.data_dir), "--port", str(port), "--sandbox", "none",
         "--token-file", str(tokens), "--apply-missing", str(QUICKSTART)],
        stdout=c.log.open("a"), stderr=subprocess.STDOUT, text=True, cwd=folder, env=env)
    try:
        wait_ready(c.base, server)
        r = c.apply(*(role_binding(u) for u in ("viewer", "editor", "approver")))
        assert r.status_code == 200, r.text
        yield c
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Per module, not per session: Playwright's sync API keeps an asyncio loop running in this thread
    while it is open, so a later module's ``asyncio.run`` on the same xdist worker would fail."""
    binary = chromium_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed (make browser-tools): the console tests must run in CI")
        pytest.skip("Chromium is not installed (make browser-tools installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=binary, headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    phone = request.node.get_closest_marker("phone") is not None
    viewport = {"width": 390, "height": 844} if phone else {"width": 1280, "height": 800}
    context = browser.new_context(viewport=viewport, color_scheme="light")
    context.set_default_timeout(15_000)
    p = context.new_page()
    yield p
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        p.evaluate("window.scrollTo(0, 0)")  # else a sticky header lands mid-page in a full-page shot
        p.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    finally:
        context.close()


def sign_in(page: Any, console: Console, user: str) -> None:
    """Sign ``page`` in to the console as ``user`` with the user's token, as a person would."""
    page.goto(f"{console.base}/console/")
    page.fill("#token", token_of(user))
    page.click("form.sign-in-form button[type=submit]")
    page.wait_for_selector("#user")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "phone: a phone-sized viewport (390x844) for the page fixture")
