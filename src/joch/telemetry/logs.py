"""Log output of ``joch server`` and ``joch controller``: text for people, JSON lines for collectors.

``--log-format json`` (``JOCH_LOG_FORMAT``) writes one JSON object per line on stderr: ``time``
(RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``, ``exception`` when there is one,
and what the line happened in: ``request_id`` (the HTTP request's id, the one returned as
``Audit-Id`` and found in the audit log), ``run_uid`` (the AgentRun a controller was reconciling)
and, when tracing is on, ``trace_id`` and ``span_id``.

The context comes from context variables, so a line logged anywhere below a request or a
reconcile carries it without being passed anything: ``request_id`` from the request context the
server makes current for every request (``joch.api.identity.current_request``, the same one audit
rows read), ``run_uid`` from ``running``. Nothing else of a record goes out: not its ``args``, not
``extra`` fields a library may attach (a header dict, a request body). A credential that made it
into a message anyway — a store URL with a password, an ``Authorization`` value — is masked
(``scrubbing.scrub``); secret *values* never reach the server's log in the first place (the runner redacts
the agents' output, ``joch.runtime.redaction``, before it is stored).

An exception nothing caught (``sys.excepthook``, ``threading.excepthook``) is one JSON line too,
its traceback in ``exception``; so are a library's ``warnings.warn`` (``logging.captureWarnings``)
and the ``error: ...`` a command stops with (``joch.cli.app``).

Text stays as it was (``%(asctime)s %(levelname)s %(name)s: %(message)s``, uvicorn's own lines in
its own format), credentials masked the same way. With JSON, ``joch.server.serving`` leaves
uvicorn's loggers unconfigured, so their lines go through the same JSON handler.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from joch.api.identity import current_request
from joch.telemetry import tracing
from joch.telemetry.scrubbing import scrub

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_format = "text"
_run_uid: contextvars.ContextVar[str | None] = contextvars.ContextVar("joch_run_uid", default=None)


def check_format(value: str) -> str:
    """``--log-format``'s value, or a ``ValueError`` that says what it may be."""
    chosen = value.strip().lower()
    if chosen not in FORMATS:
        raise ValueError(f'--log-format must be {" or ".join(FORMATS)} (JOCH_LOG_FORMAT; got "{value}")')
    return chosen


def configure(log_format: str, level: str = "info") -> None:
    """Text: the root logger's handler as before (only when nothing configured logging yet). JSON: one
    stderr handler writing ``JsonFormatter`` lines, replacing what was there."""
    global _format
    root = logging.getLogger()
    _format = check_format(log_format)
    if _format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        for old in root.handlers[:]:
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(level.upper())
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread
        logging.captureWarnings(True)  # a library's warning is a WARNING line of logger py.warnings
    elif not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(TextFormatter(TEXT_FORMAT))
        root.addHandler(handler)
        root.setLevel(level.upper())


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """An exception nothing caught (a bug) as one JSON line, its traceback inside, not as bare lines."""
    logging.getLogger("joch").critical("uncaught %s", kind.__name__, exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        thread = args.thread.name if args.thread is not None else "?"
        logging.getLogger("joch").critical("uncaught %s in thread %s", args.exc_type.__name__, thread,
                                           exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def current_format() -> str:
    return _format


def notice(text: str) -> None:
    """A note for whoever starts the process (a warning about its configuration): printed on stderr
    as it is with text logs, a WARNING line of the ``joch`` logger with JSON ones."""
    if _format == "json":
        logging.getLogger("joch").warning("%s", text)
    else:
        print(text, file=sys.stderr)


@contextmanager
def running(uid: str | None) -> Iterator[None]:
    """Log lines of the block carry ``run_uid``."""
    token = _run_uid.set(uid)
    try:
        yield
    finally:
        _run_uid.reset(token)


def run_uid() -> str | None:
    return _run_uid.get()


class TextFormatter(logging.Formatter):
    """The text lines, credentials masked as in the JSON ones."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": scrub(record.getMessage()),
        }
        if record.exc_info:
            line["exception"] = scrub(self.formatException(record.exc_info))
        request = current_request()
        if request is not None and request.request_id:
            line["request_id"] = request.request_id
        uid = _run_uid.get()
        if uid:
            line["run_uid"] = uid
        ids = tracing.current_ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        return json.dumps(line, ensure_ascii=False, default=str)
