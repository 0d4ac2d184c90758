"""Reporting usage to the run's callback: what the runner's agent (and the runner itself, reading the
agent's output) spent goes to ``POST .../agentruns/<name>/callback`` with the run token, the one path
into metering (``joch.controllers.metering``) whoever reports.

* ``post_usage`` posts one batch, retried with the same body (the same event ids, which the server
  counts once) when the server cannot be reached or answers 429/5xx.
* ``UsageReporter`` posts what the output parsers find from a thread of its own, so the log is never
  held up by HTTP.

Like the runner, this imports only the standard library (and ``agentoutput``): it loads in every run.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from joch.runtime import agentoutput
from joch.runtime.base import RunId

if TYPE_CHECKING:
    import urllib.error


class UsageNotReported(Exception):
    """Usage could not be reported (no callback, or the server refused it: the message says why;
    ``refused``: the server answered that the report itself is wrong, so sending it again is no use)."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


USAGE_ATTEMPTS = 4
USAGE_TIMEOUT = 10.0


def callback_url(api_url: str, run: RunId) -> str:
    quote = urllib.parse.quote
    return (f"{api_url.rstrip('/')}/v1/namespaces/{quote(run.namespace, safe='')}/agentruns/"
            f"{quote(run.name, safe='')}/callback")


def post_usage(url: str, token: str, events: Sequence[Mapping[str, Any]], *, attempts: int = USAGE_ATTEMPTS,
               timeout: float = USAGE_TIMEOUT) -> dict[str, Any]:
    """POST ``{"events": events}`` to a run's callback; retried (same body, so the same event ids) when
    the server cannot be reached or answers 429/5xx. Never puts ``token`` in an exception."""
    import urllib.error  # here, not at the top: the runner's start-up time is every run's latency
    import urllib.request
    if not url.startswith(("http://", "https://")):
        raise UsageNotReported(f"the callback URL must be http:// or https://, not {url.split(':')[0]}:")
    body = json.dumps({"events": [dict(e) for e in events]}).encode()
    failure = ""
    refused = False
    for attempt in range(attempts):
        if attempt:
            time.sleep(min(2.0, 0.2 * 2 ** attempt))
        request = urllib.request.Request(url, data=body, method="POST", headers={  # noqa: S310 - http(s), checked
            "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s), checked
                answer = json.loads(response.read() or b"{}")
                return answer if isinstance(answer, dict) else {}
        except urllib.error.HTTPError as exc:
            failure = f"{exc.code}: {_status_message(exc)}"
            if exc.code != 429 and exc.code < 500:
                refused = exc.code != 401
                break
        except (urllib.error.URLError, OSError, ValueError) as exc:
            failure = str(getattr(exc, "reason", None) or exc)
    raise UsageNotReported(f"usage was not recorded ({failure})", refused=refused)


def _status_message(exc: urllib.error.HTTPError) -> str:
    try:
        status = json.loads(exc.read() or b"{}")
    except (OSError, ValueError):
        return str(exc.reason)
    return str(status.get("message") or exc.reason) if isinstance(status, dict) else str(exc.reason)


class UsageReporter:
    """Posts the usage events the output parser finds to the run's callback (``post``:
    ``Runner.report_usage``) from a thread of its own, so the log is never held up by HTTP; events
    that arrive while a post is under way go together in the next one, each first held to what the
    callback takes (``agentoutput.bounded``: the agent's output can forge them). Their ids get ``prefix``
    (``a<attempt>-``): a retried attempt's output is new usage. A failed post is said on the runner's
    stderr; the run goes on."""

    def __init__(self, post: Callable[..., Any], prefix: str) -> None:
        self._post = post
        self._prefix = prefix
        self._pending: list[dict[str, Any]] = []
        self._closed = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, events: Iterable[Mapping[str, Any]]) -> None:
        with self._cond:
            self._pending += [{**(e := agentoutput.bounded(dict(event))), "id": f"{self._prefix}{e['id']}"}
                              for event in events]
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="joch-runner-usage", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float) -> None:
        """Post what is pending, waiting at most ``timeout`` seconds."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            say(f"joch runner: usage still being reported after {timeout:g} s was given up")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                batch, self._pending = self._pending[:100], self._pending[100:]
                if not batch:
                    return
            try:
                self._post(*batch)
            except UsageNotReported as exc:
                if not exc.refused or len(batch) == 1:
                    say(f"joch runner: {len(batch)} usage event(s) not reported: {exc}")
                    continue
                # One event the server refuses (a line the agent forged) must not take the rest
                # of the batch with it: each on its own.
                for event in batch:
                    try:
                        self._post(event)
                    except Exception as one:  # noqa: BLE001 - metering's loss, not the run's
                        say(f"joch runner: usage event {str(event.get('id'))[:100]} not reported: {one}")
            except Exception as exc:  # noqa: BLE001 - metering's loss, not the run's
                say(f"joch runner: {len(batch)} usage event(s) not reported: {exc}")


def say(line: str) -> None:
    """A line for runner.log; on a full disk even that may not fit, and it must not end the run."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr)
