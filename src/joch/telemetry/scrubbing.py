"""Credentials masked out of text that leaves the process as telemetry: log lines (``logs``) and
the error messages and stack traces of spans (``tracing``).

Secret *values* never reach either (the runner redacts the agents' output, ``joch.runtime.redaction``,
before it is stored). What can is a credential inside an error's message: a store or repository URL
with a password (``postgresql://joch:pw@db``, ``https://x-access-token:ghp_…@github.com``), an
``Authorization`` value quoted back. Those are replaced by ``***``.
"""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*:)[^@/?#\s]*(?=@)")
_AUTHORIZATION = re.compile(r"(?i)\b(?P<head>(?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]+")


def scrub(text: str) -> str:
    """``text`` with URL passwords and ``Authorization`` credentials replaced by ``***``."""
    if "://" in text:
        text = _URL_PASSWORD.sub(r"\g<head>***", text)
    return _AUTHORIZATION.sub(r"\g<head>***", text)
