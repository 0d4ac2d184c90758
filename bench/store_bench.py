"""Store, admission and HTTP benchmarks for Joch, on SQLite and on PostgreSQL, in one run.

Run ``.venv/bin/python bench/store_bench.py`` (or ``make bench``); ``--quick`` for a smaller run,
``--backend sqlite|postgres`` for one backend, ``--profile`` to print a cProfile of the store-level
and admission writes plus CPU per thread, ``--wait-idle S`` to first wait up to S seconds for other
processes to leave the CPU alone, ``--json PATH`` to save the figures. All load goes to 127.0.0.1
only. Every loop is bounded by a count and a wall-clock cap; a full run takes about 4 minutes on
2 cores (SQLite ~1 min, Postgres ~3 min, bounded by its fsync per commit).

Methodology (per backend; every phase gets a fresh SQLite file or a fresh Postgres schema created
with ``?options=-csearch_path=<schema>`` and dropped at the end, like ``tests/conftest.py``):

1. **Raw transaction ceiling.** The store's write shape in plain SQL on the driver (``sqlite3`` /
   ``psycopg``), one object per transaction: ``BEGIN IMMEDIATE`` (SQLite) or ``BEGIN`` + ``SELECT
   value FROM joch_meta WHERE key='revision' FOR UPDATE`` (Postgres; SQLite reads the same row
   without ``FOR UPDATE``), ``INSERT`` into ``joch_objects`` with a JSON body of the same size the
   store writes, ``INSERT`` into ``joch_changes``, ``UPDATE joch_meta``, ``COMMIT``. The body is
   prebuilt text with the name spliced in: no JSON encoding, uuid or validation — that is the
   ceiling. Durability is the store's: SQLite WAL + ``synchronous=NORMAL`` (no fsync per commit;
   durable across a process crash, not necessarily a power loss), Postgres with the server's
   settings (printed: ``synchronous_commit``/``fsync``), i.e. a WAL flush per commit. The schema
   comes from the store's own migrations. Postgres statements are prepared, as the store's are.
2. **Store-level apply.** ``store.create(AGENT, obj)`` N times (one object per transaction), and
   ``joch.admission.apply.apply_documents(store, [doc])`` N times (one single-document apply each;
   documents parsed beforehand, outside the timing) when that module is importable. Objects/s and
   the ratio to the raw ceiling. The store's own background threads (the change feed, and on
   Postgres the LISTEN thread; the store also sends a ``pg_notify`` per commit) run as they do in
   production and are part of the cost. Raw, store and admission writers are **interleaved** in
   5 rounds (raw, store, admission, raw, …) and each figure is its median round, so a burst of
   foreign load hits all three alike instead of skewing the ratio.
3. **HTTP apply.** The real server (``joch server --store URL --port P`` in a subprocess, so it has
   its own interpreter and GIL) on 127.0.0.1. ``POST /v1/resources/apply`` with multi-document YAML
   batches of 100 (2 concurrent clients), and single-object JSON ``POST`` to
   ``/apis/joch.dev/v1alpha1/namespaces/default/agents`` (4 concurrent ``httpx.Client``s, one
   thread and one keep-alive connection each). Bodies are prebuilt. Objects/s over the wall time.
   Client and server share the machine's 2 cores (and with Postgres, the database too).
4. **Watch delivery latency.** A watcher follows from the current revision while a writer creates
   objects at a paced 200/s. The writer records ``t0`` just before the write call (``store.create``,
   or the HTTP ``POST`` for the HTTP watch); the watcher records the arrival of the event carrying
   that object. Latency = arrival - t0, so it includes the write itself. Store level: a consumer
   thread on ``store.watch(AGENT, WatchOptions(resource_version=R))``. HTTP: a streaming
   ``GET …/namespaces/default/agents?watch=1&resourceVersion=R`` read line by line in a thread.
5. **List latency.** 100,000 Agents loaded through ``store.transaction()`` (1,000 creates per
   transaction), in 100 namespaces of 1,000; one of them is ``bench-target``. Timed: ``store.list``
   of ``bench-target`` (1,000 items; 20 repetitions), a full ``limit=1000`` paging walk over all
   100,000 (latency per page), and the same two over HTTP (``GET`` of the namespace list; paging
   ``GET /apis/joch.dev/v1alpha1/agents?limit=1000``), timed to the complete response body (the
   client's JSON parse is outside the timing): this adds the server's JSON encoding and transfer.

Every row's note carries CPU accounting read from ``/proc``: ``cpu/obj`` (CPU milliseconds per
object of the server subprocess and of this client process) and ``cores`` (cores busy during the
measurement: bench, server, everything else, and hypervisor steal). CPU per object is far less
sensitive to a noisy machine than objects/s, so it is the figure to compare across runs; a large
``other`` on SQLite means unrelated load shared the 2 cores and depressed the figure.

Percentiles are nearest-rank. Targets: store-level create >= 50% of the raw ceiling (SQLite),
HTTP >= 1,000 objects/s, watch p99 <= 20 ms, list p99 <= 100 ms. A MISS is reported, not tuned away.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import io
import json
import pstats
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    CpuMeter,
    Row,
    Server,
    agent,
    log,
    machine_busy,
    machine_facts,
    percentile,
    postgres_url,
    print_table,
    server_available,
    sqlite_url,
    stored_body_template,
    thread_cpu,
    wait_idle,
    workdir,
)

from joch.api.kinds import AGENT
from joch.store import ListOptions, Store, WatchOptions, open_store

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
AGENTS_PATH = "/apis/joch.dev/v1alpha1/namespaces/{namespace}/agents"
ALL_AGENTS_PATH = "/apis/joch.dev/v1alpha1/agents"
APPLY_PATH = "/v1/resources/apply"
KIND_KEY = AGENT.key

UrlFactory = Callable[[str], AbstractContextManager[str]]


@dataclass(frozen=True)
class Config:
    write_n: int  # objects per writer (raw, store, admission), interleaved in ``rounds``
    rounds: int
    http_batches: int
    http_batch_size: int
    http_single_n: int
    http_clients: int
    watch_rate: float
    watch_seconds: float
    list_total: int
    list_reps: int
    cap_seconds: float  # wall-clock cap of any one throughput loop

    @staticmethod
    def full() -> Config:
        return Config(write_n=5000, rounds=5, http_batches=50, http_batch_size=100, http_single_n=3000,
                      http_clients=4, watch_rate=200, watch_seconds=5, list_total=100_000, list_reps=20,
                      cap_seconds=60)

    @staticmethod
    def quick() -> Config:
        return Config(write_n=900, rounds=3, http_batches=10, http_batch_size=100, http_single_n=600,
                      http_clients=4, watch_rate=200, watch_seconds=2, list_total=20_000, list_reps=10,
                      cap_seconds=20)


# --- 1 and 2. raw ceiling, store-level and admission-level writes ----------------------------------

SELECT_REVISION = "SELECT value FROM joch_meta WHERE key = 'revision'"
INSERT_OBJECT = "INSERT INTO joch_objects (kind, namespace, name, uid, revision, body) VALUES (?, ?, ?, ?, ?, ?)"
INSERT_CHANGE = "INSERT INTO joch_changes (revision, kind, namespace, name, type, body) VALUES (?, ?, ?, ?, ?, ?)"
UPDATE_REVISION = "UPDATE joch_meta SET value = ? WHERE key = 'revision'"


class Writer(Protocol):
    """Writes objects ``start .. start+count-1``, one per transaction."""

    def write(self, start: int, count: int) -> None: ...

    def close(self) -> None: ...


class RawSqlite:
    def __init__(self, url: str) -> None:
        open_store(url).close()  # the store's own migrations create the schema
        self.conn = sqlite3.connect(url.removeprefix("sqlite://"), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.head, self.tail = stored_body_template()

    def write(self, start: int, count: int) -> None:
        conn = self.conn
        for i in range(start, start + count):
            name = f"raw-{i:07d}"
            body = self.head + name + self.tail
            conn.execute("BEGIN IMMEDIATE")
            (revision,) = conn.execute(SELECT_REVISION).fetchone()
            revision += 1
            conn.execute(INSERT_OBJECT, (KIND_KEY, "default", name, f"uid-{i}", revision, body))
            conn.execute(INSERT_CHANGE, (revision, KIND_KEY, "default", name, "ADDED", body))
            conn.execute(UPDATE_REVISION, (revision,))
            conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


class RawPostgres:
    def __init__(self, url: str) -> None:
        open_store(url).close()
        self.conn = psycopg.connect(url, autocommit=True)
        self.lock = (SELECT_REVISION + " FOR UPDATE").replace("?", "%s")
        self.obj, self.chg, self.upd = (q.replace("?", "%s") for q in (INSERT_OBJECT, INSERT_CHANGE, UPDATE_REVISION))
        self.head, self.tail = stored_body_template()

    def write(self, start: int, count: int) -> None:
        conn = self.conn
        for i in range(start, start + count):
            name = f"raw-{i:07d}"
            body = self.head + name + self.tail
            with conn.transaction():  # BEGIN … COMMIT, as the store's backend does
                row = conn.execute(self.lock, prepare=True).fetchone()
                assert row is not None
                revision = int(row[0]) + 1
                conn.execute(self.obj, (KIND_KEY, "default", name, f"uid-{i}", revision, body), prepare=True)
                conn.execute(self.chg, (revision, KIND_KEY, "default", name, "ADDED", body), prepare=True)
                conn.execute(self.upd, (revision,), prepare=True)

    def close(self) -> None:
        self.conn.close()


class Profiled:
    """cProfile of the calling thread plus CPU per thread of the process (the store's feed and
    listener threads work on every commit, which a single-thread profile does not show)."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile()
        self.threads: dict[str, float] = {}
        self.objects = 0

    @contextlib.contextmanager
    def measure(self, objects: int) -> Iterator[None]:
        before = thread_cpu()
        self.profile.enable()
        try:
            yield
        finally:
            self.profile.disable()
            for name, seconds in thread_cpu().items():
                self.threads[name] = self.threads.get(name, 0.0) + seconds - before.get(name, 0.0)
            self.objects += objects

    def print(self, title: str) -> None:
        out = io.StringIO()
        pstats.Stats(self.profile, stream=out).sort_stats("tottime").print_stats(18)
        print(f"\n-- cProfile: {title} (calling thread, by tottime) --", file=sys.stderr)
        print("\n".join(out.getvalue().splitlines()[4:]), file=sys.stderr)
        per_thread = ", ".join(f"{name} {seconds / max(1, self.objects) * 1000:.3f}"
                               for name, seconds in sorted(self.threads.items(), key=lambda kv: -kv[1])
                               if seconds > 0)
        print(f"-- CPU ms per object by thread: {per_thread}", file=sys.stderr)


class StoreCreates:
    def __init__(self, store: Store, profiled: Profiled | None) -> None:
        self.store = store
        self.profiled = profiled

    def write(self, start: int, count: int) -> None:
        objs = [agent(f"store-{i:07d}") for i in range(start, start + count)]
        with self.profiled.measure(count) if self.profiled else contextlib.nullcontext():
            for obj in objs:
                self.store.create(AGENT, obj)

    def close(self) -> None:
        pass


class AdmissionApplies:
    """``apply_documents(store, [doc])`` per object; documents are parsed before the timing."""

    def __init__(self, store: Store, apply: Any, documents: Any, profiled: Profiled | None) -> None:
        self.store, self.apply, self.documents, self.profiled = store, apply, documents, profiled
        # One apply outside the timing proves the API works, as a client's first call would.
        result = apply.apply_documents(store, self._docs(-1, 1)[0])
        actions = [str(item.action) for item in result.items]
        if actions != ["created"]:
            raise RuntimeError(f"unexpected apply result: {actions}")

    def _docs(self, start: int, count: int) -> list[Any]:
        return [self.documents.load_documents(json.dumps(agent(f"adm-{i:07d}")), "bench")
                for i in range(start, start + count)]

    def write(self, start: int, count: int) -> None:
        docs = self._docs(start, count)
        with self.profiled.measure(count) if self.profiled else contextlib.nullcontext():
            for doc in docs:
                self.apply.apply_documents(self.store, doc)

    def close(self) -> None:
        pass


def admission_modules() -> tuple[Any, Any] | str:
    """(apply module, documents module), or why they are not usable."""
    try:
        apply = importlib.import_module("joch.admission.apply")
        documents = importlib.import_module("joch.admission.documents")
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        return f"{type(exc).__name__}: {exc}"
    if not hasattr(apply, "apply_documents") or not hasattr(documents, "load_documents"):
        return "apply_documents/load_documents missing"
    return apply, documents


@dataclass
class Rates:
    per_round: list[float]
    meter: CpuMeter

    @property
    def median(self) -> float:
        return statistics.median(self.per_round)

    def note(self, objects: int) -> str:
        spread = f"rounds {min(self.per_round):,.0f}..{max(self.per_round):,.0f}"
        return f"{spread}; {self.meter.per_object(objects)}; {self.meter.summary()}"


def interleaved(writers: dict[str, Writer], per_writer: int, rounds: int, cap: float) -> dict[str, Rates]:
    """Alternate the writers in ``rounds`` rounds of ``per_writer / rounds`` objects each, so that
    background noise hits all of them alike; each writer's figure is its median round."""
    chunk = max(1, per_writer // rounds)
    rates = {name: Rates([], CpuMeter()) for name in writers}
    started = time.perf_counter()
    for r in range(rounds):
        for name, writer in writers.items():
            with rates[name].meter:
                t0 = time.perf_counter()
                writer.write(r * chunk, chunk)
                rates[name].per_round.append(chunk / (time.perf_counter() - t0))
        if time.perf_counter() - started > cap:
            break
    return rates


# --- 4. watch latency ----------------------------------------------------------------------------

def paced(rate: float, seconds: float) -> Iterator[int]:
    """Yield 0, 1, 2, … at ``rate`` per second for ``seconds`` (absolute schedule, no drift)."""
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i


@dataclass
class WatchRun:
    latencies: list[float]  # ms from just before the write call to the event's arrival
    writes: list[float]  # ms the write call itself took (included in the latency)
    missing: int

    @classmethod
    def of(cls, sent: dict[str, float], arrivals: dict[str, float], writes: list[float]) -> WatchRun:
        missing = sum(1 for name in sent if name not in arrivals)
        if missing:
            log(f"watch: {missing} of {len(sent)} events did not arrive (reported as missing, not as latency)")
        latencies = [(arrivals[name] - t0) * 1000 for name, t0 in sent.items() if name in arrivals]
        return cls(latencies, writes, missing)

    def note(self) -> str:
        text = f"write call itself p50 {percentile(self.writes, 50):.1f} p99 {percentile(self.writes, 99):.1f} ms"
        return text + (f"; {self.missing} events MISSING" if self.missing else "")


def watch_latency_store(store: Store, rate: float, seconds: float, prefix: str) -> WatchRun:
    n = int(rate * seconds)
    arrivals: dict[str, float] = {}
    watch = store.watch(AGENT, WatchOptions(resource_version=str(store.current_revision())))
    all_seen = threading.Event()

    def consume() -> None:
        deadline = time.monotonic() + seconds + 10
        while len(arrivals) < n and time.monotonic() < deadline:
            event = watch.get(timeout=0.5)
            if event is not None and event.type == "ADDED":
                arrivals[event.object["metadata"]["name"]] = time.perf_counter()
        all_seen.set()

    consumer = threading.Thread(target=consume, name="bench-watch", daemon=True)
    consumer.start()
    sent: dict[str, float] = {}
    writes: list[float] = []
    try:
        for i in paced(rate, seconds):
            name = f"{prefix}-{i:07d}"
            obj = agent(name)
            sent[name] = time.perf_counter()
            store.create(AGENT, obj)
            writes.append((time.perf_counter() - sent[name]) * 1000)
        all_seen.wait(timeout=10)
    finally:
        watch.close()
        consumer.join(timeout=5)
    return WatchRun.of(sent, arrivals, writes)


def watch_latency_http(base: str, rate: float, seconds: float, prefix: str) -> WatchRun:
    n = int(rate * seconds)
    path = AGENTS_PATH.format(namespace="default")
    with httpx.Client(base_url=base, timeout=10) as client:
        listed = client.get(path, params={"limit": 1})
        listed.raise_for_status()
        revision = listed.json()["metadata"]["resourceVersion"]
        arrivals: dict[str, float] = {}
        ready = threading.Event()
        all_seen = threading.Event()

        def consume() -> None:
            params = {"watch": "1", "resourceVersion": revision, "timeoutSeconds": str(int(seconds) + 15)}
            with httpx.Client(base_url=base, timeout=httpx.Timeout(10, read=None)) as watcher, \
                    watcher.stream("GET", path, params=params) as response:
                response.raise_for_status()
                ready.set()
                for line in response.iter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ADDED":
                        arrivals[event["object"]["metadata"]["name"]] = time.perf_counter()
                        if len(arrivals) >= n:
                            break
            all_seen.set()

        consumer = threading.Thread(target=consume, name="bench-http-watch", daemon=True)
        consumer.start()
        if not ready.wait(timeout=10):
            raise RuntimeError("the HTTP watch did not start streaming")
        sent: dict[str, float] = {}
        writes: list[float] = []
        for i in paced(rate, seconds):
            name = f"{prefix}-{i:07d}"
            body = json.dumps(agent(name))
            sent[name] = time.perf_counter()
            response = client.post(path, content=body, headers={"content-type": "application/json"})
            writes.append((time.perf_counter() - sent[name]) * 1000)
            if response.status_code != 201:
                raise RuntimeError(f"POST {name}: {response.status_code} {response.text[:300]}")
        all_seen.wait(timeout=15)
        consumer.join(timeout=20)
    return WatchRun.of(sent, arrivals, writes)


# --- 3. HTTP throughput ----------------------------------------------------------------------------

Request = tuple[str, str, str, int]  # path, body, content type, objects in it


def http_load(base: str, requests: list[Request], concurrency: int, cap: float) -> tuple[int, float]:
    """POST ``requests`` from ``concurrency`` threads, each with its own ``httpx.Client`` (one
    keep-alive connection). Returns (objects written, seconds)."""
    lock = threading.Lock()
    queue = iter(requests)
    written = [0]
    failures: list[str] = []
    start = time.perf_counter()

    def worker() -> None:
        with httpx.Client(base_url=base, timeout=60) as client:
            while True:
                with lock:
                    item = next(queue, None)
                if item is None or failures or time.perf_counter() - start > cap:
                    return
                path, body, content_type, objects = item
                response = client.post(path, content=body, headers={"content-type": content_type})
                with lock:
                    if response.status_code in (200, 201):
                        written[0] += objects
                    else:
                        failures.append(f"POST {path}: {response.status_code} {response.text[:300]}")

    threads = [threading.Thread(target=worker, name=f"bench-http-{i}") for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise RuntimeError(failures[0])
    return written[0], elapsed


def http_throughput(server: Server, requests: list[Request], concurrency: int, cap: float) -> tuple[float, str]:
    meter = CpuMeter(server.proc.pid)
    with meter:
        written, elapsed = http_load(server.base, requests, concurrency, cap)
    bound = f"; srv CPU alone caps at {written / meter.server:,.0f}/s per core" if meter.server else ""
    return written / elapsed, f"{written} obj; {meter.per_object(written)}{bound}; {meter.summary()}"


def apply_batches(batches: int, size: int, prefix: str) -> list[Request]:
    out = []
    for b in range(batches):
        docs = [agent(f"{prefix}-{b:04d}-{i:04d}") for i in range(size)]
        out.append((APPLY_PATH, yaml.safe_dump_all(docs, sort_keys=False), "application/yaml", size))
    return out


def single_posts(n: int, prefix: str) -> list[Request]:
    path = AGENTS_PATH.format(namespace="default")
    return [(path, json.dumps(agent(f"{prefix}-{i:07d}")), "application/json", 1) for i in range(n)]


# --- 5. list latency -----------------------------------------------------------------------------

TARGET_NS = "bench-target"


def load_objects(store: Store, total: int, per_tx: int = 1000) -> float:
    """``total`` Agents in namespaces of ``per_tx`` (one transaction each); the middle one is
    ``bench-target``. Returns objects/s."""
    namespaces = max(1, total // per_tx)
    start = time.perf_counter()
    for ns_index in range(namespaces):
        namespace = TARGET_NS if ns_index == namespaces // 2 else f"bench-ns-{ns_index:03d}"
        with store.transaction() as tx:
            for i in range(per_tx):
                tx.create(AGENT, agent(f"agent-{i:05d}", namespace))
    return namespaces * per_tx / (time.perf_counter() - start)


def time_calls(fn: Callable[[], object], reps: int) -> list[float]:
    fn()  # warm-up, not counted
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def store_list_namespace(store: Store, reps: int) -> list[float]:
    def once() -> None:
        result = store.list(AGENT, ListOptions(namespace=TARGET_NS))
        assert len(result.items) == 1000, len(result.items)

    return time_calls(once, reps)


def store_list_pages(store: Store, total: int) -> list[float]:
    """Latency of each page of one full ``limit=1000`` walk."""
    samples: list[float] = []
    token: str | None = None
    seen = 0
    while len(samples) <= total // 1000 + 5:
        start = time.perf_counter()
        result = store.list(AGENT, ListOptions(limit=1000, continue_token=token))
        samples.append((time.perf_counter() - start) * 1000)
        seen += len(result.items)
        token = result.continue_token
        if not token:
            break
    assert seen == total, (seen, total)
    return samples


def http_list_namespace(client: httpx.Client, reps: int) -> list[float]:
    """Time to the complete response body; the client's JSON parse is checked outside the timing."""
    path = AGENTS_PATH.format(namespace=TARGET_NS)
    samples: list[float] = []
    for rep in range(reps + 1):  # the first is a warm-up
        start = time.perf_counter()
        response = client.get(path)
        elapsed = (time.perf_counter() - start) * 1000
        response.raise_for_status()
        assert len(response.json()["items"]) == 1000
        if rep:
            samples.append(elapsed)
    return samples


def http_list_pages(client: httpx.Client, total: int) -> list[float]:
    samples: list[float] = []
    token: str | None = None
    seen = 0
    while len(samples) <= total // 1000 + 5:
        params = {"limit": "1000", **({"continue": token} if token else {})}
        start = time.perf_counter()
        response = client.get(ALL_AGENTS_PATH, params=params)
        samples.append((time.perf_counter() - start) * 1000)
        response.raise_for_status()
        body = response.json()
        seen += len(body["items"])
        token = body["metadata"].get("continue")
        if not token:
            break
    assert seen == total, (seen, total)
    return samples


# --- one backend ------------------------------------------------------------------------------------

def latency_rows(label: str, samples: list[float] | None, target: float, note: str = "") -> list[Row]:
    if not samples:
        return [Row(f"{label} p50", None, "ms", note=note), Row(f"{label} p99", None, "ms", target, False, note=note)]
    n = f"n={len(samples)}" + (f"; {note}" if note else "")
    return [Row(f"{label} p50", percentile(samples, 50), "ms", note=n),
            Row(f"{label} p99", percentile(samples, 99), "ms", target, False, note=n)]


def failed(exc: BaseException) -> str:
    note = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    log(note)
    return note


def run_backend(backend: str, make_url: UrlFactory, cfg: Config, profile: bool) -> list[Row]:
    rows: list[Row] = []
    server_problem = server_available()
    with make_url("raw") as raw_url, make_url("apply") as url:
        raw: Writer = RawSqlite(raw_url) if backend == "sqlite" else RawPostgres(raw_url)
        store = open_store(url)
        profilers = {"store": Profiled(), "admission": Profiled()} if profile else {}
        writers: dict[str, Writer] = {"raw": raw, "store": StoreCreates(store, profilers.get("store"))}
        mods = admission_modules()
        adm_problem = mods if isinstance(mods, str) else None
        if not isinstance(mods, str):
            try:
                writers["admission"] = AdmissionApplies(store, *mods, profilers.get("admission"))
            except Exception as exc:  # noqa: BLE001 - report it, measure the rest
                adm_problem = failed(exc)
        try:
            log(f"{backend}: raw ceiling / store.create / admission apply, {cfg.write_n} objects each, "
                f"interleaved in {cfg.rounds} rounds")
            rates = interleaved(writers, cfg.write_n, cfg.rounds, cfg.cap_seconds)
            ceiling = rates["raw"].median
            chunk = cfg.write_n // cfg.rounds
            objs = chunk * len(rates["raw"].per_round)
            rows.append(Row("raw txn ceiling (1 obj/txn)", ceiling, "obj/s", note=rates["raw"].note(objs)))
            target = 0.5 * ceiling if backend == "sqlite" else None
            rows.append(Row("store.create (1 obj/txn)", rates["store"].median, "obj/s", target, ceiling=ceiling,
                            note=("target = 50% of raw; " if target else "") + rates["store"].note(objs)))
            if "admission" in rates:
                rows.append(Row("admission apply_documents (1 doc)", rates["admission"].median, "obj/s",
                                ceiling=ceiling, note=rates["admission"].note(objs)))
            else:
                rows.append(Row("admission apply_documents (1 doc)", None, "obj/s",
                                note=f"n/a (admission not available: {adm_problem})"))
            for name, profiled in profilers.items():
                if name in rates:
                    profiled.print(f"{backend} {name} writes")

            log(f"{backend}: store-level watch latency ({cfg.watch_rate:.0f}/s for {cfg.watch_seconds:.0f}s)")
            meter = CpuMeter()
            with meter:
                lat = watch_latency_store(store, cfg.watch_rate, cfg.watch_seconds, "watch")
            rows += latency_rows("watch latency, store", lat.latencies, 20,
                                 f"{cfg.watch_rate:.0f} creates/s; {lat.note()}; {meter.summary()}")
        finally:
            store.close()
            raw.close()

        if server_problem:
            note = f"n/a (server not available: {server_problem})"
            rows.append(Row(f"HTTP apply, {cfg.http_batch_size}-doc YAML batches", None, "obj/s", 1000, note=note))
            rows.append(Row("HTTP POST single object", None, "obj/s", 1000, note=note))
            rows += latency_rows("watch latency, HTTP", None, 20, note)
        else:
            rows += http_phase(backend, url, cfg)

    with make_url("list") as url:
        store = open_store(url)
        try:
            log(f"{backend}: loading {cfg.list_total:,} objects (1,000 per transaction)")
            load_rate = load_objects(store, cfg.list_total)
            rows.append(Row("bulk load via transaction() (1000/txn)", load_rate, "obj/s",
                            note=f"{cfg.list_total:,} objects, 1,000 in {TARGET_NS}"))
            log(f"{backend}: store list latency")
            meters = CpuMeter(), CpuMeter()
            with meters[0]:
                by_namespace = store_list_namespace(store, cfg.list_reps)
            with meters[1]:
                pages = store_list_pages(store, cfg.list_total)
            rows += latency_rows("store.list namespace", by_namespace, 100,
                                 f"1,000 of {cfg.list_total:,}; {meters[0].summary()}")
            rows += latency_rows("store.list limit=1000 page", pages, 100,
                                 f"every page of a walk over {cfg.list_total:,}; {meters[1].summary()}")
        finally:
            store.close()
        if server_problem:
            note = f"n/a (server not available: {server_problem})"
            rows += latency_rows("HTTP list namespace", None, 100, note)
            rows += latency_rows("HTTP list limit=1000 page", None, 100, note)
        else:
            log(f"{backend}: HTTP list latency")
            try:
                with Server(url) as server, httpx.Client(base_url=server.base, timeout=60) as client:
                    meters = CpuMeter(server.proc.pid), CpuMeter(server.proc.pid)
                    with meters[0]:
                        by_namespace = http_list_namespace(client, cfg.list_reps)
                    with meters[1]:
                        pages = http_list_pages(client, cfg.list_total)
                    rows += latency_rows("HTTP list namespace", by_namespace, 100,
                                         f"1,000 of {cfg.list_total:,}; {meters[0].summary()}")
                    rows += latency_rows("HTTP list limit=1000 page", pages, 100,
                                         f"every page of a walk over {cfg.list_total:,}; {meters[1].summary()}")
            except Exception as exc:  # noqa: BLE001 - report the failure in the table, keep going
                note = failed(exc)
                rows += latency_rows("HTTP list namespace", None, 100, note)
                rows += latency_rows("HTTP list limit=1000 page", None, 100, note)
    return rows


def http_phase(backend: str, url: str, cfg: Config) -> list[Row]:
    rows: list[Row] = []
    batch_label = f"HTTP apply, {cfg.http_batch_size}-doc YAML batches"
    single_label = f"HTTP POST single object ({cfg.http_clients} clients)"
    try:
        with Server(url) as server:
            log(f"{backend}: HTTP apply, {cfg.http_batches} batches of {cfg.http_batch_size} documents")
            rate, note = http_throughput(server, apply_batches(cfg.http_batches, cfg.http_batch_size, "batch"),
                                         2, cfg.cap_seconds)
            rows.append(Row(batch_label, rate, "obj/s", 1000, note=note))
            log(f"{backend}: HTTP POST, {cfg.http_single_n} single objects, {cfg.http_clients} clients")
            rate, note = http_throughput(server, single_posts(cfg.http_single_n, "post"), cfg.http_clients,
                                         cfg.cap_seconds)
            rows.append(Row(single_label, rate, "obj/s", 1000, note=note))
            log(f"{backend}: HTTP watch latency ({cfg.watch_rate:.0f}/s for {cfg.watch_seconds:.0f}s)")
            meter = CpuMeter(server.proc.pid)
            with meter:
                lat = watch_latency_http(server.base, cfg.watch_rate, cfg.watch_seconds, "hwatch")
            rows += latency_rows("watch latency, HTTP", lat.latencies, 20,
                                 f"{cfg.watch_rate:.0f} POSTs/s; {lat.note()}; {meter.summary()}")
    except Exception as exc:  # noqa: BLE001 - report the failure in the table, keep going
        note = failed(exc)
        done = {r.figure for r in rows}
        if batch_label not in done:
            rows.append(Row(batch_label, None, "obj/s", 1000, note=note))
        if single_label not in done:
            rows.append(Row(single_label, None, "obj/s", 1000, note=note))
        rows += latency_rows("watch latency, HTTP", None, 20, note)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts (well under a minute per backend)")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--postgres", default=POSTGRES, help="base PostgreSQL URL (a schema is created in it)")
    parser.add_argument("--profile", action="store_true", help="cProfile the store-level and admission writes")
    parser.add_argument("--wait-idle", type=float, default=0, metavar="SECONDS",
                        help="first wait up to SECONDS for other processes to leave the CPU idle")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    cfg = Config.quick() if args.quick else Config.full()
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    mode = "quick" if args.quick else "full"

    busy = wait_idle(args.wait_idle) if args.wait_idle else machine_busy(1.0)
    print(f"joch store benchmark ({mode} run, {time.strftime('%Y-%m-%d %H:%M')})")
    facts = machine_facts(args.postgres if "postgres" in backends else None)
    facts.append(("cores busy before start", f"{busy:.2f} (other processes)"))
    facts.append(("sqlite durability", "WAL, synchronous=NORMAL (store default; no fsync per commit)"))
    for key, value in facts:
        print(f"  {key:<28} {value}")

    results: dict[str, list[Row]] = {}
    started = time.perf_counter()
    with workdir() as tmp:
        for backend in backends:
            factory: UrlFactory
            if backend == "sqlite":
                def factory(name: str, _tmp: str = tmp) -> AbstractContextManager[str]:
                    return sqlite_url(Path(_tmp), name)
            else:
                def factory(name: str) -> AbstractContextManager[str]:
                    return postgres_url(args.postgres, name)
            try:
                results[backend] = run_backend(backend, factory, cfg, args.profile)
            except psycopg.OperationalError as exc:
                log(f"{backend}: skipped, database unreachable: {exc}")
                continue
            print_table(f"{backend} ({mode})", results[backend])
    print(f"\ntotal wall time {time.perf_counter() - started:.0f}s")
    print("notes: 'cores' = CPU used during the measurement, in cores of the machine: bench = this client process,"
          "\n  srv = the joch server subprocess, other = everything else (Postgres backends and any unrelated load:"
          "\n  with 'other' well above 0 on SQLite, figures are depressed by foreign load). 'cpu/obj' = CPU ms per"
          "\n  object (cli = this process, including the store's feed thread). 'rounds' = slowest..fastest round."
          "\n  A p99 of fewer than 100 samples is the maximum.")
    if args.json:
        payload = {"date": time.strftime("%Y-%m-%d"), "mode": mode, "machine": dict(facts),
                   "results": {b: [{**asdict(r), "verdict": r.verdict} for r in rows] for b, rows in results.items()}}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
