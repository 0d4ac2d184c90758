"""Layers import downwards only (DESIGN.md §4), and Kubernetes clients stay in their two modules.

The check parses every module under src/joch (no imports are executed), so a violating import fails
here even when nothing exercises it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "joch"

# Each layer may import itself, and the layers listed for it (transitively below it).
LAYERS: dict[str, set[str]] = {
    "telemetry": {"api"},  # metrics, traces, logs: below everything, so every layer can record
    "api": set(),
    "store": {"api"},
    "admission": {"policy", "store", "api"},  # policy preflight: admission evaluates the rules
    "compiler": {"store", "api"},
    "runtime": {"store", "api"},
    "integrations": {"store", "api"},
    "policy": {"store", "api"},
    "controllers": {"admission", "compiler", "runtime", "integrations", "policy", "store", "api"},
}
TOP = {"controllers", "admission", "compiler", "runtime", "integrations", "policy", "store", "api"}
for top in ("cli", "server", "mcp", "web"):
    LAYERS[top] = set(TOP)
LAYERS["server"] |= {"web", "mcp"}  # the server mounts the console and the MCP endpoint
LAYERS["cli"] |= {"server", "mcp", "web"}  # `joch server` serves in-process; `joch mcp`
for layer, below in LAYERS.items():
    if layer not in ("api", "telemetry"):
        below.add("telemetry")
KUBERNETES_CLIENTS = ("lightkube", "kubernetes", "kubernetes_asyncio")
KUBERNETES_HOMES = ("store/kubernetes", "runtime/kubernetes")


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def layer_of(path: Path) -> str | None:
    parts = path.relative_to(SRC).parts
    return parts[0] if len(parts) > 1 else None


def test_layers_import_downwards_only() -> None:
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        layer = layer_of(path)
        if layer is None:
            continue
        assert layer in LAYERS, f"{path}: package joch.{layer} is not placed in a layer in tests/test_layers.py"
        for line, module in imports(path):
            parts = module.split(".")
            if parts[0] != "joch" or len(parts) < 2 or parts[1] == layer or parts[1] not in LAYERS:
                continue
            if parts[1] not in LAYERS[layer]:
                problems.append(f"{path.relative_to(SRC.parent)}:{line}: joch.{layer} imports {module}")
    assert not problems, "imports against the layering (DESIGN.md §4):\n" + "\n".join(problems)


def test_kubernetes_clients_only_in_their_modules() -> None:
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(KUBERNETES_HOMES):
            continue
        for line, module in imports(path):
            if module.split(".")[0] in KUBERNETES_CLIENTS:
                problems.append(f"{rel}:{line}: imports {module}")
    assert not problems, "Kubernetes client imports outside store/kubernetes and runtime/kubernetes:\n" + "\n".join(
        problems
    )


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from joch.server import app\nimport lightkube\n")
    assert (1, "joch.server") in imports(bad) and (2, "lightkube") in imports(bad)
    assert "server" not in LAYERS["store"]
