"""``joch audit`` against a real ``joch server``: the table, filters, -o json, paging past one
page, and bad flags reported as errors naming them."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from integration.cli.conftest import JOCH, free_port
from joch.api.audit import MAX_LIMIT, AuditEntry
from joch.cli.main import app
from joch.server.testing import live_server
from joch.store import open_store
from support import stop_server, wait_ready


def providers(prefix: str) -> str:
    # Names of their own per test: the server (one per module) keeps the audit rows of earlier tests.
    return "".join(f"---\napiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {{name: {prefix}-{i}}}\n"
                   "spec: {binary: /bin/true}\n" for i in range(3))


HEADERS = ["TIME", "ACTOR", "VERB", "KIND", "NAMESPACE", "NAME", "DECISION", "REASON"]


def test_audit_prints_what_an_apply_did_newest_first(joch) -> None:
    joch.ok("apply", "-f", "-", input=providers("audited"))
    out = joch.ok("audit", "--kind", "ap", "--since", "10m", "--verb", "apply").out.splitlines()
    assert out[0].split() == HEADERS
    rows = [line.split() for line in out[1:]]
    assert [r[5] for r in rows] == ["audited-2", "audited-1", "audited-0"]
    for r in rows:
        assert r[0].endswith("Z") and len(r[0]) == 20  # to the second
        assert r[1:5] == ["system:anonymous", "apply", "AgentProvider", "default"]
        assert r[6:] == ["allowed", "created"]


def test_audit_filters_output_and_paging(joch) -> None:
    joch.ok("apply", "-f", "-", input=providers("paged"))
    body = json.loads(joch.ok("audit", "--kind", "agentproviders", "--name", "paged-1", "-o", "json").out)
    assert body["kind"] == "AuditEventList"
    (item,) = body["items"]
    assert (item["name"], item["sourceIP"], item["decision"]) == ("paged-1", "127.0.0.1", "allowed")
    assert item["requestId"]

    # --limit across pages of the server: two rows, newest first, then stop.
    two = joch.ok("audit", "--kind", "ap", "--limit", "2").out.splitlines()[1:]
    assert [line.split()[5] for line in two] == ["paged-2", "paged-1"]

    nothing = joch("audit", "--decision", "denied", "--since", "10m")
    assert nothing.code == 0 and nothing.out == "" and "No audit events found in default namespace" in nothing.err
    assert joch("audit", "-n", "elsewhere", "--kind", "ap").out == ""
    assert len(joch.ok("audit", "-A", "--kind", "ap", "--name", "paged-0").out.splitlines()) == 2


def test_audit_reports_bad_flags_by_name(joch) -> None:
    since = joch("audit", "--since", "yesterday")
    assert since.code == 2 and "since" in since.err and "yesterday" in since.err
    decision = joch("audit", "--decision", "maybe")
    assert decision.code == 2 and "--decision must be one of allowed, denied" in decision.err
    assert joch("audit", "--limit", "0").code == 2
    retention = joch("server", "--audit-retention", "forever")
    assert retention.code == 2 and "--audit-retention" in retention.err


def test_joch_server_prunes_rows_older_than_audit_retention_at_start(tmp_path: Path) -> None:
    def start(*flags: str) -> tuple[subprocess.Popen[str], str]:
        port = free_port()
        proc = subprocess.Popen([str(JOCH), "server", "--data-dir", str(tmp_path), "--port", str(port),
                                 "--no-controllers", *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc)
        return proc, base

    proc, base = start()
    try:
        applied = httpx.post(f"{base}/v1/resources/apply", content=providers("old"),
                             headers={"Content-Type": "application/yaml"})
        assert applied.status_code == 200, applied.text
        assert len(httpx.get(f"{base}/v1/audit").json()["items"]) == 3
    finally:
        stop_server(proc)
    time.sleep(1.5)
    proc, base = start("--audit-retention", "1s")
    try:
        deadline = time.monotonic() + 10
        while httpx.get(f"{base}/v1/audit").json()["items"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert httpx.get(f"{base}/v1/audit").json()["items"] == []
    finally:
        stop_server(proc)


def test_audit_pages_through_continue_up_to_the_limit(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    try:
        with store.transaction() as tx:
            for i in range(MAX_LIMIT + 3):
                tx.audit(AuditEntry("dispatch", kind="AgentRun", namespace="default", name=f"r{i}"))
        with live_server(store) as server:
            result = CliRunner().invoke(app, ["--server", server.url, "audit", "--limit", str(MAX_LIMIT + 2),
                                              "-o", "json"], env={"JOCH_NAMESPACE": None})
            assert result.exit_code == 0, result.stderr
            names = [item["name"] for item in json.loads(result.stdout)["items"]]
            # Newest first across the server's two pages, and no more than asked for.
            assert names == [f"r{i}" for i in range(MAX_LIMIT + 2, 0, -1)]
    finally:
        store.close()
