"""The runner's limits, on real agents: the log keeps its head and tail with a line saying what was
cut; an output over the artifact limit (and a changes.patch over it) is refused and said so; and
an artifact takes its size on disk once, not twice (measured in allocated blocks)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from integration.runtime.helpers import Repo, RunnerRun, git_source, python_agent, spec
from joch.runtime.base import Output, RunnerSpec
from support.disks import blocks_used

LINES = "import sys\nfor i in range({n}): sys.stdout.write(f'line {{i:06d}}\\n')\n"  # 12 bytes a line
MiB = 1024 * 1024


def with_outputs(make_run: Callable[..., RunnerRun], s: RunnerSpec) -> RunnerRun:
    """A run whose agent finds its outputs directory in $OUT."""
    r = make_run(s)
    r.files.spec.write_text(r.files.spec.read_text().replace("set below", str(r.files.outputs)))
    return r


def test_a_long_log_keeps_its_head_and_tail_and_says_what_was_cut(make_run: Callable[..., RunnerRun]) -> None:
    r = make_run(spec(python_agent(LINES.format(n=10_000)), max_log_bytes=12_000))
    code, state = r.run()
    assert (code, state.reason) == (0, "Completed")
    output = "".join(f"line {i:06d}\n" for i in range(10_000)).encode()
    log = r.files.log.read_bytes()
    assert log.startswith(output[:6_000]) and log.endswith(output[-6_000:])
    middle = log[6_000:-6_000].decode()
    assert middle.splitlines() == [
        "[joch: the output passed the log limit of 12000 bytes (--max-log-bytes): it is cut from here, and its "
        "last 6000 bytes are added when the agent ends]",
        f"[joch: {len(output) - 12_000} bytes of output were cut here; the log keeps the first 6000 and the last "
        "6000 bytes (--max-log-bytes 12000)]",
    ]
    assert not r.files.log_tail.exists()


def test_a_log_within_its_limit_is_whole_and_says_nothing(make_run: Callable[..., RunnerRun]) -> None:
    r = make_run(spec(python_agent(LINES.format(n=900)), max_log_bytes=12_000))  # 10,800 bytes: past the head
    assert r.run()[0] == 0
    assert r.files.log.read_bytes() == "".join(f"line {i:06d}\n" for i in range(900)).encode()


def test_an_artifact_is_stored_once(make_run: Callable[..., RunnerRun]) -> None:
    code = ("import os; data = os.urandom(1 << 20)\n"
            "with open(os.path.join(os.environ['OUT'], 'big.bin'), 'wb') as f:\n"
            "    for _ in range(8): f.write(data)\n")
    r = with_outputs(make_run, spec(python_agent(code), env={"OUT": "set below"}, outputs=(Output("big", "big.bin"),)))
    exit_code, state = r.run()
    assert (exit_code, state.reason) == (0, "Completed")
    (record,) = state.artifacts
    stored = r.files.artifacts / record.path
    assert record.size == 8 * MiB
    assert record.sha256 == hashlib.sha256(stored.read_bytes()).hexdigest()
    used = blocks_used(r.files.dir)
    assert 8 * MiB <= used < 9 * MiB, used  # a copy would make it 16 MiB


def test_an_output_over_the_artifact_limit_is_refused_and_removed(make_run: Callable[..., RunnerRun]) -> None:
    code = ("import os; out = os.environ['OUT']\n"
            "open(os.path.join(out, 'big.txt'), 'w').write('x' * 5000)\n"
            "open(os.path.join(out, 'small.txt'), 'w').write('ok')\n")
    outputs = (Output("big", "big.txt", optional=True), Output("small", "small.txt"))
    r = with_outputs(make_run, spec(python_agent(code), env={"OUT": "set below"}, outputs=outputs,
                                    max_artifact_bytes=1000))
    exit_code, state = r.run()
    assert (exit_code, state.phase, state.reason) == (0, "Succeeded", "Completed")  # an optional one
    assert [a.name for a in state.artifacts] == ["small"]
    (refused,) = state.refused
    assert (refused.name, refused.path, refused.size) == ("big", "outputs/big.txt", 5000)
    assert refused.message == ("5000 bytes is over the artifact size limit of 1000 bytes (--max-artifact-bytes); "
                               "it was not stored")
    assert not (r.files.outputs / "big.txt").exists() and not (r.files.artifacts / "outputs/big.txt").exists()


def test_a_required_output_over_the_limit_fails_the_run(make_run: Callable[..., RunnerRun]) -> None:
    code = "import os; open(os.path.join(os.environ['OUT'], 'big.txt'), 'w').write('x' * 5000)\n"
    r = with_outputs(make_run, spec(python_agent(code), env={"OUT": "set below"}, outputs=(Output("big", "big.txt"),),
                                    max_artifact_bytes=1000))
    exit_code, state = r.run()
    assert (exit_code, state.phase, state.reason) == (1, "Failed", "ArtifactTooLarge")
    assert state.message == ('agent exited with code 0 but its output "big" (outputs/big.txt: 5000 bytes is over the '
                             "artifact size limit of 1000 bytes (--max-artifact-bytes); it was not stored) was not "
                             "stored")


def test_a_changes_patch_over_the_limit_is_refused(make_run: Callable[..., RunnerRun], repo: Repo) -> None:
    code = "open('notes.txt', 'w').write('a fairly long line of notes\\n' * 400)\n"
    r = make_run(spec(python_agent(code), git=git_source(repo), max_artifact_bytes=2000))
    exit_code, state = r.run()
    assert (exit_code, state.reason) == (0, "Completed")
    assert state.artifacts == ()
    (refused,) = state.refused
    assert (refused.name, refused.path) == ("changes.patch", "changes.patch")
    assert refused.size > 2000
    assert refused.message == ("the workspace's changes are more than the artifact size limit of 2000 bytes "
                               "(--max-artifact-bytes); they were not stored")
    assert not (r.files.artifacts / "changes.patch").exists()
