"""The typer app without a server: help, argument errors and how errors are reported."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from joch.api import errors
from joch.cli import main

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(main.app, list(args), env={"JOCH_SERVER": None, "JOCH_NAMESPACE": None})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_the_exit_code_table_is_generated_from_the_error_classes() -> None:
    text = main.exit_codes_help()
    for cls in errors.JochError.__subclasses__():
        line = next(line for line in text.splitlines() if line.startswith(f"- **{cls.exit_code}**"))
        assert cls.reason in line
    assert "- **0** success" in text
    code, out, _ = invoke("--help")
    assert code == 0 and "Exit codes" in out and "server unreachable" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--server", "localhost:8080", "get", "agents"], 'the server URL "localhost:8080" must start with http'),
        (["get", "agents", "x", "-A"], "a resource cannot be retrieved by name across all namespaces"),
        (["describe", "agents"], "you must specify the name of the resource to describe"),
        (["delete"], "you must specify a KIND and NAME..., or -f"),
        (["delete", "agents"], "you must specify the name of the agents to delete"),
        (["apply"], "must specify one of -f/--filename"),
        (["apply", "-f", "/definitely/not/here.yaml"], 'the path "/definitely/not/here.yaml" does not exist'),
    ],
)
def test_user_errors_are_one_line_with_exit_code_2(args: list[str], message: str) -> None:
    code, out, err = invoke(*args)
    assert code == 2
    assert out == ""
    assert err.startswith(f"error: {message}")


def test_report_prints_each_cause_on_its_own_line(capsys: pytest.CaptureFixture[str]) -> None:
    main.report(errors.Invalid("1 of 2 documents are invalid", causes=[
        errors.Cause("documents[1] (Agent/x in a.yaml:5).spec.providerRef", "required field is missing"),
        errors.Cause("documents[1] (Agent/x in a.yaml:5)", "whole-document problem"),
        errors.Cause("", "no field at all"),
    ]))
    assert capsys.readouterr().err.splitlines() == [
        "error: 1 of 2 documents are invalid",
        "  - documents[1] (Agent/x in a.yaml:5): spec.providerRef: required field is missing",
        "  - documents[1] (Agent/x in a.yaml:5): whole-document problem",
        "  - no field at all",
    ]


def test_apply_with_empty_input_sends_nothing() -> None:
    result = runner.invoke(main.app, ["--server", "http://127.0.0.1:9", "apply", "-f", "-"], input="# nothing\n---\n")
    assert result.exit_code == 2
    assert result.stderr == "error: no objects passed to apply\n"
