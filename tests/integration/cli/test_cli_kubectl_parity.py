"""The kubectl habits ``joch`` keeps, against a real ``joch server`` (one per module, see conftest):
``-o jsonpath=``, ``-o custom-columns=``, ``--sort-by``, ``--show-labels``, ``--field-selector``,
``edit``, ``patch``, ``label``, ``wait``, ``logs --tail`` and ``completion``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from integration.cli.conftest import Joch, Server
from support import kubectl_binary

KUBECTL = kubectl_binary()
AGENTS = "/apis/joch.dev/v1alpha1/namespaces/default/agents"
RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"


def agents(joch: Joch, *specs: tuple[str, str, dict[str, str]]) -> None:
    """AgentProvider echo and one Agent per (name, description, labels)."""
    docs = ["apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: echo}\n"
            "spec: {binary: /bin/echo, argsTemplate: ['{{ implementation.text }}']}\n"]
    for name, description, labels in specs:
        docs.append(json.dumps({"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
                                "metadata": {"name": name, "labels": labels},
                                "spec": {"providerRef": {"name": "echo"}, "description": description}}))
    joch.ok("apply", "-f", "-", input="\n---\n".join(docs))


def lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


# --- output -------------------------------------------------------------------------------------

def test_jsonpath_prints_a_list_a_range_and_one_object(joch: Joch) -> None:
    agents(joch, ("b", "second", {"team": "core"}), ("a", "first", {"team": "web"}))
    assert joch.ok("get", "agents", "-o", "jsonpath={.items[*].metadata.name}").out == "a b"
    ranged = joch.ok("get", "agents", "-o",
                     'jsonpath={range .items[*]}{.metadata.name}{"\\t"}{.metadata.labels.team}{"\\n"}{end}').out
    assert ranged == "a\tweb\nb\tcore\n"
    assert joch.ok("get", "agent", "b", "-o", "jsonpath={.spec.description}").out == "second"
    filtered = joch.ok("get", "agent", "a", "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}').out
    assert filtered == "True"


def test_a_bad_template_is_a_usage_error_before_any_request(joch: Joch) -> None:
    result = joch("get", "agents", "-o", "jsonpath={range .items[*]}{.metadata.name}")
    assert result.code == 2
    assert "error parsing JSONPath template" in result.err and "{range} has no {end}" in result.err
    assert "Traceback" not in result.err
    result = joch("get", "agents", "-o", "custom-columns=NAME")
    assert result.code == 2 and "expected HEADER:JSONPATH" in result.err
    result = joch("get", "agents", "-o", "table")
    assert result.code == 2 and "jsonpath=TEMPLATE" in result.err


def test_custom_columns_and_sort_by(joch: Joch) -> None:
    agents(joch, ("a", "zebra", {}), ("b", "apple", {}), ("c", "mango", {"x": "1"}))
    spec = "custom-columns=NAME:.metadata.name,DESC:.spec.description,X:.metadata.labels.x"
    out = joch.ok("get", "agents", "-o", spec, "--sort-by", ".spec.description").out
    assert lines(out) == [["NAME", "DESC", "X"], ["b", "apple", "<none>"], ["c", "mango", "1"],
                          ["a", "zebra", "<none>"]]
    table = joch.ok("get", "agents", "--sort-by", "{.spec.description}").out
    assert [row[0] for row in lines(table)] == ["NAME", "b", "c", "a"]
    yaml_names = joch.ok("get", "agents", "--sort-by", ".spec.description", "-o", "name").out.split()
    assert yaml_names == ["agent.joch.dev/b", "agent.joch.dev/c", "agent.joch.dev/a"]


def test_show_labels_adds_a_labels_column(joch: Joch) -> None:
    agents(joch, ("a", "x", {"team": "core", "app": "web"}), ("b", "y", {}))
    rows = lines(joch.ok("get", "agents", "--show-labels").out)
    assert rows[0][-1] == "LABELS"
    assert rows[1][0] == "a" and rows[1][-1] == "app=web,team=core"
    assert rows[2][0] == "b" and rows[2][-1] == "<none>"
    wide = lines(joch.ok("get", "agents", "-A", "--show-labels").out)
    assert wide[0][0] == "NAMESPACE" and wide[0][-1] == "LABELS"


def test_field_selector_on_a_spec_field_and_an_unknown_field(joch: Joch, server: Server, tmp_path: Path) -> None:
    agents(joch, ("a", "x", {}))
    joch.ok("apply", "-f", "-", input="apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: other}\n"
                                      "spec: {binary: /bin/true}\n---\napiVersion: joch.dev/v1alpha1\nkind: Agent\n"
                                      "metadata: {name: b}\nspec: {providerRef: {name: other}}\n")
    out = joch.ok("get", "agents", "--field-selector", "spec.providerRef.name=other", "-o", "name").out
    assert out.split() == ["agent.joch.dev/b"]
    out = joch.ok("get", "agents", "--field-selector", "spec.providerRef.name!=other,metadata.name=a", "-o", "name")
    assert out.out.split() == ["agent.joch.dev/a"]
    result = joch("get", "agents", "--field-selector", "spec.description=x")
    assert result.code == 2
    assert "field label not supported for agents: spec.description" in result.err
    assert "spec.providerRef.name" in result.err  # the message lists what is supported
    # Any client sees the same fields (the server filters): the API, and kubectl itself.
    listing = httpx.get(f"{server.url}{AGENTS}", params={"fieldSelector": "spec.providerRef.name=echo"}).json()
    assert [i["metadata"]["name"] for i in listing["items"]] == ["a"]
    if KUBECTL is not None:
        env = {"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "kubeconfig"), "PATH": "/usr/bin:/bin"}
        done = subprocess.run([KUBECTL, f"--server={server.url}", "get", "agents", "-o", "name",
                               "--field-selector", "spec.providerRef.name=other"],
                              capture_output=True, text=True, env=env, timeout=60, check=False)
        assert (done.returncode, done.stdout) == (0, "agent.joch.dev/b\n"), done.stderr
    result = joch("get", "agents", "a", "--field-selector", "metadata.name=a")
    assert result.code == 2 and "name cannot be provided" in result.err


# --- changing objects ---------------------------------------------------------------------------

def test_patch_merge_yaml_and_no_change(joch: Joch) -> None:
    agents(joch, ("a", "x", {}))
    assert joch.ok("patch", "agent", "a", "-p", '{"spec":{"description":"merged"}}').out == \
        "agent.joch.dev/a patched\n"
    assert joch.ok("get", "agent", "a", "-o", "jsonpath={.spec.description}").out == "merged"
    assert joch.ok("patch", "agent/a", "-p", "spec: {description: merged}").out == \
        "agent.joch.dev/a patched (no change)\n"
    result = joch("patch", "agent", "a", "-p", '{"spec":{"providerRef":{"name":5}}}')
    assert result.code == 2 and "spec.providerRef.name" in result.err
    result = joch("patch", "agent", "missing", "-p", "{}")
    assert result.code == 3 and "not found" in result.err
    patched = joch.ok("patch", "agent", "a", "--subresource", "status", "-p", '{"status":{"observedGeneration":99}}',
                      "-o", "json").out
    assert json.loads(patched)["status"]["observedGeneration"] == 99  # (the controller sets it back later)
    result = joch("patch", "agent", "a", "--type", "strategic", "-p", "{}")
    assert result.code == 2 and "--type must be one of merge, json" in result.err


def test_patch_type_json(joch: Joch) -> None:
    agents(joch, ("a", "x", {}))
    joch.ok("patch", "agent", "a", "--type", "json", "-p", '[{"op":"replace","path":"/spec/description","value":"j"}]')
    assert joch.ok("get", "agent", "a", "-o", "jsonpath={.spec.description}").out == "j"
    result = joch("patch", "agent", "a", "--type", "json", "-p", '{"op":"replace"}')
    assert result.code == 2 and "must be a list of operations" in result.err


def test_get_leaves_out_managed_fields_unless_asked(joch: Joch, server: Server) -> None:
    agent = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a", "namespace": "default"},
             "spec": {"providerRef": {"name": "x"}}}
    created = httpx.post(f"{server.url}/apis/joch.dev/v1alpha1/namespaces/default/agents?fieldManager=tester",
                         json=agent)
    assert created.status_code == 201 and created.json()["metadata"]["managedFields"], created.text
    for output in ("yaml", "json"):
        assert "managedFields" not in joch.ok("get", "agent", "a", "-o", output).out
        assert "managedFields" not in joch.ok("get", "agents", "-o", output).out
    shown = json.loads(joch.ok("get", "agent", "a", "-o", "json", "--show-managed-fields").out)
    assert shown["metadata"]["managedFields"], shown["metadata"]


def test_label_set_overwrite_remove_and_selector(joch: Joch) -> None:
    agents(joch, ("a", "x", {"team": "core"}), ("b", "y", {"team": "core"}))
    assert joch.ok("label", "agent", "a", "tier=1").out == "agent.joch.dev/a labeled\n"
    refused = joch("label", "agent", "a", "team=web")
    assert refused.code == 2 and "'team' already has a value (core), and --overwrite is false" in refused.err
    joch.ok("label", "agent", "a", "team=web", "--overwrite")
    assert joch.ok("label", "agent/a", "tier-").out == "agent.joch.dev/a unlabeled\n"
    missing = joch.ok("label", "agent", "a", "nothing-")
    assert missing.out == "agent.joch.dev/a not labeled\n" and 'label "nothing" not found' in missing.err
    assert joch.ok("get", "agent", "a", "-o", "jsonpath={.metadata.labels}").out == '{"team":"web"}'
    out = joch.ok("label", "agents", "-l", "team=core", "picked=yes").out
    assert out == "agent.joch.dev/b labeled\n"
    invalid = joch("label", "agent", "a", "bad key=1")
    assert invalid.code == 2 and "Traceback" not in invalid.err
    assert joch("label", "agent", "a").code == 2  # no change given


def editor(tmp_path: Path, body: str) -> dict[str, str]:
    """An $EDITOR that runs ``body`` (Python, with ``text`` the file's content; what it leaves in
    ``text`` is saved), recording each text it was shown."""
    script = tmp_path / "editor.py"
    script.write_text(
        "import pathlib, sys\n"
        "path = pathlib.Path(sys.argv[1]); text = path.read_text()\n"
        f"log = pathlib.Path({str(tmp_path / 'shown')!r}); log.mkdir(exist_ok=True)\n"
        "(log / str(len(list(log.iterdir())))).write_text(text)\n"
        f"{body}\n"
        "path.write_text(text)\n"
    )
    return {"EDITOR": f"{sys.executable} {script}", "JOCH_EDITOR": "", "KUBE_EDITOR": ""}


def test_edit_saves_what_the_editor_wrote(joch: Joch, tmp_path: Path) -> None:
    agents(joch, ("a", "before", {}))
    env = editor(tmp_path, "text = text.replace('description: before', 'description: after')")
    assert joch.ok("edit", "agent", "a", env=env).out == "agent.joch.dev/a edited\n"
    assert joch.ok("get", "agent", "a", "-o", "jsonpath={.spec.description}").out == "after"
    (tmp_path / "again").mkdir()
    unchanged = joch.ok("edit", "agent/a", env=editor(tmp_path / "again", "pass"))
    assert unchanged.out == "Edit cancelled, no changes made.\n"


def test_edit_reopens_with_the_error_then_gives_up_keeping_a_copy(joch: Joch, tmp_path: Path) -> None:
    agents(joch, ("a", "before", {}))
    # Always writes an invalid providerRef.name: the server refuses it each time.
    env = editor(tmp_path, "import re\ntext = re.sub(r'name: echo', 'name: 5', text)")
    result = joch("edit", "agent", "a", env=env)
    assert result.code == 2 and "spec.providerRef.name" in result.err
    shown = sorted((tmp_path / "shown").iterdir(), key=lambda p: int(p.name))
    assert len(shown) == 2  # opened again once, with the error on top
    second = shown[1].read_text()
    assert second.startswith("# Please edit the object below")
    assert "# * spec.providerRef.name" in second or "providerRef.name" in second.split("apiVersion")[0]
    kept = result.err.split('stored to "')[1].split('"')[0]
    assert "name: 5" in Path(kept).read_text()
    Path(kept).unlink()
    assert joch.ok("get", "agent", "a", "-o", "jsonpath={.spec.providerRef.name}").out == "echo"


def test_edit_fixing_the_error_saves(joch: Joch, tmp_path: Path) -> None:
    agents(joch, ("a", "before", {}))
    env = editor(tmp_path, "text = text.replace('description: before', 'description: [broken') "
                           "if 'edited file' not in text else text.replace('description: [broken', 'description: ok')")
    assert joch.ok("edit", "agent", "a", env=env).out == "agent.joch.dev/a edited\n"
    assert joch.ok("get", "agent", "a", "-o", "jsonpath={.spec.description}").out == "ok"


def test_edit_without_an_editor_says_so(joch: Joch) -> None:
    agents(joch, ("a", "x", {}))
    result = joch("edit", "agent", "a", env={"EDITOR": "/nonexistent/editor", "JOCH_EDITOR": "", "KUBE_EDITOR": ""})
    assert result.code == 2 and "cannot start the editor" in result.err


# --- wait ---------------------------------------------------------------------------------------

def test_wait_for_a_condition_a_jsonpath_and_a_timeout(joch: Joch) -> None:
    agents(joch, ("a", "x", {}))
    assert joch.ok("wait", "agent", "a", "--for", "condition=Ready").out == "agent.joch.dev/a condition met\n"
    assert joch.ok("wait", "agent/a", "--for", "jsonpath={.spec.description}=x").out == \
        "agent.joch.dev/a condition met\n"
    started = time.monotonic()
    result = joch("wait", "agent", "a", "--for", "condition=Ready=False", "--timeout", "1s")
    assert result.code == 1
    assert result.err == "error: timed out waiting for the condition on agents/a\n"
    assert time.monotonic() - started < 5
    assert joch("wait", "agent", "nope", "--for", "condition=Ready", "--timeout", "1s").code == 3
    bad = joch("wait", "agent", "a", "--for", "ready")
    assert bad.code == 2 and "unrecognized --for" in bad.err
    assert joch("wait", "agent", "a", "--for", "delete", "--timeout", "soon").code == 2


def test_wait_follows_changes_until_deleted_and_a_value(joch: Joch, server: Server) -> None:
    agents(joch, ("a", "x", {}))

    def later() -> None:
        time.sleep(0.5)
        httpx.patch(f"{server.url}{AGENTS}/a", content='{"spec":{"description":"y"}}',
                    headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
        time.sleep(0.3)
        httpx.delete(f"{server.url}{AGENTS}/a").raise_for_status()

    thread = threading.Thread(target=later)
    thread.start()
    try:
        assert joch.ok("wait", "agent", "a", "--for", "jsonpath={.spec.description}=y", "--timeout", "10s").out == \
            "agent.joch.dev/a condition met\n"
        assert joch.ok("wait", "agent", "a", "--for", "delete", "--timeout", "10s").out == "agent.joch.dev/a deleted\n"
    finally:
        thread.join()


# --- logs --tail, field selectors on a run's phase -----------------------------------------------

@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "init"], check=True)
    return path


def test_logs_tail_and_runs_selected_by_phase(joch: Joch, repo: Path) -> None:
    joch.ok("apply", "-f", "-", input=(
        "apiVersion: joch.dev/v1alpha1\nkind: AgentProvider\nmetadata: {name: lines}\n"
        "spec: {binary: /bin/sh, argsTemplate: ['-c', 'for i in 1 2 3 4 5; do echo line$i; done']}\n---\n"
        "apiVersion: joch.dev/v1alpha1\nkind: Agent\nmetadata: {name: liner}\nspec: {providerRef: {name: lines}}\n"))
    joch.ok("run", "--agent", "liner", "--repo", str(repo), "--text", "go", "--name", "r1")
    joch.ok("wait", "run", "r1", "--for", "jsonpath={.status.phase}=Succeeded", "--timeout", "60s")
    assert joch.ok("logs", "r1", "--tail", "2").out == "line4\nline5\n"
    assert joch.ok("logs", "run/r1", "--tail", "0").out == ""
    assert joch.ok("logs", "r1", "--tail", "2", "-f").out == "line4\nline5\n"
    assert joch.ok("logs", "r1").out.count("line") == 5
    assert joch.ok("logs", "r1", "--limit-bytes", "8").out == "line1\nli"
    assert joch.ok("logs", "r1", "--tail", "1", "--limit-bytes", "4").out == "line"
    bad = joch("logs", "r1", "--limit-bytes", "0")
    assert bad.code == 2 and "--limit-bytes" in bad.err
    selected = joch.ok("get", "runs", "--field-selector", "status.phase=Succeeded,spec.agentRef.name=liner",
                       "-o", "custom-columns=NAME:.metadata.name,PHASE:.status.phase").out
    assert lines(selected) == [["NAME", "PHASE"], ["r1", "Succeeded"]]
    none = joch("get", "runs", "--field-selector", "status.phase=Running")
    assert none.code == 0 and none.out == "" and "No resources found" in none.err


def test_get_watch_with_a_field_selector_prints_runs_as_they_enter_it(joch: Joch, server: Server, repo: Path,
                                                                      joch_binary: Path) -> None:
    agents(joch, ("coder", "x", {}))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}, "JOCH_SERVER": server.url}
    watcher = subprocess.Popen([str(joch_binary), "get", "runs", "-w", "-o", "name",
                                "--field-selector", "status.phase=Succeeded"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    guard = threading.Timer(20, watcher.kill)  # a readline that never returns must not hang the suite
    guard.start()
    try:
        time.sleep(1.0)  # the watch is open (an empty list first)
        joch.ok("run", "--agent", "coder", "--repo", str(repo), "--text", "hi", "--name", "w1")
        assert watcher.stdout is not None
        line = watcher.stdout.readline()  # only once it Succeeded: Pending, Queued, Running are not printed
        assert line == "agentrun.runtime.joch.dev/w1\n"
        phase = joch.ok("get", "run", "w1", "-o", "jsonpath={.status.phase}").out
        assert phase == "Succeeded"
    finally:
        guard.cancel()
        watcher.terminate()
        watcher.wait(timeout=10)


# --- completion ---------------------------------------------------------------------------------

def complete(server: Server, words: str, cword: int) -> list[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JOCH_")}, "_JOCH_COMPLETE": "complete_bash",
           "COMP_WORDS": words, "COMP_CWORD": str(cword), "JOCH_SERVER": server.url}
    joch_bin = Path(sys.executable).with_name("joch")
    done = subprocess.run([str(joch_bin)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_completion_scripts_and_what_they_complete(joch: Joch, server: Server) -> None:
    bash = joch.ok("completion", "bash").out
    assert "_JOCH_COMPLETE=complete_bash" in bash and "complete -o default -F _joch_completion joch" in bash
    subprocess.run(["bash", "-n"], input=bash, text=True, check=True)  # it parses
    assert "compdef _joch_completion joch" in joch.ok("completion", "zsh").out
    assert "complete --command joch" in joch.ok("completion", "fish").out
    bad = joch("completion", "tcsh")
    assert bad.code == 2 and "unsupported shell" in bad.err
    agents(joch, ("coder", "x", {}))
    assert "get" in complete(server, "joch ge", 1)
    assert complete(server, "joch get agentp", 2) == ["agentproviders"]
    assert complete(server, "joch get agents c", 3) == ["coder"]
    assert complete(server, "joch label agent/c", 2) == ["agent/coder"]
    assert complete(server, "joch edit agent c", 3) == ["coder"]
    assert "--show-labels" in complete(server, "joch get --sh", 2)

