"""How long ``joch server`` takes from process start to answering ``/readyz``, and what building a
second app costs in one process (the test suite builds hundreds).

Each start is ``python -m joch server`` on a fresh data directory (embedded SQLite, the controllers
on, as ``make run`` starts it but without the quickstart), timed from ``Popen`` to the first 200
of ``/readyz``, then stopped with SIGTERM. Starts alternate between the configurations so that the
machine's load falls on each alike. The baselines, measured in the same run:

* ``python -c 'import joch.cli.main, joch.server'``: the interpreter and the modules a server
  imports before it does anything, the floor of a start;
* ``--compare COMMIT``: that commit's ``src`` (``git archive``), started the same way.

Run: ``.venv/bin/python bench/server_start_bench.py [--starts N] [--compare COMMIT]`` (about 30 s).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from _common import free_port, log, machine_busy, workdir
from governance_bench import extract_source

APP_BUILDS = """
import sys, tempfile, time
from joch.server.app import create_app
from joch.store import open_store
store = open_store(f"sqlite:///{tempfile.mkdtemp()}/joch.db")
for _ in range(4):
    started = time.perf_counter()
    create_app(store)
    print(time.perf_counter() - started)
store.close()
"""


@dataclass
class Config:
    label: str
    source: Path | None  # PYTHONPATH for that commit's src; None: this checkout
    starts: list[float] = field(default_factory=list)
    builds: list[float] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOCH_") and k != "PYTHONPATH"}
        if self.source is not None:
            env["PYTHONPATH"] = str(self.source)
        return env


def time_start(config: Config, data_dir: Path) -> float:
    port = free_port()
    data_dir.parent.mkdir(parents=True)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "joch", "server", "--data-dir", str(data_dir), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=config.env(), cwd=data_dir.parent)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{config.label}: joch server exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1.0).status_code == 200:
                    return time.monotonic() - started
            if time.monotonic() - started > 120:
                raise RuntimeError(f"{config.label}: not ready after 120 s")
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def time_import(config: Config) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import joch.cli.main, joch.server"], env=config.env(), check=True)
    return time.monotonic() - started


def app_builds(config: Config) -> list[float]:
    done = subprocess.run([sys.executable, "-c", APP_BUILDS], env=config.env(), capture_output=True, text=True,
                          check=True)
    return [float(line) for line in done.stdout.split()]


def spread(samples: list[float]) -> str:
    return f"{statistics.median(samples):6.2f} s  (min {min(samples):.2f}, max {max(samples):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5, help="starts per configuration (default 5)")
    parser.add_argument("--compare", metavar="COMMIT", help="also start this commit's code (git archive of src)")
    args = parser.parse_args(argv)
    with workdir() as tmp:
        work = Path(tmp)
        configs = [Config("this checkout", None)]
        if args.compare:
            configs.append(Config(args.compare, extract_source(work, args.compare)))
        log(f"machine busy: {machine_busy():.2f} cores")
        imports = [time_import(configs[0]) for _ in range(args.starts)]
        for i in range(args.starts):
            for n, config in enumerate(configs):
                config.starts.append(time_start(config, work / f"start-{n}-{i}" / "data"))
        for config in configs:
            config.builds = app_builds(config)
    print(f"\n== joch server: process start to /readyz, {args.starts} starts each ==")
    print(f"  {'imports alone (floor)':<33} {spread(imports)}")
    for config in configs:
        print(f"  {config.label:<33} {spread(config.starts)}")
    print("\n== create_app in one process: the first, then three more ==")
    for config in configs:
        first, *rest = config.builds
        print(f"  {config.label:<33} first {first:.2f} s, then {', '.join(f'{b:.2f}' for b in rest)} s")
    if args.compare:
        now, before = (statistics.median(c.starts) for c in configs)
        print(f"\n  start to /readyz: {now / before:.2f}x the time of {args.compare}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
