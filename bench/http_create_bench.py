"""Single-object creates over HTTP against the raw SQLite transaction of the same shape, in one run.

The server: the real ``joch server --no-controllers`` (``governance_bench.GovServer``) in a
subprocess on a fresh SQLite file, with ``--token-file``: the clients send the bearer token of user
``eddie``, an ``editor`` through a RoleBinding in ``default`` (not ``system:masters``, so every
request resolves the user's bindings), every Agent goes through admission (validation, defaulting,
the reference to its AgentProvider, the Policies of its namespace — there are none here) and gets
an audit row in its transaction. Afterwards the audit rows of ``eddie`` are counted through
``GET /v1/audit`` and must equal the Agents created, and a request without a token must be a 401:
auth and audit were on.

The load: ``--clients`` (4) client *processes*, each with one keep-alive connection, each POSTing
one Agent per request to ``/apis/joch.dev/v1alpha1/namespaces/default/agents`` and reading the
whole answer before the next. The client is a few lines over a socket (the request bytes are
built before the clock starts; the answer's status line and ``content-length`` are parsed, its body
read to the end): on these 2 cores every millisecond the load generator spends is taken from the
server, and httpx spends about 1.5 ms per request.

The ceiling, in the same shape: ``--clients`` writer processes, each with its own connection,
running ``store_bench.RawSqlite``: the store's write shape in plain SQL (``BEGIN IMMEDIATE``, read
the revision counter, insert the object row and its change row, update the counter, ``COMMIT``;
WAL, ``synchronous=NORMAL``), one object per transaction, contending for SQLite's write lock as
the server's requests do.

Rounds alternate raw and HTTP (``--rounds``, ``--seconds`` each) so that foreign load on a shared
machine hits both alike; each figure is its median round and the ratio is HTTP / raw. CPU per
object is the server subprocess's (with its worker processes) and the clients' own (``/proc``),
steadier than objects/s.

``--workers N`` serves this checkout with ``joch server --workers N`` (the commit of ``--compare``
still as one process, which it may not know how to do otherwise).

``--compare COMMIT`` serves that commit's code as well (``git archive`` of its ``src``, imported
through ``PYTHONPATH``, as ``governance_bench`` does), in the same rounds, the order alternating: a
before/after of a change on a machine whose load moves.

``--profile OUT.prof`` runs the server under cProfile (``_profiled_server.py``) and prints its top
functions; figures under the profiler are not the ones to quote.

Run: ``.venv/bin/python bench/http_create_bench.py [--rounds N] [--seconds S] [--clients N]
[--compare COMMIT] [--workers N] [--profile OUT.prof] [--json OUT.json]`` (``make bench-http``; about 40 s).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import pstats
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CpuMeter, log, machine_busy, machine_facts, sqlite_url, workdir
from governance_bench import AGENTS_PATH, EDITOR_TOKEN, Config, GovServer, agent, audit_rows, extract_source
from store_bench import RawSqlite

TARGET_RATE = 1000.0


# --- the clients ---------------------------------------------------------------------------------------

def request_bytes(host: str, token: str, name: str) -> bytes:
    body = json.dumps(agent(name), separators=(",", ":")).encode()
    head = (f"POST {AGENTS_PATH} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def read_response(sock: socket.socket, buffer: bytearray) -> int:
    """Reads one response off a keep-alive connection (``buffer`` carries what arrived past it);
    returns its status code."""
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buffer += chunk
    head = bytes(buffer[:end]).lower()
    status = int(head[9:12])
    at = head.find(b"content-length:")
    if at < 0:
        raise ConnectionError(f"no content-length in the answer: {head[:200]!r}")
    length = int(head[at + 15:head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None])
    total = end + 4 + length
    while len(buffer) < total:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection mid-answer")
        buffer += chunk
    if status != 201:
        raise RuntimeError(f"POST answered {status}: {bytes(buffer[end + 4:total])[:300]!r}")
    del buffer[:total]
    return status


def client(port: int, token: str, prefix: str, start_at: float, stop_at: float) -> tuple[int, float, float]:
    """One HTTP client: requests built up front, sent one after the other on one connection from
    ``start_at`` until ``stop_at``."""
    count = int((stop_at - start_at) * 2000) + 100  # more than one client can send in the time
    requests = [request_bytes(f"127.0.0.1:{port}", token, f"{prefix}-{i:06d}") for i in range(count)]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray()
    cpu0, wall0 = _wait_until(start_at)
    created = 0
    for req in requests:
        if time.time() >= stop_at:
            break
        sock.sendall(req)
        read_response(sock, buffer)
        created += 1
    sock.close()
    return created, time.process_time() - cpu0, time.perf_counter() - wall0


def raw_writer(url: str, first: int, start_at: float, stop_at: float) -> tuple[int, float, float]:
    """One raw writer: its own connection (the default 5 s busy timeout waits for the write lock),
    transactions of one object from ``start_at`` until ``stop_at``."""
    raw = RawSqlite(url)
    cpu0, wall0 = _wait_until(start_at)
    written = 0
    while time.time() < stop_at:
        raw.write(first + written, 20)
        written += 20
    raw.close()
    return written, time.process_time() - cpu0, time.perf_counter() - wall0


def _wait_until(start_at: float) -> tuple[float, float]:
    while time.time() < start_at:
        time.sleep(0.001)
    return time.process_time(), time.perf_counter()


def _child(target: Callable[..., tuple[int, float, float]], args: tuple[Any, ...], out: Connection) -> None:
    try:
        out.send(target(*args))
    except BaseException as exc:  # reported to the parent, which fails the run with it
        out.send(f"{type(exc).__name__}: {exc}")
        raise


@dataclass
class Round:
    rate: float
    objects: int
    server_ms: float  # server CPU per object (0 for the raw writers)
    client_ms: float  # the client or writer processes' CPU per object
    cores: str


def in_processes(
    target: Callable[..., tuple[int, float, float]], args: list[tuple[Any, ...]], seconds: float,
    server_pid: int | None = None,
) -> Round:
    """``target(*each, start_at, stop_at)`` in one process per ``args`` item, all started together
    for ``seconds``; objects/s over the longest of their wall times."""
    ctx = multiprocessing.get_context("fork")
    start_at = time.time() + 0.3 + 0.1 * len(args)
    stop_at = start_at + seconds
    pipes, procs = [], []
    for each in args:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(target, (*each, start_at, stop_at), send), daemon=True)
        proc.start()
        pipes.append(recv)
        procs.append(proc)
    meter = CpuMeter(server_pid)
    _wait_until(start_at)
    with meter:
        results = [pipe.recv() for pipe in pipes]
    for proc in procs:
        proc.join(timeout=10)
    failures = [r for r in results if isinstance(r, str)]
    if failures:
        raise RuntimeError(f"a {target.__name__} process failed: {failures[0]}")
    objects = sum(r[0] for r in results)
    wall = max(r[2] for r in results)
    return Round(rate=objects / wall, objects=objects, server_ms=meter.server / objects * 1000,
                 client_ms=sum(r[1] for r in results) / objects * 1000, cores=meter.summary())


def http_round(server: GovServer, prefix: str, clients: int, seconds: float) -> Round:
    args = [(server.port, EDITOR_TOKEN, f"{prefix}-c{c}") for c in range(clients)]
    try:
        return in_processes(client, args, seconds, server.proc.pid)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{server.output()}") from None


def raw_round(url: str, first: int, writers: int, seconds: float) -> Round:
    return in_processes(raw_writer, [(url, first + w * 1_000_000) for w in range(writers)], seconds)


# --- the run ----------------------------------------------------------------------------------------------

@dataclass
class Served:
    """One server's rounds and its audit check."""

    label: str
    http: list[Round] = field(default_factory=list)
    audit_rows: int = 0
    created: int = 0

    def median(self) -> Round:
        return Round(rate=statistics.median(r.rate for r in self.http), objects=sum(r.objects for r in self.http),
                     server_ms=statistics.median(r.server_ms for r in self.http),
                     client_ms=statistics.median(r.client_ms for r in self.http), cores="")


@dataclass
class Result:
    raw: list[Round] = field(default_factory=list)
    servers: list[Served] = field(default_factory=list)

    def raw_rate(self) -> float:
        return statistics.median(r.rate for r in self.raw)

    def summary(self) -> dict[str, Any]:
        raw = self.raw_rate()
        return {"raw_per_s": raw, "servers": {
            s.label: {"http_per_s": (m := s.median()).rate, "ratio": m.rate / raw, "server_ms_per_obj": m.server_ms,
                      "client_ms_per_obj": m.client_ms} for s in self.servers}}


def unauthenticated_status(server: GovServer) -> int:
    response = httpx.post(f"{server.base}{AGENTS_PATH}", json=agent("no-token"), timeout=10)
    return response.status_code


def start_server(config: Config, url: str, data_dir: Path, profile: str | None, workers: int = 1) -> GovServer:
    server = GovServer(config, url, data_dir, Path(profile) if profile else None, workers=workers)
    try:
        server.wait_ready(timeout=60.0 * workers)  # the workers start one after the first
        server.setup()
        if (code := unauthenticated_status(server)) != 401:
            raise RuntimeError(f"{config.label}: a POST without a token answered {code}, not 401: is auth on?")
    except BaseException:
        server.stop()
        raise
    return server


def run(args: argparse.Namespace, work: Path) -> Result:
    configs = [Config("this checkout", None, auth=True, policies=False)]
    if args.compare:
        configs.append(Config(args.compare, extract_source(work, args.compare), auth=True, policies=False))
    result = Result(servers=[Served(c.label) for c in configs])
    with contextlib.ExitStack() as stack:
        raw_url = stack.enter_context(sqlite_url(work, "raw"))
        RawSqlite(raw_url).close()  # the store's migrations, once
        servers = []
        for i, config in enumerate(configs):
            url = stack.enter_context(sqlite_url(work, f"server{i}"))
            server = start_server(config, url, work / f"server{i}", args.profile if i == 0 else None,
                                  workers=args.workers if i == 0 else 1)
            stack.callback(server.stop)
            servers.append(server)
        log("warm-up")
        raw_round(raw_url, 90_000_000, args.clients, 1.0)
        for served, server in zip(result.servers, servers, strict=True):
            served.created += http_round(server, "warm", args.clients, 2.0).objects
        for r in range(args.rounds):
            raw = raw_round(raw_url, r * 10_000_000, args.clients, args.seconds)
            result.raw.append(raw)
            line = f"round {r + 1}: raw {raw.rate:,.0f}/s"
            order = list(zip(result.servers, servers, strict=True))
            for served, server in order if r % 2 == 0 else order[::-1]:  # who goes first alternates
                http = http_round(server, f"r{r}", args.clients, args.seconds)
                served.http.append(http)
                served.created += http.objects
                line += (f"; {served.label}: {http.rate:,.0f}/s (srv {http.server_ms:.2f} + cli "
                         f"{http.client_ms:.2f} ms CPU/obj; {http.cores})")
            log(line)
        for served, server in zip(result.servers, servers, strict=True):
            served.audit_rows = audit_rows(server)
            if served.audit_rows != served.created:
                raise RuntimeError(f"{served.label}: {served.created} Agents created, {served.audit_rows} audit rows")
    return result


def report(result: Result, args: argparse.Namespace) -> None:
    raw = result.raw_rate()
    workers = f", this checkout with --workers {args.workers}" if args.workers > 1 else ""
    print(f"\n== HTTP single-object create, SQLite, {args.clients} client processes{workers}, "
          f"{args.rounds} rounds of {args.seconds:.0f} s (medians) ==")
    print(f"{'raw SQLite txn, 1 obj, ' + str(args.clients) + ' writer procs':<44} {raw:>8,.0f} obj/s   "
          f"rounds {', '.join(f'{r.rate:,.0f}' for r in result.raw)}")
    for served in result.servers:
        m = served.median()
        verdict = "PASS" if m.rate >= TARGET_RATE else "MISS"
        print(f"{'HTTP POST one Agent, ' + served.label:<44} {m.rate:>8,.0f} obj/s   "
              f"rounds {', '.join(f'{r.rate:,.0f}' for r in served.http)}   target >= {TARGET_RATE:,.0f}: {verdict}")
        print(f"{'  ratio to raw':<44} {m.rate / raw:>8.1%}")
        print(f"{'  CPU per object':<44} server {m.server_ms:.2f} ms, clients {m.client_ms:.2f} ms")
        print(f"{'  audit rows = Agents created':<44} {served.audit_rows:,} = {served.created:,}")


def print_profile(path: str) -> None:
    out = io.StringIO()
    stats = pstats.Stats(path, stream=out)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(35)
    print(out.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0, help="per round and writer")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--compare", metavar="COMMIT", help="also serve this commit's code (git archive), same rounds")
    parser.add_argument("--profile", metavar="OUT.prof", help="serve under cProfile and print its top functions")
    parser.add_argument("--json", metavar="OUT.json", help="also save the figures")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="serve this checkout with joch server --workers N (--compare's commit: one process)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.profile and args.workers > 1:
        parser.error("--profile profiles one server process: use it with --workers 1")
    for name, value in machine_facts(None):
        print(f"{name:>10}: {value}")
    print(f"{'busy':>10}: {machine_busy(1.0):.2f} cores before the run")
    with workdir() as tmp:
        result = run(args, Path(tmp))
    report(result, args)
    if args.json:
        rounds = {s.label: [asdict(r) for r in s.http] for s in result.servers}
        Path(args.json).write_text(json.dumps({**result.summary(), "rounds": rounds,
                                               "raw_rounds": [asdict(r) for r in result.raw]}, indent=2))
    if args.profile:
        with contextlib.suppress(OSError):
            print_profile(args.profile)
    return 0


if __name__ == "__main__":
    os.environ.pop("PYTHONPATH", None)
    raise SystemExit(main())
