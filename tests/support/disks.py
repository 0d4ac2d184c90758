"""A small real filesystem to fill: a tmpfs mounted for one test (root only, as in CI).

Where mounting is not permitted the test is skipped with the reason, except in CI (``CI`` set),
where that is a failure: the disk-full tests must run there.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, *, size: str = "2m", owner: str | None = None) -> Iterator[Path]:
    """``path`` with a tmpfs of ``size`` mounted on it (owned by ``owner``), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",mode=0700" if owner else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        why = f"cannot mount a tmpfs at {path}: {done.stderr.strip() or done.returncode}"
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI must run the disk-full tests: run them as root)")
        pytest.skip(f"{why} (needs root)")
    try:
        if owner:
            subprocess.run(["chown", owner, str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def fill(directory: Path, name: str = "ballast") -> Path:
    """Write a file in ``directory`` until its filesystem has no byte left; the file is returned
    (remove it to give the space back)."""
    ballast = directory / name
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
            chunk = b"\0" * size
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    return ballast


def blocks_used(directory: Path) -> int:
    """Bytes allocated below ``directory``, each inode counted once (as ``du`` does)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, dirs, files in os.walk(directory):
        for entry in [*dirs, *files]:
            st = os.lstat(os.path.join(root, entry))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total
