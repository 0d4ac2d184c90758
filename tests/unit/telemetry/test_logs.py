"""``joch.telemetry.logs``: JSON lines with the request id and run uid from the context, and no
credentials in them."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from joch.api.identity import ANONYMOUS, RequestContext, acting_as
from joch.telemetry import logs


def line(message: str, *args: object, exc_info: bool = False) -> dict[str, object]:
    record = logging.LogRecord("joch.test", logging.WARNING, __file__, 1, message, args,
                               sys.exc_info() if exc_info else None)
    parsed: dict[str, object] = json.loads(logs.JsonFormatter().format(record))
    return parsed


def test_a_line_has_the_fixed_fields_and_the_context_where_set() -> None:
    plain = line("hello %s", "there")
    assert plain.keys() == {"time", "level", "logger", "message"}
    assert plain["message"] == "hello there" and plain["level"] == "WARNING" and plain["logger"] == "joch.test"
    assert str(plain["time"]).endswith("Z") and "T" in str(plain["time"])
    with acting_as(RequestContext(user=ANONYMOUS, request_id="req-1")), logs.running("uid-1"):
        inside = line("x")
    assert inside["request_id"] == "req-1" and inside["run_uid"] == "uid-1"
    assert "run_uid" not in line("after")


def test_credentials_in_a_message_are_masked() -> None:
    said = line("cannot open postgresql://joch:s3cret@db:5432/joch; header Authorization: Bearer abc.def-ghi")
    assert "s3cret" not in str(said["message"]) and "abc.def" not in str(said["message"])
    assert said["message"] == "cannot open postgresql://joch:***@db:5432/joch; header Authorization: Bearer ***"
    try:
        raise ValueError("https://u:pw@example.com")
    except ValueError:
        failed = line("failed", exc_info=True)
    assert "pw@" not in str(failed["exception"]) and "https://u:***@example.com" in str(failed["exception"])


def test_a_format_other_than_text_or_json_is_refused() -> None:
    with pytest.raises(ValueError, match='--log-format must be text or json \\(JOCH_LOG_FORMAT; got "xml"\\)'):
        logs.check_format("xml")
    assert logs.check_format(" JSON ") == "json"


@contextmanager
def root_logging() -> Iterator[None]:
    """The root logger without its handlers for the block; its handlers, level and the hooks
    ``configure`` sets, back after (and the format text again)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    for handler in handlers:
        root.removeHandler(handler)
    try:
        yield
    finally:
        logs.configure("text")  # the format back to text; the root has a handler, so none is added
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        sys.excepthook, threading.excepthook = sys.__excepthook__, threading.__excepthook__
        logging.captureWarnings(False)


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    """``configure("json")``, its handler writing to the buffer yielded."""
    written = io.StringIO()
    with root_logging():
        logs.configure("json")
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(written)
        yield written


def test_with_json_an_exception_nothing_caught_is_one_line_with_its_traceback(json_logs: io.StringIO) -> None:
    def fail() -> None:
        raise RuntimeError("boom at postgresql://joch:s3cret@db/joch")

    thread = threading.Thread(target=fail, name="worker")
    thread.start()
    thread.join()
    (said,) = [json.loads(text) for text in json_logs.getvalue().splitlines()]
    assert said["level"] == "CRITICAL" and said["message"] == "uncaught RuntimeError in thread worker"
    assert "Traceback" in said["exception"] and "s3cret" not in said["exception"]


def test_with_json_a_library_warning_is_a_json_line(json_logs: io.StringIO) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
    (said,) = [json.loads(text) for text in json_logs.getvalue().splitlines()]
    assert said["level"] == "WARNING" and said["logger"] == "py.warnings" and "deprecated thing" in said["message"]


def test_with_text_credentials_are_masked_too(capsys: pytest.CaptureFixture[str]) -> None:
    with root_logging():
        logs.configure("text")
        logging.getLogger("joch.test").warning("cannot clone https://x-access-token:ghp_s3cret@github.com/o/r")
    said = capsys.readouterr().err
    assert said.endswith("WARNING joch.test: cannot clone https://x-access-token:***@github.com/o/r\n")
