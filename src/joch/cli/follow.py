"""``joch run --follow``: a run's phase and log as they change, until the run ends.

Two streams feed one queue, each read by a daemon thread: the watch of the run
(``?watch=1&fieldSelector=metadata.name=NAME``, which first sends the run as it is now; watched
again from the current state when the server ends it, and after ``Retry-After`` when the server
has no watch to spare, a 429) and its log
(``/log?follow=true``). The main thread owns the display and reads the queue with a short timeout,
so the elapsed time ticks while nothing happens. A log is requested only once the watch shows a
``runtimeRef``, one attempt after the other (a retried run gets a new reference; each is followed
to its end, ``attempt=N`` pinning the one meant), so a run that ends before it starts makes no log
request at all. The run is over when the watch shows ``Succeeded``, ``Failed`` or ``Cancelled``
and the log streams have ended (or ``DRAIN_SECONDS`` later, should a runtime be slow to end one).

On a terminal the display is a rich ``Live`` panel (phase, attempt, elapsed time, the message, the
last ``TAIL_LINES`` log lines); otherwise it is plain text that a file or a CI log keeps: the log
bytes as they come, and a ``==> Phase: message`` line for each new phase and attempt (``_step``:
not for the moments every run passes through, unless it stays in one). Log lines are shown with
their colours (``Text.from_ansi``) and never read as rich markup. Either way the command ends with
the outcome (``agentrun.runtime.joch.dev/NAME Succeeded: message (reason)``) and the artifacts.

Rich (``rich.live`` and friends) is imported here, and this module only by ``joch run --follow``.
"""

from __future__ import annotations

import codecs
import collections
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import typer

from joch.api import errors
from joch.cli import runs
from joch.cli.client import Client

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

Obj = dict[str, Any]
TAIL_LINES = 10
TICK_SECONDS = 0.25
DRAIN_SECONDS = 10.0
REWATCH_SECONDS = 1.0
MAX_RETRY_AFTER = 30.0

Kind = Literal["run", "deleted", "log", "log-end", "log-error", "error"]


@dataclass(frozen=True)
class Update:
    kind: Kind
    value: Any = None


@dataclass
class RunView:
    """What the display shows, fed by the two streams."""

    name: str
    run: Obj | None = None
    lines: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    partial: str = ""
    note: str | None = None
    shown: tuple[str, object] | None = None  # the (phase, attempt) of the last ==> line
    waiting: tuple[tuple[str, object], float] | None = None  # a passing step not shown yet, and since when
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))

    @property
    def phase(self) -> str:
        return runs.phase_of(self.run or {})

    @property
    def status(self) -> Obj:
        return (self.run or {}).get("status") or {}

    def feed(self, chunk: bytes) -> None:
        text = self.partial + self._decoder.decode(chunk)
        *complete, self.partial = text.replace("\r\n", "\n").split("\n")
        self.lines.extend(complete)

    def tail(self) -> list[str]:
        return [*self.lines, self.partial][-TAIL_LINES:] if self.partial else list(self.lines)


class Display(Protocol):
    def start(self, view: RunView) -> None: ...
    def phase(self, view: RunView) -> None: ...
    def log(self, view: RunView, chunk: bytes) -> None: ...
    def note(self, view: RunView, text: str) -> None: ...
    def tick(self, view: RunView, elapsed: float) -> None: ...
    def stop(self, view: RunView, elapsed: float) -> None: ...


class PlainDisplay:
    """Log bytes as they arrive and a line per phase; a phase line always starts a line."""

    def __init__(self, echo: Callable[..., None] = typer.echo) -> None:
        self._echo = echo
        self._at_line_start = True

    def start(self, view: RunView) -> None:
        pass

    def phase(self, view: RunView) -> None:
        if view.phase in runs.FINISHED:
            return  # the outcome line says it
        message = view.status.get("message")
        self._line(f"==> {view.phase}" + (f": {message}" if message else ""))

    def log(self, view: RunView, chunk: bytes) -> None:
        if chunk:
            self._echo(chunk, nl=False)
            self._at_line_start = chunk.endswith(b"\n")

    def note(self, view: RunView, text: str) -> None:
        self._line(f"==> {text}")

    def tick(self, view: RunView, elapsed: float) -> None:
        pass

    def stop(self, view: RunView, elapsed: float) -> None:
        if not self._at_line_start:
            self._echo("")
            self._at_line_start = True

    def _line(self, text: str) -> None:
        if not self._at_line_start:
            self._echo("")
        self._echo(text)
        self._at_line_start = True


class LiveDisplay:
    """A rich ``Live`` panel redrawn from the view; left on screen when the run ends."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._live: Any = None
        self._elapsed = 0.0

    def start(self, view: RunView) -> None:
        from rich.live import Live

        self._live = Live(self.render(view, 0.0), console=self._console, refresh_per_second=4, transient=False)
        self._live.start()

    def phase(self, view: RunView) -> None:
        self._update(view)

    def log(self, view: RunView, chunk: bytes) -> None:
        self._update(view)

    def note(self, view: RunView, text: str) -> None:
        view.note = text
        self._update(view)

    def tick(self, view: RunView, elapsed: float) -> None:
        self._elapsed = elapsed
        self._update(view)

    def stop(self, view: RunView, elapsed: float) -> None:
        self._elapsed = elapsed
        self._update(view)
        if self._live is not None:
            self._live.stop()

    def _update(self, view: RunView) -> None:
        if self._live is not None:
            self._live.update(self.render(view, self._elapsed))

    def render(self, view: RunView, elapsed: float) -> RenderableType:
        from rich.console import Group
        from rich.panel import Panel
        from rich.rule import Rule
        from rich.text import Text

        status = view.status
        head = Text.assemble(("Phase: ", "bold"), (view.phase, _colour(view.phase)),
                             ("   Attempt: ", "bold"), str(status.get("attempt") or 1),
                             ("   Elapsed: ", "bold"), elapsed_text(elapsed))
        parts: list[RenderableType] = [head]
        if status.get("message") or status.get("reason"):
            parts.append(Text(explained(status), style="dim"))
        if view.note:
            parts.append(Text(view.note, style="yellow"))
        tail = view.tail()
        if tail:
            parts += [Rule(style="dim"), *(Text.from_ansi(line) for line in tail)]
        return Panel(Group(*parts), title=f"{runs.RUNS.qualified_kind}/{view.name}", title_align="left")


def _colour(phase: str) -> str:
    return {"Succeeded": "green", "Failed": "red", "Cancelled": "yellow"}.get(phase, "cyan")


def elapsed_text(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def display_for_terminal() -> Display:
    from rich.console import Console

    console = Console()
    if console.is_terminal and not console.is_dumb_terminal:
        return LiveDisplay(console)
    return PlainDisplay()


class Follower:
    """Reads the run's watch and logs in threads and hands their news to ``follow``'s loop."""

    def __init__(self, client: Client, namespace: str, name: str) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.updates: queue.Queue[Update] = queue.Queue()
        self.logging = False  # a log stream is being read
        self._followed: list[Obj] = []
        self._pending: list[int | None] = []  # the attempts whose logs wait their turn (None: the latest)

    @property
    def busy(self) -> bool:
        """A log is being read or waits its turn."""
        return self.logging or bool(self._pending)

    def start(self) -> None:
        self._thread(self._watch, "watch")

    def saw(self, run: Obj) -> None:
        """Queue the log of a runtime reference not seen before; start it if none is being read.

        The log is pinned to ``status.attempt`` once the attempt is running or over; a retried run
        waiting in ``Queued`` already counts its next attempt while it still shows the last one's
        reference, so that reference is read as "the latest"."""
        status = run.get("status") or {}
        ref = status.get("runtimeRef")
        if isinstance(ref, dict) and ref and not ref.get("pending") and ref not in self._followed:
            self._followed.append(ref)
            pinned = runs.phase_of(run) in ("Running", *runs.FINISHED) and isinstance(status.get("attempt"), int)
            self._pending.append(status["attempt"] if pinned else None)
        self.next_log()

    def next_log(self) -> None:
        if self.logging or not self._pending:
            return
        attempt = self._pending.pop(0)
        self.logging = True
        self._thread(lambda: self._log(attempt), "log")

    def _thread(self, target: Callable[[], None], what: str) -> None:
        threading.Thread(target=self._guarded(target), name=f"joch-follow-{what}", daemon=True).start()

    def _guarded(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception as exc:  # noqa: BLE001 - raised again by the main thread, which reports it
                self.updates.put(Update("error", exc))

        return run

    def _watch(self) -> None:
        path = runs.RUNS.path(namespace=self.namespace)
        params = {"watch": "1", "fieldSelector": f"metadata.name={self.name}"}
        while True:
            try:
                for event in self.client.stream(path, params):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        break  # an expired revision, a watch that fell behind: watch again from now
                    if kind == "DELETED":
                        self.updates.put(Update("deleted", obj))
                        return
                    if kind in ("ADDED", "MODIFIED"):
                        self.updates.put(Update("run", obj))
                        if runs.phase_of(obj) in runs.FINISHED:
                            return
            except errors.TooManyRequests as exc:  # the server's watches are all taken: wait, as told
                retry = exc.extra.get("retryAfterSeconds")
                time.sleep(min(float(retry), MAX_RETRY_AFTER) if isinstance(retry, int | float) else REWATCH_SECONDS)
                continue
            time.sleep(REWATCH_SECONDS)  # the server ended the stream (restarting?): watch again

    def _log(self, attempt: int | None) -> None:
        params = {"follow": "true"}
        if attempt is not None:
            params["attempt"] = str(attempt)
        try:
            for chunk in self.client.stream_bytes(runs.log_path(self.namespace, self.name), params):
                self.updates.put(Update("log", chunk))
        except errors.JochError as exc:
            # No log is no reason to stop showing the run (a server that cannot reach it fails the
            # watch too, and that ends the command).
            self.updates.put(Update("log-error", exc))
        finally:
            self.updates.put(Update("log-end"))


def follow(client: Client, namespace: str, name: str, *, display: Display | None = None,
           clock: Callable[[], float] = time.monotonic) -> Obj:
    """Show the run until it ends; the run as it ended. Ctrl-C stops following, not the run."""
    display = display or display_for_terminal()
    view = RunView(name)
    follower = Follower(client, namespace, name)
    started = clock()
    ended_at: float | None = None
    display.start(view)
    interrupted = False
    try:
        follower.start()
        while True:
            try:
                update: Update | None = follower.updates.get(timeout=TICK_SECONDS)
            except queue.Empty:
                update = None
            if update is not None:
                _apply(update, view, follower, display, clock())
            now = clock()
            _show_if_stuck(view, display, now)
            if ended_at is None and view.phase in runs.FINISHED and view.run is not None:
                ended_at = now
            display.tick(view, now - started)
            if ended_at is not None and (not follower.busy or now - ended_at > DRAIN_SECONDS):
                break
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        display.stop(view, clock() - started)
        if interrupted:
            typer.echo(f"stopped following; the run goes on (joch cancel run {name} stops it)", err=True)
    return view.run or {}


# A run passes through these on its way to Running within a moment when nothing holds it back.
_TRANSIENT = {("Pending", None), ("Queued", "Accepted"), ("Queued", "Approved"), ("Running", "Starting")}
TRANSIENT_SECONDS = 2.0


def _step(view: RunView) -> tuple[str, object, bool] | None:
    """What a ``==> Phase`` line is shown for: each phase, and each attempt (a retry is a new
    ``Running``), and whether it is a step every run passes through at once when nothing holds it:
    ``Pending``, ``Queued`` just accepted or approved, ``Running`` with reason ``Starting`` (the
    controller's note that it is about to start the runner). Whether a follower sees those is a
    matter of timing, so they are shown only once a run stays in one for ``TRANSIENT_SECONDS``
    (no controller running, a slow server): a run that starts at once always prints the same lines,
    ``==> Running: attempt N started on ...``, and a run held back says why."""
    if view.run is None:
        return None
    phase, reason = view.phase, view.status.get("reason")
    return phase, view.status.get("attempt"), (phase, reason if phase != "Pending" else None) in _TRANSIENT


def _show_if_stuck(view: RunView, display: Display, now: float) -> None:
    """The line for a step every run passes through, once the run has stayed in it a while."""
    if view.waiting is not None and now - view.waiting[1] >= TRANSIENT_SECONDS:
        view.shown, view.waiting = view.waiting[0], None
        display.phase(view)


def _apply(update: Update, view: RunView, follower: Follower, display: Display, now: float = 0.0) -> None:
    if update.kind == "run":
        view.run = update.value
        follower.saw(update.value)
        step = _step(view)
        if step is None or step[:2] == view.shown:
            view.waiting = None
        elif step[2]:
            if view.waiting is None or view.waiting[0] != step[:2]:
                view.waiting = (step[:2], now)
        else:
            view.waiting = None
            view.shown = step[:2]
            display.phase(view)
    elif update.kind == "log":
        view.feed(update.value)
        display.log(view, update.value)
    elif update.kind == "log-error":
        display.note(view, f"no log: {update.value.message}")
    elif update.kind == "log-end":
        follower.logging = False
        follower.next_log()
    elif update.kind == "deleted":
        raise errors.NotFound(f'run "{view.name}" was deleted while it was followed',
                              kind=runs.RUNS.plural, name=view.name)
    elif update.kind == "error":
        raise update.value


def explained(status: Obj) -> str:
    """``message (reason)``, or whichever of the two there is."""
    message, reason = status.get("message"), status.get("reason")
    if message and reason and reason != message:
        return f"{message} ({reason})"
    return str(message or reason or "")


def outcome(run: Obj) -> list[str]:
    """The lines printed when the run has ended: how, and its artifacts."""
    status = run.get("status") or {}
    name = (run.get("metadata") or {}).get("name", "")
    line = f"{runs.RUNS.qualified_kind}/{name} {runs.phase_of(run)}"
    if status.get("message") or status.get("reason"):
        line += f": {explained(status)}"
    lines = [line]
    artifacts = [a for a in status.get("artifacts") or [] if isinstance(a, dict)]
    if artifacts:
        lines += ["Artifacts:", *("  " + row for row in runs.artifact_rows(artifacts))]
    return lines

