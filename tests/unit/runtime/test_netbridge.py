"""The limited network's allow list and proxy requests, and ``--agent-user``, read without a sandbox
(``tests/integration/runtime/test_confinement.py`` runs them in one)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from joch.runtime import netbridge, sandbox


def test_allow_entries_are_hosts_ports_and_wildcards() -> None:
    rules = netbridge.parse_allow(["api.openai.com:443", "Example.COM", "*.anthropic.com:443", "[::1]:8080"])
    assert rules == [("api.openai.com", 443), ("example.com", None), ("*.anthropic.com", 443), ("::1", 8080)]
    assert netbridge.allowed(rules, "api.openai.com", 443)
    assert not netbridge.allowed(rules, "api.openai.com", 80)
    assert netbridge.allowed(rules, "EXAMPLE.com.", 8443)
    assert netbridge.allowed(rules, "api.anthropic.com", 443)
    assert not netbridge.allowed(rules, "anthropic.com", 443)
    assert not netbridge.allowed(rules, "evil-anthropic.com", 443)
    assert netbridge.allowed(rules, "::1", 8080)


@pytest.mark.parametrize(("entry", "message"), [
    ("host:0", "the port must be a number from 1 to 65535"),
    ("host:http", "the port must be a number from 1 to 65535"),
    ("http://host/", "is not host, host:port or [address]:port"),
    ("", "is not host, host:port or [address]:port"),
])
def test_a_bad_allow_entry_is_named(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"spec\.security\.network\.allow\[1\]: .*" + message.replace("[", r"\[")
                       .replace("]", r"\]")):
        netbridge.parse_allow(["ok.example", entry])


def test_the_agent_environment_names_the_bridge_and_no_exceptions() -> None:
    env = netbridge.agent_env({"NO_PROXY": "*", "no_proxy": "localhost", "https_proxy": "http://corp:3128",
                               "PATH": "/bin"})
    assert "NO_PROXY" not in env and "no_proxy" not in env and env["PATH"] == "/bin"
    assert {env[k] for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")} == {
        f"http://127.0.0.1:{netbridge.PROXY_PORT}"}


def _ask(path: Path, request: bytes) -> bytes:
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)  # the path is too long to connect to
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(f"/proc/self/fd/{directory}/{path.name}")
        os.close(directory)
        s.sendall(request)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    return data


def test_the_proxy_forwards_allowed_requests_and_refuses_others(tmp_path: Path) -> None:
    upstream = socket.create_server(("127.0.0.1", 0))
    port = upstream.getsockname()[1]
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = upstream.accept()
        with conn:
            seen.append(conn.recv(65536))
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    threading.Thread(target=serve, daemon=True).start()
    said: list[str] = []
    # A path longer than a unix socket's limit: bound through the directory's descriptor.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    proxy = netbridge.Proxy(deep / "network.sock", [f"127.0.0.1:{port}"], said.append)
    try:
        assert oct((deep / "network.sock").stat().st_mode & 0o777) == "0o666"
        answer = _ask(deep / "network.sock", f"GET http://127.0.0.1:{port}/p?q=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                             "Proxy-Connection: keep-alive\r\n\r\n".encode())
        assert answer.endswith(b"ok")
        assert seen[0].startswith(b"GET /p?q=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert b"Proxy-Connection" not in seen[0] and b"Connection: close\r\n\r\n" in seen[0]
        answer = _ask(deep / "network.sock", b"CONNECT elsewhere.example:443 HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403 Forbidden")
        assert said == ["joch runner: network: refused CONNECT elsewhere.example:443 (not in the Agent's "
                        "spec.security.network.allow)"]
        assert _ask(deep / "network.sock", b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    finally:
        proxy.close()
        upstream.close()
    assert not (deep / "network.sock").exists()


def test_agent_users_by_name_uid_and_group() -> None:
    assert sandbox.parse_agent_user("nobody").uid == 65534
    assert sandbox.parse_agent_user("1234:2345") == sandbox.AgentUser(1234, 2345)
    assert sandbox.parse_agent_user("0:root") == sandbox.AgentUser(0, 0)
    with pytest.raises(sandbox.SandboxError, match='--agent-user: no user "nobody-at-all"'):
        sandbox.parse_agent_user("nobody-at-all")
    with pytest.raises(sandbox.SandboxError, match='--agent-user: no group "no-such-group"'):
        sandbox.parse_agent_user("nobody:no-such-group")
    with pytest.raises(sandbox.SandboxError, match="--agent-user must be a user name or uid"):
        sandbox.parse_agent_user(":12")
    if os.geteuid() == 0:
        assert sandbox.agent_user(None) == sandbox.parse_agent_user("65534")
        assert sandbox.agent_user("root") is None  # root keeps root
    else:
        assert sandbox.agent_user("1234") is None  # only a root runner changes user


def test_of_the_joch_server_a_limited_agent_reaches_only_its_callback(tmp_path: Path) -> None:
    # The server itself is reachable for the usage callback; under --auth none every other route of
    # its API would be anyone's, so the proxy passes only that one request, not CONNECT, other paths
    # or what the agent sends after the callback's body.
    upstream = socket.create_server(("127.0.0.1", 0))
    port = upstream.getsockname()[1]
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = upstream.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(0.5)
                data = b""
                try:
                    while chunk := conn.recv(65536):
                        data += chunk
                except TimeoutError:
                    pass
                seen.append(data)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    threading.Thread(target=serve, daemon=True).start()
    said: list[str] = []
    callback = "/v1/namespaces/default/agentruns/demo/callback"
    proxy = netbridge.Proxy(tmp_path / "network.sock", [], said.append, callback=("127.0.0.1", port, callback))
    try:
        sock = tmp_path / "network.sock"
        body = b'{"events": []}'
        smuggled = b"DELETE /apis/joch.dev/v1alpha1/namespaces/default/agents/a HTTP/1.1\r\nHost: x\r\n\r\n"
        answer = _ask(sock, f"POST http://127.0.0.1:{port}{callback} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            f"Content-Length: {len(body)}\r\n\r\n".encode() + body + smuggled)
        assert answer.endswith(b"ok"), answer
        assert seen == [f"POST {callback} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
                        "Connection: close\r\n\r\n".encode() + body]
        for refused in (f"GET http://127.0.0.1:{port}/apis/ops.joch.dev/v1alpha1/secrets HTTP/1.1\r\n\r\n",
                        f"POST http://127.0.0.1:{port}/v1/namespaces/default/approvals/x/decide HTTP/1.1\r\n"
                        "Content-Length: 0\r\n\r\n",
                        f"POST http://127.0.0.1:{port}{callback} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                        f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"):
            assert _ask(sock, refused.encode()).startswith(b"HTTP/1.1 403 Forbidden"), refused
        assert len(seen) == 1 and len(said) == 4
    finally:
        proxy.close()
        upstream.close()


def test_an_allowed_name_that_resolves_to_the_hosts_loopback_is_refused(tmp_path: Path) -> None:
    # A name in the allow list is resolved by the proxy, on the host: one whose DNS points at
    # 127.0.0.1 (or the cloud metadata address) must not open the host's own services to the agent.
    # (/etc/hosts's "localhost" names itself and passes; so does an address named as one.)
    upstream = socket.create_server(("127.0.0.1", 0))
    port = upstream.getsockname()[1]
    said: list[str] = []
    names = [n for n in ("ip6-localhost", "ip6-loopback", socket.gethostname()) if _resolves_to_loopback(n)]
    if not names:
        pytest.skip("no name other than localhost resolves to the loopback here")
    proxy = netbridge.Proxy(tmp_path / "network.sock", [names[0], "localhost", f"127.0.0.1:{port}"], said.append)
    try:
        answer = _ask(tmp_path / "network.sock", f"CONNECT {names[0]}:{port} HTTP/1.1\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 403 Forbidden") and b"loopback" in answer, answer
        for allowed in (f"localhost:{port}", f"127.0.0.1:{port}"):
            head = _ask_head(tmp_path / "network.sock", f"CONNECT {allowed} HTTP/1.1\r\n\r\n".encode())
            assert head.startswith(b"HTTP/1.1 200"), (allowed, head)
    finally:
        proxy.close()
        upstream.close()


def _resolves_to_loopback(name: str) -> bool:
    try:
        return any(info[4][0] in ("127.0.0.1", "::1") or str(info[4][0]).startswith("127.")
                   for info in socket.getaddrinfo(name, None))
    except OSError:
        return False


def _ask_head(path: Path, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        s.sendall(request)
        return s.recv(4096)
