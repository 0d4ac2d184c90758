"""Secret values kept out of a run's log: each value and its common encodings become ``***``.

A tool may print a secret as it is or encoded (a Basic auth header, a JSON dump, a URL, a hex
dump), and may print it across two reads of its output: ``Redactor`` catches each form, including
one split between chunks.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from collections.abc import Iterable

REDACTED = b"***"
MIN_SECRET_LENGTH = 4

MIN_FRAGMENT_LENGTH = 8
"""The shortest piece of an encoding redacted on its own: the middle of a base64 stream (below) is
noise-like, and a short piece of it would match by chance."""


def encodings(value: bytes) -> set[bytes]:
    """The common encodings of a secret value that a tool may print instead of the value: base64
    (standard and URL-safe, with and without padding, and wrapped in lines of 76 or 64), hex (both
    cases), percent-encoding (``%20`` and ``+`` for a space, both hex cases) and a JSON string's
    escaped form.

    Base64 of the value inside a longer encoded text (an ``Authorization: Basic`` header, a config
    blob) depends on where the value starts modulo 3 bytes: for each of the three alignments the
    characters determined by the value alone are redacted too (as GitHub Actions' masker does)."""
    forms: set[bytes] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(value)
        forms.update((whole, whole.rstrip(b"=")))
        for shift in (0, 1, 2):
            shifted = encode(b"\0" * shift + value).rstrip(b"=")
            head = -(-shift * 8 // 6)  # characters holding bits of what precedes the value
            tail = 1 if (shift + len(value)) % 3 else 0       # a last character holding bits of what follows
            fragment = shifted[head:len(shifted) - tail]
            if len(fragment) >= MIN_FRAGMENT_LENGTH:
                forms.add(fragment)
        # Tools wrap base64 (``base64`` at 76 columns, ``openssl base64`` and PEM at 64, MIME with
        # CRLF): a long value's encoding is then printed line by line, and each line is redacted.
        for width in (76, 64):
            forms.update(line for start in range(0, len(whole), width)
                         if len(line := whole[start:start + width]) >= MIN_FRAGMENT_LENGTH and len(whole) > width)
    forms.update((value.hex().encode(), value.hex().upper().encode()))
    for quote in (urllib.parse.quote, urllib.parse.quote_plus):
        quoted = quote(value, safe="").encode()
        forms.update((quoted, re.sub(rb"%[0-9A-F]{2}", lambda m: m.group().lower(), quoted)))
    text = value.decode("utf-8", "surrogateescape")
    for ascii_only in (True, False):
        forms.add(json.dumps(text, ensure_ascii=ascii_only)[1:-1].encode("utf-8", "surrogateescape"))
    forms.discard(value)
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


class Redactor:
    """Replaces secret values in a byte stream, holding back just enough of each chunk's end that
    a secret split across two chunks is still found: the longest end of the output that could be
    the beginning of a secret (or of one of its forms), nothing when no secret could begin there.
    Output that cannot be part of a secret reaches the log at once: every run has a secret (its
    run token), and a live log must not lag by a secret's length."""

    def __init__(self, secrets: Iterable[bytes]) -> None:
        values = sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        # Longest first: where one secret is a prefix of another, the longer one is replaced whole.
        self._pattern = re.compile(b"|".join(re.escape(v) for v in values)) if values else None
        self._values = values
        self._firsts = frozenset(v[0] for v in values)
        self._hold = max((len(v) for v in values), default=1) - 1
        self._pending = b""

    def _held(self, data: bytes) -> int:
        """How many bytes at the end of ``data`` may be the start of a secret not complete in it."""
        for start in range(max(0, len(data) - self._hold), len(data)):
            if data[start] in self._firsts:
                tail = data[start:]
                if any(len(v) > len(tail) and v.startswith(tail) for v in self._values):
                    return len(data) - start
        return 0

    def feed(self, chunk: bytes) -> bytes:
        if self._pattern is None:
            return chunk
        data = self._pending + chunk
        # A match that starts before `safe` is complete: a secret starting there and running past
        # the end of data would make the end from there a beginning of it, which `_held` keeps.
        safe = len(data) - self._held(data)
        out, pos = [], 0
        for match in self._pattern.finditer(data):
            if match.start() >= safe:
                break
            out += [data[pos:match.start()], REDACTED]
            pos = match.end()
        end = max(pos, safe)
        out.append(data[pos:end])
        self._pending = data[end:]
        return b"".join(out)

    def flush(self) -> bytes:
        if self._pattern is None:
            return b""
        data, self._pending = self._pending, b""
        return self._pattern.sub(REDACTED, data)
