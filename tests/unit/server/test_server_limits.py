"""Running out of file descriptors: 503 with ``Retry-After`` instead of a 500, logged once; the
watch-cap default follows the descriptor limit."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import subprocess
import sys
import textwrap

import httpx
import pytest
from fastapi import FastAPI

from joch.server import errors as server_errors
from joch.server import limits
from joch.server.serving import _loop_exception
from joch.server.testing import ServerThread
from joch.store import exhaustion


def test_the_default_watch_cap_follows_the_descriptor_limit() -> None:
    assert limits.default_max_watches(1024) == 384
    assert limits.default_max_watches(65_536) == 32_640
    assert limits.default_max_watches(100) == limits.MIN_WATCHES


def test_slots_are_given_back_once() -> None:
    slots = limits.WatchSlots(1)
    release = slots.acquire()
    with pytest.raises(Exception, match="at most 1"):
        slots.acquire()
    release()
    release()
    assert slots.open == 0
    slots.acquire()
    assert slots.open == 1


def test_a_request_out_of_descriptors_is_a_503_with_retry_after_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = FastAPI()
    app.router.route_class = server_errors.StatusRoute
    server_errors.install(app)

    def exhausted() -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    app.add_api_route("/x", exhausted, methods=["GET"])
    with caplog.at_level(logging.WARNING), ServerThread(app) as thread, httpx.Client(base_url=thread.url) as client:
        answers = [client.get("/x") for _ in range(3)]
    for answer in answers:
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
        body = answer.json()
        assert body["reason"] == "ServiceUnavailable" and "out of file descriptors" in body["message"]
        assert body["details"]["retryAfterSeconds"] == 1
    reports = [r for r in caplog.records if "out of file descriptors" in r.getMessage()]
    assert len(reports) <= 1 and not any(r.exc_info for r in caplog.records)


def test_accept_out_of_descriptors_is_one_line_not_a_traceback_per_retry(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(5):
                _loop_exception(loop, {"message": "socket.accept() out of system resource",
                                       "exception": OSError(errno.EMFILE, "Too many open files")})
    finally:
        loop.close()
    accepted = [r for r in caplog.records if "cannot accept connections" in r.getMessage()]
    assert len(accepted) <= 1 and not any(r.exc_info for r in caplog.records)


def test_sqlite_out_of_descriptors_is_service_unavailable(tmp_path: object) -> None:
    """In a process of its own, whose descriptors it uses up: a read that needs a new database
    connection fails with a 503-class error carrying retryAfterSeconds, not "unable to open database file"."""
    script = textwrap.dedent(f"""
        import json, os, resource, threading
        from joch.api import errors
        from joch.api.kinds import AGENT
        from joch.store import open_store
        store = open_store("sqlite:///{tmp_path}/joch.db", history=None)
        store.list(AGENT)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        out = {{}}
        def read():  # another thread: the one idle reader connection is taken by this one first
            try:
                with store.backend.read():
                    store.list(AGENT)
                out["result"] = "ok"
            except errors.JochError as exc:
                out["result"] = exc.to_status()
        t = threading.Thread(target=read); t.start(); t.join()
        for fd in held:
            os.close(fd)
        print(json.dumps(out["result"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    status = json.loads(done.stdout.strip().splitlines()[-1])
    assert status["code"] == 503 and status["details"]["retryAfterSeconds"] == exhaustion.RETRY_AFTER_SECONDS
    assert "out of file descriptors" in status["message"]


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one_capped() -> None:
    script = textwrap.dedent("""
        import resource
        from joch.server import limits
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        print(limits.raise_fd_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    returned, now, hard = (int(v) for v in done.stdout.split())
    expected = min(hard, limits.FD_LIMIT_CAP) if hard != -1 else limits.FD_LIMIT_CAP
    assert returned == now == max(expected, min(256, hard))
