"""What the runner does for real agent CLIs: a HOME of each attempt's own with the provider's config
files, a record of what ran, the agent's output read for usage, its session and its verdict, the
success policy, patch hygiene, and resuming an earlier attempt. Real runner processes throughout."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from integration.runtime import lineformat
from integration.runtime.helpers import PYTHON, RunnerRun, python_agent, spec
from joch.runtime.base import ConfigFile, RunState

TESTS = str(Path(__file__).resolve().parents[2])


def with_test_format(r: RunnerRun, *extra: str) -> list[str]:
    """The runner command, in an interpreter that reads the ``test-lines`` output format."""
    return [PYTHON, "-c", lineformat.RUNNER_WITH_TEST_FORMAT, "--spec", str(r.files.spec), *r.options(), *extra]


def run_with_test_format(r: RunnerRun, *extra: str, timeout: float = 60) -> tuple[int, RunState]:
    env = {**r.env, "PYTHONPATH": os.pathsep.join([TESTS, r.env.get("PYTHONPATH", "")])}
    done = subprocess.run(with_test_format(r, *extra), env=env, capture_output=True, timeout=timeout, check=False)
    state = r.state()
    assert state is not None, done.stderr.decode()
    return done.returncode, state


DUMP_ENV = """
import json, os, sys, time
home = os.environ["HOME"]
open(os.path.join(home, "written-by-the-agent"), "w").write("mine")
time.sleep(0.3)  # the two runs overlap
json.dump({"env": dict(os.environ), "files": sorted(os.listdir(home))}, open(sys.argv[1], "w"))
"""


def test_each_attempt_has_its_own_home_with_its_config_files(make_run: Callable[..., RunnerRun],
                                                             tmp_path: Path) -> None:
    server_home = tmp_path / "server-home"
    (server_home / ".codex").mkdir(parents=True)
    (server_home / ".codex" / "config.toml").write_text("operator's own\n")
    configs = (ConfigFile(".codex/config.toml", 'model = "m1"\n'),
               ConfigFile(".config/tool/settings.json", "{}", mode=0o644))
    runs = [make_run(spec([*python_agent(DUMP_ENV), str(tmp_path / f"env-{n}.json")], uid=f"uid-{n}",
                          config_files=configs), env={"HOME": str(server_home), "XDG_CONFIG_HOME": "/etc/xdg-x"})
            for n in (1, 2)]
    started = [r.start() for r in runs]  # concurrently
    for proc in started:
        assert proc.wait(timeout=60) == 0, proc.stdout.read() if proc.stdout else ""
    homes = []
    for n, r in enumerate(runs, 1):
        state = r.state()
        assert state is not None and state.phase == "Succeeded", state
        seen = json.loads((tmp_path / f"env-{n}.json").read_text())
        env = seen["env"]
        home = r.files.home
        assert env["HOME"] == str(home)
        assert {k: env[k] for k in env if k.startswith("XDG_")} == {
            "XDG_CONFIG_HOME": f"{home}/.config", "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_CACHE_HOME": f"{home}/.cache", "XDG_STATE_HOME": f"{home}/.local/state"}
        assert not any(str(server_home) in value for value in env.values())  # nothing of the server's HOME
        assert (home / ".codex" / "config.toml").read_text() == 'model = "m1"\n'
        assert stat.S_IMODE((home / ".codex" / "config.toml").stat().st_mode) == 0o600
        assert stat.S_IMODE((home / ".config" / "tool" / "settings.json").stat().st_mode) == 0o644
        assert (home / "written-by-the-agent").read_text() == "mine"
        assert all((home / sub).is_dir() for sub in (".config", ".local/share", ".cache", ".local/state"))
        homes.append(env["HOME"])
    assert homes[0] != homes[1]
    assert (server_home / ".codex" / "config.toml").read_text() == "operator's own\n"
    assert sorted(p.name for p in server_home.iterdir()) == [".codex"]


def test_a_config_file_must_stay_inside_home(make_run: Callable[..., RunnerRun], tmp_path: Path) -> None:
    for path, why in (("../outside.toml", "must be a relative path that stays inside HOME"),
                      ("/etc/x.toml", "must be a relative path that stays inside HOME"),
                      (".", "names HOME itself, not a file in it")):
        r = make_run(spec(["true"], config_files=(ConfigFile("ok.toml", "x"), ConfigFile(path, "x"))))
        code, state = r.run()
        assert (code, state.phase, state.reason) == (1, "Failed", "WorkspaceError")
        assert state.message == f'config file "{path}" (configFiles[1].path): {why}'
    assert not (tmp_path / "outside.toml").exists()


FAKE_CLI = """#!/bin/sh
case "$1" in
  --version) echo; echo "  fake-cli 1.2.3 (key $FAKE_KEY)"; echo "second line"; exit 0 ;;
  --broken) exit 3 ;;
  --slow) sleep 30; exit 0 ;;
esac
cp "$STATE" "$COPY"
"""


def test_the_record_says_what_ran(make_run: Callable[..., RunnerRun], tmp_path: Path) -> None:
    real = tmp_path / "install" / "fake-cli.sh"
    real.parent.mkdir()
    real.write_text(FAKE_CLI)
    real.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fake-cli").symlink_to(real)
    secret = "sk-the-key-1234"
    long_arg = "x" * 5000
    s = spec(["fake-cli", f"--key={secret}", long_arg], env={"COPY": str(tmp_path / "running.json")},
             secret_env=("FAKE_KEY",))
    r = make_run(s, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_KEY": secret})
    r.files.spec.write_text(r.files.spec.read_text().replace('"env": {', f'"env": {{"STATE": "{r.files.state}", '))
    code, state = r.run()
    assert (code, state.phase) == (0, "Succeeded"), state
    running = json.loads((tmp_path / "running.json").read_text())  # the record while the agent ran
    assert running["phase"] == "Running" and running["invocation"] == json.loads(json.dumps(
        state.invocation, default=lambda o: o.__dict__))
    inv = state.invocation
    assert inv is not None
    assert inv.executable == str(bin_dir / "fake-cli")
    assert inv.sha256 == hashlib.sha256(FAKE_CLI.encode()).hexdigest()
    assert inv.version == "fake-cli 1.2.3 (key ***)"
    assert inv.argv[:2] == ("fake-cli", "--key=***")
    assert inv.argv[2] == "x" * 4096 + "…[joch: 904 more bytes]"
    assert list(inv.env) == sorted(inv.env) and {"COPY", "FAKE_KEY", "HOME", "PATH", "STATE"} <= set(inv.env)
    assert state.sandbox is not None and (state.sandbox.mode, state.sandbox.user) == ("none", os.getuid())
    assert running["sandbox"]["mode"] == "none" and running["sandbox"]["network"] == "on"
    assert secret not in r.files.state.read_text()

    # A CLI that will not say its version, or takes too long to: no version, and the run goes on.
    for args in (("--broken",), ("--slow",)):
        r = make_run(spec(["fake-cli"], version_args=args, env={"STATE": "/dev/null", "COPY": str(tmp_path / "copy")}),
                     env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
        code, state = r.run()
        assert (code, state.phase) == (0, "Succeeded") and state.invocation is not None
        assert state.invocation.version is None and state.invocation.sha256 is not None
    r = make_run(spec([sys.executable, "-c", "pass"], version_args=()))
    _, state = r.run()
    assert state.invocation is not None and state.invocation.version is None  # not asked
