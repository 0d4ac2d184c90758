"""The ``joch`` CLI end to end: the installed console script against a real ``joch server``."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

import joch as package

PROVIDER = "apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: p}\nspec: {binary: /bin/true}\n"
QUICKSTART_CREATED = [
    "agentprovider.joch.dev/echo created",
    "agent.joch.dev/coder created",
    "implementationspec.joch.dev/hello created",
]


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


# --- apply ---------------------------------------------------------------------------------------

def test_apply_creates_and_reapply_is_unchanged(joch, manifest) -> None:
    first = joch.ok("apply", "-f", manifest("quickstart.yaml"))
    assert first.out.splitlines() == QUICKSTART_CREATED
    again = joch.ok("apply", "-f", manifest("quickstart.yaml"))
    assert again.out.splitlines() == [line.replace("created", "unchanged") for line in QUICKSTART_CREATED]


def test_apply_a_directory_and_stdin(joch, manifest, tmp_path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "b.yaml").write_text(Path(manifest("quickstart.yaml")).read_text())
    (tmp_path / "m" / "ignored.txt").write_text("not a manifest")
    assert joch.ok("apply", "-f", str(tmp_path / "m")).out.splitlines() == QUICKSTART_CREATED
    piped = joch.ok("apply", "-f", "-", input=Path(manifest("reviewer.yaml")).read_text())
    assert piped.out == "agent.joch.dev/reviewer created\n"


def test_a_batch_with_one_bad_document_writes_nothing_and_names_it(joch, manifest) -> None:
    result = joch("apply", "-f", manifest("three-good-one-bad.yaml"))
    assert result.code == 2
    assert result.out == ""
    lines = result.err.splitlines()
    assert lines[0] == "error: 1 of 4 documents is invalid; nothing was applied"
    where = f"documents[3] (Agent/batch-broken in {manifest('three-good-one-bad.yaml')}:23)"
    assert f"  - {where}: spec.providerRef: required field is missing" in lines
    assert any(line.startswith(f"  - {where}: spec.requiresApproval: expected a boolean") for line in lines)
    assert "Traceback" not in result.err
    for kind in ("agents", "agentproviders", "implementationspecs"):
        empty = joch.ok("get", kind)
        assert empty.out == ""
        assert empty.err == "No resources found in default namespace.\n"


def test_atomicity_spans_every_file_and_errors_name_the_file_they_are_in(joch, manifest) -> None:
    result = joch("apply", "-f", manifest("reviewer.yaml"), "-f", manifest("three-good-one-bad.yaml"))
    assert result.code == 2
    assert "error: 1 of 5 documents is invalid; nothing was applied" in result.err
    # the index and the line are those inside the second file, not in the joined request
    assert f"documents[3] (Agent/batch-broken in {manifest('three-good-one-bad.yaml')}:23): " in result.err
    assert "reviewer.yaml" not in result.err
    assert joch.ok("get", "agents").err == "No resources found in default namespace.\n"


def test_yaml_traps_are_reported_as_written_in_the_file(joch, tmp_path) -> None:
    trap = tmp_path / "trap.yaml"
    trap.write_text("apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata:\n  name: p\n"
                    "spec:\n  binary: on\n")
    result = joch("apply", "-f", str(trap))
    assert result.code == 2
    assert f'documents[0] (AgentProvider/p in {trap}:1): spec.binary: ' in result.err
    assert '("on")' in result.err  # the server saw the text itself, not a re-serialized `true`


def test_a_yaml_syntax_error_is_reported_before_sending(joch, tmp_path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: Agent\nmetadata:\n  name: [oops\n")
    result = joch("apply", "-f", str(broken))
    assert result.code == 2
    assert result.err.startswith(f"error: {broken}: invalid YAML at line 4")


def test_dry_run_writes_nothing(joch, manifest) -> None:
    result = joch.ok("apply", "-f", manifest("quickstart.yaml"), "--dry-run=server")
    assert result.out.splitlines() == [f"{line} (server dry run)" for line in QUICKSTART_CREATED]
    assert joch.ok("get", "agents").err.startswith("No resources found")


def test_warnings_go_to_stderr_naming_the_object(joch, manifest) -> None:
    result = joch.ok("apply", "-f", manifest("reviewer.yaml"))
    assert result.out == "agent.joch.dev/reviewer created\n"
    assert result.err.startswith("Warning: agent.joch.dev/reviewer: spec.providerRef.name: ")
    assert 'agentprovider "echo" not found' in result.err


def test_apply_output_name_and_yaml(joch, manifest) -> None:
    named = joch.ok("apply", "-f", manifest("quickstart.yaml"), "-o", "name")
    assert named.out.splitlines() == [line.removesuffix(" created") for line in QUICKSTART_CREATED]
    shown = yaml.safe_load(joch.ok("apply", "-f", manifest("reviewer.yaml"), "-o", "yaml").out)
    assert shown["kind"] == "Agent" and shown["metadata"]["resourceVersion"]


# --- create --------------------------------------------------------------------------------------

def test_create_honours_generate_name(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"))
    names = []
    for _ in range(2):
        line = joch.ok("create", "-f", manifest("run.yaml")).out.strip()
        assert line.startswith("agentrun.runtime.joch.dev/run-") and line.endswith(" created")
        names.append(line.split()[0].split("/")[1])
    assert names[0] != names[1]
    rows = table(joch.ok("get", "runs").out)
    assert rows[0] == ["NAME", "AGENT", "PHASE", "COST", "AGE"]
    assert sorted(r[0] for r in rows[1:]) == sorted(names)


def test_create_an_existing_object_fails_and_names_it(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"))
    result = joch("create", "-f", manifest("quickstart.yaml"))
    assert result.code == 5
    assert result.err.startswith(f"error: documents[0] (AgentProvider/echo in {manifest('quickstart.yaml')}:2): ")
    assert result.out == ""


BAD_CREATE = (PROVIDER.replace("name: p", "name: first") + "---\n"
              "apiVersion: joch.dev/v1alpha1\nkind: Agent\nmetadata: {name: second}\n"
              "spec: {provderRef: {name: first}}\n")


def test_create_is_atomic_and_prints_each_cause_once(joch, tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_CREATE)
    result = joch("create", "-f", str(bad))
    assert (result.code, result.out) == (2, "")
    lines = result.err.splitlines()
    assert lines[0] == "error: 1 of 2 documents is invalid; nothing was created"
    where = f"documents[1] (Agent/second in {bad}:6)"
    assert f'  - {where}: spec.provderRef: unknown field "provderRef"; did you mean "providerRef"?' in lines
    assert result.err.count("provderRef: unknown field") == 1
    assert joch.ok("get", "agentproviders").err == "No resources found in default namespace.\n"  # not half-written


def test_create_dry_run_and_output(joch) -> None:
    dry = joch.ok("create", "-f", "-", "--dry-run=server", input=PROVIDER)
    assert dry.out == "agentprovider.joch.dev/p created (server dry run)\n"
    assert joch.ok("get", "ap").err.startswith("No resources found")
    assert joch.ok("create", "-f", "-", "-o", "name", input=PROVIDER).out == "agentprovider.joch.dev/p\n"


# --- get -----------------------------------------------------------------------------------------

def test_get_agents_table(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"), "-f", manifest("reviewer.yaml"))
    rows = table(joch.ok("get", "agents").out)
    assert rows[0] == ["NAME", "PROVIDER", "READY", "AGE"]
    assert [r[:2] for r in rows[1:]] == [["coder", "echo"], ["reviewer", "echo"]]
    assert all(r[3].endswith("s") for r in rows[1:])  # just created: seconds old
    wide = table(joch.ok("get", "ag", "-o", "wide").out)
    assert wide[0] == ["NAME", "PROVIDER", "READY", "RUNTIME", "AGE"] and wide[1][3] == "local"
    everywhere = table(joch.ok("get", "Agent", "-A").out)
    assert everywhere[0][0] == "NAMESPACE" and everywhere[1][:2] == ["default", "coder"]
    assert joch.ok("get", "agents.joch.dev", "-o", "name").out.splitlines() == [
        "agent.joch.dev/coder", "agent.joch.dev/reviewer"]


def test_get_several_kinds_and_all(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"))
    out = joch.ok("get", "agents,ap").out
    first, second = out.split("\n\n")
    assert table(first)[0] == ["NAME", "PROVIDER", "READY", "AGE"]
    assert table(first)[1][0] == "agent.joch.dev/coder"
    assert table(second)[1][:2] == ["agentprovider.joch.dev/echo", "/bin/echo"]
    everything = joch.ok("get", "all", "-o", "name").out.splitlines()
    assert "agent.joch.dev/coder" in everything and "agentprovider.joch.dev/echo" in everything
    listed = json.loads(joch.ok("get", "ag,ap", "-o", "json").out)
    assert sorted(i["kind"] for i in listed["items"]) == ["Agent", "AgentProvider"]
    both = joch("get", "agents,ap", "coder")  # as kubectl: each type's object of that name
    assert (both.code, table(both.out)[1][0]) == (3, "agent.joch.dev/coder")
    assert both.err == 'error: agentproviders.joch.dev "coder" in namespace "default" not found\n'
    joch.ok("delete", "-f", manifest("quickstart.yaml"))
    assert joch.ok("get", "all").err == "No resources found in default namespace.\n"


def compiled(joch, name: str, *, seconds: float = 20) -> dict:
    """The Agent once the server's Agent controller has compiled it (and so stopped writing its status)."""
    deadline = time.monotonic() + seconds
    while True:
        obj = json.loads(joch.ok("get", "agent", name, "-o", "json").out)
        conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        if "Ready" in conditions:
            return obj
        assert time.monotonic() < deadline, f"agent {name} was not compiled within {seconds}s: {obj}"
        time.sleep(0.05)


def test_get_one_agent_as_yaml_and_json(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"))
    compiled(joch, "coder")
    obj = yaml.safe_load(joch.ok("get", "agent", "coder", "-o", "yaml").out)
    assert obj["apiVersion"] == "joch.dev/v1alpha1" and obj["kind"] == "Agent"
    assert obj["metadata"]["name"] == "coder" and obj["metadata"]["labels"] == {"team": "core"}
    assert obj["spec"]["providerRef"] == {"name": "echo"}
    assert obj["spec"]["systemPrompt"] == "You are careful.\nYou write tests.\n"
    assert json.loads(joch.ok("get", "agent/coder", "-o", "json").out) == obj
    listed = json.loads(joch.ok("get", "agents", "-o", "json").out)
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == ["coder"]


def test_get_missing_things(joch) -> None:
    missing = joch("get", "agent", "nope")
    assert missing.code == 3
    assert missing.err == 'error: agents.joch.dev "nope" in namespace "default" not found\n'
    unknown = joch("get", "gadgets")
    assert unknown.code == 3
    assert 'error: the server doesn\'t have a resource type "gadgets"' in unknown.err


def test_an_empty_namespace_says_which_namespaces_have_some(joch, manifest) -> None:
    # The controllers' Lease lives in joch-system; `joch get leases` in default must not look like none exist.
    leases = joch.ok("get", "leases")
    assert leases.out == ""
    assert leases.err == ("No resources found in default namespace.\n"
                          "Some exist in namespace joch-system: add -n joch-system, or -A for all namespaces.\n")
    assert table(joch.ok("get", "leases", "-n", "joch-system").out)[1][0] == "joch-controller-manager"
    joch.ok("-n", "team-a", "apply", "-f", manifest("reviewer.yaml"))
    joch.ok("-n", "team-b", "apply", "-f", manifest("reviewer.yaml"))
    several = joch.ok("get", "agents,leases", "-n", "team-c")
    assert several.err == ("No resources found in team-c namespace.\n"
                           "Some exist in namespaces joch-system, team-a, team-b: add -n NAMESPACE, or -A for all "
                           "namespaces.\n")
    assert joch.ok("get", "agents", "-l", "no=such").err == "No resources found in default namespace.\n"


def test_get_prints_what_it_finds_then_an_error_for_each_missing_name(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"), "-f", manifest("reviewer.yaml"))
    result = joch("get", "ag", "coder", "nope", "reviewer")
    assert result.code == 3
    assert [r[0] for r in table(result.out)] == ["NAME", "coder", "reviewer"]
    assert result.err == 'error: agents.joch.dev "nope" in namespace "default" not found\n'
    named = joch("get", "ag", "nope", "coder", "-o", "name")
    assert (named.code, named.out) == (3, "agent.joch.dev/coder\n")
    listed = joch("get", "ag", "coder", "nope", "-o", "yaml")
    assert listed.code == 3
    assert [i["metadata"]["name"] for i in yaml.safe_load(listed.out)["items"]] == ["coder"]
    nothing = joch("get", "ag", "nope", "gone")
    assert (nothing.code, nothing.out) == (3, "")
    assert nothing.err.count("error: ") == 2


def test_get_several_type_name_arguments(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"))
    out = joch.ok("get", "ag/coder", "ap/echo", "agents/coder").out
    first, second = out.split("\n\n")
    assert table(first)[0] == ["NAME", "PROVIDER", "READY", "AGE"]
    assert [r[0] for r in table(first)[1:]] == ["agent.joch.dev/coder", "agent.joch.dev/coder"]
    assert table(second)[1][:2] == ["agentprovider.joch.dev/echo", "/bin/echo"]
    named = joch("get", "ag/coder", "ap/echo", "is/nope", "-o", "name")
    assert named.out.splitlines() == ["agent.joch.dev/coder", "agentprovider.joch.dev/echo"]
    assert (named.code, named.err) == (3, 'error: implementationspecs.joch.dev "nope" in namespace "default" '
                                          "not found\n")
    one = joch.ok("get", "ag/coder", "ag/coder", "-o", "json").out
    assert [i["kind"] for i in json.loads(one)["items"]] == ["Agent", "Agent"]
    mixed = joch("get", "ag/coder", "echo")
    assert mixed.code == 2 and "every argument must be one" in mixed.err


def test_label_selectors(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"), "-f", manifest("reviewer.yaml"))
    assert [r[0] for r in table(joch.ok("get", "agents", "-l", "team=core").out)[1:]] == ["coder"]
    assert [r[0] for r in table(joch.ok("get", "agents", "-l", "team!=core").out)[1:]] == ["reviewer"]
    both = joch.ok("get", "agents", "-l", "team in (core,quality)", "-o", "name").out.split()
    assert both == ["agent.joch.dev/coder", "agent.joch.dev/reviewer"]
    none = joch.ok("get", "agents", "-l", "team=nobody")
    assert none.out == "" and none.err == "No resources found in default namespace.\n"
    bad = joch("get", "agents", "-l", "team in (")
    assert bad.code == 2 and bad.err.startswith("error: ")


def test_namespaces(joch, manifest) -> None:
    joch.ok("-n", "team-a", "apply", "-f", manifest("quickstart.yaml"))
    assert [r[0] for r in table(joch.ok("get", "agents", "-n", "team-a").out)[1:]] == ["coder"]
    assert joch.ok("get", "agents").err == (
        "No resources found in default namespace.\nSome exist in namespace team-a: add -n team-a, or -A for all "
        "namespaces.\n")
    obj = yaml.safe_load(joch.ok("get", "agent", "coder", "-n", "team-a", "-o", "yaml").out)
    assert obj["metadata"]["namespace"] == "team-a"
    # -n goes to the server as a parameter; errors still point into the file as written
    bad = joch("apply", "-n", "team-a", "-f", manifest("three-good-one-bad.yaml"))
    assert bad.code == 2
    assert f"documents[3] (Agent/batch-broken in {manifest('three-good-one-bad.yaml')}:23): " in bad.err
    conflicting = joch("apply", "-n", "elsewhere", "-f", "-",
                       input="apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\n"
                             "metadata: {name: x, namespace: team-a}\nspec: {binary: /bin/true}\n")
    assert conflicting.code == 2
    assert 'the namespace from the provided object "team-a" does not match the namespace "elsewhere"' in (
        conflicting.err)
    trap = joch("apply", "-n", "team-a", "-f", "-",
                input="apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: y}\n"
                      "spec: {binary: /bin/true, envTemplate: {MODE: on}}\n")
    assert trap.code == 2 and 'quote the value ("on")' in trap.err


MIXED = ("apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata:\n  name: here\nspec: {binary: /bin/true}\n"
         "---\napiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: there, namespace: team-b}\n"
         "spec: {binary: /bin/true}\n")


def test_joch_namespace_is_a_default_that_manifests_override(joch, tmp_path) -> None:
    team_a = {"JOCH_NAMESPACE": "team-a"}
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(MIXED)
    applied = joch.ok("apply", "-f", str(mixed), env=team_a)
    assert applied.out.splitlines() == ["agentprovider.joch.dev/here created", "agentprovider.joch.dev/there created"]
    rows = table(joch.ok("get", "ap", "-A").out)
    assert [r[:2] for r in rows[1:]] == [["team-a", "here"], ["team-b", "there"]]
    assert mixed.read_text() == MIXED
    # errors still point at the lines of the file as written (a line was added to the first document)
    broken = tmp_path / "broken.yaml"
    broken.write_text(MIXED.replace("there", "broken").replace("/bin/true}\n", "/bin/true, bogus: 1}\n"))
    failed = joch("apply", "-f", str(broken), env=team_a)
    assert failed.code == 2
    assert f'  - documents[1] (AgentProvider/broken in {broken}:7): spec.bogus: unknown field "bogus"' in failed.err
    # create and delete -f take it the same way
    joch.ok("delete", "-f", str(mixed), env=team_a)
    assert joch.ok("create", "-f", str(mixed), env=team_a).out.count(" created") == 2
    assert joch.ok("get", "ap", "here", "-o", "name", env=team_a).out == "agentprovider.joch.dev/here\n"
    assert joch.ok("delete", "-f", str(mixed), env=team_a).out.count(" deleted") == 2


def test_only_an_explicit_namespace_conflicts_and_messages_say_where_a_namespace_came_from(joch, tmp_path) -> None:
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(MIXED)
    for args in (["-n", "team-a", "apply"], ["apply", "--namespace", "team-a"], ["create", "-n", "team-a"]):
        conflict = joch(*args, "-f", str(mixed), env={"JOCH_NAMESPACE": "team-c"})
        assert conflict.code == 2
        assert conflict.err == (f'error: documents[1] (AgentProvider/there in {mixed}:7): the namespace from the '
                                'provided object "team-b" does not match the namespace "team-a" given with '
                                "-n/--namespace; pass --namespace=team-b or remove metadata.namespace\n")
    empty = joch("get", "ap", env={"JOCH_NAMESPACE": "team-c"})
    assert empty.err == "No resources found in team-c namespace (from JOCH_NAMESPACE).\n"
    missing = joch("get", "ap", "x", env={"JOCH_NAMESPACE": "team-c"})
    assert missing.err == ('error: agentproviders.joch.dev "x" in namespace "team-c" not found '
                           "(the namespace came from JOCH_NAMESPACE)\n")
    assert joch("get", "ap", "x", "-n", "team-c").err == (
        'error: agentproviders.joch.dev "x" in namespace "team-c" not found\n')
    invalid = joch("apply", "-f", str(mixed), env={"JOCH_NAMESPACE": "Team_C"})
    assert invalid.code == 2
    assert invalid.err.startswith('error: invalid namespace "Team_C" (from JOCH_NAMESPACE=Team_C)')


def test_watch_prints_the_table_then_a_row_per_change(joch, manifest, server, joch_binary) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"))
    proc = subprocess.Popen([str(joch_binary), "get", "agents", "-w", "--server", server.url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = _line_reader(proc)

    def row_of(name: str) -> list[str]:
        # the server's Agent controller writes each agent's status once after it is applied, which
        # the watch shows as one more row of that agent: skip rows of other agents
        for _ in range(5):
            row = lines(10).split()
            if row[0] == name:
                return row
        raise AssertionError(f"no row for {name}")

    try:
        assert lines(10).split() == ["NAME", "PROVIDER", "READY", "AGE"]
        assert row_of("coder")[:2] == ["coder", "echo"]
        joch.ok("apply", "-f", manifest("reviewer.yaml"))
        assert row_of("reviewer")[:2] == ["reviewer", "echo"]
        compiled(joch, "reviewer")
        joch.ok("delete", "agent", "coder")
        assert row_of("coder")[:2] == ["coder", "echo"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "Traceback" not in proc.stderr.read()


def _line_reader(proc: subprocess.Popen[str]) -> Callable[[float], str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()

    def next_line(timeout: float) -> str:
        try:
            return lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output from `joch get -w` within {timeout}s") from None

    return next_line


# --- describe ------------------------------------------------------------------------------------

def test_describe_agent(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"), "-f", manifest("event.yaml"))
    compiled(joch, "coder")  # ReferencesResolved and Ready are the Agent controller's
    page = joch.ok("describe", "agent", "coder").out
    lines = page.splitlines()
    assert lines[:6] == ["Name:         coder", "Namespace:    default", "Labels:       team=core",
                         "Annotations:  <none>", "API Version:  joch.dev/v1alpha1", "Kind:         Agent"]
    assert "Metadata:\n  uid:" in page and "  resourceVersion:" in page and "  generation:         1" in page
    assert "Spec:\n  providerRef:\n    name:  echo\n" in page
    assert "  systemPrompt:  |\n    You are careful.\n    You write tests.\n" in page
    conditions = page.split("  Conditions:\n")[1].splitlines()
    assert conditions[0].split() == ["Type", "Status", "Reason", "Message", "Age"]
    assert conditions[1].split()[:3] == ["ReferencesResolved", "True", "Resolved"]
    events = page.split("Events:\n")[1].splitlines()
    assert events[0].split() == ["Type", "Reason", "Age", "From", "Message"]
    assert events[2].split()[:2] == ["Normal", "Compiled"]
    assert "agent-controller   compiled the agent manifest" in events[2]
    assert "NotAboutCoder" not in page


def test_describe_without_events_and_a_missing_object(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"))
    page = joch.ok("describe", "implementationspecs", "hello").out
    assert "Spec:\n  text:     Print hello.\n" in page and page.endswith("Events:       <none>\n")
    missing = joch("describe", "agent", "ghost")
    assert missing.code == 3 and missing.err.startswith("error: ")


def test_describe_several_objects_and_a_missing_one(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"))
    result = joch("describe", "ag/coder", "ap/nope", "ap/echo")
    assert result.code == 3
    assert [line for line in result.out.splitlines() if line.startswith("Name:")] == [
        "Name:         coder", "Name:         echo"]
    assert result.err == 'error: agentproviders.joch.dev "nope" in namespace "default" not found\n'


def test_describe_secret_shows_sizes_not_values(joch) -> None:
    secret = ("apiVersion: ops.joch.dev/v1alpha1\nkind: Secret\nmetadata: {name: keys}\n"
              "spec:\n  data: {token: czNjcjN0LXZhbHVl}\n")  # s3cr3t-value
    joch.ok("apply", "-f", "-", input=secret)
    page = joch.ok("describe", "secret", "keys").out
    assert "Data:\n  token:  12 bytes\n" in page
    assert "czNjcjN0LXZhbHVl" not in page and "s3cr3t" not in page


# --- delete --------------------------------------------------------------------------------------

def test_delete_by_name_and_by_file(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"))
    assert joch.ok("delete", "agent", "coder").out == 'agent.joch.dev "coder" deleted\n'
    assert joch("get", "agent", "coder").code == 3
    again = joch("delete", "agent", "coder")
    assert again.code == 3 and again.err == 'error: agents.joch.dev "coder" in namespace "default" not found\n'
    assert joch.ok("delete", "agent", "coder", "--ignore-not-found").out == ""
    by_file = joch("delete", "-f", manifest("quickstart.yaml"))
    assert by_file.out.splitlines() == ['agentprovider.joch.dev "echo" deleted',
                                        'implementationspec.joch.dev "hello" deleted']
    assert by_file.code == 3  # coder was already gone; the others were still deleted
    assert "documents[1] (Agent/coder in" in by_file.err


def test_delete_type_name_arguments(joch, manifest) -> None:
    joch.ok("apply", "-f", manifest("quickstart.yaml"))
    result = joch("delete", "ag/coder", "ap/nope", "is/hello")
    assert result.out.splitlines() == ['agent.joch.dev "coder" deleted', 'implementationspec.joch.dev "hello" deleted']
    assert (result.code, result.err) == (3, 'error: agentproviders.joch.dev "nope" in namespace "default" '
                                             "not found\n")


def test_delete_of_an_object_with_finalizers_says_it_is_only_marked(joch, server) -> None:
    held = PROVIDER.replace("metadata: {name: p}", "metadata: {name: p, finalizers: [example.com/a, example.com/b]}")
    joch.ok("apply", "-f", "-", input=held)
    try:
        result = joch.ok("delete", "ap", "p")
        assert result.out == ('agentprovider.joch.dev "p" marked for deletion '
                              "(waiting on finalizers: example.com/a, example.com/b)\n")
        assert yaml.safe_load(joch.ok("get", "ap", "p", "-o", "yaml").out)["metadata"]["deletionTimestamp"]
    finally:
        httpx.patch(f"{server.url}/apis/joch.dev/v1alpha1/namespaces/default/agentproviders/p",
                    content='{"metadata": {"finalizers": null}}',
                    headers={"Content-Type": "application/merge-patch+json"}, timeout=10).raise_for_status()
    assert joch("get", "ap", "p").code == 3


# --- discovery, version, and no server -----------------------------------------------------------

def test_api_resources_lists_agents_with_their_short_name(joch) -> None:
    rows = table(joch.ok("api-resources").out)
    assert rows[0] == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert ["agents", "ag", "joch.dev/v1alpha1", "true", "Agent"] in rows
    assert ["agentruns", "run,runs,ar", "runtime.joch.dev/v1alpha1", "true", "AgentRun"] in rows


def test_version_prints_client_and_server_alike(joch, joch_at, server) -> None:
    expected = f"Client Version: v{package.__version__}\nServer Version: v{package.__version__}\n"
    installed = joch_at(server.url, "version")  # the console script, in its own process
    assert (installed.code, installed.err) == (0, "")
    assert installed.out == expected
    assert joch.ok("version").out == expected


def test_no_server_is_one_clear_line_and_exit_code_7(joch_at, closed_port) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    message = f"error: cannot reach the Joch server at {url} (is `joch server` running?)\n"
    for args in (["get", "agents"], ["describe", "agent", "x"], ["delete", "agent", "x"], ["api-resources"],
                 ["create", "-f", "-"], ["apply", "-f", "-"]):
        result = joch_at(url, *args, input=PROVIDER)
        assert (result.code, result.out, result.err) == (7, "", message), args
    version = joch_at(url, "version")
    assert (version.code, version.out, version.err) == (7, f"Client Version: v{package.__version__}\n", message)


def test_server_refuses_a_taken_port_with_a_clear_error(server, joch_binary, tmp_path) -> None:
    result = subprocess.run([str(joch_binary), "server", "--port", str(server.port), "--data-dir",
                             str(tmp_path / "other")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr == (f"error: cannot listen on 127.0.0.1:{server.port}: the address is already in use "
                             "(is another `joch server` running?)\n")


def test_a_malformed_server_url_or_port_is_a_clear_error_not_a_traceback(joch_at, joch_binary, tmp_path) -> None:
    bad_url = joch_at("http://[::1", "get", "ag")
    assert bad_url.code == 2 and "Traceback" not in bad_url.err
    assert bad_url.err.startswith('error: the server URL "http://[::1" (JOCH_SERVER) is not a valid URL')
    flag = joch_at("http://127.0.0.1:1", "get", "ag", "--server", "http://[::1")
    assert flag.code == 2 and '(--server) is not a valid URL' in flag.err
    port = subprocess.run([str(joch_binary), "server", "--port", "99999", "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=30)
    assert (port.returncode, port.stdout, port.stderr) == (2, "", "error: --port must be between 1 and 65535 "
                                                                  "(got 99999)\n")


def test_a_web_page_cannot_make_the_server_run_anything(server, joch) -> None:
    # The three requests of the attack on a real `joch server` with its controllers: cross-origin,
    # no Content-Type, Host of the page (DNS rebinding), then the same to 127.0.0.1 itself.
    ap, ag, run = ("/apis/joch.dev/v1alpha1/namespaces/default/agentproviders",
                   "/apis/joch.dev/v1alpha1/namespaces/default/agents",
                   "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns")
    bodies = [(ap, {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "p"},
                    "spec": {"binary": "id"}}),
              (ag, {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
                    "spec": {"providerRef": {"name": "p"}}}),
              (run, {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r"},
                     "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}}}})]
    page = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    for headers in ({**page, "Host": "evil.example"}, page):
        for path, body in bodies:
            r = httpx.post(f"{server.url}{path}", content=json.dumps(body), headers=headers, timeout=10)
            assert r.status_code in (400, 403) and r.json()["kind"] == "Status", r.text
    for path, _ in bodies:
        assert httpx.get(f"{server.url}{path}", timeout=10).json()["items"] == []
    assert joch.ok("get", "runs").err == "No resources found in default namespace.\n"


def test_server_flags_allow_hosts_and_origins(joch_binary, closed_port, tmp_path) -> None:
    proc = subprocess.Popen(
        [str(joch_binary), "server", "--no-controllers", "--port", str(closed_port), "--data-dir", str(tmp_path),
         "--allowed-host", "Joch.Test", "--allowed-origin", "http://localhost:3000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = f"http://127.0.0.1:{closed_port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "joch server did not start"
                time.sleep(0.1)
        assert httpx.get(f"{url}/apis", headers={"Host": "joch.test:80"}).status_code == 200
        assert httpx.get(f"{url}/apis", headers={"Host": "other.test"}).status_code == 400
        r = httpx.get(f"{url}/apis", headers={"Origin": "http://localhost:3000", "Sec-Fetch-Site": "same-site"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert httpx.get(f"{url}/apis", headers={"Origin": "http://localhost:3001"}).status_code == 403
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=20)
    assert "WITHOUT AUTHENTICATION" not in stderr  # loopback: nothing to warn about


def test_a_web_server_that_is_not_joch_is_named_with_exit_code_7(joch_at, closed_port, tmp_path) -> None:
    port = closed_port
    web = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url)
        for args, request in ((["get", "agents"], "GET /apis answered 404 text/html"),
                              (["version"], "GET /version answered 404 text/html"),
                              (["apply", "-f", "-"], "POST /v1/resources/apply answered 501 text/html"),
                              (["create", "-f", "-"], "POST /v1/resources/create answered 501 text/html")):
            result = joch_at(url, *args, input=PROVIDER)
            assert (result.code, result.err) == (7, f"error: {url} is not a Joch API server ({request})\n"), args
    finally:
        web.terminate()
        web.wait(timeout=10)


def test_a_peer_that_does_not_speak_http_is_one_line_and_exit_code_7(joch_at) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"

        def banner() -> None:
            for _ in range(2):
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)  # the request, read so closing does not reset the connection
                    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

        threading.Thread(target=banner, daemon=True).start()
        for args in (["get", "agents"], ["version"]):
            result = joch_at(url, *args)
            assert result.code == 7 and "Traceback" not in result.err
            assert [line for line in result.err.splitlines() if line.startswith("error: ")] == result.err.splitlines()
            assert result.err.startswith(f"error: no valid HTTP answer from {url} to GET ")


def test_a_yaml_bomb_is_refused_with_exit_code_2_not_a_crash(joch_at, server, tmp_path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 100_000 + "\n")
    for verb in ("apply", "create", "delete"):
        result = joch_at(server.url, verb, "-f", str(deep))
        assert result.code == 2, (verb, result)  # libyaml's composer used to die here with SIGSEGV (139)
        assert result.err.startswith(f"error: {deep}: documents[0] (line 1): mappings and lists nest more than 64")


def _wait_for(url: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError(f"nothing answered at {url}")


def test_apply_sends_a_relative_repository_path_resolved_against_the_manifest(joch, tmp_path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "run.yaml").write_text(
        "apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: p}\nspec: {binary: /bin/true}\n---\n"
        "apiVersion: joch.dev/v1alpha1\nkind: Agent\nmetadata: {name: a}\nspec: {providerRef: {name: p}}\n---\n"
        "apiVersion: runtime.joch.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: r}\nspec:\n  agentRef: {name: a}\n"
        "  implementation: {inline: {text: x}}\n  execution: {coordinates: {git: {url: ..}}}\n")
    joch.ok("apply", "-f", str(tmp_path / "m" / "run.yaml"), "--dry-run=server")
    applied = joch.ok("apply", "-f", str(tmp_path / "m"), "-o", "yaml")
    run = next(d for d in yaml.safe_load(applied.out)["items"] if d["kind"] == "AgentRun")
    assert run["spec"]["execution"]["coordinates"]["git"]["url"] == str(tmp_path.resolve())
    assert joch.ok("apply", "-f", str(tmp_path / "m")).out.splitlines()[-1] == "agentrun.runtime.joch.dev/r unchanged"


def test_an_apply_past_the_servers_document_cap_is_one_line_and_writes_nothing(joch, tmp_path) -> None:
    many = tmp_path / "many.yaml"
    many.write_text("\n---\n".join(
        f"apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {{name: p{i}}}\nspec: {{binary: x}}"
        for i in range(1001)))
    result = joch("apply", "-f", str(many))
    assert result.code == 2
    assert result.err == ("error: the request holds 1001 objects; one apply takes at most 1000 "
                          "(joch server --max-apply-documents): split the manifests into several requests\n")
    assert joch.ok("get", "agentproviders").out == ""


def test_server_limit_flags_below_one_are_refused_in_one_line(joch) -> None:
    result = joch("server", "--max-watches", "0")
    assert result.code == 2 and result.err == "error: --max-watches must be at least 1 (got 0)\n"
