"""The README's Quickstart, run as written: every ``$ joch ...`` command of its first console block
against a real ``joch server --apply-missing examples/quickstart/`` (what ``make run`` starts),
from the repository root, and its output compared with the sample printed under it.

Ages, hashes, sizes and generated names differ from run to run, so both sides are compared with
those masked (``_shape``). In a sample, a line that starts and ends with ``…`` stands for any
number of lines, and ``…`` inside a line for any text.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from integration.cli.conftest import JOCH, free_port
from support import wait_ready

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
_MASKS = (
    # a uid, or its first group before an ellipsis in a sample (the text is split at each "…")
    (re.compile(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b|\b[0-9a-f]{8}-$"), "UID"),
    (re.compile(r"\b[0-9a-f]{12,64}\b"), "HEX"),
    (re.compile(r"demo-[a-z0-9]{5}\b"), "demo-NAME"),
    (re.compile(r"\b\d+(?:[smhd]\d*[smh]?)?\b"), "N"),
)


@dataclass(frozen=True)
class Step:
    command: str
    sample: list[str]


def quickstart_steps() -> list[Step]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Quickstart"):]
    block = section[section.index("```console\n") + len("```console\n"):]
    block = block[:block.index("```")]
    steps: list[Step] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append(Step(line[2:].split("  #")[0].strip(), []))
        elif steps and line.strip():
            steps[-1].sample.append(line)
    return steps


def _shape(line: str) -> str:
    for pattern, mask in _MASKS:
        line = pattern.sub(mask, line)
    return " ".join(line.split())


def matches(sample: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` has the shape of ``sample`` (see the module docstring)."""
    if not sample:
        return not actual
    head, rest = sample[0], sample[1:]
    if head.startswith("…") and head.endswith("…"):
        return any(matches(rest, actual[i:]) for i in range(len(actual) + 1))
    if not actual:
        return False
    parts = [re.escape(_shape(part)) for part in head.split("…")]
    return re.fullmatch(".*".join(parts), _shape(actual[0])) is not None and matches(rest, actual[1:])


@pytest.fixture
def quickstart_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([str(JOCH), "server", "--data-dir", str(tmp_path / ".joch"), "--port", str(port),
                             "--apply-missing", "examples/quickstart/"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        deadline = time.monotonic() + 60
        run = f"{base}/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns/hello-readme"
        while (httpx.get(run).json().get("status") or {}).get("phase") != "Succeeded":
            assert time.monotonic() < deadline, httpx.get(run).json()
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def test_the_quickstart_prints_what_the_readme_shows(quickstart_server: str, tmp_path: Path) -> None:
    steps = quickstart_steps()
    assert [s.command.split()[1] for s in steps][:3] == ["apply", "get", "get"]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}, "JOCH_SERVER": quickstart_server}
    for step in steps:
        # The README downloads to /tmp/hello-readme; the test keeps to its own directory.
        args = step.command.replace("/tmp/hello-readme", str(tmp_path / "hello-readme")).split()
        assert args[0] == "joch", step.command
        done = subprocess.run([str(JOCH), *args[1:]], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, f"{step.command}:\n{done.stderr}"
        shown = [line.replace(str(tmp_path / "hello-readme"), "/tmp/hello-readme")
                 for line in done.stdout.splitlines() if line.strip()]
        assert matches(step.sample, shown), (f"`{step.command}` printed:\n" + "\n".join(shown) +
                                             "\n\nthe README shows:\n" + "\n".join(step.sample))
