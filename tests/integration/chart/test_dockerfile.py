"""The Dockerfile of the image the chart runs, checked without a Docker daemon (none runs here):
two stages, the final one non-root with the uid the chart's podSecurityContext uses, git inside,
``joch`` (server and runner) as the entrypoint; and the build context ``.dockerignore`` lets through
is enough to build joch the way the build stage does (a wheel with its store migrations)."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

from support.helmchart import CHART, REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for op, rest in instructions():
        if op == "FROM":
            out.append([])
        if out:
            out[-1].append((op, rest))
    return out


def in_context(path: str) -> bool:
    """Whether ``.dockerignore`` (Docker's last-match-wins patterns) lets ``path`` into the context."""
    included = True
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate, pattern = line.startswith("!"), line.lstrip("!").rstrip("/")
        pattern = pattern.removeprefix("**/")
        parts = path.split("/")
        if any(fnmatch.fnmatch("/".join(parts[: n + 1]), pattern) or fnmatch.fnmatch(parts[n], pattern)
               for n in range(len(parts))):
            included = negate
    return included


def test_two_stages_and_the_final_one_runs_as_the_charts_non_root_user() -> None:
    build, final = stages()
    assert build[0][1].endswith(" AS build")
    user = [rest for op, rest in final if op == "USER"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
    assert user == [f"{values['runAsUser']}:{values['runAsGroup']}"], "numeric, so runAsNonRoot can check it"
    assert ("COPY", "--from=build /opt/joch /opt/joch") in final
    assert not [rest for op, rest in final if op == "COPY" and "--from" not in rest], "sources stay in build"


def test_the_final_stage_has_git_and_joch_server_and_runner() -> None:
    _, final = stages()
    installs = " ".join(rest for op, rest in final if op == "RUN")
    assert re.search(r"apt-get install [^&]*\bgit\b", installs)
    assert ("ENTRYPOINT", '["tini", "--", "joch"]') in final
    assert ("CMD", '["server", "--host", "0.0.0.0", "--data-dir", "/var/lib/joch"]') in final
    build_runs = " ".join(rest for op, rest in stages()[0] if op == "RUN")
    assert "-r /src/requirements.lock" in build_runs, "dependencies come pinned from the lock"
    assert "joch runner --help" in build_runs and "joch server --help" in build_runs
    for command in ("server", "runner"):
        joch = Path(sys.executable).parent / "joch"
        subprocess.run([str(joch), command, "--help"], check=True, capture_output=True)


def test_dockerignore_keeps_data_and_secrets_out_of_the_context() -> None:
    for path in (".git/config", ".venv/bin/python", ".joch/joch.db", ".joch/secret.key", "tests/conftest.py",
                 "src/joch/__pycache__/x.pyc"):
        assert not in_context(path), path
    for op, rest in stages()[0]:
        if op == "COPY":
            for source in rest.split()[:-1]:
                assert (REPO / source).exists() and in_context(source), f"COPY {source}: not in the build context"


def test_the_build_context_builds_joch_with_its_migrations(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for top, dirs, files in os.walk(REPO):
        here = "" if Path(top) == REPO else Path(top).relative_to(REPO).as_posix()
        dirs[:] = [d for d in dirs if in_context(f"{here}/{d}".lstrip("/"))]
        for name in files:
            relative = f"{here}/{name}".lstrip("/")
            if in_context(relative):
                (context / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / relative, context / relative)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "wheels"), str(context)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "wheels").glob("joch-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert any(n.startswith("joch/store/migrations/sqlite/") and n.endswith(".sql") for n in names)
    assert any(n.startswith("joch/store/migrations/postgres/") and n.endswith(".sql") for n in names)
    assert "joch = joch.cli.main:main" in entry_points
