"""The typer app without a server: help, argument errors and how errors are reported."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
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
        (["--server", "localhost:8080", "get", "agents"],
         'the server URL "localhost:8080" (--server) must start with http'),
        (["get", "agents", "x", "-A"], "a resource cannot be retrieved by name across all namespaces"),
        (["get", "agents", "x", "-l", "a=b"], "name cannot be provided when a selector is specified"),
        (["describe", "agents"], "you must specify the name of the resource to describe"),
        (["delete"], "you must specify a KIND and NAME..., or -f"),
        (["delete", "agents"], "you must specify the name of the agents to delete"),
        (["apply"], "must specify one of -f/--filename"),
        (["apply", "-f", "/definitely/not/here.yaml"], 'the path "/definitely/not/here.yaml" does not exist'),
        (["apply", "-f", ""], "must specify -f with a file, directory or - (got an empty filename)"),
        (["create", "-f", "-", "-f", ""], "must specify -f with a file, directory or -"),
        (["get", "agents", "-n", "Team_A"], 'invalid namespace "Team_A" (from -n/--namespace Team_A): a namespace'),
        (["delete", "-f", ""], "must specify -f with a file, directory or -"),
        (["--server", "http://[::1", "get", "agents"],
         'the server URL "http://[::1" (--server) is not a valid URL (Invalid IPv6 URL); give http://HOST[:PORT]'),
        (["get", "agents", "--server", "http://127.0.0.1:99999"],
         'the server URL "http://127.0.0.1:99999" (--server) is not a valid URL (Port out of range 0-65535)'),
        (["server", "--port", "99999"], "--port must be between 1 and 65535 (got 99999)"),
        (["server", "--port", "0"], "--port must be between 1 and 65535 (got 0)"),
        (["server", "--allowed-origin", "*"], '--allowed-origin "*" cannot be allowed (any page could drive'),
        (["server", "--allowed-origin", "app.example.com"], '--allowed-origin "app.example.com" is not an origin'),
        (["server", "--allowed-host", "joch.example:8080"], '--allowed-host "joch.example:8080" has a port'),
        (["get", "ag/demo", "ap"], '"ap" is not TYPE/NAME: once one argument is TYPE/NAME, every argument must be'),
        (["get", "ag", "ap/demo"], "there is no need to give the resource type as a separate argument"),
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


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["get", "ag", "-o", "bogus"], "error: --output must be one of wide, yaml, json, name, jsonpath=TEMPLATE, "
                                       'custom-columns=SPEC (got "bogus")'),
        (["apply", "-f", "-", "-o", "wide"], 'error: --output must be one of yaml, json, name (got "wide")'),
        (["create", "-f", "-", "--dry-run=client"], 'error: --dry-run must be one of none, server (got "client")'),
        (["server", "--port", "abc"], 'error: --port must be a whole number (got "abc")'),
        (["get"], "error: missing argument 'KIND'"),
        (["get", "ag", "--bogus"], "error: no such option: --bogus"),
        (["apply", "-f"], "error: option '-f' requires an argument"),
        (["gte", "ag"], "error: no such command 'gte'. Did you mean 'get'?"),
    ],
)
def test_usage_errors_are_plain_error_lines_with_exit_code_2(args: list[str], line: str) -> None:
    code, out, err = invoke(*args)
    assert (code, out, err) == (2, "", line + "\n")


def test_no_command_prints_the_help() -> None:
    code, out, err = invoke()
    assert code == 0 and "Usage: joch" in out and "Exit codes" in out and err == ""


def test_a_message_listing_its_causes_is_not_printed_twice(capsys: pytest.CaptureFixture[str]) -> None:
    causes = [errors.Cause("spec.providerRef", "required field is missing"),
              errors.Cause("spec.tools[0]", 'unknown tool "x"')]
    main.report(errors.Invalid('Agent.joch.dev "x" is invalid: [spec.providerRef: required field is missing, '
                               'spec.tools[0]: unknown tool "x"]', causes=causes))
    main.report(errors.Invalid('Agent.joch.dev "y" is invalid: spec.providerRef: required field is missing',
                               causes=causes[:1]))
    main.report(errors.Invalid("1 of 2 documents are invalid; nothing was applied\nsecond line", causes=causes[:1]))
    assert capsys.readouterr().err.splitlines() == [
        'error: Agent.joch.dev "x" is invalid',
        "  - spec.providerRef: required field is missing",
        '  - spec.tools[0]: unknown tool "x"',
        'error: Agent.joch.dev "y" is invalid',
        "  - spec.providerRef: required field is missing",
        "error: 1 of 2 documents are invalid; nothing was applied",
        "  - spec.providerRef: required field is missing",
    ]


def test_the_cli_starts_without_the_libraries_only_some_commands_need() -> None:
    """Every command pays for what ``import joch.cli.main`` imports (see the module docstring)."""
    probe = ("import sys, joch.cli.main; print(' '.join(sorted(m for m in ('httpx', 'yaml', 'rich', 'fastapi', "
             "'uvicorn', 'joch.admission', 'joch.server', 'joch.store') if m in sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.split() == []


def test_the_httpx_command_line_client_is_not_imported() -> None:
    probe = ("import sys; from joch.cli import client; client._httpx(); "
             "print('httpx' in sys.modules, sys.modules.get('httpx._main') is None, 'rich' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.split() == ["True", "True", "False"]


def test_a_cause_the_headline_already_says_is_not_repeated(capsys: pytest.CaptureFixture[str]) -> None:
    text = ("documents[0] (Agent/demo in demo.yaml:1): the object has been modified since resourceVersion 1 "
            "was read (it is now at 4); get it again and re-apply your change")
    main.report(errors.Conflict(text, causes=[errors.Cause("documents[0].metadata", text)]))
    err = capsys.readouterr().err
    assert err == f"error: {text}\n"


def _help(*args: str) -> str:
    result = runner.invoke(main.app, [*args, "--help"], env={"JOCH_SERVER": None, "JOCH_NAMESPACE": None,
                                                             "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_help_shows_metavars_not_python_types() -> None:
    assert main.app.registered_commands
    for info in main.app.registered_commands:
        text = _help(str(info.name))
        for placeholder in ("<str>", "<bool>", "<int>", "<path>", "<list[", "<float>", "range>", "{"):
            assert placeholder not in text, f"joch {info.name} --help shows {placeholder}:\n{text}"
    run = _help("run")
    assert " URL|DIR " in run and " SECONDS [x>=1] " in run
    assert " --follow  " in run  # a flag shows no value placeholder
    get = _help("get")
    assert "Usage: joch get [OPTIONS] KIND [NAME]..." in get
    assert " NAMESPACE " in get and " wide|yaml|json|name " in get


def test_the_internal_runner_command_is_hidden_but_works() -> None:
    top = _help()
    assert " runner " not in top and " run " in top
    assert "--spec" in _help("runner")  # still a command: runtimes start it
    code, _, err = invoke("runner")
    assert code == 2 and "--spec" in err


@pytest.mark.parametrize("columns", ["80", "60"])
def test_help_never_cuts_an_option_name(columns: str) -> None:
    # At 80 columns typer's rich table cut `joch server --help`'s --max-concurrent-runs and
    # --max-concurrent-runs-per-namespace to the same "--max-concurrent…", and more.
    from typer.core import TyperOption

    group = typer.main.get_command(main.app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        result = runner.invoke(main.app, [name, "--help"], env={"JOCH_SERVER": None, "JOCH_NAMESPACE": None,
                                                                "COLUMNS": columns})
        assert result.exit_code == 0, result.output
        assert "…" not in result.stdout, f"joch {name} --help at {columns} columns:\n{result.stdout}"
        for param in command.params:
            for opt in (*param.opts, *param.secondary_opts) if isinstance(param, TyperOption) else ():
                assert opt in result.stdout, f"joch {name} --help at {columns} columns lacks {opt}:\n{result.stdout}"
        if name == "server":
            assert "--max-concurrent-runs-per-namespace N" in result.stdout


def test_help_says_that_the_current_context_gives_the_server_and_namespace() -> None:
    # `joch config set-context -n team-a` makes team-a the namespace of every command; the help of -n
    # said "JOCH_NAMESPACE, else default" and of --server "JOCH_SERVER; default ...", leaving it out.
    group = typer.main.get_command(main.app)
    commands = {"": group, **group.commands}  # type: ignore[attr-defined]
    for name, command in commands.items():
        for param in command.params:
            if "--namespace" in param.opts:
                assert "JOCH_NAMESPACE, else the current context's, else default" in param.help, name
            if "--server" in param.opts:
                assert "JOCH_SERVER; else the current context's" in param.help, name


def test_audit_verb_help_names_the_verbs_an_approval_decision_is_recorded_with() -> None:
    # A decision is audited with verb approve or deny (server/runs.py); the help said "decide", which
    # `joch audit --verb decide` never finds.
    group = typer.main.get_command(main.app)
    verb = next(p for p in group.commands["audit"].params if "--verb" in p.opts)  # type: ignore[attr-defined]
    assert "approve" in verb.help and "deny" in verb.help and "decide" not in verb.help
