"""The ``limited`` network of a sandboxed agent: a proxy outside the sandbox, a bridge inside.

An Agent whose ``spec.security.network.mode`` is ``limited`` runs in a network namespace of its own
(``bwrap --unshare-net``: a loopback, no route anywhere). Two pieces give it the hosts its ``allow``
list names, and nothing else:

* **The proxy** (``Proxy``, a thread pool in the runner, outside the sandbox) listens on a unix
  socket in the run directory, which the sandbox mounts in. It speaks HTTP proxy: ``CONNECT
  host:port`` (HTTPS and any other TLS: the proxy sees the name, never the content) and plain HTTP
  requests in absolute form (``GET http://host:port/path``, forwarded in origin form with
  ``Connection: close``). A host:port the allow list does not match gets ``403 Forbidden`` and a line
  in the runner's log; a name is resolved by the proxy, on the host. Bounded: ``MAX_CONNECTIONS``
  at once (more get ``503``), a request head of at most ``MAX_HEAD`` bytes read within
  ``HEAD_SECONDS``, upstream connections opened within ``CONNECT_SECONDS``.
* **The bridge** (``python netbridge.py [--user=UID:GID] SOCKET PORT -- ARGV``, the first command
  in the sandbox) listens on 127.0.0.1:``PROXY_PORT`` inside the namespace and carries each
  connection to the proxy's socket; it forks that listener off (which drops to the agent's user)
  and executes ``ARGV`` (``setpriv ... AGENT``) in its own place, so the agent keeps the pid, exit
  status and signals the runner supervises. The agent
  gets ``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY`` (and their lower-case forms) naming the
  bridge, and no ``NO_PROXY``: a client that honours them reaches the allowed hosts; one that does
  not reaches nothing.

Allow entries are ``host`` (any port) or ``host:port`` (``[v6]:port`` for an IPv6 address), and
``*.example.com`` for the subdomains of example.com; names compare case-insensitively. The module
imports only the standard library and is run by path inside the sandbox (``-I -S``), so it needs
nothing of joch's installation but this file.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

PROXY_PORT = 3128
"""Where the bridge listens inside the sandbox (127.0.0.1): the network namespace is the agent's own."""
MAX_CONNECTIONS = 64
MAX_HEAD = 64 * 1024
HEAD_SECONDS = 30.0
CONNECT_SECONDS = 10.0
_CHUNK = 65536
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
_HOP_HEADERS = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")


def bridge_command(proxy_socket: str, user: tuple[int, int] | None = None) -> list[str]:
    """The command (to put in front of the agent's) that runs the bridge inside the sandbox, where
    the proxy's socket is at ``proxy_socket``; ``user`` (uid, gid): what the bridge drops to."""
    ids = [] if user is None else [f"--user={user[0]}:{user[1]}"]
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), *ids, proxy_socket, str(PROXY_PORT), "--"]


def agent_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the proxy variables naming the bridge and no ``NO_PROXY``."""
    url = f"http://127.0.0.1:{PROXY_PORT}"
    out = {k: v for k, v in env.items() if k not in ("NO_PROXY", "no_proxy")}
    out.update(dict.fromkeys(_PROXY_VARS, url))
    return out


# --- the allow list -------------------------------------------------------------------------------


def parse_allow(entries: Iterable[str]) -> list[tuple[str, int | None]]:
    """``(host, port or None)`` per entry; ``ValueError`` naming the entry (``allow[i]``)."""
    parsed: list[tuple[str, int | None]] = []
    for i, entry in enumerate(entries):
        try:
            host, port = split_host_port(entry.strip(), None)
        except ValueError as exc:
            raise ValueError(f"spec.security.network.allow[{i}]: {exc}") from None
        parsed.append((host, port))
    return parsed


def split_host_port(text: str, default: int | None) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` → (lower-case host, port or ``default``)."""
    if any(c in text for c in "/ \t@?#\\"):
        raise ValueError(f'"{text}" is not host, host:port or [address]:port')
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else None)
        if port_text is None:
            raise ValueError(f'"{text}" is not host, host:port or [address]:port')
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    host = host.rstrip(".").lower()
    if not host:
        raise ValueError(f'"{text}" is not host, host:port or [address]:port')
    if not port_text:
        return host, default
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f'"{text}": the port must be a number from 1 to 65535')
    return host, int(port_text)


def allowed(rules: Sequence[tuple[str, int | None]], host: str, port: int) -> bool:
    host = host.rstrip(".").lower()
    for rule_host, rule_port in rules:
        if rule_port is not None and rule_port != port:
            continue
        if rule_host == host or (rule_host.startswith("*.") and host.endswith(rule_host[1:])):
            return True
    return False


# --- the proxy (outside the sandbox) --------------------------------------------------------------


class Proxy:
    """The runner's HTTP proxy on a unix socket; ``say`` gets a line per refused request."""

    def __init__(self, path: Path, allow: Iterable[str], say: Callable[[str], None],
                 callback: tuple[str, int, str] | None = None) -> None:
        """``callback``: the run's usage callback on the Joch server (host, port, path), reached over
        plain HTTP: of that host:port, only ``POST path`` passes (one request, its body as long as
        its ``Content-Length`` says), not the rest of the API, which a server without
        authentication (``--auth none``) would let anyone use."""
        self.path = path
        self.rules = parse_allow(allow)
        self.say = say
        self.callback = (callback[0].lower(), callback[1], callback[2]) if callback is not None else None
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # A unix socket's path is at most 107 bytes; the run directory's may be longer: bind through
        # a descriptor of the directory.
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._listener.bind(f"/proc/self/fd/{directory}/{path.name}" if len(str(path)) > 100 else str(path))
        finally:
            os.close(directory)
        # Reachable only where the run directory is (root's, 0700) and in this run's sandbox.
        os.chmod(path, 0o666)  # noqa: S103 - the agent's user connects to it
        self._listener.listen(MAX_CONNECTIONS)
        self._thread = threading.Thread(target=self._accept, name="joch-netproxy", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = list(self._open)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=2)
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._open.add(sock)
            return True

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                with contextlib.suppress(OSError), client:
                    client.sendall(_answer(503, f"joch: more than {MAX_CONNECTIONS} connections at once\n"))
                continue
            if not self._track(client):
                client.close()
                self._slots.release()
                return
            threading.Thread(target=self._serve, args=(client,), name="joch-netproxy-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            client.settimeout(HEAD_SECONDS)
            head, rest = _read_head(client)
            if head is None:
                client.sendall(_answer(400, "joch: not an HTTP proxy request (or its head is too long)\n"))
                return
            client.settimeout(None)
            target = _target(head)
            if target is None:
                client.sendall(_answer(400, "joch: the proxy takes CONNECT host:port and http:// URLs\n"))
                return
            method, host, port, forward = target
            only_callback = (not allowed(self.rules, host, port) and self.callback is not None
                             and (host, port) == self.callback[:2])
            if only_callback:
                length = _callback_length(head, self.callback[2] if self.callback else "")
                if forward is None or method != "POST" or length is None:
                    self.say(f"joch runner: network: refused {method} {host}:{port} (of the Joch server, only the "
                             "run's usage callback is reachable)")
                    client.sendall(_answer(403, "joch: of the Joch server, only POST to this run's usage callback "
                                                "(with a Content-Length) is reachable\n"))
                    return
            elif not allowed(self.rules, host, port):
                self.say(f"joch runner: network: refused {method} {host}:{port} (not in the Agent's "
                         "spec.security.network.allow)")
                client.sendall(_answer(403, f"joch: {host}:{port} is not in this Agent's "
                                            "spec.security.network.allow\n"))
                return
            try:
                addresses = _addresses(host)
                if addresses is None:
                    self.say(f"joch runner: network: refused {method} {host}:{port} (the name resolves to a "
                             "loopback or link-local address of the host)")
                    client.sendall(_answer(403, f"joch: {host} resolves to a loopback or link-local address of the "
                                                "host; an allow entry reaches one only by naming it (127.0.0.1:PORT, "
                                                "localhost:PORT)\n"))
                    return
                upstream = _connect(addresses, port)
            except OSError as exc:
                client.sendall(_answer(502, f"joch: cannot connect to {host}:{port}: {exc.strerror or exc}\n"))
                return
            upstream.settimeout(None)
            if not self._track(upstream):
                return
            if only_callback:
                # One request and its body; what the agent sends after it goes nowhere.
                body = rest[:length]
                while len(body) < (length or 0):
                    chunk = client.recv(min(_CHUNK, (length or 0) - len(body)))
                    if not chunk:
                        return
                    body += chunk
                upstream.sendall((forward or b"") + body)
                while chunk := upstream.recv(_CHUNK):
                    client.sendall(chunk)
                return
            if forward is None:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    upstream.sendall(rest)
            else:
                upstream.sendall(forward + rest)
            pump(client, upstream)
        except OSError:
            pass
        finally:
            if upstream is not None:
                self._untrack(upstream)
            self._untrack(client)
            self._slots.release()


def _addresses(host: str) -> list[str] | None:
    """Where to connect for an allowed ``host``: an address as it is; a name resolved here, once (so
    the addresses checked are the ones connected to), and None when it resolves to a loopback or
    link-local address of the host (a name whose DNS someone else controls, pointed at 127.0.0.1 or
    the cloud metadata address) unless the name is ``localhost``. ``OSError`` when it does not resolve."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return [host]
    except ValueError:
        pass
    addresses = list(dict.fromkeys(str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)))
    if not addresses:
        raise OSError(f"{host} has no address")
    if host != "localhost" and any(_local(a) for a in addresses):
        return None
    return addresses


def _connect(addresses: list[str], port: int) -> socket.socket:
    failure: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout=CONNECT_SECONDS)
        except OSError as exc:
            failure = exc
    raise failure or OSError("no address")


def _local(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_link_local or ip.is_unspecified


def _read_head(sock: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            return None, b""
        chunk = sock.recv(_CHUNK)
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _target(head: bytes) -> tuple[str, str, int, bytes | None] | None:
    """(method, host, port, the head to send upstream: None for CONNECT) of a proxy request."""
    line, _, headers = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3:
        return None
    method, target, version = (p.decode("latin-1") for p in parts)
    try:
        if method == "CONNECT":
            host, port = split_host_port(target, None)
            return (method, host, port, None) if port is not None else None
        if not target.lower().startswith("http://"):
            return None
        authority, _, path = target[len("http://"):].partition("/")
        host, port = split_host_port(authority.rpartition("@")[2], 80)
    except ValueError:
        return None
    if port is None:
        return None
    kept = [h for h in headers.split(b"\r\n") if h and h.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS]
    forward = b"\r\n".join([f"{method} /{path} {version}".encode("latin-1"), *kept, b"Connection: close"])
    return method, host, port, forward + b"\r\n\r\n"


def _callback_length(head: bytes, path: str) -> int | None:
    """The ``Content-Length`` of a proxy request for ``path`` (absolute form, query ignored); None
    when it is for another path, has no length or is chunked."""
    line, _, headers = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[1].lower().startswith(b"http://"):
        return None
    target = "/" + parts[1][len(b"http://"):].decode("latin-1").partition("/")[2]
    if target.partition("?")[0] != path:
        return None
    length: int | None = None
    for header in headers.split(b"\r\n"):
        name, _, value = header.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            if not value.strip().isdigit() or length is not None:
                return None
            length = int(value.strip())
    return length


def _answer(code: int, text: str) -> bytes:
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}[code]
    body = text.encode()
    return (f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides are done (a side that ends its writing is half-closed)."""
    peers = {a: b, b: a}
    reading = [a, b]
    while reading:
        ready, _, _ = select.select(reading, [], [])
        for sock in ready:
            try:
                chunk = sock.recv(_CHUNK)
            except OSError:
                return
            if not chunk:
                reading.remove(sock)
                with contextlib.suppress(OSError):
                    peers[sock].shutdown(socket.SHUT_WR)
                continue
            peers[sock].sendall(chunk)


# --- the bridge (inside the sandbox) --------------------------------------------------------------


def bridge(proxy_socket: str, port: int, argv: list[str], user: tuple[int, int] | None = None) -> None:
    """Listen on 127.0.0.1:``port``, fork the listener off (as ``user``, when given: uid, gid, no
    supplementary groups), and become the agent (``argv``)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(MAX_CONNECTIONS)
    agent = os.getpid()
    if os.fork() == 0:
        try:
            if user is not None:
                os.setgroups([])
                os.setresgid(user[1], user[1], user[1])
                os.setresuid(user[0], user[0], user[0])
            _serve_bridge(listener, proxy_socket, agent)
        finally:
            os._exit(0)
    listener.close()
    try:
        os.execvp(argv[0], argv)  # noqa: S606 - the agent, as the runner was told to start it
    except OSError as exc:
        print(f"joch: cannot start {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        os._exit(127)


def _serve_bridge(listener: socket.socket, proxy_socket: str, agent: int) -> None:
    """Carry connections until the agent (this process's parent) is gone. (Not PR_SET_PDEATHSIG:
    the agent's setpriv changing its credentials sends that signal at once.)"""
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def carry(client: socket.socket) -> None:
        try:
            with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as proxy:
                proxy.connect(proxy_socket)
                pump(client, proxy)
        except OSError:
            pass
        finally:
            slots.release()

    listener.settimeout(0.5)
    while os.getppid() == agent:
        try:
            client, _ = listener.accept()
        except TimeoutError:
            continue
        client.settimeout(None)
        slots.acquire()
        threading.Thread(target=carry, args=(client,), daemon=True).start()


if __name__ == "__main__":
    args = sys.argv[1:]
    ids: tuple[int, int] | None = None
    if args and args[0].startswith("--user="):
        uid, _, gid = args.pop(0).removeprefix("--user=").partition(":")
        ids = (int(uid), int(gid))
    if len(args) < 4 or args[2] != "--":
        print("usage: netbridge.py [--user=UID:GID] SOCKET PORT -- ARGV...", file=sys.stderr)
        sys.exit(2)
    bridge(args[0], int(args[1]), args[3:], ids)
