"""The console's shell and its run pages in Chromium: sign-in, a run followed live from the table to its
diff, what a viewer is not offered, a phone and a dark screen; and, without a browser, what the server
serves at /console/ (public files under a strict CSP; every API call still needs a token)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from e2e.console.conftest import Console, sign_in, token_of

RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"
FINISHED = ("Succeeded", "Failed", "Cancelled")
GATED = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "gated-demo"},
         "spec": {"providerRef": {"name": "demo-agent"}, "requiresApproval": True}}  # its runs wait for approval
# Records, in the page, each phase the row of run `name` shows, and marks the document: a reload
# would lose both.
RECORD_PHASES = """name => {
  window.__phases = [];
  window.__samePage = true;
  const seen = () => {
    for (const tr of document.querySelectorAll('#main tbody tr')) {
      const link = tr.querySelector('a');
      const badge = tr.querySelector('[data-phase]');
      if (link && badge && link.textContent === name && window.__phases.at(-1) !== badge.dataset.phase) {
        window.__phases.push(badge.dataset.phase);
      }
    }
  };
  new MutationObserver(seen).observe(document.getElementById('main'), {childList: true, subtree: true});
}"""


def demo_run(console: Console, name: str, agent: str = "demo") -> dict[str, Any]:
    return {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
            "spec": {"agentRef": {"name": agent}, "implementationRef": {"name": "hello-readme"},
                     "execution": {"coordinates": {"git": {"url": str(console.repo)}}}}}


def phase(console: Console, name: str) -> str:
    with console.api() as client:
        return str((client.get(f"{RUNS}/{name}").json().get("status") or {}).get("phase") or "")


def until(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    """Poll from Python: the console's CSP (no eval) refuses Playwright's wait_for_function."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited in vain for {what}"
        time.sleep(0.05)


def finished_run(console: Console, name: str) -> None:
    assert console.apply(demo_run(console, name)).status_code == 200
    deadline = time.monotonic() + 90
    while phase(console, name) not in FINISHED:
        assert time.monotonic() < deadline, f"run {name} did not end"
        time.sleep(0.2)
    assert phase(console, name) == "Succeeded"


# --- sign-in ------------------------------------------------------------------------------------------

def test_a_bad_token_is_refused_with_the_servers_message_and_a_good_one_shows_the_user(
        console: Console, page: Any) -> None:
    page.goto(f"{console.base}/")  # a browser at the root lands on the console
    assert page.url == f"{console.base}/console/"
    page.fill("#token", "not-a-token")
    page.click("form.sign-in-form button[type=submit]")
    error = page.locator("#sign-in-error")
    error.get_by_text("Unauthorized").wait_for()
    assert "does not accept this token" in error.inner_text()
    assert page.locator("#user").count() == 0
    page.fill("#token", token_of("viewer"))
    page.click("form.sign-in-form button[type=submit]")
    assert page.locator("#user").inner_text() == "viewer"
    assert page.evaluate("sessionStorage.getItem('joch.token')") == token_of("viewer")
    assert token_of("viewer") not in page.url
    page.click("#sign-out")
    page.locator("#token").wait_for()
    assert page.evaluate("sessionStorage.getItem('joch.token')") is None


# --- a run, live --------------------------------------------------------------------------------------

def test_a_run_goes_from_queued_to_succeeded_in_the_table_without_a_reload_and_its_diff_opens(
        console: Console, page: Any) -> None:
    sign_in(page, console, "admin")
    page.locator("#live", has_text="live").wait_for()
    page.evaluate(RECORD_PHASES, "live-readme")
    assert console.apply(demo_run(console, "live-readme")).status_code == 200
    row = page.locator("#main tbody tr", has=page.get_by_role("link", name="live-readme", exact=True))
    row.locator("[data-phase=Succeeded]").wait_for(timeout=90_000)
    phases = page.evaluate("window.__phases")
    assert phases[0] in ("Pending", "Queued", "Running") and phases[-1] == "Succeeded", phases
    assert page.evaluate("window.__samePage") is True  # the rows changed in place: no reload
    # Keyboard: the row takes focus and Enter opens the run.
    row.focus()
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/#/runs/default/live-readme")
    for step in ("Pending", "Queued", "Running", "Succeeded"):
        assert "done" in (page.locator(f".timeline li[data-step={step}]").get_attribute("class") or "")
    assert page.locator("#manifest-hash").inner_text().startswith("sha256:")
    page.locator("#log", has_text="joch-demo-agent").wait_for()
    diff = page.locator("#diff")
    diff.locator(".diff-file-name", has_text="README.md").wait_for()
    added = diff.locator("tr.add", has_text="Hello from Joch")
    assert added.count() == 1 and added.inner_text().replace("\t", "").endswith("+Hello from Joch")
    page.get_by_role("button", name="Side by side").click()
    assert diff.locator("td.side.add", has_text="Hello from Joch").count() == 1
    with page.expect_download() as download:
        page.locator("tr", has_text="changes.patch").get_by_role("button", name="Download").click()
    assert "+Hello from Joch" in download.value.path().read_text()


def test_a_viewer_is_offered_neither_cancel_nor_rerun_and_an_editor_cancels(console: Console, page: Any) -> None:
    assert console.apply(GATED, demo_run(console, "waits-for-approval", agent="gated-demo")).status_code == 200
    sign_in(page, console, "viewer")
    page.goto(f"{console.base}/console/#/runs/default/waits-for-approval")
    page.locator("#run-phase [data-phase=AwaitingApproval]").wait_for(timeout=30_000)
    assert page.locator("#cancel-run").count() == 0 and page.locator("#rerun").count() == 0

    page.click("#sign-out")
    sign_in(page, console, "editor")
    page.goto(f"{console.base}/console/#/runs/default/waits-for-approval")
    page.locator("#cancel-run").click()
    page.locator("dialog[open]").get_by_role("button", name="Cancel run").click()
    page.locator("#run-phase [data-phase=Cancelled]").wait_for(timeout=30_000)
    assert page.locator("#cancel-run").is_hidden()


def test_the_log_of_a_run_that_starts_after_the_page_opened_is_followed_as_it_is_written(
        console: Console, page: Any) -> None:
    assert console.apply(GATED, demo_run(console, "follow-me", agent="gated-demo")).status_code == 200
    sign_in(page, console, "viewer")
    page.goto(f"{console.base}/console/#/runs/default/follow-me")
    page.locator("#run-phase [data-phase=AwaitingApproval]").wait_for(timeout=30_000)
    page.get_by_text("Following the log").wait_for()
    page.evaluate("window.__samePage = true")
    with console.api() as client:
        approvals = client.get("/apis/runtime.joch.dev/v1alpha1/namespaces/default/approvals").json()["items"]
        approval = next(a for a in approvals if a["spec"]["runRef"]["name"] == "follow-me")
        r = client.post(f"/v1/namespaces/default/approvals/{approval['metadata']['name']}/decide",
                        json={"decision": "approve"})
        assert r.status_code == 200, r.text
    page.locator("#log", has_text='appending "Hello from Joch" to README.md').wait_for(timeout=90_000)
    page.locator("#run-phase [data-phase=Succeeded]").wait_for(timeout=90_000)
    page.locator("#diff tr.add", has_text="Hello from Joch").wait_for()
    assert page.evaluate("window.__samePage") is True


def test_filters_are_applied_by_the_server_kept_in_the_address_and_followed_live(
        console: Console, page: Any) -> None:
    gated, plain = demo_run(console, "filter-gated", agent="gated-demo"), demo_run(console, "filter-plain")
    gated["metadata"]["labels"], plain["metadata"]["labels"] = {"team": "x"}, {"team": "y"}
    assert console.apply(GATED, gated, plain).status_code == 200
    sign_in(page, console, "admin")
    names = page.locator("#main tbody tr a")

    page.goto(f"{console.base}/console/#/runs?label=team%3Dy")
    page.get_by_role("link", name="filter-plain").wait_for()
    assert names.all_inner_texts() == ["filter-plain"]

    page.goto(f"{console.base}/console/#/runs?agent=gated-demo")
    page.get_by_role("link", name="filter-gated").wait_for()
    assert "filter-plain" not in names.all_inner_texts()
    page.get_by_label("Phase").select_option("AwaitingApproval")
    page.wait_for_url("**/console/#/runs?agent=gated-demo&phase=AwaitingApproval")
    page.locator("#live", has_text="live").wait_for()
    page.get_by_role("link", name="filter-gated").wait_for()
    # A new run that matches appears; one that does not stays out.
    late, other = demo_run(console, "filter-late", agent="gated-demo"), demo_run(console, "filter-other")
    assert console.apply(other, late).status_code == 200
    page.get_by_role("link", name="filter-late").wait_for()
    assert "filter-other" not in names.all_inner_texts()
    page.keyboard.press("/")
    page.keyboard.type("late")
    until(lambda: names.all_inner_texts() == ["filter-late"], "the search box to narrow the rows")


def test_rerun_starts_a_copy_and_opens_it(console: Console, page: Any) -> None:
    finished_run(console, "rerun-source")
    sign_in(page, console, "editor")
    page.goto(f"{console.base}/console/#/runs/default/rerun-source")
    page.locator("#rerun").click()
    page.wait_for_url("**/console/#/runs/default/rerun-source-rerun-*")
    page.locator("#run-phase [data-phase=Succeeded]").wait_for(timeout=90_000)


# --- the layout -------------------------------------------------------------------------------------

@pytest.mark.phone
def test_on_a_phone_the_nav_collapses_behind_the_menu(console: Console, page: Any) -> None:
    finished_run(console, "phone-readme")
    sign_in(page, console, "admin")
    nav = page.locator("#nav")
    page.get_by_role("link", name="phone-readme").wait_for()
    assert nav.bounding_box()["x"] < 0  # off screen
    page.get_by_role("button", name="Menu").click()
    until(lambda: nav.bounding_box()["x"] >= 0, "the menu to open")
    nav.get_by_role("link", name="Runs").click()
    until(lambda: nav.bounding_box()["x"] <= -nav.bounding_box()["width"], "the menu to close")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width}px wide on a 390px screen"


def test_the_dark_theme_is_chosen_by_toggle_or_by_the_system_and_kept(console: Console, page: Any) -> None:
    finished_run(console, "dark-readme")
    sign_in(page, console, "admin")
    light = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.click("#theme-toggle")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert dark != light
    page.reload()
    page.locator("#user").wait_for()
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"  # kept (localStorage)
    page.goto(f"{console.base}/console/#/runs/default/dark-readme")
    page.locator("#diff .diff-file-name").wait_for()

    page.evaluate("localStorage.removeItem('joch.theme')")
    page.emulate_media(color_scheme="dark")
    page.reload()
    page.locator("#user").wait_for()
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == dark


def test_keyboard_shortcuts_move_between_pages_and_slash_focuses_the_filter(console: Console, page: Any) -> None:
    sign_in(page, console, "admin")
    page.locator("#live").wait_for()
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.dataset.filter") == ""
    page.keyboard.press("Escape")
    page.evaluate("document.activeElement.blur()")
    page.keyboard.press("g")
    page.keyboard.press("a")
    page.wait_for_url("**/console/#/approvals")
    page.keyboard.press("g")
    page.keyboard.press("r")
    page.wait_for_url("**/console/#/runs")


# --- the diff ----------------------------------------------------------------------------------------

PATCH = """From 0123 Mon Sep 17 00:00:00 2001
From: joch-demo-agent <agent@joch.dev>
Subject: [PATCH] two files

---
diff --git a/app.py b/app.py
index 1111111..2222222 100644
--- a/app.py
+++ b/app.py
@@ -1,3 +1,4 @@
 import os
-print("old")
+print("new")
+print("more")
 x = 1
\\ No newline at end of file
diff --git a/gone.txt b/gone.txt
deleted file mode 100644
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
--- a line that looks like a signature
""" + "-- \n2.39.2\n"  # format-patch's signature


def test_the_diff_reads_a_format_patch_and_pairs_lines_side_by_side(console: Console, page: Any) -> None:
    sign_in(page, console, "viewer")
    files = page.evaluate("async patch => (await import('/console/lib/diff.js')).parse(patch)", PATCH)
    assert [f["name"] for f in files] == ["app.py", "gone.txt"]
    app = files[0]["hunks"][0]["lines"]
    assert [(line["kind"], line["text"], line["old"], line["new"]) for line in app] == [
        (" ", "import os", 1, 1), ("-", 'print("old")', 2, None), ("+", 'print("new")', None, 2),
        ("+", 'print("more")', None, 3), (" ", "x = 1", 3, 4)]
    # the deleted line starting "-- " is the hunk's; the signature after it is not
    assert [line["text"] for line in files[1]["hunks"][0]["lines"]] == ["-- a line that looks like a signature"]
    rows = page.evaluate("""async patch => {
      const node = (await import('/console/lib/diff.js')).render(patch, 'split');
      return [...node.querySelectorAll('.diff-split tr:not(.hunk)')].map(
        tr => [...tr.querySelectorAll('td.side')].map(td => td.textContent));
    }""", PATCH)
    assert rows[:3] == [["import os", "import os"], ['print("old")', 'print("new")'], ["", 'print("more")']]


# --- what the server serves ---------------------------------------------------------------------------

def test_console_files_are_public_under_a_strict_csp_and_the_api_is_not(console: Console) -> None:
    with httpx.Client(base_url=console.base) as client:
        index = client.get("/console/")
        assert index.status_code == 200 and '<script type="module" src="app.js">' in index.text
        csp = index.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        for path in ("/console/app.js", "/console/lib/api.js", "/console/pages/runs.js", "/console/style.css"):
            assert client.get(path).status_code == 200, path
        assert client.get("/console/config.json").json()["oidc"] is None
        assert client.get("/", headers={"Accept": "text/html"}).headers["location"] == "/console/"
        assert client.get("/").status_code == 404  # not a browser: no redirect
        assert client.get(RUNS).status_code == 401
        assert client.post("/console/config.json", json={}).status_code in (401, 405)
        assert client.get("/console/../v1/whoami").status_code == 401
