"""HTTP apply throughput with the audit log on, for a before/after comparison.

Run ``.venv/bin/python bench/audit_bench.py`` (``--backend sqlite|postgres``, ``--rounds N``,
``--objects N``). Against a fresh store per backend, a real ``joch server`` subprocess on 127.0.0.1
receives ``--rounds`` applies of ``--objects`` new Agents each (one multi-document YAML
``POST /v1/resources/apply`` per round, prebuilt bodies, one warm-up round untimed) and the median
objects/s is printed, with the number of audit rows the server holds afterwards (``GET /v1/audit``;
"n/a" on a server without it). Every object written during a request costs one audit row in the
same transaction (rows are batched into one ``INSERT`` per 80 objects).

``--before SRC`` compares with a Joch without the audit log (``git archive <commit> src | tar -x -C
/tmp/before`` then ``--before /tmp/before/src``): two servers run side by side over stores of their
own, one importing ``joch`` from SRC, and their rounds alternate, so load from other processes on a
shared machine hits both alike; the ratio after/before is printed. (Run one after the other, the
objects/s of a shared 2-core machine swing by tens of percent.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Server, agent, postgres_url, sqlite_url, workdir

import joch

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


def body(round_: int, objects: int) -> str:
    return yaml.safe_dump_all([agent(f"r{round_}-a{i}") for i in range(objects)])


def server(store_url: str, source: str | None) -> Server:
    """``joch server`` importing ``joch`` from ``source`` (None: this checkout)."""
    saved = os.environ.get("PYTHONPATH")
    if source:
        os.environ["PYTHONPATH"] = source
    try:
        return Server(store_url)
    finally:
        if source:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved


def rate(http: httpx.Client, text: str, objects: int) -> float:
    started = time.perf_counter()
    response = http.post("/v1/resources/apply", content=text, headers={"Content-Type": "application/yaml"})
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return objects / elapsed


def audit_rows(http: httpx.Client) -> str:
    audit = http.get("/v1/audit", params={"limit": 5000, "verb": "apply", "kind": "Agent"})
    return str(len(audit.json()["items"])) if audit.status_code == 200 else "n/a"


def measure(urls: list[str], sources: list[str | None], rounds: int, objects: int) -> list[tuple[float, str]]:
    """Median objects/s and audit rows per server; the servers' rounds alternate."""
    bodies = [body(r, objects) for r in range(rounds + 1)]
    with contextlib.ExitStack() as stack:
        clients = []
        for url, source in zip(urls, sources, strict=True):
            running = stack.enter_context(server(url, source))
            clients.append(stack.enter_context(httpx.Client(base_url=running.base, timeout=120)))
        rates: list[list[float]] = [[] for _ in clients]
        for r, text in enumerate(bodies):
            for i, http in enumerate(clients if r % 2 else reversed(clients)):
                index = i if r % 2 else len(clients) - 1 - i
                measured = rate(http, text, objects)
                if r:  # round 0 warms the servers up
                    rates[index].append(measured)
        return [(statistics.median(rs), audit_rows(http)) for rs, http in zip(rates, clients, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--postgres", default=POSTGRES)
    parser.add_argument("--before", metavar="SRC", help="also measure the joch package in SRC, alternating")
    args = parser.parse_args()
    print(f"joch from {Path(joch.__file__).resolve().parent}" + (f", before from {args.before}" if args.before else ""))
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    sources: list[str | None] = [None, args.before] if args.before else [None]
    with workdir() as tmp:
        for backend in backends:
            with contextlib.ExitStack() as stack:
                urls = [stack.enter_context(sqlite_url(Path(tmp), f"audit{i}") if backend == "sqlite"
                                            else postgres_url(args.postgres, f"audit{i}"))
                        for i in range(len(sources))]
                results = measure(urls, sources, args.rounds, args.objects)
            (after, rows), *before = results
            line = (f"{backend:8} HTTP apply of {args.objects} objects, median of {args.rounds} rounds: "
                    f"{after:6.0f} objects/s (audit rows: {rows})")
            if before:
                line += f"; before: {before[0][0]:6.0f} objects/s; after/before = {after / before[0][0]:.0%}"
            print(line)


if __name__ == "__main__":
    main()
