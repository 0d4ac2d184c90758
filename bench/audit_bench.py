"""HTTP apply throughput with the audit log on, for a before/after comparison.

Run ``.venv/bin/python bench/audit_bench.py`` (``--backend sqlite|postgres``, ``--rounds N``,
``--objects N``). Against a fresh store per backend, a real ``joch server`` subprocess on 127.0.0.1
receives ``--rounds`` applies of ``--objects`` new Agents each (one multi-document YAML
``POST /v1/resources/apply`` per round, prebuilt bodies, one warm-up round untimed) and the median
objects/s is printed, with the number of audit rows the server holds afterwards (``GET /v1/audit``;
"n/a" on a server without it). Every object written during a request costs one audit row in the
same transaction (rows are batched into one ``INSERT`` per 80 objects).

The figure of a Joch without the audit log comes from the same script run against that source tree:
``git archive <commit> src | tar -x -C /tmp/before && PYTHONPATH=/tmp/before/src .venv/bin/python
bench/audit_bench.py`` (the first line printed says which ``joch`` was measured). On a shared 2-core
machine objects/s swing by tens of percent between runs: alternate before/after runs and compare
medians.
"""

from __future__ import annotations

import argparse
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


def measure(store_url: str, rounds: int, objects: int) -> tuple[float, str]:
    bodies = [body(r, objects) for r in range(rounds + 1)]
    with Server(store_url) as server, httpx.Client(base_url=server.base, timeout=120) as http:
        rates = []
        for r, text in enumerate(bodies):
            started = time.perf_counter()
            response = http.post("/v1/resources/apply", content=text, headers={"Content-Type": "application/yaml"})
            elapsed = time.perf_counter() - started
            response.raise_for_status()
            if r:  # round 0 warms the server up
                rates.append(objects / elapsed)
        audit = http.get("/v1/audit", params={"limit": 5000, "verb": "create"})
        rows = str(len(audit.json()["items"])) if audit.status_code == 200 else "n/a"
    return statistics.median(rates), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--postgres", default=POSTGRES)
    args = parser.parse_args()
    print(f"joch from {Path(joch.__file__).resolve().parent}")
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    with workdir() as tmp:
        for backend in backends:
            url_of = sqlite_url(Path(tmp), "audit") if backend == "sqlite" else postgres_url(args.postgres, "audit")
            with url_of as url:
                rate, rows = measure(url, args.rounds, args.objects)
            print(f"{backend:8} HTTP apply of {args.objects} objects: median {rate:7.0f} objects/s over "
                  f"{args.rounds} rounds; audit rows: {rows}")


if __name__ == "__main__":
    main()
