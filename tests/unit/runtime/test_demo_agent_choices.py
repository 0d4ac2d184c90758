"""How the demo agent reads an implementation request."""

from __future__ import annotations

from pathlib import Path

from joch import demo_agent

QUICKSTART = 'Add a line "Hello from Joch" to the end of README.md and explain the change in summary.md.\n'


def test_the_quickstart_request(tmp_path: Path) -> None:
    assert demo_agent.choose_target(QUICKSTART, tmp_path, exclude="summary.md") == "README.md"
    assert demo_agent.choose_line(QUICKSTART) == "Hello from Joch"


def test_an_existing_file_is_preferred(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("")
    text = "Mention it in CHANGELOG.md, e.g. in docs/notes.txt: “Shipped”"
    assert demo_agent.choose_target(text, tmp_path, exclude="summary.md") == "docs/notes.txt"
    assert demo_agent.choose_line(text) == "Shipped"


def test_defaults(tmp_path: Path) -> None:
    assert demo_agent.choose_target("Say hello, e.g. politely.\nThanks", tmp_path, exclude="summary.md") == "README.md"
    assert demo_agent.choose_line("\n  Say hello\nmore") == "Say hello"
    assert demo_agent.choose_target("edit ../outside.md", tmp_path, exclude="summary.md") == "README.md"
