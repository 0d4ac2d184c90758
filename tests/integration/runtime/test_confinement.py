"""From inside a real sandboxed agent (bubblewrap, real processes, real HTTP servers on 127.0.0.1):
a root runner's agent is an unprivileged uid that cannot read /etc/shadow, another run's worktree or
the data dir, yet commits in its worktree, and the runner still takes changes.patch from it; the
network is the host's (on), none (off), or only the allowed host:ports through the runner's proxy
(limited); a network the runtime cannot enforce fails the start instead."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.runtime.helpers import PYTHON, Repo, RunnerRun, git_source, python_agent, spec, wait_for
from joch.runtime import sandbox
from joch.runtime.base import Network, Output, RunId, RunState, Sandbox
from joch.runtime.local import LocalRuntime

ROOT = os.geteuid() == 0


def finished(rt: LocalRuntime, ref: dict[str, Any], timeout: float = 20) -> RunState:
    return wait_for(lambda: (s := rt.status(ref)).finished and s, timeout)  # type: ignore[no-any-return]


def log_of(ref: dict[str, Any]) -> str:
    return (Path(ref["dir"]) / "log").read_text()


def needs_bwrap() -> None:
    problem = sandbox.sandbox_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"bubblewrap is required in CI: {problem}")
        pytest.skip(problem)


@pytest.fixture
def sandboxed(tmp_path: Path) -> Iterator[LocalRuntime]:
    needs_bwrap()
    rt = LocalRuntime(tmp_path / "data", poll_interval=0.02, sandbox="bwrap")
    yield rt
    rt.close()


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from {self.server.server_address[1]} for {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[tuple[int, int]]:
    """Two HTTP servers on the host's 127.0.0.1: their ports."""
    started = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello) for _ in range(2)]
    for server in started:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield started[0].server_address[1], started[1].server_address[1]
    for server in started:
        server.shutdown()
        server.server_close()


# Fetches each URL (through the proxy the environment names, if any) and prints what came back.
FETCH = """
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        print(url, "->", urllib.request.urlopen(url, timeout=5).read().decode())
    except urllib.error.HTTPError as exc:
        print(url, "-> HTTP", exc.code, exc.read().decode().strip())
    except OSError as exc:
        print(url, "-> failed:", type(exc).__name__)
"""


@pytest.mark.skipif(not ROOT, reason="a runner drops the agent's privileges only when it runs as root")
def test_a_root_runners_agent_is_nobody_and_reads_no_secret_of_the_host(sandboxed: LocalRuntime, repo: Repo) -> None:
    # Another run's worktree, alive while this one looks.
    other_outputs = Path(sandboxed.workspace(RunId("default", "demo", "conf-other"), None).outputs)
    other = sandboxed.submit(spec([*python_agent(
        "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"), f"{other_outputs}/go"],
        uid="conf-other", git=git_source(repo)))
    wait_for(lambda: sandboxed.status(other).phase == "Running")
    other_readme = sandboxed.workspace_root(RunId("default", "demo", "conf-other")) / "README.md"
    assert other_readme.exists()
    look = f"""
import os, json, subprocess
seen = {{"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
        "id": subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip()}}
for name, path in (("shadow", "/etc/shadow"), ("other", {str(other_readme)!r})):
    try:
        open(path).read()
        seen[name] = "read"
    except OSError as exc:
        seen[name] = type(exc).__name__
seen["data"] = [os.path.join(b, f) for b, _, fs in os.walk({str(sandboxed.root)!r}) for f in fs
                if "conf-other" in b or f in ("state.json", "spec.json", "ref.json", "log")]
print(json.dumps(seen))
"""
    try:
        ref = sandboxed.submit(spec(python_agent(look), uid="conf-look", git=git_source(repo)))
        state = finished(sandboxed, ref)
    finally:
        (other_outputs / "go").touch()
    assert state.phase == "Succeeded", (state, log_of(ref))
    seen = json.loads(log_of(ref))
    assert (seen["uid"], seen["gid"], seen["id"]) == (65534, 65534, "65534")
    assert set(seen["groups"]) <= {65534}
    assert seen["shadow"] == "PermissionError"
    assert seen["other"] == "FileNotFoundError"  # the data dir is an empty tmpfs: other runs are not there
    assert seen["data"] == []
    assert state.sandbox == Sandbox(mode="bwrap", user=65534, network="on", reason=None)
    assert finished(sandboxed, other).phase == "Succeeded"


@pytest.mark.skipif(not ROOT, reason="a runner drops the agent's privileges only when it runs as root")
def test_the_agent_commits_as_nobody_and_the_runner_still_writes_the_patch(sandboxed: LocalRuntime,
                                                                          repo: Repo) -> None:
    work = ("set -e; echo agent >> README.md; git commit --quiet -am 'agent work'; echo new > new.txt; "
            "echo home > $HOME/note; echo out > \"$1/result.txt\"; id -u")
    outputs = sandboxed.workspace(RunId("default", "demo", "conf-commit"), None).outputs
    ref = sandboxed.submit(spec(["sh", "-c", work, "work", outputs], uid="conf-commit", git=git_source(repo),
                                outputs=(Output("result", "result.txt"),)))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, log_of(ref))
    assert log_of(ref) == "65534\n"
    patch = (Path(ref["dir"]) / "artifacts/changes.patch").read_text()
    assert "+agent" in patch and "+new" in patch and "new.txt" in patch
    assert (Path(ref["dir"]) / "artifacts/outputs/result.txt").read_text() == "out\n"
    root = sandboxed.workspace_root(RunId("default", "demo", "conf-commit"))
    assert root.stat().st_uid == 65534 and (root / "new.txt").stat().st_uid == 65534
    # ... and no other process of that uid on the host gets to them.
    for private in (root.parent, sandboxed.mirrors):
        assert private.stat().st_mode & 0o777 == 0o700, private
    # The next run of the same repository (a fetch into the mirror the agent wrote objects into) works.
    ref = sandboxed.submit(spec(["git", "log", "-1", "--format=%s"], uid="conf-next", git=git_source(repo)))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, log_of(ref))
    assert log_of(ref) == "second\n"


@pytest.mark.skipif(not ROOT, reason="a runner drops the agent's privileges only when it runs as root")
def test_the_agent_commits_under_a_server_with_a_strict_umask(tmp_path: Path, repo: Repo) -> None:
    needs_bwrap()
    before = os.umask(0o077)  # the mirror's config, HEAD and packed-refs are root's only as written
    try:
        rt = LocalRuntime(tmp_path / "data", poll_interval=0.02, sandbox="bwrap")
        try:
            ref = rt.submit(spec(["sh", "-c", "echo x >> README.md && git commit --quiet -am umask && git log -1 "
                                 "--format=%s"], uid="conf-umask", git=git_source(repo)))
            state = finished(rt, ref)
        finally:
            rt.close()
    finally:
        os.umask(before)
    assert state.phase == "Succeeded", (state, log_of(ref))
    assert log_of(ref) == "umask\n"


# Replaces the object of README.md's content with other content: in the agent's repository and in
# every object directory it borrows from (its alternates: the repository's mirror).
TAMPER = """
import os, subprocess, zlib
common = subprocess.run(["git", "rev-parse", "--git-common-dir"], capture_output=True, text=True).stdout.strip()
blob = subprocess.run(["git", "rev-parse", "HEAD:README.md"], capture_output=True, text=True).stdout.strip()
dirs = [os.path.join(common, "objects")]
try:
    with open(os.path.join(common, "objects", "info", "alternates")) as f:
        dirs += [line.strip() for line in f if line.strip()]
except OSError:
    pass
assert len(dirs) > 1, dirs
data = b"tampered\\n"
for objects in dirs:
    obj = os.path.join(objects, blob[:2], blob[2:])
    try:
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        with open(obj + ".new", "wb") as f:
            f.write(zlib.compress(b"blob %d\\0" % len(data) + data))
        os.replace(obj + ".new", obj)
    except OSError as exc:
        print("refused:", exc.strerror)
"""


def test_an_agent_cannot_change_the_objects_the_next_run_checks_out(sandboxed: LocalRuntime, repo: Repo) -> None:
    base = repo.commit({"README.md": "genuine\n"}, "loose objects")
    source = dataclasses.replace(git_source(repo), ref=base)
    ref = sandboxed.submit(spec(python_agent(TAMPER), uid="conf-tamper", git=source))
    assert finished(sandboxed, ref).phase == "Succeeded", log_of(ref)
    ref = sandboxed.submit(spec(["cat", "README.md"], uid="conf-after", git=source))
    assert finished(sandboxed, ref).phase == "Succeeded" and log_of(ref) == "genuine\n"


def test_a_ref_the_agent_planted_does_not_stop_the_next_runs_fetch(sandboxed: LocalRuntime, repo: Repo) -> None:
    # The mirror's refs are the agent's to write (its branches). git's fetch fails on a ref whose
    # object is missing ("bad object"), and the runner then goes on with the cached mirror: every
    # later run of the repository would get a stale commit. A link there would be read by root's git.
    work = ('set -e; refs="$(git rev-parse --git-common-dir)/refs/heads"; echo agent >> README.md; '
            "git commit --quiet -am 'agent work'; git branch agent-branch; "
            'echo 0123456789abcdef0123456789abcdef01234567 > "$refs/bogus"; ln -s /etc/shadow "$refs/planted"')
    ref = sandboxed.submit(spec(["sh", "-c", work], uid="conf-refs", git=git_source(repo)))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, log_of(ref))
    repo.commit({"README.md": "upstream moved on\n"}, "upstream moved on")
    ref = sandboxed.submit(spec(["git", "log", "-1", "--format=%s"], uid="conf-refs-next", git=git_source(repo)))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, log_of(ref))
    assert log_of(ref) == "upstream moved on\n", (Path(ref["dir"]) / "runner.log").read_text()


@pytest.mark.skipif(not ROOT, reason="a runner drops the agent's privileges only when it runs as root")
def test_another_agent_user_is_taken_and_a_bad_one_refused(tmp_path: Path) -> None:
    needs_bwrap()
    rt = LocalRuntime(tmp_path / "data", poll_interval=0.02, sandbox="bwrap", agent_user="4321:4322")
    try:
        ref = rt.submit(spec(["sh", "-c", "id -u; id -g; touch $HOME/x"], uid="conf-user"))
        state = finished(rt, ref)
        assert state.phase == "Succeeded", (state, log_of(ref))
        assert log_of(ref) == "4321\n4322\n"
        assert state.sandbox is not None and state.sandbox.user == 4321
    finally:
        rt.close()
    with pytest.raises(ValueError, match='--agent-user: no user "no-such-user-here"'):
        LocalRuntime(tmp_path / "data2", sandbox="bwrap", agent_user="no-such-user-here")


@pytest.mark.skipif(not ROOT, reason="a runner drops the agent's privileges only when it runs as root")
def test_a_data_dir_below_a_directory_the_agent_user_cannot_enter_still_works(repo: Repo) -> None:
    # /root (0700) with the server's Python below it, a data dir in a root-only directory: each
    # such directory is an empty tmpfs to the agent, with only what it needs mounted back.
    needs_bwrap()
    base = Path(tempfile.mkdtemp(prefix="joch-private-", dir="/var/tmp"))  # mode 0700, root's
    (base / "private.txt").write_text("root's\n")
    rt = LocalRuntime(base / "data", poll_interval=0.02, sandbox="bwrap")
    code = ("import os, sys; print(os.getuid(), sorted(os.listdir(sys.argv[1])), open('README.md').read().strip()); "
            "open(sys.argv[2] + '/out.txt', 'w').write('written')")
    try:
        outputs = rt.workspace(RunId("default", "demo", "conf-private"), None).outputs
        ref = rt.submit(spec([*python_agent(code), str(base), outputs], uid="conf-private", git=git_source(repo)))
        state = finished(rt, ref)
        assert state.phase == "Succeeded", (state, log_of(ref))
        assert log_of(ref) == "65534 ['data'] # Demo\n"
        assert Path(outputs, "out.txt").read_text() == "written"
    finally:
        rt.close()
        shutil.rmtree(base)


CONNECT_UNIX = """
import socket, sys
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(sys.argv[1])
    print("connected")
except OSError as exc:
    print("refused:", exc.strerror)
"""


@pytest.mark.parametrize(("mode", "said"), [("on", "connected"), ("off", "refused: No such file or directory"),
                                            ("limited", "refused: No such file or directory")])
def test_without_a_network_the_hosts_unix_sockets_are_out_of_reach(sandboxed: LocalRuntime, mode: str,
                                                                   said: str) -> None:
    # A daemon's socket under /run (a Postgres that trusts local connections: any user is its
    # superuser) is a network too; "off" must not leave it open.
    path = Path("/run") / f"joch-test-{os.getpid()}-{mode}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o777)
    listener.listen(1)
    try:
        ref = sandboxed.submit(spec([*python_agent(CONNECT_UNIX), str(path)], uid=f"conf-unix-{mode}",
                                    network=Network(mode=mode)))
        state = finished(sandboxed, ref)
        assert state.phase == "Succeeded", (state, log_of(ref))
        assert log_of(ref) == f"{said}\n"
    finally:
        listener.close()
        path.unlink()


def test_network_on_reaches_the_host(sandboxed: LocalRuntime, servers: tuple[int, int]) -> None:
    port = servers[0]
    ref = sandboxed.submit(spec([*python_agent(FETCH), f"http://127.0.0.1:{port}/x"], uid="net-on"))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, log_of(ref))
    assert log_of(ref) == f"http://127.0.0.1:{port}/x -> hello from {port} for /x\n"
    assert state.sandbox is not None and state.sandbox.network == "on"


def test_network_off_reaches_nothing_of_the_host(sandboxed: LocalRuntime, servers: tuple[int, int]) -> None:
    port = servers[0]
    ref = sandboxed.submit(spec([*python_agent(FETCH), f"http://127.0.0.1:{port}/x"], uid="net-off",
                                network=Network(mode="off")))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, log_of(ref))
    assert log_of(ref) == f"http://127.0.0.1:{port}/x -> failed: URLError\n"
    assert state.sandbox is not None and state.sandbox.network == "off"


CONNECT = """
import os, socket, sys
proxy = os.environ["HTTPS_PROXY"].removeprefix("http://").split(":")
for target in sys.argv[1:]:
    with socket.create_connection((proxy[0], int(proxy[1])), timeout=5) as s:
        s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
        answer = s.recv(4096).decode()
        print(answer.splitlines()[0])
        if " 200 " in answer:
            s.sendall(b"GET /tunnel HTTP/1.0\\r\\nHost: here\\r\\n\\r\\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            print(data.decode().split("\\r\\n\\r\\n", 1)[1])
"""


def test_network_limited_passes_only_the_allowed_host_ports(sandboxed: LocalRuntime,
                                                            servers: tuple[int, int]) -> None:
    allowed, other = servers
    ref = sandboxed.submit(spec([*python_agent(FETCH), f"http://127.0.0.1:{allowed}/ok",
                                 f"http://127.0.0.1:{other}/no"], uid="net-limited",
                                network=Network(mode="limited", allow=(f"127.0.0.1:{allowed}",))))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, log_of(ref))
    assert log_of(ref).splitlines() == [
        f"http://127.0.0.1:{allowed}/ok -> hello from {allowed} for /ok",
        f"http://127.0.0.1:{other}/no -> HTTP 403 joch: 127.0.0.1:{other} is not in this Agent's "
        "spec.security.network.allow",
    ]
    assert state.sandbox is not None and state.sandbox.network == "limited"
    runner_log = (Path(ref["dir"]) / "runner.log").read_text()
    assert f"refused GET 127.0.0.1:{other}" in runner_log and f"127.0.0.1:{allowed}" not in runner_log
    assert not (Path(ref["dir"]) / "network.sock").exists()  # the proxy is gone with the agent

    # CONNECT (what HTTPS goes through): a tunnel to the allowed port, 403 for the other.
    ref = sandboxed.submit(spec([*python_agent(CONNECT), f"127.0.0.1:{allowed}", f"127.0.0.1:{other}"],
                                uid="net-connect", network=Network(mode="limited", allow=(f"127.0.0.1:{allowed}",))))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, log_of(ref))
    assert log_of(ref).splitlines() == ["HTTP/1.1 200 Connection established", f"hello from {allowed} for /tunnel",
                                        "HTTP/1.1 403 Forbidden"]


def test_network_limited_without_the_proxy_reaches_nothing(sandboxed: LocalRuntime,
                                                           servers: tuple[int, int]) -> None:
    allowed = servers[0]
    code = "import os; [os.environ.pop(k) for k in list(os.environ) if k.lower().endswith('_proxy')]\n" + FETCH
    ref = sandboxed.submit(spec([*python_agent(code), f"http://127.0.0.1:{allowed}/direct"], uid="net-direct",
                                network=Network(mode="limited", allow=(f"127.0.0.1:{allowed}",))))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, log_of(ref))
    assert log_of(ref) == f"http://127.0.0.1:{allowed}/direct -> failed: URLError\n"


@pytest.mark.parametrize("mode", ["off", "limited"])
def test_a_network_that_cannot_be_enforced_fails_the_start(tmp_path: Path, mode: str) -> None:
    rt = LocalRuntime(tmp_path / "data", poll_interval=0.02, sandbox="none")
    try:
        ref = rt.submit(spec(["true"], uid=f"net-{mode}-none", network=Network(mode=mode)))  # type: ignore[arg-type]
        state = finished(rt, ref)
        assert (state.phase, state.reason) == ("Failed", "StartError"), state
        assert state.message is not None
        assert f"spec.security.network.mode is {mode}" in state.message
        assert "the server was started with --sandbox none" in state.message
        assert "--sandbox auto or bwrap" in state.message
        assert state.sandbox == Sandbox(mode="none", user=os.geteuid(), network=mode,
                                        reason="the server was started with --sandbox none")
        ref = rt.submit(spec(["true"], uid=f"net-{mode}-on"))
        state = finished(rt, ref)
        assert state.phase == "Succeeded"
        assert state.sandbox == Sandbox(mode="none", user=os.geteuid(), network="on",
                                        reason="the server was started with --sandbox none")
    finally:
        rt.close()


def test_the_reason_for_no_sandbox_reaches_the_record(tmp_path: Path) -> None:
    reason = "--sandbox auto: bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    rt = LocalRuntime(tmp_path / "data", poll_interval=0.02, sandbox="none", sandbox_reason=reason)
    try:
        ref = rt.submit(spec(["id", "-u"], uid="none-reason"))
        state = finished(rt, ref)
        assert state.phase == "Succeeded"
        assert state.sandbox == Sandbox(mode="none", user=os.geteuid(), network="on", reason=reason)
        assert log_of(ref) == f"{os.geteuid()}\n"  # without the sandbox, the server's own user
    finally:
        rt.close()


@pytest.mark.skipif(not ROOT, reason="a runner drops the agent's privileges only when it runs as root")
def test_joch_runner_takes_the_agent_user(make_run: Callable[..., RunnerRun]) -> None:
    needs_bwrap()
    r = make_run(spec(["id", "-u"]))
    joch = str(Path(sys.executable).with_name("joch"))
    done = subprocess.run([joch, "runner", "--spec", str(r.files.spec), *r.options(), "--sandbox", "bwrap",
                           "--agent-user", "daemon"], env=r.env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert r.log() == f"{pwd.getpwnam('daemon').pw_uid}\n"
    r = make_run(spec(["id", "-u"]))
    done = subprocess.run([joch, "runner", "--spec", str(r.files.spec), *r.options(), "--sandbox", "bwrap",
                           "--agent-user", "no-such-user-here"], env=r.env, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and 'no user "no-such-user-here"' in done.stderr
    state = r.state()
    assert state is not None and (state.phase, state.reason) == ("Failed", "StartError")


@pytest.mark.skipif(not ROOT, reason="a runner drops the agent's privileges only when it runs as root")
def test_the_version_is_asked_in_the_sandbox_as_the_agent_user(sandboxed: LocalRuntime, repo: Repo) -> None:
    # `<cli> --version` runs a program the provider names: as the runner's user (root) it could read
    # what the agent cannot. It is asked as the agent is run, without a network.
    ask = ["-c", "import os, socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), 1)\n    net = 'net'\n"
                 "except OSError:\n    net = 'no-net'\nprint('uid', os.getuid(), net, os.path.exists('/etc/shadow') "
                 "and os.access('/etc/shadow', os.R_OK))"]
    ref = sandboxed.submit(spec(python_agent("print('done')"), uid="conf-version", git=git_source(repo),
                                version_args=tuple(ask)))
    state = finished(sandboxed, ref)
    assert state.phase == "Succeeded", (state, log_of(ref))
    assert state.invocation is not None and state.invocation.version == "uid 65534 no-net False", state.invocation
    assert state.invocation.executable == PYTHON
