"""Static bearer tokens from a file in kube-apiserver's ``--token-file`` format.

One CSV line per token: ``token,user,uid,"group1,group2"`` (the groups column may be left out;
blank lines and lines starting with ``#`` are skipped). The token column may instead be
``sha256:<64 hex digits>``, the SHA-256 of the token, so the file need not hold the tokens
themselves (``printf %s "$TOKEN" | sha256sum``). Every token is kept by its digest: a lookup hashes
the presented token once and finds it in a dict, whichever way the file spelled it.

The file is re-read when it changes, without a restart: at most every ``check_seconds`` a request
compares the file's ``stat`` (inode, size, mtime in nanoseconds) with the one read, so no request
reads the file. A malformed file is an error naming the line and the fix — at start-up it stops the
server; at a reload the previous table stays in force and the error is logged (an operator's typo
must not lock everyone out).
"""

from __future__ import annotations

import csv
import hashlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from joch.api import errors
from joch.api.identity import AUTHENTICATED, UserInfo

logger = logging.getLogger("joch.server.auth")
SHA256_PREFIX = "sha256:"
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
FORMAT = 'token,user,uid,"group1,group2" (or sha256:<hex of the token> in the first column)'


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class _Stat:
    inode: int
    size: int
    mtime_ns: int


def parse(text: str, source: str) -> dict[str, UserInfo]:
    """The users of a token file by token digest; ``BadRequest`` naming the first bad line."""
    table: dict[str, UserInfo] = {}
    for number, row in enumerate(csv.reader(text.splitlines()), start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        where = f"{source} line {number}"
        if len(row) < 3 or len(row) > 4:
            raise errors.BadRequest(f"{where} has {len(row)} field(s): write {FORMAT}; quote the groups column "
                                    "when it holds commas")
        token, user, uid = (field.strip() for field in row[:3])
        if not token or not user:
            missing = "token" if not token else "user"
            raise errors.BadRequest(f"{where} has an empty {missing} column: write {FORMAT}")
        if token.startswith(SHA256_PREFIX):
            key = token[len(SHA256_PREFIX):]
            if not _HEX64.match(key):
                raise errors.BadRequest(f"{where}: a sha256: token must be followed by the 64 hex digits of the "
                                        "token's SHA-256 (printf %s TOKEN | sha256sum)")
            key = key.lower()
        else:
            key = digest(token)
        if key in table:
            raise errors.BadRequest(f"{where} repeats a token of an earlier line: give every user a token of its own")
        groups = tuple(g.strip() for g in row[3].split(",") if g.strip()) if len(row) == 4 else ()
        table[key] = UserInfo(user, (*groups, AUTHENTICATED), uid)
    return table


class TokenFile:
    def __init__(self, path: Path, *, check_seconds: float = 1.0) -> None:
        self.path = path
        self._check_seconds = check_seconds
        self._lock = threading.Lock()
        self._stat = self._stat_of()
        self._table = self._read()
        self._checked = time.monotonic()
        self._error: str | None = None

    def _stat_of(self) -> _Stat:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise errors.BadRequest(f'cannot read --token-file "{self.path}": {exc.strerror or exc}') from None
        return _Stat(st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self) -> dict[str, UserInfo]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise errors.BadRequest(f'cannot read --token-file "{self.path}": '
                                    f"{getattr(exc, 'strerror', None) or exc}") from None
        return parse(text, f'--token-file "{self.path}"')

    def authenticate(self, token: str) -> UserInfo | None:
        self._maybe_reload()
        return self._table.get(digest(token))

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self._check_seconds:
            return
        with self._lock:
            if now - self._checked < self._check_seconds:
                return
            self._checked = now
            try:
                stat = self._stat_of()
                if stat == self._stat:
                    return
                self._stat = stat  # a bad version is reported once, and read again when it changes
                table = self._read()
            except errors.JochError as exc:
                if exc.message != self._error:
                    logger.error("%s; the tokens read before stay in force until the file is fixed", exc.message)
                self._error = exc.message
                return
            self._table, self._error = table, None
            logger.info('re-read --token-file "%s": %d token(s)', self.path, len(table))
