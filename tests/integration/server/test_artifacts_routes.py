"""``GET .../agentruns/{name}/artifacts[/{artifact}]`` over a real server, store and runtime."""

from __future__ import annotations

import base64
import hashlib

from integration.server import test_logs_routes
from integration.server.test_logs_routes import RunServer
from joch.runtime.base import Output
from joch.server.testing import is_status

runtime = test_logs_routes.runtime  # the fixtures: a server with a LocalRuntime
server = test_logs_routes.server

WRITE = ("import os\nopen(os.path.join(os.environ['OUT'], 'report.md'), 'w').write('# done\\n')\n"
         "open(os.path.join(os.environ['OUT'], 'data.bin'), 'wb').write(bytes(range(256)) * 1000)\n")
OUTPUTS = (Output("report", "report.md"), Output("data ä.bin", "data.bin"))


def artifacts_path(server: RunServer, name: str, artifact: str | None = None) -> str:
    return server.path("agentruns", name, sub="artifacts" + (f"/{artifact}" if artifact else ""))


def test_the_list_is_the_runs_recorded_artifacts(server: RunServer) -> None:
    run = server.executed("made", WRITE, outputs=OUTPUTS)
    r = server.http.get(artifacts_path(server, "made"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kind"] == "ArtifactList" and body["apiVersion"] == "runtime.joch.dev/v1alpha1"
    assert body["items"] == run["status"]["artifacts"]
    assert {a["name"] for a in body["items"]} == {"report", "data ä.bin"}


def test_a_download_is_the_bytes_with_their_digest(server: RunServer) -> None:
    server.executed("made", WRITE, outputs=OUTPUTS)
    r = server.http.get(artifacts_path(server, "made", "report"))
    assert r.status_code == 200, r.text
    assert r.content == b"# done\n"
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["content-disposition"] == 'attachment; filename="report"'
    digest = hashlib.sha256(b"# done\n")
    assert r.headers["x-content-sha256"] == digest.hexdigest()
    assert r.headers["digest"] == "sha-256=" + base64.b64encode(digest.digest()).decode()

    big = server.http.get(artifacts_path(server, "made", "data ä.bin"))
    assert big.content == bytes(range(256)) * 1000
    assert big.headers["content-disposition"] == "attachment; filename*=utf-8''data%20%C3%A4.bin"


def test_an_unknown_artifact_is_a_404_naming_the_ones_there_are(server: RunServer) -> None:
    server.executed("made", WRITE, outputs=OUTPUTS)
    r = server.http.get(artifacts_path(server, "made", "nope"))
    assert is_status(r.json(), 404, "NotFound")
    assert r.json()["message"] == 'run "made" has no artifact "nope"; its artifacts are report, data ä.bin'
    server.executed("bare", "print('no outputs')")
    r = server.http.get(artifacts_path(server, "bare", "nope"))
    assert r.json()["message"] == 'run "bare" has no artifact "nope"; it has none'
    assert server.http.get(artifacts_path(server, "bare")).json()["items"] == []


def test_unknown_runs_and_runs_not_started(server: RunServer) -> None:
    assert is_status(server.http.get(artifacts_path(server, "ghost")).json(), 404, "NotFound")
    assert is_status(server.http.get(artifacts_path(server, "ghost", "x")).json(), 404, "NotFound")
    server.run("queued", phase="Queued")
    assert server.http.get(artifacts_path(server, "queued")).json()["items"] == []
    r = server.http.get(artifacts_path(server, "queued", "report"))
    assert is_status(r.json(), 404, "NotFound")
    assert r.json()["message"] == 'run "queued" has no artifact "report": it has not started (phase Queued)'
