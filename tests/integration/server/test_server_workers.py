"""``joch server --workers N``: real supervisor and worker processes on one SQLite store.

Creates over many connections land in both workers, each audited; a watch served by one worker sees
what the other created at once (``SqliteBackend.listen``); the quickstart is applied once, before
the second worker starts; SIGTERM stops everything with exit 0; a killed worker is replaced; a
supervisor killed with SIGKILL takes its workers with it; a first worker that cannot start ends the
supervisor as one process would end; ``--workers 0`` is a usage error; a burst of connections
while every worker is busy waits for them instead of being closed; a terminal's Ctrl-C (SIGINT to
the foreground process group) reaches the supervisor alone."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from joch.api.audit import AuditQuery
from joch.store import open_store
from support import ports, provider, token_file

JOCH = Path(sys.executable).with_name("joch")
QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart"
PROVIDERS = "/apis/joch.dev/v1alpha1/namespaces/default/agentproviders"
TOKEN = "workers-test-token"


@dataclass
class Served:
    proc: subprocess.Popen[str]
    base: str
    log: Path
    data: Path

    def workers(self) -> list[int]:
        return [int(pid) for pid in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]

    def text(self) -> str:
        return self.log.read_text()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped, as in a container without an init, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(predicate: object, seconds: float, what: str, served: Served | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        log = served.text()[-3000:] if served is not None else ""
        assert time.monotonic() < deadline, f"{what} did not happen in {seconds}s\n{log}"
        time.sleep(0.1)


@contextmanager
def server(tmp_path: Path, *args: str, workers: int = 2) -> Iterator[Served]:
    port = ports.free_port()
    log = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOCH_", "PROMETHEUS_"))}
    env["TMPDIR"] = str(tmp_path)  # the metrics directory: left behind by a supervisor killed with SIGKILL
    proc = subprocess.Popen([str(JOCH), "server", "--data-dir", str(tmp_path / "data"), "--port", str(port),
                             "--sandbox", "none", "--workers", str(workers), *args],
                            stdout=log.open("a"), stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                            process_group=0)  # as a shell starts a job: a group of its own
    served = Served(proc, f"http://127.0.0.1:{port}", log, tmp_path / "data")
    try:
        wait_for(lambda: "worker processes (pids" in served.text() or proc.poll() is not None, 90,
                 "the workers' start", served)
        assert proc.poll() is None, served.text()
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def connections(served: Served) -> dict[int, int]:
    """Established connections to the server's port held by each worker."""
    port = int(served.base.rsplit(":", 1)[1])
    established = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                established.add(fields[9])
    held = {}
    for pid in served.workers():
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
            except OSError:
                continue
            if match:
                inodes.add(match.group(1))
        held[pid] = len(inodes & established)
    return held


def test_creates_over_many_connections_land_in_every_worker_audited_and_watched(tmp_path: Path) -> None:
    tokens = token_file(tmp_path / "tokens.csv", {"alice": "system:masters"}, lambda _: TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with server(tmp_path, "--token-file", str(tokens), "--apply-missing", str(QUICKSTART)) as served:
        log = served.text()
        assert log.count("agent.joch.dev/demo created") == 1, log
        second = served.workers()[1]  # started once the first had applied it
        assert log.index("agent.joch.dev/demo created") < log.index(f"Started server process [{second}]"), log
        rv = httpx.get(f"{served.base}{PROVIDERS}", headers=auth, timeout=10).json()["metadata"]["resourceVersion"]
        seen: dict[str, float] = {}
        watching = threading.Event()

        def watch() -> None:
            with httpx.stream("GET", f"{served.base}{PROVIDERS}?watch=1&resourceVersion={rv}", headers=auth,
                              timeout=60) as response:
                watching.set()
                for line in response.iter_lines():
                    name = json.loads(line)["object"]["metadata"]["name"]
                    seen.setdefault(name, time.monotonic())
                    if len(seen) == 8 * 15:
                        return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        assert watching.wait(15)
        created: dict[str, float] = {}
        statuses: list[int] = []
        clients = [httpx.Client(base_url=served.base, headers=auth, timeout=30) for _ in range(8)]
        try:
            for client in clients:  # one connection each, opened one after another
                client.get("/readyz")
            held = connections(served)

            def create(i: int, client: httpx.Client) -> None:
                for j in range(15):
                    name = f"w-{i}-{j}"
                    statuses.append(client.post(PROVIDERS, json=provider(name)).status_code)
                    created[name] = time.monotonic()

            threads = [threading.Thread(target=create, args=(i, c)) for i, c in enumerate(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        finally:
            for client in clients:
                client.close()
        watcher.join(10)
        assert statuses == [201] * len(created) and len(created) == 8 * 15
        # the supervisor hands connections round in turn: the watch's and the eight clients' split evenly
        assert max(held.values()) - min(held.values()) <= 1, f"the connections were not spread evenly: {held}"
        assert set(seen) >= set(created), sorted(set(created) - set(seen))
        late = {name: seen[name] - at for name, at in created.items() if seen[name] - at > 0.5}
        assert not late, late
    assert served.proc.returncode == 0, served.text()
    store = open_store(f"sqlite:///{served.data / 'joch.db'}", history=None)
    try:
        rows = store.audit_events(AuditQuery(actor="alice", verb="create", limit=1000)).items
    finally:
        store.close()
    assert sorted(r.name for r in rows if (r.name or "").startswith("w-")) == sorted(created)
    assert "Traceback" not in served.text(), served.text()


def test_a_killed_worker_is_replaced_and_sigterm_stops_all(tmp_path: Path) -> None:
    with server(tmp_path, "--no-controllers", workers=3) as served:
        workers = served.workers()
        assert len(workers) == 3
        os.kill(workers[1], signal.SIGKILL)
        wait_for(lambda: len(set(served.workers()) - set(workers)) == 1, 30, "a new worker", served)
        assert "was killed by signal 9; starting it again" in served.text()
        assert httpx.get(f"{served.base}/readyz", timeout=10).status_code == 200
        everyone = served.workers()
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(30) == 0, served.text()
    assert not [pid for pid in everyone if alive(pid)]
    assert "Traceback" not in served.text(), served.text()


def test_workers_stop_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    with server(tmp_path, "--no-controllers") as served:
        workers = served.workers()
        served.proc.kill()
        served.proc.wait()
        wait_for(lambda: not any(alive(pid) for pid in workers), 10, "the workers' exit")


def test_a_first_worker_that_cannot_start_ends_the_supervisor_as_one_process_ends(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: p}\nspec: {}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
    ran = []
    for workers in ("1", "2"):
        ran.append(subprocess.run([str(JOCH), "server", "--data-dir", str(tmp_path / "data"),
                                   "--port", str(ports.free_port()), "--no-controllers", "--apply", str(bad),
                                   "--workers", workers],
                                  capture_output=True, text=True, env=env, timeout=90, cwd=tmp_path))
    one, two = ran
    assert one.returncode != 0 and two.returncode == one.returncode, (one.stderr, two.stderr)
    error = [line for line in one.stderr.splitlines() if line.startswith("error")]
    assert error and [line for line in two.stderr.splitlines() if line.startswith("error")] == error, two.stderr


def test_zero_workers_is_a_usage_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}
    for args, extra in ((["--workers", "0"], {}), ([], {"JOCH_SERVER_WORKERS": "0"})):
        done = subprocess.run([str(JOCH), "server", "--data-dir", str(tmp_path / "data"), *args],
                              capture_output=True, text=True, env={**env, **extra}, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "--workers must be at least 1 (got 0)" in done.stderr


def test_a_burst_of_connections_while_every_worker_is_busy_waits_for_them(tmp_path: Path) -> None:
    """More connections than the workers' channels hold (about 280 each here) arrive while every
    worker's loop is busy (stopped, here): they wait, in the supervisor's hand and the backlog, and
    are all served once the workers go on; none is closed for want of a worker."""
    burst = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < burst + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(burst + 200, hard), hard))
    port = None
    clients: list[socket.socket] = []
    try:
        with server(tmp_path, "--no-controllers") as served:
            port = int(served.base.rsplit(":", 1)[1])
            workers = served.workers()
            for pid in workers:
                os.kill(pid, signal.SIGSTOP)
            try:
                for _ in range(burst):
                    client = socket.create_connection(("127.0.0.1", port), timeout=30)
                    clients.append(client)
                    client.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                time.sleep(1.0)  # the supervisor hands over what it can meanwhile
            finally:
                for pid in workers:
                    os.kill(pid, signal.SIGCONT)
            answers = []
            for client in clients:
                try:
                    answers.append(client.recv(64).split(b"\r\n", 1)[0])
                except OSError as exc:
                    answers.append(repr(exc).encode())
            refused = [a for a in answers if a != b"HTTP/1.1 200 OK"]
            assert not refused, f"{len(refused)} of {burst} connections were not served: {set(refused)}"
            assert "no worker could take" not in served.text()
    finally:
        for client in clients:
            client.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_ctrl_c_in_a_terminal_reaches_the_supervisor_alone(tmp_path: Path) -> None:
    """The terminal sends SIGINT to its foreground process group: the workers, in a group of their
    own, get only the supervisor's SIGTERM, and so stop once each, cleanly."""
    with server(tmp_path) as served:
        workers = served.workers()
        group = os.getpgid(served.proc.pid)
        assert all(os.getpgid(pid) != group for pid in workers), (group, workers)
        os.killpg(group, signal.SIGINT)
        assert served.proc.wait(30) == 0, served.text()
    assert not [pid for pid in workers if alive(pid)]
    log = served.text()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert log.count("Finished server process") == len(workers), log
