"""The runner's on-disk record and paths, without starting processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from joch.runtime import runner, workspace
from joch.runtime.base import ArtifactRecord, GitSource, Invocation, RefusedArtifact, RunState, Sandbox, Session


def test_the_state_record_round_trips_with_extras(tmp_path: Path) -> None:
    state = RunState(phase="Succeeded", reason="Completed", message="agent exited with code 0", exit_code=0,
                     started_at=1.5, finished_at=2.5, pid=42,
                     artifacts=(ArtifactRecord(name="changes.patch", path="changes.patch", sha256="ab", size=3),),
                     base_commit="abc",
                     invocation=Invocation(argv=("codex", "exec"), env=("HOME", "OPENAI_API_KEY"),
                                           executable="/usr/bin/codex", version="codex-cli 0.169.0", sha256="cd"),
                     sandbox=Sandbox(mode="bwrap", user=65534, network="off"),
                     session=Session(id="s-1", resumed_from=1),
                     omitted=(RefusedArtifact(name="big.bin", path="big.bin", size=9, message="over 8 bytes"),))
    path = tmp_path / "state.json"
    runner.write_state(path, state, runner_pid=7)
    assert runner.read_state(path) == state
    record = json.loads(path.read_text())
    assert record["apiVersion"] == "runner.joch.dev/v1" and record["runner_pid"] == 7
    assert record["base_commit"] == "abc"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left
    assert runner.read_state(tmp_path / "missing.json") is None


def test_workspace_paths(tmp_path: Path) -> None:
    files = runner.RunFiles(tmp_path / "run")
    ws = runner.workspace_of(files, tmp_path / "wt", GitSource(url="x", path="./a/b/"))
    assert ws.context() == {"root": str(tmp_path / "wt"), "path": str(tmp_path / "wt/a/b"),
                            "inputs": str(tmp_path / "run/inputs"), "outputs": str(tmp_path / "run/outputs"),
                            "home": str(tmp_path / "run/home")}
    assert runner.workspace_of(files, tmp_path / "wt", None).path == str(tmp_path / "wt")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("path", ["..", "../x", "a/../../x", "/abs"])
def test_subpaths_may_not_escape(path: str) -> None:
    with pytest.raises(workspace.WorkspaceError, match="must be relative and stay inside"):
        workspace.subpath(Path("/root"), path)


@pytest.mark.parametrize(("path", "expected"),
                         [(".", "/root"), ("", "/root"), ("a/../b", "/root/b"), ("a/", "/root/a")])
def test_subpaths_are_normalized(path: str, expected: str) -> None:
    assert workspace.subpath(Path("/root"), path) == Path(expected)


def test_mirror_paths_are_keyed_by_url() -> None:
    a = workspace.mirror_path(Path("/cache"), "https://example.com/a.git")
    assert a.parent == Path("/cache") and a.suffix == ".git" and len(a.stem) == 16
    assert a != workspace.mirror_path(Path("/cache"), "https://example.com/b.git")


def test_help_works(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        runner.main(["--help"])
    assert exited.value.code == 0 and "--spec" in capsys.readouterr().out


def test_the_runner_spec_round_trips_with_policies() -> None:
    from joch.runtime.base import ConfigFile, Network, PatchPolicy, Resume, RunId, RunnerSpec, SuccessPolicy

    spec = RunnerSpec(run=RunId(namespace="ns", name="r", uid="u", attempt=2), argv=("codex", "exec"),
                      config_files=(ConfigFile(path=".codex/config.toml", content="model = 'x'\n"),),
                      output_format="codex",
                      success=SuccessPolicy(require_changes=True, failure_patterns=("^Error:",),
                                            required_artifacts=("summary",)),
                      patch=PatchPolicy(exclude=(".aider*",), max_file_bytes=1024), version_args=(),
                      resume=Resume(attempt=1, session_id="s-1"), network=Network(mode="limited", allow=("a:443",)),
                      manifest_hash="sha256:ab")
    assert RunnerSpec.from_json(spec.to_json()) == spec
    old = json.loads(spec.to_json())
    for key in ("config_files", "output_format", "success", "patch", "version_args", "resume", "network",
                "manifest_hash"):
        del old[key]
    plain = RunnerSpec.from_json(json.dumps(old))  # a spec written before these fields existed
    assert plain.success == SuccessPolicy() and plain.version_args == ("--version",) and plain.resume is None
