"""The console against what it should survive: hostile links, a session that ends under the user, a run
whose agent writes far more than a page can hold, and a run deleted while its page is open."""

from __future__ import annotations

from typing import Any

from e2e.console.conftest import Console, sign_in


def test_a_malformed_link_shows_no_page_instead_of_breaking_the_router(console: Console, page: Any) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    sign_in(page, console, "viewer")
    page.locator("#runs-summary").wait_for()
    page.goto(f"{console.base}/console/#/runs/default/%E0%A4%A")
    page.locator("#main .empty", has_text="No page at /runs/default/%E0%A4%A").wait_for()
    assert page.locator("#runs-summary").count() == 0  # the runs page it came from is gone
    assert errors == []
