"""HTTP apply throughput with authentication and RBAC on, as a ratio of the same without (target >= 70%).

Two real ``joch server`` subprocesses on 127.0.0.1 over fresh SQLite stores, one with no
authenticator (auth none) and one with ``--token-file``, where the caller is an editor through a
RoleBinding of its group (so every request pays: bearer lookup, request resolution, a binding
lookup). Each measures:

* single-object creates: ``POST /apis/joch.dev/v1alpha1/namespaces/default/agentproviders`` from
  4 concurrent clients;
* batch applies: ``POST /v1/resources/apply`` of 100-document YAML (every document authorized).

Run: ``.venv/bin/python bench/auth_bench.py [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, VENV_BIN, free_port

TOKENS = "admin,alice,1,system:masters\neditor,eddie,2,devs\n"
BINDING = """apiVersion: ops.joch.dev/v1alpha1
kind: RoleBinding
metadata: {name: devs, namespace: default}
roleRef: {kind: Role, name: editor}
subjects: [{kind: Group, name: devs}]
"""
CLIENTS = 4


@contextlib.contextmanager
def server(directory: Path, *, auth: bool) -> Iterator[str]:
    port = free_port()
    cmd = [str(VENV_BIN / "joch"), "server", "--no-controllers", "--data-dir", str(directory), "--port", str(port)]
    if auth:
        (directory / "tokens.csv").write_text(TOKENS)
        cmd += ["--token-file", str(directory / "tokens.csv")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the server did not start")
            time.sleep(0.1)
        if auth:
            r = httpx.post(f"{base}/v1/resources/apply", content=BINDING,
                           headers={"Content-Type": "application/yaml", "Authorization": "Bearer admin"})
            r.raise_for_status()
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def provider(name: str) -> str:
    return f"apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {{name: {name}}}\nspec: {{binary: echo}}\n"


def singles(base: str, headers: dict[str, str], n: int, prefix: str) -> float:
    path = "/apis/joch.dev/v1alpha1/namespaces/default/agentproviders"
    errors: list[str] = []

    def client(k: int) -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=30) as http:
            for i in range(k, n, CLIENTS):
                body = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider",
                        "metadata": {"name": f"{prefix}-{i}"}, "spec": {"binary": "echo"}}
                r = http.post(path, json=body)
                if r.status_code != 201:
                    errors.append(r.text)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(errors[0])
    return n / elapsed


def batches(base: str, headers: dict[str, str], count: int, size: int, prefix: str) -> float:
    with httpx.Client(base_url=base, headers={**headers, "Content-Type": "application/yaml"}, timeout=60) as http:
        start = time.perf_counter()
        for b in range(count):
            body = "---\n".join(provider(f"{prefix}-{b}-{i}") for i in range(size))
            http.post("/v1/resources/apply", content=body).raise_for_status()
        return count * size / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    n, count, size = (600, 5, 100) if args.quick else (3000, 20, 100)
    results: dict[str, tuple[float, float]] = {}
    for label, auth in (("auth none", False), ("token file + RBAC", True)):
        with tempfile.TemporaryDirectory() as tmp, server(Path(tmp), auth=auth) as base:
            headers = {"Authorization": "Bearer editor"} if auth else {}
            singles(base, headers, 100, "warm")
            results[label] = (singles(base, headers, n, "p"), batches(base, headers, count, size, "b"))
    none, on = results["auth none"], results["token file + RBAC"]
    print(f"{'':22}{'creates/s':>12}{'batch objects/s':>18}")
    for label, (single, batch) in results.items():
        print(f"{label:22}{single:12.0f}{batch:18.0f}")
    ratios = (on[0] / none[0], on[1] / none[1])
    print(f"{'ratio (target >= 70%)':22}{ratios[0]:12.0%}{ratios[1]:18.0%}")
    return 0 if min(ratios) >= 0.7 else 1


if __name__ == "__main__":
    raise SystemExit(main())
