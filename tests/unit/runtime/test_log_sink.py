"""``LogSink`` against a reference: for any limit, chunking and length, the log is the output when
it fits, else its first and last halves around the two lines that say what was cut."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from joch.runtime import runner


def written(tmp_path: Path, data: bytes, limit: int | None, chunk: int) -> bytes:
    files = runner.RunFiles(tmp_path)
    sink = runner.LogSink(files, limit)
    try:
        for i in range(0, len(data), chunk):
            sink.write(data[i:i + chunk])
        sink.finish()
    finally:
        sink.close()
    assert not files.log_tail.exists()
    return files.log.read_bytes()


@pytest.mark.parametrize("limit", [2, 11, 100, 4096])
@pytest.mark.parametrize("chunk", [1, 3, 64, 5000])
@pytest.mark.parametrize("length", [0, 5, 99, 100, 101, 150, 999, 20_000])
def test_the_log_is_the_head_and_the_tail_of_the_output(tmp_path: Path, limit: int, chunk: int, length: int) -> None:
    data = bytes(i % 251 for i in range(length)).replace(b"\n", b".")
    log = written(tmp_path, data, limit, chunk)
    if length <= limit:
        assert log == data
        return
    head, tail = limit // 2, limit - limit // 2
    assert log.startswith(data[:head]) and log.endswith(data[-tail:])
    notes = log[head:len(log) - tail].decode("latin-1")
    assert re.fullmatch(r"\n\[joch: the output passed the log limit of \d+ bytes[^\]]*\]\n"
                        rf"\[joch: {length - limit} bytes of output were cut here;[^\]]*\]\n", notes), notes


def test_without_a_limit_everything_is_kept(tmp_path: Path) -> None:
    data = b"x" * 300_000
    assert written(tmp_path, data, None, 65536) == data
