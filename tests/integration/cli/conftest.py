"""A real ``joch server`` subprocess, and runners for the real ``joch`` CLI.

One server per test module (its own data directory and free localhost port; the fixture waits
for ``/healthz``). Before each test every object is deleted through the HTTP API, so each test
starts from an empty store without paying a server start (seconds) per test.

``joch(...)`` runs the real typer app in-process with typer's CliRunner: same parsing, output and
exit codes, without an interpreter start and imports for each of the ~130 commands. ``joch_at``
and ``joch_binary`` run the installed console script as a subprocess where the process itself is
under test: exit codes without a server, no traceback, watches, a taken port.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from joch.cli.main import app
from support import ports

FIXTURES = Path(__file__).parent / "fixtures"
JOCH = Path(sys.executable).with_name("joch")
STARTUP_SECONDS = 90.0  # a loaded CI machine took 25 s to start a server


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


NAMESPACES = ("team-a", "team-b", "team-c", "elsewhere", "shop", "shop-dev", "shop-prod")
"""The namespaces the CLI tests write into besides ``default`` (wipe leaves Namespaces alone)."""


def free_port() -> int:
    return ports.free_port()  # not an ephemeral port: see support/ports.py


def run_joch(*args: str, server: str | None = None, input: str | None = None, timeout: float = 30) -> Result:
    if not JOCH.exists():
        pytest.fail(f"{JOCH} is missing: run `pip install -e .` in the venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_") or k == "JOCH_CONFIG"}
    if server:
        env["JOCH_SERVER"] = server
    proc = subprocess.run([str(JOCH), *args], capture_output=True, text=True, input=input, env=env,
                          timeout=timeout, check=False)
    return Result(proc.returncode, proc.stdout, proc.stderr)


class Server:
    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data_dir / "server.log"
        self._log_file = self.log.open("w")
        self.proc = subprocess.Popen(
            [str(JOCH), "server", "--data-dir", str(data_dir / "data"), "--port", str(self.port)],
            stdout=self._log_file, stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"joch server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        pytest.fail(f"joch server did not answer /healthz in {STARTUP_SECONDS}s:\n{self.log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("joch-server"))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def wipe(url: str) -> None:
    """Delete every object of every served kind, in every namespace, and check none is left.

    The server runs controllers, so deleting is a few rounds: a run's finalizer is removed by the run
    controller, which may write one last Event. The controllers' own Lease is left alone."""
    with httpx.Client(base_url=url, timeout=60) as http:
        collections = []
        for group in http.get("/apis").json()["groups"]:
            group_version = group["preferredVersion"]["groupVersion"]
            for resource in http.get(f"/apis/{group_version}").json()["resources"]:
                # not the self-reviews kubectl auth uses, nor read-only views (events.k8s.io)
                listable = "list" in resource["verbs"] and "delete" in resource["verbs"]
                if "/" not in resource["name"] and resource["name"] != "leases" and listable:
                    collections.append(f"/apis/{group_version}/{resource['name']}")
        deadline = time.monotonic() + 15
        while True:
            for collection in collections:
                for item in http.get(collection).json()["items"]:
                    meta = item["metadata"]
                    prefix = collection.rsplit("/", 1)[0]
                    plural = collection.rsplit("/", 1)[1]
                    ns = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
                    if not meta.get("deletionTimestamp"):
                        response = http.delete(f"{prefix}{ns}/{plural}/{meta['name']}")
                        if response.status_code != 404:
                            response.raise_for_status()
            left = [c for c in collections if http.get(c).json()["items"]]
            if not left:
                return
            assert time.monotonic() < deadline, f"objects survived deletion (finalizers?) in {left}"
            time.sleep(0.05)


class Joch:
    """``joch(...)`` runs the CLI app in-process against the test's server."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.runner = CliRunner()

    def __call__(self, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        environ: dict[str, str | None] = {"JOCH_SERVER": self.server.url, "JOCH_NAMESPACE": None, "JOCH_STORE": None,
                                          "JOCH_TOKEN": None}
        result = self.runner.invoke(app, list(args), input=input, env={**environ, **(env or {})})
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception  # a bug, not a user error: the CLI must never get here
        return Result(result.exit_code, result.stdout, result.stderr)

    def ok(self, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        result = self(*args, input=input, env=env)
        assert result.code == 0, f"joch {' '.join(args)} exited {result.code}:\n{result.out}\n{result.err}"
        return result


@pytest.fixture
def joch(server: Server) -> Joch:
    wipe(server.url)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for name in NAMESPACES:  # a namespace must exist before anything is created in it
            created = http.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": name}})
            assert created.status_code in (201, 409), created.text
    return Joch(server)


@pytest.fixture
def manifest() -> Callable[[str], str]:
    """The path of a manifest under fixtures/."""
    return lambda name: str(FIXTURES / name)


@pytest.fixture
def joch_at() -> Callable[..., Result]:
    """``joch_at(url, *args, input=None)``: the CLI against any URL (a server that is not there)."""

    def run(url: str, *args: str, input: str | None = None) -> Result:
        return run_joch(*args, server=url, input=input)

    return run


@pytest.fixture
def joch_binary() -> Path:
    return JOCH


@pytest.fixture
def closed_port() -> int:
    """A localhost port nothing listens on (it was free a moment ago)."""
    return free_port()
