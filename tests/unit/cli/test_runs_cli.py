"""The run commands' pure parts: the AgentRun ``joch run`` builds, how names are read, the follow
display (plain and rich), the outcome lines, ``describe``'s Artifacts section and the exit codes."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from joch.api import errors
from joch.cli import describe, follow, runs
from joch.cli.main import exit_codes_help

NOW = dt.datetime(2025, 1, 10, 12, 0, 0, tzinfo=dt.UTC)


# --- run_object --------------------------------------------------------------------------------------

def test_a_run_with_text_gets_a_generated_name_and_an_absolute_repo(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "checkout").mkdir()
    monkeypatch.chdir(tmp_path)
    obj = runs.run_object(runs.NewRun(agent="coder", repo="checkout", text="fix it", params=["a=1", "a=2", "b="]))
    assert obj == {
        "apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"generateName": "coder-"},
        "spec": {"agentRef": {"name": "coder"}, "implementation": {"inline": {"text": "fix it"}},
                 "execution": {"coordinates": {"git": {"url": str(tmp_path / "checkout")}}},
                 "parameters": {"a": "2", "b": ""}},
    }


def test_a_run_with_everything() -> None:
    obj = runs.run_object(runs.NewRun(agent="coder", repo="https://h/o/r.git", spec="s", ref="v1", path="sub",
                                      name="mine", timeout=60, idempotency_key="k"))
    assert obj["metadata"] == {"name": "mine"}
    assert obj["spec"] == {"agentRef": {"name": "coder"}, "implementationRef": {"name": "s"},
                           "execution": {"coordinates": {"git": {"url": "https://h/o/r.git", "ref": "v1",
                                                                 "path": "sub"}}},
                           "timeoutSeconds": 60, "idempotencyKey": "k"}


@pytest.mark.parametrize("url", ["https://github.com/o/r.git", "ssh://git@h/o/r", "file:///srv/r.git",
                                 "git@github.com:o/r.git", "github.invalid:org/repo.git"])
def test_urls_are_kept_as_given(url: str) -> None:
    assert runs.repo_url(url) == url


def test_an_scp_style_url_without_a_user_is_a_url_even_where_a_directory_has_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "github.invalid:org/repo.git").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert runs.repo_url("github.invalid:org/repo.git") == "github.invalid:org/repo.git"
    assert runs.repo_url("./github.invalid:org/repo.git") == str(tmp_path / "github.invalid:org/repo.git")


@pytest.mark.parametrize(("new", "message"), [
    (runs.NewRun(agent="a", repo="https://h/r", spec="s", text="t"), "give exactly one of --spec"),
    (runs.NewRun(agent="a", repo="https://h/r"), "give exactly one of --spec"),
    (runs.NewRun(agent="a", repo="https://h/r", text=" \n"), "--text is empty"),
    (runs.NewRun(agent="a", repo="https://h/r", text="t", params=["=x"]), '--param must be KEY=VALUE (got "=x")'),
    (runs.NewRun(agent="a", repo="/no/such/dir", text="t"), '--repo "/no/such/dir" is neither a URL nor a directory'),
])
def test_usage_mistakes_are_bad_requests(new: runs.NewRun, message: str) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        runs.run_object(new)
    assert caught.value.message.startswith(message)
    assert caught.value.exit_code == 2


# --- names -------------------------------------------------------------------------------------------

def test_names_in_both_spellings() -> None:
    assert runs.named(["run", "a", "b"], verb="cancel", kinds=(runs.RUNS,)) == (runs.RUNS, ["a", "b"])
    assert runs.named(["ar/a", "runs/b"], verb="cancel", kinds=(runs.RUNS,)) == (runs.RUNS, ["a", "b"])
    both = (runs.APPROVALS, runs.RUNS)
    assert runs.named(["Approval", "x"], verb="approve", kinds=both) == (runs.APPROVALS, ["x"])
    assert runs.named(["approvals.runtime.joch.dev/x"], verb="approve", kinds=both) == (runs.APPROVALS, ["x"])
    assert runs.named(["execution", "r"], verb="approve", kinds=both) == (runs.RUNS, ["r"])
    assert [runs.log_target(a) for a in (["r"], ["run", "r"], ["run/r"])] == ["r", "r", "r"]


@pytest.mark.parametrize(("args", "kinds", "message"), [
    (["agent", "x"], (runs.RUNS,), 'joch cancel works on run objects, not "agent": joch cancel run NAME'),
    (["run"], (runs.RUNS,), "you must specify the name of the agentrun to cancel: joch cancel run NAME"),
    (["run/a", "approval/b"], (runs.APPROVALS, runs.RUNS),
     "joch cancel takes names of one kind at a time, not agentruns and approvals"),
    (["run", "a/b"], (runs.RUNS,), "there is no need to give the resource type as a separate argument"),
])
def test_naming_mistakes(args: list[str], kinds: tuple[Any, ...], message: str) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        runs.named(args, verb="cancel", kinds=kinds)
    assert caught.value.message.startswith(message)


# --- the follow display ------------------------------------------------------------------------------

def run(phase: str | None, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "r"}, "status": {"phase": phase, **status} if phase else status}


def test_the_view_keeps_the_last_lines_across_split_chunks() -> None:
    view = follow.RunView("r")
    for chunk in (b"a\r\nb", b"c\n", "é".encode()[:1]):
        view.feed(chunk)
    assert view.tail() == ["a", "bc"]  # half a character waits for the rest
    view.feed("é".encode()[1:] + b"\n" + b"".join(f"{i}\n".encode() for i in range(20)) + b"partial")
    assert view.tail() == [*(str(i) for i in range(11, 20)), "partial"]
    assert len(view.lines) == follow.TAIL_LINES


def test_plain_display_starts_every_phase_line_on_a_line_of_its_own() -> None:
    out: list[tuple[Any, bool]] = []
    display = follow.PlainDisplay(lambda text="", nl=True: out.append((text, nl)))
    view = follow.RunView("r")
    view.run = run("Queued", message="waiting for a run slot")
    display.phase(view)
    display.log(view, b"no newline yet")
    view.run = run("Running")
    display.phase(view)
    display.note(view, "no log: gone")
    view.run = run("Succeeded")
    display.phase(view)  # the outcome line says it
    display.log(view, b"tail")
    display.stop(view, 3.0)
    assert out == [("==> Queued: waiting for a run slot", True), (b"no newline yet", False), ("", True),
                   ("==> Running", True), ("==> no log: gone", True), (b"tail", False), ("", True)]


def test_follow_shows_the_same_lines_whatever_it_happened_to_see_of_a_runs_way_to_running() -> None:
    # Pending, Queued (accepted) and Running/Starting pass within a moment; whether the watch shows
    # them is timing (under load it did, and the README's sample no longer matched). Such a step is
    # shown only once the run has stayed in it TRANSIENT_SECONDS; a held run says why at once.
    def shown(*updates: dict[str, Any] | float) -> list[Any]:
        out: list[Any] = []
        display = follow.PlainDisplay(lambda text="", nl=True: out.append(text))
        view = follow.RunView("r")
        follower = follow.Follower(None, "default", "r")  # type: ignore[arg-type]  # no runtimeRef: never called
        now = 0.0
        for value in updates:
            if isinstance(value, float):
                now += value
            else:
                follow._apply(follow.Update("run", value), view, follower, display, now)
            follow._show_if_stuck(view, display, now)
        return out

    pending, queued = run("Pending"), run("Queued", attempt=1, reason="Accepted", message="waiting for a run slot")
    starting = run("Running", attempt=1, reason="Starting", message="starting attempt 1")
    started = run("Running", attempt=1, reason="Started", message="attempt 1 started on the local runtime")
    expected = ["==> Running: attempt 1 started on the local runtime"]
    assert shown(pending, queued, starting, started) == expected
    assert shown(queued, 0.5, started) == expected
    assert shown(started) == expected
    held = run("Queued", attempt=1, reason="WaitingForSlot", message="waiting for a run slot: 1 of 1 runs are running")
    assert shown(pending, held, started) == ["==> Queued: waiting for a run slot: 1 of 1 runs are running", *expected]
    assert shown(pending, 2.5, started) == ["==> Pending", *expected]  # e.g. no controller is running
    retried = run("Running", attempt=2, reason="Started", message="attempt 2 started on the local runtime")
    assert shown(started, run("Queued", attempt=2, reason="Accepted"), retried) == [
        *expected, "==> Running: attempt 2 started on the local runtime"]


def test_live_display_renders_phase_elapsed_and_log_lines_without_markup() -> None:
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None, record=True)
    view = follow.RunView("demo-x1")
    view.run = run("Running", attempt=2, reason="Started", message="attempt 2 started")
    view.feed(b"[bold]not markup[/bold]\n\x1b[31mred\x1b[0m\n")
    console.print(follow.LiveDisplay(console).render(view, 75.0))
    text = console.export_text()
    assert "agentrun.runtime.joch.dev/demo-x1" in text
    assert "Phase: Running   Attempt: 2   Elapsed: 1:15" in text
    assert "attempt 2 started (Started)" in text
    assert "[bold]not markup[/bold]" in text and "red" in text and "\x1b" not in text


def test_live_display_starts_and_stops() -> None:
    console = Console(file=io.StringIO(), width=60, force_terminal=True)
    display = follow.LiveDisplay(console)
    view = follow.RunView("r")
    display.start(view)
    view.run = run("Succeeded")
    display.phase(view)
    display.note(view, "no log: x")
    display.stop(view, 1.0)
    assert "Succeeded" in console.file.getvalue()  # type: ignore[attr-defined]


def test_elapsed_text() -> None:
    assert [follow.elapsed_text(s) for s in (0, 59.9, 61, 3600, 3725)] == ["0:00", "0:59", "1:01", "1:00:00",
                                                                           "1:02:05"]


def test_outcome_lines() -> None:
    ended = {"metadata": {"name": "r"}, "status": {
        "phase": "Failed", "reason": "AgentFailed", "message": "agent exited with code 3",
        "artifacts": [{"name": "summary", "path": "summary.md", "sha256": "ab" * 32, "size": 11}]}}
    lines = follow.outcome(ended)
    assert lines[0] == "agentrun.runtime.joch.dev/r Failed: agent exited with code 3 (AgentFailed)"
    assert lines[1] == "Artifacts:"
    assert lines[2].split() == ["NAME", "SIZE", "SHA256", "PATH"]
    assert lines[3].split() == ["summary", "11", "ab" * 32, "summary.md"]
    assert follow.outcome({"metadata": {"name": "r"}, "status": {"phase": "Cancelled"}}) == [
        "agentrun.runtime.joch.dev/r Cancelled"]


class FakeClient:
    """The two streams ``follow`` reads: watch events and log chunks, each from a list."""

    def __init__(self, events: list[dict[str, Any]], chunks: list[bytes] | Exception) -> None:
        self.events = events
        self.chunks = chunks
        self.log_params: list[dict[str, str]] = []

    def stream(self, path: str, params: dict[str, str]) -> Iterator[dict[str, Any]]:
        assert params == {"watch": "1", "fieldSelector": "metadata.name=r"}
        yield from self.events

    def stream_bytes(self, path: str, params: dict[str, str]) -> Iterator[bytes]:
        assert path.endswith("/agentruns/r/log")
        self.log_params.append(params)
        if isinstance(self.chunks, Exception):
            raise self.chunks
        yield from self.chunks


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def start(self, view: follow.RunView) -> None:
        self.calls.append(("start", None))

    def phase(self, view: follow.RunView) -> None:
        self.calls.append(("phase", view.phase))

    def log(self, view: follow.RunView, chunk: bytes) -> None:
        self.calls.append(("log", chunk))

    def note(self, view: follow.RunView, text: str) -> None:
        self.calls.append(("note", text))

    def tick(self, view: follow.RunView, elapsed: float) -> None:
        pass

    def stop(self, view: follow.RunView, elapsed: float) -> None:
        self.calls.append(("stop", view.phase))


REF = {"type": "local", "id": "u/1"}


def event(kind: str, phase: str | None, **status: Any) -> dict[str, Any]:
    return {"type": kind, "object": run(phase, **status)}


def test_follow_shows_phases_and_the_log_and_returns_the_ended_run() -> None:
    client = FakeClient([event("ADDED", None), event("MODIFIED", "Queued"),
                         event("MODIFIED", "Running", runtimeRef=REF, attempt=1),
                         event("MODIFIED", "Succeeded", runtimeRef=REF, attempt=1)], [b"one\n", b"two\n"])
    display = Recorder()
    ended = follow.follow(client, "default", "r", display=display)  # type: ignore[arg-type]
    assert runs.phase_of(ended) == "Succeeded"
    assert client.log_params == [{"follow": "true", "attempt": "1"}]
    # (Pending, which every run passes through at once, is shown only if the run stays in it.)
    assert [c for c in display.calls if c[0] == "phase"] == [("phase", "Queued"), ("phase", "Running"),
                                                             ("phase", "Succeeded")]
    assert [c[1] for c in display.calls if c[0] == "log"] == [b"one\n", b"two\n"]
    assert display.calls[-1] == ("stop", "Succeeded")


def test_follow_of_a_run_that_never_started_reads_no_log_and_a_missing_log_is_a_note() -> None:
    never = FakeClient([event("ADDED", "Failed", reason="InvalidSpec")], [b"unused"])
    assert runs.phase_of(follow.follow(never, "default", "r", display=Recorder())) == "Failed"  # type: ignore[arg-type]
    assert never.log_params == []

    gone = FakeClient([event("ADDED", "Cancelled", runtimeRef=REF)], errors.NotFound("no log here"))
    display = Recorder()
    follow.follow(gone, "default", "r", display=display)  # type: ignore[arg-type]
    assert ("note", "no log: no log here") in display.calls
    assert gone.log_params == [{"follow": "true"}]  # no attempt in the status: the latest


def test_follow_of_a_deleted_run_is_not_found() -> None:
    client = FakeClient([event("ADDED", "Running"), {"type": "DELETED", "object": run("Running")}], [])
    display = Recorder()
    with pytest.raises(errors.NotFound) as caught:
        follow.follow(client, "default", "r", display=display)  # type: ignore[arg-type]
    assert caught.value.message == 'run "r" was deleted while it was followed'
    assert display.calls[-1] == ("stop", "Running")  # the live panel is stopped before the error is shown


def test_follow_reads_each_attempts_log_in_turn() -> None:
    second = {"type": "local", "id": "u/2"}
    client = FakeClient([event("ADDED", "Running", runtimeRef=REF, attempt=1),
                         event("MODIFIED", "Queued", runtimeRef=REF, attempt=2),
                         event("MODIFIED", "Running", runtimeRef=second, attempt=2),
                         event("MODIFIED", "Succeeded", runtimeRef=second, attempt=2)], [b"x\n"])
    follow.follow(client, "default", "r", display=Recorder())  # type: ignore[arg-type]
    assert client.log_params == [{"follow": "true", "attempt": "1"}, {"follow": "true", "attempt": "2"}]


# --- describe and help -------------------------------------------------------------------------------

def test_describe_run_shows_artifacts_as_a_table() -> None:
    obj = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
           "metadata": {"name": "r", "namespace": "default", "uid": "u"},
           "spec": {"agentRef": {"name": "a"}},
           "status": {"phase": "Succeeded", "artifacts": [
               {"name": "summary", "path": "summary.md", "sha256": "ab" * 32, "size": 11}]}}
    page = describe.describe(obj, runs.RUNS, events=[], now=NOW)
    assert "Status:\n  phase:  Succeeded\nArtifacts:\n" in page
    rows = page.split("Artifacts:\n")[1].splitlines()
    assert rows[0].split() == ["Name", "Size", "SHA256"] and rows[1].split() == ["----", "----", "------"]
    assert rows[2].split() == ["summary", "11", "ab" * 32]
    assert "summary.md" not in page
    bare = describe.describe({**obj, "status": {"phase": "Queued"}}, runs.RUNS, events=[], now=NOW)
    assert "Artifacts:    <none>\n" in bare


def test_the_exit_code_table_names_the_run_outcomes() -> None:
    table = exit_codes_help()
    assert "- **8** the run ended Failed (`run --follow`)" in table
    assert "- **9** the run ended Cancelled (`run --follow`)" in table
    assert runs.EXIT_CODES == {"Succeeded": 0, "Failed": 8, "Cancelled": 9}


def test_events_are_ordered_by_time_then_by_revision() -> None:
    def ev(rv: str, at: str) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": rv}, "spec": {"lastTimestamp": at}}

    events = [ev("12", "2025-01-10T11:00:01Z"), ev("10", "2025-01-10T11:00:01Z"), ev("30", "2025-01-10T11:00:00Z")]
    assert [e["metadata"]["resourceVersion"] for e in sorted(events, key=describe.event_order)] == ["30", "10", "12"]


class EventsClient:
    """``discovery`` and ``get_object`` for ``reading._events_for``; records each list's parameters."""

    def __init__(self, labelled: list[dict[str, Any]], everything: list[dict[str, Any]]) -> None:
        self.labelled, self.everything = labelled, everything
        self.asked: list[dict[str, str] | None] = []
        self.discovery = self

    def resolve(self, word: str) -> Any:
        from joch.cli.resolve import ResourceType

        return ResourceType(group="ops.joch.dev", version="v1alpha1", kind="Event", plural="events",
                            singular="event", namespaced=True)

    def get_object(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        assert path == "/apis/ops.joch.dev/v1alpha1/namespaces/default/events"
        self.asked.append(params)
        return {"items": self.labelled if params else self.everything}


def test_describe_finds_events_by_the_involved_uid_label_and_falls_back_to_scanning() -> None:
    from joch.cli import reading

    obj = {"kind": "AgentRun", "metadata": {"name": "r", "namespace": "default", "uid": "u-1"}}
    mine = {"metadata": {"resourceVersion": "5"}, "spec": {"involvedObject": {"kind": "AgentRun", "name": "r",
                                                                                "uid": "u-1"}}}
    by_hand = {"metadata": {"resourceVersion": "6"}, "spec": {"involvedObject": {"kind": "AgentRun", "name": "r"}}}
    labelled = EventsClient([mine], [mine, by_hand])
    assert reading._events_for(labelled, obj, "default") == [mine]  # type: ignore[arg-type]
    assert labelled.asked == [{"labelSelector": "events.joch.dev/involved-uid=u-1"}]
    unlabelled = EventsClient([], [by_hand])
    assert reading._events_for(unlabelled, obj, "default") == [by_hand]  # type: ignore[arg-type]
    assert unlabelled.asked == [{"labelSelector": "events.joch.dev/involved-uid=u-1"}, None]


class BusyThenServing(FakeClient):
    """A server whose watches are all taken at first (429 with ``Retry-After: 0``), then one that
    cuts the watch off as fallen behind (an ERROR event carrying a 410), then serves it."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__(events, [])
        self.watches = 0

    def stream(self, path: str, params: dict[str, str]) -> Iterator[dict[str, Any]]:
        self.watches += 1
        if self.watches == 1:
            raise errors.retry_after(errors.TooManyRequests("too many open watches"), 0)
        if self.watches == 2:
            yield {"type": "ERROR", "object": errors.Gone("the watch fell behind").to_status()}
            return
        yield from super().stream(path, params)


def test_follow_waits_out_a_429_and_watches_again_after_a_watch_is_cut_off() -> None:
    client = BusyThenServing([event("ADDED", "Failed", reason="InvalidSpec")])
    ended = follow.follow(client, "default", "r", display=Recorder())  # type: ignore[arg-type]
    assert runs.phase_of(ended) == "Failed" and client.watches == 3
