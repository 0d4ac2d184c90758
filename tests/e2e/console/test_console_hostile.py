"""The console against what it should survive: hostile links, a session that ends under the user, a run
whose agent writes far more than a page can hold, and a run deleted while its page is open."""

from __future__ import annotations

from typing import Any

from e2e.console.conftest import Console, sign_in, token_of


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
