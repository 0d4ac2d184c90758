"""The runner's redactor: secrets replaced in a byte stream however it is cut into chunks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from joch.runtime.base import RunId, RunnerSpec
from joch.runtime.redaction import MIN_FRAGMENT_LENGTH, Redactor, encodings
from joch.runtime.runner import RunFiles, Runner


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


def test_common_encodings_of_a_secret_are_redacted() -> None:
    import base64
    import json
    import urllib.parse

    secret = "s3cr/t+val ue?é"
    value = secret.encode()
    printed = [
        base64.b64encode(value), base64.b64encode(value).rstrip(b"="), base64.urlsafe_b64encode(value),
        base64.urlsafe_b64encode(value).rstrip(b"="), value.hex().encode(), value.hex().upper().encode(),
        urllib.parse.quote(secret, safe="").encode(), urllib.parse.quote_plus(secret).encode(),
        urllib.parse.quote(secret, safe="").lower().encode(), json.dumps(secret)[1:-1].encode(),
        json.dumps(secret, ensure_ascii=False)[1:-1].encode(),
    ]
    for form in printed:
        assert redact([value, *encodings(value)], [b"<" + form + b">"]) == b"<***>", form


@pytest.mark.parametrize("before", [b"", b"u", b"us", b"user:"])
def test_a_secret_inside_a_longer_base64_text_is_redacted(before: bytes) -> None:
    import base64

    value = b"hunter2-password"
    blob = base64.b64encode(before + value + b"@host")  # e.g. an Authorization: Basic header
    out = redact([value, *encodings(value)], [blob])
    assert b"***" in out
    for size in range(MIN_FRAGMENT_LENGTH, len(blob)):  # no piece of the value's own encoding is left
        for start in range(len(out) - size + 1):
            assert out[start:start + size] not in base64.b64encode(value), out


def test_the_runner_redacts_the_encodings_of_its_secrets() -> None:
    spec = RunnerSpec(run=RunId("ns", "n", "u"), argv=("true",), secret_env=("TOKEN",))
    r = Runner(spec, RunFiles(Path("/nonexistent")), root=Path("/nonexistent"), cache=Path("/nonexistent"),
               environ={}, secrets={"TOKEN": "tok-0123456789\n"})
    forms = r.secrets()
    assert b"tok-0123456789" in forms and b"746f6b2d30313233343536373839" in forms
    assert b"dG9rLTAxMjM0NTY3ODk=" in forms  # base64 of the stripped value
    assert all(len(form) >= 4 for form in forms)


@pytest.mark.parametrize("width", [76, 64])
@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_a_long_secrets_base64_wrapped_in_lines_is_redacted(width: int, newline: bytes) -> None:
    import base64

    # `base64 < key` wraps at 76 columns, `openssl base64` and PEM at 64, MIME with CRLF.
    value = b"-----BEGIN KEY-----" + bytes(range(33, 127)) * 3
    whole = base64.b64encode(value)
    printed = newline.join(whole[i:i + width] for i in range(0, len(whole), width)) + newline
    chunks = [printed[i:i + 7] for i in range(0, len(printed), 7)]  # arriving in small writes
    out = redact([value, *encodings(value)], chunks)
    left = [line for line in out.split(newline) if line and line != b"***"]
    assert all(len(line) < MIN_FRAGMENT_LENGTH for line in left), out


def test_output_that_cannot_begin_a_secret_is_not_held_back() -> None:
    # Every run has a secret (its run token): a live log must show a quiet agent's last line at once.
    redactor = Redactor([b"jrt1_" + b"ab" * 32])
    assert redactor.feed(b"sleeping\n") == b"sleeping\n"
    assert redactor.feed(b"token: jrt1_ab") == b"token: "  # this might go on to be the token: held
    assert redactor.feed(b"ab" * 31 + b"!\n") == b"***!\n"
    assert redactor.feed(b"jrt1_x") == b"jrt1_x"  # it did not: released with the byte that says so
    assert redactor.flush() == b""
