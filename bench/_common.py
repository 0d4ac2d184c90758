"""Helpers shared by the benchmarks: timing statistics, result rows, machine facts, throwaway
stores (a temporary SQLite file or a dedicated Postgres schema) and a server in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


# --- statistics ------------------------------------------------------------------------------------

def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``samples``; NaN when empty."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class Row:
    """One line of a result table. ``higher_is_better`` decides how ``target`` is compared."""

    figure: str
    value: float | None
    unit: str
    target: float | None = None
    higher_is_better: bool = True
    ceiling: float | None = None  # the raw ceiling this throughput is compared with
    note: str = ""

    @property
    def ratio(self) -> str:
        if self.value is None or not self.ceiling:
            return ""
        return f"{self.value / self.ceiling:.0%}"

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "n/a"
        if self.target is None:
            return ""
        ok = self.value >= self.target if self.higher_is_better else self.value <= self.target
        return "PASS" if ok else "MISS"

    def cells(self) -> list[str]:
        value = "n/a" if self.value is None else f"{self.value:,.1f} {self.unit}"
        if self.target is None:
            target = ""
        else:
            target = f"{'>=' if self.higher_is_better else '<='} {self.target:,.0f} {self.unit}"
        return [self.figure, value, self.ratio, target, self.verdict, self.note]


def print_table(title: str, rows: Sequence[Row]) -> None:
    header = ["figure", "value", "vs raw", "target", "result", "note"]
    body = [r.cells() for r in rows]
    widths = [max(len(header[i]), *(len(b[i]) for b in body)) for i in range(len(header))]
    print(f"\n== {title} ==")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for b in body:
        print("  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)).rstrip())


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- machine facts ----------------------------------------------------------------------------------

def machine_facts(postgres_url: str | None) -> list[tuple[str, str]]:
    facts = [
        ("cpu cores", str(os.cpu_count())),
        ("cpu model", _cpu_model()),
        ("memory", _memory()),
        ("os", platform.platform()),
        ("python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("sqlite", sqlite3.sqlite_version),
        ("psycopg", psycopg.__version__),
    ]
    if postgres_url:
        try:
            with psycopg.connect(postgres_url, connect_timeout=3) as conn:
                for setting in ("server_version", "synchronous_commit", "fsync", "shared_buffers"):
                    row = conn.execute(f"SHOW {setting}").fetchone()
                    facts.append((f"postgres {setting}", str(row[0]) if row else "?"))
        except psycopg.Error as exc:
            facts.append(("postgres", f"unreachable: {exc}".splitlines()[0]))
    return facts


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _memory() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return "?"


# --- throwaway stores -----------------------------------------------------------------------------

@contextlib.contextmanager
def sqlite_url(workdir: Path, name: str) -> Iterator[str]:
    """A ``sqlite:///`` URL naming a fresh file (plus its -wal/-shm), removed afterwards."""
    path = workdir / f"{name}.db"
    try:
        yield f"sqlite:///{path}"
    finally:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{path}{suffix}").unlink()


@contextlib.contextmanager
def postgres_url(base: str, name: str) -> Iterator[str]:
    """A URL whose search_path is a fresh schema, dropped afterwards (as tests/conftest.py does)."""
    schema = f"joch_bench_{name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def workdir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="joch-bench-")


# --- objects ----------------------------------------------------------------------------------------

def agent(name: str, namespace: str = "default") -> dict[str, object]:
    return {
        "apiVersion": "joch.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"providerRef": {"name": "p"}},
    }


def stored_body_template() -> tuple[str, str]:
    """The JSON text the store writes for an Agent, split around its name: same keys, same size
    (uid, creationTimestamp, generation and resourceVersion filled in like ``create`` does)."""
    body = {
        "apiVersion": "joch.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {
            "name": "@NAME@", "namespace": "default", "uid": str(uuid.uuid4()),
            "creationTimestamp": "2026-11-22T00:00:00Z", "generation": 1, "resourceVersion": "1000000",
        },
        "spec": {"providerRef": {"name": "p"}},
    }
    head, tail = json.dumps(body, separators=(",", ":")).split("@NAME@")
    return head, tail


# --- a server in a subprocess ---------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_available() -> str | None:
    """None when the server can be started, else why not."""
    probe = subprocess.run(
        [sys.executable, "-c", "import joch.server.serving, joch.admission.apply"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines()
        return lines[-1] if lines else "import failed"
    return None


class Server:
    """``joch server --store URL --port P`` (the real CLI) in a subprocess on 127.0.0.1.

    A subprocess, not a thread, so the server has its own interpreter (and GIL): on a 2-core machine
    the benchmark client and the server each get a core instead of sharing one."""

    def __init__(self, store_url: str, *extra: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        joch = VENV_BIN / "joch"
        if joch.exists():
            cmd = [str(joch), "server", "--store", store_url, "--port", str(self.port), *extra]
        else:  # no console script installed: the same entry point the CLI calls
            cmd = [sys.executable, "-c",
                   "import sys; from joch.server.serving import serve; "
                   "serve(store_url=sys.argv[1], port=int(sys.argv[2]), log_level='warning')",
                   store_url, str(self.port)]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/readyz", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()

    def __enter__(self) -> Server:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- CPU accounting ----------------------------------------------------------------------------------

def _machine_jiffies() -> tuple[int, int, int]:
    """(busy, total, steal) jiffies over all cores, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    steal = fields[7] if len(fields) > 7 else 0
    total = sum(fields[:8])
    return total - idle - steal, total, steal


def _process_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and of its live children (``joch server --workers``' worker processes)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return _process_seconds_path(f"/proc/{pid}/stat") + sum(_process_seconds_path(f"/proc/{c}/stat") for c in children)


class CpuMeter:
    """CPU used while measuring, in cores (1.0 = one core busy for the whole wall time): this
    process (the benchmark client), the server subprocess if any, and everything else on the machine
    (Postgres backends, and any unrelated load, which makes a figure less trustworthy). Accumulates
    over several ``with meter:`` blocks."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.server_pid = server_pid
        self.wall = self.bench = self.server = self.machine = self.steal = 0.0
        self._start: tuple[float, float, float, tuple[int, int, int]] | None = None

    def _snap(self) -> tuple[float, float, float, tuple[int, int, int]]:
        t = os.times()
        server = _process_seconds(self.server_pid) if self.server_pid else 0.0
        return time.perf_counter(), t.user + t.system, server, _machine_jiffies()

    def __enter__(self) -> CpuMeter:
        self._start = self._snap()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._start is None:
            return
        wall0, own0, server0, (busy0, total0, steal0) = self._start
        wall1, own1, server1, (busy1, total1, steal1) = self._snap()
        cores = os.cpu_count() or 1
        wall = wall1 - wall0
        self.wall += wall
        self.bench += own1 - own0
        self.server += server1 - server0
        if total1 > total0:
            self.machine += (busy1 - busy0) / (total1 - total0) * cores * wall
            self.steal += (steal1 - steal0) / (total1 - total0) * cores * wall
        self._start = None

    def summary(self) -> str:
        """``cores bench 0.49 srv 0.57 other 1.26`` (steal shown when the hypervisor took >= 0.05)."""
        if not self.wall:
            return ""
        other = max(0.0, self.machine - self.bench - self.server)
        parts = [f"bench {self.bench / self.wall:.2f}"]
        if self.server_pid:
            parts.append(f"srv {self.server / self.wall:.2f}")
        parts.append(f"other {other / self.wall:.2f}")
        if self.steal / self.wall >= 0.05:
            parts.append(f"steal {self.steal / self.wall:.2f}")
        return "cores " + " ".join(parts)

    def per_object(self, objects: int) -> str:
        """``cpu/obj srv 2.85 cli 1.85 ms``: server and client CPU milliseconds per object."""
        if not objects:
            return ""
        text = f"cli {self.bench / objects * 1000:.2f} ms"
        if self.server_pid:
            text = f"srv {self.server / objects * 1000:.2f} " + text
        return f"cpu/obj {text}"


def machine_busy(seconds: float = 1.0) -> float:
    """Cores busy over the next ``seconds`` (everything on the machine, steal excluded)."""
    busy0, total0, _ = _machine_jiffies()
    time.sleep(seconds)
    busy1, total1, _ = _machine_jiffies()
    return (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)


def wait_idle(limit: float, threshold: float = 0.25) -> float:
    """Wait up to ``limit`` seconds for the machine to be idle (< ``threshold`` cores busy over 2 s).
    Returns the last busy figure."""
    deadline = time.monotonic() + limit
    busy = machine_busy(2.0)
    while busy >= threshold and time.monotonic() < deadline:
        log(f"machine busy ({busy:.2f} cores used by other processes); waiting for it to settle")
        busy = machine_busy(5.0)
    return busy


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by thread name (Linux /proc)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            name = names.get(int(tid), f"thread-{tid}")
            out[name] = out.get(name, 0.0) + _process_seconds_path(f"/proc/self/task/{tid}/stat")
    return out


def _process_seconds_path(path: str) -> float:
    try:
        stat = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
