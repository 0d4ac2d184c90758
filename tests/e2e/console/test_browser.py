"""The browser itself starts and renders a page of the server: the ground the console tests stand on."""

from __future__ import annotations

from typing import Any

from e2e.console.conftest import Console


def test_chromium_renders_a_page_of_the_server(console: Console, page: Any) -> None:
    response = page.goto(f"{console.base}/livez")
    assert response is not None and response.status == 200
    assert "ok" in page.content()
