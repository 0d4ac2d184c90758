"""The runner's redactor: secrets replaced in a byte stream however it is cut into chunks."""

from __future__ import annotations

import random

import pytest

from joch.runtime.runner import Redactor


def redact(secrets: list[bytes], chunks: list[bytes]) -> bytes:
    r = Redactor(secrets)
    return b"".join(r.feed(c) for c in chunks) + r.flush()


def test_a_secret_in_one_chunk() -> None:
    assert redact([b"hunter22"], [b"pw=hunter22 ok\n"]) == b"pw=*** ok\n"


@pytest.mark.parametrize("cut", range(1, 12))
def test_a_secret_split_anywhere(cut: int) -> None:
    data = b"a hunter22 b hunter22"
    assert redact([b"hunter22"], [data[:cut], data[cut:]]) == b"a *** b ***"


def test_byte_by_byte_with_overlapping_secrets() -> None:
    data = b"x abcdefgh y abcd z abcdefg"
    assert redact([b"abcd", b"abcdefgh"], [bytes([c]) for c in data]) == b"x *** y *** z ***efg"


def test_random_chunkings_match_one_pass() -> None:
    rng = random.Random(7)
    secrets = [b"tok-123456", b"zzzz", b"tok-12"]
    data = b"".join(rng.choice([b"tok-123456", b"tok-12", b"zz", b"zzzz", b"-", b"\n", b"tok"]) for _ in range(300))
    whole = redact(secrets, [data])
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(data)), 20))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert redact(secrets, chunks) == whole
    assert b"tok-12" not in whole and b"zzzz" not in whole


def test_short_values_and_no_secrets_pass_through() -> None:
    assert redact([b"abc", b""], [b"abc abc"]) == b"abc abc"
    assert redact([], [b"anything", b" at all"]) == b"anything at all"
