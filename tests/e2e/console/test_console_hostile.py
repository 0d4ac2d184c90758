"""The console against what it should survive: hostile links, a session that ends under the user, a run
whose agent writes far more than a page can hold, and a run deleted while its page is open."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from e2e.console.conftest import ARTIFACTS, Console, sign_in, token_of

RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"
LOG_LINES = 10_000  # pages/run.js: the lines of a log the page asks for (tailLines)
MAX_LINES = 5000  # lib/diff.js
# An agent that writes a 3 MB log and a 6,000-line file (the patch): no braces, which are the template's.
FLOOD = ("import pathlib, sys\n"
         "sys.stdout.write(('x' * 99 + chr(10)) * 30000)\n"
         "print('the last line')\n"
         "pathlib.Path('big.txt').write_text(''.join('line %d%s' % (i, chr(10)) for i in range(6000)))\n")


def leave(page: Any, name: str) -> None:
    """Save what the viewport shows, then leave the page: a full-page shot of 5,000 diff rows (what the
    page fixture takes at teardown) outlasts its timeout on a busy machine."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    page.goto("about:blank")


def flood_run(console: Console, name: str) -> None:
    """A finished run of an agent that writes more than the run page shows."""
    provider = {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "flood"},
                "spec": {"binary": sys.executable, "argsTemplate": ["-c", FLOOD]}}
    agent = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "flood"},
             "spec": {"providerRef": {"name": "flood"}, "runtime": {"type": "local"}}}
    run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
           "spec": {"agentRef": {"name": "flood"}, "implementation": {"inline": {"text": "flood"}},
                    "execution": {"coordinates": {"git": {"url": str(console.repo)}}}}}
    assert console.apply(provider, agent, run).status_code == 200
    deadline = time.monotonic() + 90
    with console.api() as client:
        while (client.get(f"{RUNS}/{name}").json().get("status") or {}).get("phase") != "Succeeded":
            assert time.monotonic() < deadline, f"run {name} did not succeed"
            time.sleep(0.2)


def test_a_malformed_link_shows_no_page_instead_of_breaking_the_router(console: Console, page: Any) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    sign_in(page, console, "viewer")
    page.locator("#runs-summary").wait_for()
    page.goto(f"{console.base}/console/#/runs/default/%E0%A4%A")
    page.locator("#main .empty", has_text="No page at /runs/default/%E0%A4%A").wait_for()
    assert page.locator("#runs-summary").count() == 0  # the runs page it came from is gone
    assert errors == []


def test_a_token_that_stops_working_mid_session_brings_back_the_sign_in_page(console: Console, page: Any) -> None:
    sign_in(page, console, "editor")
    page.goto(f"{console.base}/console/#/apply")
    page.get_by_label("Manifests (YAML or JSON)").fill("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n")
    page.evaluate("sessionStorage.setItem('joch.token', 'a-token-the-server-no-longer-accepts')")  # expired, revoked
    page.get_by_role("button", name="Dry run").click()
    page.locator("#sign-in-error", has_text="Your session has ended: sign in again.").wait_for()
    # Signing in again lands on the page the user was on.
    sign_in_again = page.locator("#token")
    sign_in_again.fill(token_of("editor"))
    page.click("form.sign-in-form button[type=submit]")
    page.get_by_label("Manifests (YAML or JSON)").wait_for()
    assert page.url.endswith("#/apply")



def test_a_patch_larger_than_a_page_shows_its_first_lines_and_says_so(console: Console, page: Any) -> None:
    flood_run(console, "flood")
    sign_in(page, console, "viewer")
    page.goto(f"{console.base}/console/#/runs/default/flood")
    cut = page.locator("#diff .diff-cut").first
    cut.wait_for()
    assert f"Showing the first {MAX_LINES:,} of 6,000 lines" in cut.inner_text()
    assert page.locator("#diff tr:not(.hunk)").count() == MAX_LINES
    cut.scroll_into_view_if_needed()
    leave(page, "hostile-patch-cut")


def test_a_log_larger_than_a_page_shows_its_end_says_so_and_downloads_whole(console: Console, page: Any) -> None:
    flood_run(console, "flood")
    sign_in(page, console, "viewer")
    page.goto(f"{console.base}/console/#/runs/default/flood")
    page.locator("#log-state", has_text=f"Showing the last {LOG_LINES:,} lines").wait_for()
    log = page.locator("#log").text_content() or ""
    # the server sent only the last LOG_LINES lines (tailLines), about a third of the log
    assert log.count("\n") == LOG_LINES and log.endswith("x\nthe last line\n")
    assert len(log) == (LOG_LINES - 1) * 100 + len("the last line\n")
    with page.expect_download() as download:
        page.locator("#download-log").click()
    assert download.value.suggested_filename == "flood.log"
    assert (Path(download.value.path()).stat().st_size) == 3_000_000 + len("the last line\n")
    leave(page, "hostile-log-cut")


def test_a_run_deleted_while_its_page_is_open_is_said_to_be_gone(console: Console, page: Any) -> None:
    demo = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "doomed"},
            "spec": {"agentRef": {"name": "demo"}, "implementationRef": {"name": "hello-readme"},
                     "execution": {"coordinates": {"git": {"url": str(console.repo)}}}}}
    assert console.apply(demo).status_code == 200
    sign_in(page, console, "admin")
    page.goto(f"{console.base}/console/#/runs/default/doomed")
    page.locator("#run-phase [data-phase=Succeeded]").wait_for(timeout=90_000)
    assert page.locator("#run-deleted").is_hidden()
    with console.api() as client:
        assert client.delete(f"{RUNS}/doomed").status_code == 200
    page.locator("#run-deleted", has_text="Run doomed was deleted").wait_for()
    assert page.locator("#cancel-run").count() == 0


def test_a_line_of_a_minified_bundle_is_cut_in_the_diff_not_drawn_as_a_tower(console: Console, page: Any) -> None:
    sign_in(page, console, "viewer")
    patch = ("diff --git a/app.min.js b/app.min.js\n--- /dev/null\n+++ b/app.min.js\n@@ -0,0 +1,2 @@\n"
             + "+" + "x" * 100_000 + "\n+short\n")
    for mode in ("unified", "split"):
        cells = page.evaluate("""async ([patch, mode]) => {
          const node = (await import('/console/lib/diff.js')).render(patch, mode);
          return [...node.querySelectorAll('td.code, td.side.add')].map(td => td.textContent);
        }""", [patch, mode])
        assert len(cells) == 2, mode
        assert len(cells[0]) < 1_100 and cells[0].endswith("99,000 more characters"), mode
        assert cells[1].endswith("short"), mode
