"""``/joch run`` comment commands."""

from __future__ import annotations

import pytest

from joch.integrations.commands import Command, CommandError, parse_command


def test_agent_and_parameters() -> None:
    assert parse_command('/joch run agent=demo model=gpt-5 "text=fix the login page"') == Command(
        agent="demo", parameters={"model": "gpt-5", "text": "fix the login page"})


def test_bare_command_names_nothing() -> None:
    assert parse_command("/joch run") == Command()
    assert parse_command("  /joch run  \n") == Command()


def test_only_the_first_command_line_counts() -> None:
    body = "Thanks!\n\n/joch run agent=first\n/joch run agent=second\n"
    assert parse_command(body) == Command(agent="first")
    assert parse_command("ok\r\n/joch run agent=demo\r\n") == Command(agent="demo")


@pytest.mark.parametrize("body", ["", "please /joch run agent=demo", "> /joch run agent=demo", "/joch running",
                                  "/joch runagent=x", "/JOCH RUN agent=x"])
def test_no_command(body: str) -> None:
    assert parse_command(body) is None


def test_other_command_word() -> None:
    assert parse_command("/agent go agent=x", command="/agent go") == Command(agent="x")
    assert parse_command("/joch run agent=x", command="/agent go") is None


def test_values_may_be_empty_or_hold_equals_signs() -> None:
    assert parse_command("/joch run note= expr=a=b") == Command(parameters={"note": "", "expr": "a=b"})


@pytest.mark.parametrize(("body", "says"), [
    ("/joch run demo", "'demo' is not key=value"),
    ('/joch run "text=unclosed', "No closing quotation"),
    ("/joch run agent=", "agent= names no agent"),
    ("/joch run agent=a agent=b", "agent is given twice"),
    ("/joch run k=1 k=2", "'k' is given twice"),
    ("/joch run 9lives=x", "is not key=value"),
    ("/joch run =x", "is not key=value"),
])
def test_malformed_commands_show_the_syntax(body: str, says: str) -> None:
    with pytest.raises(CommandError) as caught:
        parse_command(body)
    assert says in str(caught.value)
    assert "/joch run [agent=NAME] [key=value ...]" in str(caught.value)
