"""What the Kubernetes store does beyond the shared contract (``test_contract.py`` runs that on it
too), against a stand-in cluster: 410 passed through as ``Gone``, leader election on a
``coordination.k8s.io/v1`` Lease, what it refuses (sealed values) and how it fails (bad URLs, an
unreachable server), and a ``joch server --store kubernetes://`` keeping its objects there."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from joch.api import errors
from joch.api.kinds import AGENT, SECRET
from joch.controllers.leader import LeaderElector
from joch.store import Store, WatchOptions, open_store
from joch.store.kubernetes import KubernetesStore
from support import stop_server, wait_ready
from support.kubecluster import kubeconfig


def agent(name: str) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name, "namespace": "default"},
            "spec": {"providerRef": {"name": "p"}}}


@pytest.fixture
def store(kubernetes_url: str) -> Iterator[KubernetesStore]:
    s = KubernetesStore(kubernetes_url)
    yield s
    s.close()


def test_a_compacted_resource_version_is_gone(store: KubernetesStore, backing: Store) -> None:
    old = store.create(AGENT, agent("a"))["metadata"]["resourceVersion"]
    store.create(AGENT, agent("b"))
    last = store.create(AGENT, agent("c"))["metadata"]["resourceVersion"]
    backing.compact(int(last) - 1)
    with pytest.raises(errors.Gone, match="too old resource version"):
        store.watch(AGENT, WatchOptions(resource_version=old))
    with store.watch(AGENT, WatchOptions(resource_version=str(int(last) - 1))) as w:
        event = w.get(timeout=3)
        assert event is not None and event.object["metadata"]["name"] == "c"


class _MidStreamExpiry(http.server.BaseHTTPRequestHandler):
    """An apiserver's watch that expires mid-stream, on the wire as kube-apiserver writes it: HTTP 200,
    newline-delimited events, then an ``ERROR`` event carrying a 410 ``Expired`` Status (what etcd's
    compaction under a watcher looks like to a client)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if "watch=" not in self.path:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [{"type": "ADDED", "object": {**agent(f"b{i}"), "metadata": {
                      **agent(f"b{i}")["metadata"], "resourceVersion": str(20 + i)}}} for i in range(3)]
        events.append({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 410,
            "reason": "Expired", "message": "The resourceVersion for the provided watch is too old."}})
        for event in events:
            line = (json.dumps(event) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_an_error_event_mid_stream_ends_the_watch_with_expired(tmp_path: Path) -> None:
    """Deterministic: the stand-in's own replay can finish before a compaction lands, so the ERROR a
    real apiserver sends mid-stream is served here by a server that always sends it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MidStreamExpiry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = kubeconfig(f"http://127.0.0.1:{server.server_address[1]}", tmp_path / "kubeconfig")
    store = KubernetesStore(f"kubernetes://?kubeconfig={config}")
    try:
        w = store.watch(AGENT, WatchOptions(resource_version="19"))
        seen = []
        while (event := w.get(timeout=3)) is not None:
            seen.append(event)
        w.close()
        assert [e.type for e in seen] == ["ADDED", "ADDED", "ADDED", "ERROR"]
        assert [e.revision for e in seen[:3]] == [20, 21, 22]
        assert seen[-1].object["code"] == 410 and seen[-1].object["reason"] == "Expired"
    finally:
        store.close()
        server.shutdown()
        server.server_close()


def test_a_watch_compacted_while_replaying_loses_nothing_silently(store: KubernetesStore, backing: Store) -> None:
    """Against the stand-in: the compaction lands during the replay (the watch ends with 410 ``Expired``)
    or after it (every change arrived, in order); which one depends on the machine's load, and either
    way no change goes missing without an ERROR to say so."""
    rv = store.create(AGENT, agent("a"))["metadata"]["resourceVersion"]
    with backing.transaction() as tx:
        for i in range(600):
            tx.create(AGENT, agent(f"b{i}"))
    w = store.watch(AGENT, WatchOptions(resource_version=rv))
    first = w.get(timeout=3)
    assert first is not None and first.type == "ADDED"
    backing.compact(backing.current_revision())
    seen = [first]
    while (event := w.get(timeout=3)) is not None:
        seen.append(event)
    w.close()
    added = [e.object["metadata"]["name"] for e in seen if e.type == "ADDED"]
    assert added == [f"b{i}" for i in range(len(added))]
    if seen[-1].type == "ERROR":
        assert seen[-1].object["code"] == 410 and seen[-1].object["reason"] == "Expired"
    else:
        assert len(added) == 600


def test_leader_election_takes_a_coordination_lease(kubernetes_url: str, kube_cluster: Any) -> None:
    stores = [KubernetesStore(kubernetes_url), KubernetesStore(kubernetes_url)]
    electors = [LeaderElector(s, identity=f"replica-{i}", namespace="joch-system", name="joch-test-lease",
                              lease_duration=3, renew_deadline=2, retry_period=0.2,
                              on_started_leading=lambda: None, on_stopped_leading=lambda: None)
                for i, s in enumerate(stores)]
    try:
        electors[0].start()
        deadline = time.monotonic() + 5
        while not electors[0].is_leader and time.monotonic() < deadline:
            time.sleep(0.05)
        assert electors[0].is_leader
        electors[1].start()
        lease = httpx.get(f"{kube_cluster.url}/apis/coordination.k8s.io/v1/namespaces/joch-system/leases/"
                          "joch-test-lease", timeout=5).json()
        assert lease["apiVersion"] == "coordination.k8s.io/v1" and lease["spec"]["holderIdentity"] == "replica-0"
        time.sleep(0.5)
        assert not electors[1].is_leader and electors[1].holder == "replica-0"
        electors[0].stop()  # releases: the other replica takes over at its next retry
        deadline = time.monotonic() + 5
        while not electors[1].is_leader and time.monotonic() < deadline:
            time.sleep(0.05)
        assert electors[1].is_leader
        lease = httpx.get(f"{kube_cluster.url}/apis/coordination.k8s.io/v1/namespaces/joch-system/leases/"
                          "joch-test-lease", timeout=5).json()
        assert lease["spec"]["holderIdentity"] == "replica-1" and lease["spec"]["leaseTransitions"] == 1
    finally:
        for elector in electors:
            elector.stop()
        for s in stores:
            s.close()


def test_secret_values_are_refused_with_where_to_keep_them(store: KubernetesStore) -> None:
    secret = {"apiVersion": SECRET.api_version, "kind": SECRET.kind,
              "metadata": {"name": "token", "namespace": "default"}, "spec": {"data": {"TOKEN": "aGk="}}}
    with pytest.raises(errors.Invalid, match="Kubernetes Secret") as caught:
        store.create(SECRET, secret)
    assert caught.value.causes[0].field == "spec.data"


def test_a_failed_transaction_deletes_what_it_created(store: KubernetesStore) -> None:
    store.create(AGENT, agent("taken"))
    with pytest.raises(errors.AlreadyExists):
        with store.transaction() as tx:
            tx.create(AGENT, agent("fresh"))
            tx.create(AGENT, agent("taken"))
    assert [o["metadata"]["name"] for o in store.list(AGENT).items] == ["taken"]


def test_an_update_without_resource_version_is_last_writer_wins(store: KubernetesStore) -> None:
    """Custom resources refuse unconditional updates; the store reads the current version for one."""
    created = store.create(AGENT, agent("a"))
    meta = {k: v for k, v in created["metadata"].items() if k != "resourceVersion"}
    updated = store.update(AGENT, {**created, "metadata": meta, "spec": {"providerRef": {"name": "z"}}})
    assert updated["spec"]["providerRef"] == {"name": "z"} and updated["metadata"]["generation"] == 2


@pytest.mark.parametrize(("url", "error", "text"), [
    ("kubernetes://somewhere/else", errors.BadRequest, "kubernetes://?kubeconfig=PATH&context=NAME"),
    ("kubernetes://?kubecfg=/x", errors.BadRequest, "unsupported Kubernetes store URL"),
    ("kubernetes://?kubeconfig=/no/such/kubeconfig", errors.ServiceUnavailable, "/no/such/kubeconfig"),
])
def test_bad_urls_say_what_to_write(url: str, error: type[errors.JochError], text: str) -> None:
    with pytest.raises(error, match="kube") as caught:
        open_store(url)
    assert text in caught.value.message


def test_bare_kubernetes_means_in_cluster_or_kubeconfig(kubernetes_url: str, kube_cluster: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    store = open_store("kubernetes")
    try:
        assert isinstance(store, KubernetesStore)
        created = store.create(AGENT, agent("via-kubeconfig-env"))
        assert httpx.get(f"{kube_cluster.url}/apis/joch.dev/v1alpha1/namespaces/default/agents/via-kubeconfig-env",
                         timeout=5).json()["metadata"]["uid"] == created["metadata"]["uid"]
    finally:
        store.close()


def test_an_unreachable_api_server_is_service_unavailable(tmp_path: Path) -> None:
    from support.jochserver import free_port
    from support.kubecluster import kubeconfig

    config = kubeconfig(f"http://127.0.0.1:{free_port()}", tmp_path / "kubeconfig")
    store = open_store(f"kubernetes://?kubeconfig={config}&context=stand-in")
    try:
        with pytest.raises(errors.ServiceUnavailable, match="cannot reach the Kubernetes API server at http://127"):
            store.get(AGENT, "default", "a")
    finally:
        store.close()


def test_joch_server_keeps_its_objects_in_the_cluster_and_runs_an_agent(kubernetes_url: str, kube_cluster: Any,
                                                                        tmp_path: Path) -> None:
    """``joch server --store kubernetes://``: an apply lands in the cluster, the controllers (leading
    on a coordination Lease) run an agent to Succeeded, its status written to the custom resource."""
    import json
    import sys

    from support.jochserver import JOCH, free_port

    port = free_port()
    log = tmp_path / "joch.log"
    process = subprocess.Popen(
        [str(JOCH), "server", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--sandbox", "none",
         "--store", kubernetes_url],
        stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    manifests = [
        {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
         "spec": {"binary": sys.executable, "argsTemplate": ["-c", "print('hello')"]}},
        agent("demo"),
        {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "once"},
         "spec": {"agentRef": {"name": "demo"}, "implementation": {"inline": {"text": "say hello"}}}},
    ]
    try:
        wait_ready(url, process)
        applied = httpx.post(f"{url}/v1/resources/apply", content="\n---\n".join(json.dumps(m) for m in manifests),
                             headers={"content-type": "application/yaml"}, timeout=30)
        assert applied.status_code == 200, applied.text
        cluster_run = f"{kube_cluster.url}/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns/once"
        deadline = time.monotonic() + 30
        while (status := httpx.get(cluster_run, timeout=5).json().get("status") or {}).get("phase") not in (
                "Succeeded", "Failed", "Cancelled"):
            assert time.monotonic() < deadline, (status, log.read_text()[-2000:])
            time.sleep(0.1)
        assert status["phase"] == "Succeeded", status
        assert httpx.get(f"{url}/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns/once",
                         timeout=5).json()["status"]["phase"] == "Succeeded"
        lease = httpx.get(f"{kube_cluster.url}/apis/coordination.k8s.io/v1/namespaces/joch-system/leases/"
                          "joch-controller-manager", timeout=5).json()
        assert lease["spec"]["holderIdentity"], lease
    finally:
        stop_server(process)
    assert "Traceback" not in log.read_text(), log.read_text()


def test_shared_keys_live_in_one_kubernetes_secret(kubernetes_url: str, kube_cluster: Any) -> None:
    first, second = KubernetesStore(kubernetes_url), KubernetesStore(kubernetes_url)
    try:
        key = first.shared_key("run-token")
        assert len(key) == 32 and second.shared_key("run-token") == key
        other = second.shared_key("another")
        assert other != key and first.shared_key("another") == other
        secret = httpx.get(f"{kube_cluster.url}/api/v1/namespaces/joch-system/secrets/joch-shared-keys",
                           timeout=5).json()
        assert sorted(secret["data"]) == ["another", "run-token"]
    finally:
        first.close()
        second.close()


def test_usage_rows_are_refused_with_the_fix(store: KubernetesStore) -> None:
    from joch.store.base import UsageFilter

    with pytest.raises(errors.MethodNotAllowed, match="SQL store"):
        store.usage_totals(UsageFilter())


def test_closing_a_watch_ends_its_streams_at_once(store: KubernetesStore) -> None:
    """Each stream is a thread blocked reading the apiserver: close must wake it, not leave it (and its
    connection) waiting for the next event."""
    import threading

    def streams() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "joch-kube-watch")

    before = streams()
    watches = [store.watch(AGENT, WatchOptions(resource_version=str(store.current_revision()))) for _ in range(3)]
    everything = store.watch(None)
    assert streams() > before + 3
    for w in [*watches, everything]:
        w.close()
    deadline = time.monotonic() + 2
    while streams() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert streams() == before


def test_the_audit_log_is_the_apiservers(store: KubernetesStore) -> None:
    from joch.api.audit import AuditEntry, AuditQuery

    store.audit(AuditEntry(verb="create", kind="Agent", namespace="default", name="a"))  # records nothing
    with pytest.raises(errors.MethodNotAllowed, match="apiserver's audit log"):
        store.audit_events(AuditQuery())


def test_a_stream_the_apiserver_ends_is_reopened_where_it_was(kubernetes_url: str) -> None:
    """Streams are bounded (``timeoutSeconds``, here 1 s) and reopened from the last revision seen:
    nothing is lost or repeated across the reconnections."""
    store = KubernetesStore(kubernetes_url, watch_timeout=(1, 1))
    try:
        rv = store.create(AGENT, agent("before"))["metadata"]["resourceVersion"]
        with store.watch(AGENT, WatchOptions(resource_version=rv)) as w:
            names = []
            for i in range(3):
                time.sleep(1.2)  # the stream ends and is reopened in between
                store.create(AGENT, agent(f"after-{i}"))
                event = w.get(timeout=5)
                assert event is not None and event.type == "ADDED"
                names.append(event.object["metadata"]["name"])
            assert w.get(timeout=0.3) is None
        assert names == ["after-0", "after-1", "after-2"]
    finally:
        store.close()
