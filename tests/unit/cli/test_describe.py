"""``joch describe`` pages, rendered from an object, its events and a fixed clock."""

from __future__ import annotations

import datetime as dt
from typing import Any

from joch.cli import describe
from joch.cli.resolve import ResourceType

NOW = dt.datetime(2025, 1, 10, 12, 0, 0, tzinfo=dt.UTC)
AGENTS = ResourceType(group="joch.dev", version="v1alpha1", kind="Agent", plural="agents", singular="agent",
                      namespaced=True, short_names=("ag",))
AGENT: dict[str, Any] = {
    "apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
    "metadata": {"name": "coder", "namespace": "default", "uid": "u-1", "resourceVersion": "7", "generation": 2,
                 "creationTimestamp": "2025-01-10T11:00:00Z", "labels": {"team": "core", "app": "x"}},
    "spec": {"providerRef": {"name": "codex"}, "tools": [], "systemPrompt": "line one\nline two",
             "env": [{"name": "A", "value": "1"}, {"name": "LONGER", "value": "2"}], "requiresApproval": False},
    "status": {"observedGeneration": 2, "conditions": [
        {"type": "Ready", "status": "False", "reason": "ProviderMissing", "message": "no provider codex",
         "lastTransitionTime": "2025-01-10T11:57:00Z"}]},
}


def event(name: str, *, kind: str = "Agent", reason: str = "Compiled", at: str = "2025-01-10T11:59:00Z",
          count: int = 1) -> dict[str, Any]:
    return {"kind": "Event", "metadata": {"name": name, "namespace": "default"},
            "spec": {"involvedObject": {"kind": kind, "name": "coder"}, "reason": reason, "type": "Normal",
                     "message": "ok", "count": count, "firstTimestamp": "2025-01-10T11:50:00Z",
                     "lastTimestamp": at, "source": {"component": "agent-controller"}}}


def test_the_page_has_the_kubectl_header_and_yaml_ish_spec() -> None:
    page = describe.describe(AGENT, AGENTS, events=[], now=NOW)
    lines = page.splitlines()
    assert lines[:7] == [
        "Name:         coder",
        "Namespace:    default",
        "Labels:       app=x",
        "              team=core",
        "Annotations:  <none>",
        "API Version:  joch.dev/v1alpha1",
        "Kind:         Agent",
    ]
    assert "Metadata:\n  uid:                u-1\n  creationTimestamp:  2025-01-10T11:00:00Z\n" in page
    assert "  resourceVersion:    7\n  generation:         2\n" in page
    assert "Spec:\n  providerRef:\n    name:  codex\n" in page
    assert "  systemPrompt:  |\n    line one\n    line two\n" in page
    assert "  env:\n    - name:   A\n      value:  1\n    - name:   LONGER\n      value:  2\n" in page
    assert "tools" not in page  # empty defaults are noise
    assert "  requiresApproval:  false\n" in page
    assert lines[-1] == "Events:       <none>"


def test_conditions_are_a_table_with_ages() -> None:
    page = describe.describe(AGENT, AGENTS, events=[], now=NOW)
    assert "Status:\n  observedGeneration:  2\n  Conditions:\n" in page
    assert "    Type    Status   Reason            Message             Age\n" in page
    assert "    Ready   False    ProviderMissing   no provider codex   3m\n" in page


def test_events_table_counts_repeats() -> None:
    page = describe.describe(AGENT, AGENTS, events=[event("e1", count=3), event("e2", reason="Ready")], now=NOW)
    assert page.endswith(
        "Events:\n"
        "  Type     Reason     Age                From               Message\n"
        "  ----     ------     ---                ----               -------\n"
        "  Normal   Compiled   1m (x3 over 10m)   agent-controller   ok\n"
        "  Normal   Ready      1m                 agent-controller   ok\n"
    )


def test_an_object_without_status_or_labels() -> None:
    bare = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "b", "namespace": "n"},
            "spec": {"providerRef": {"name": "p"}}}
    page = describe.describe(bare, AGENTS, events=[], now=NOW)
    assert "Labels:       <none>\n" in page
    assert "Status:       <none>\n" in page


def test_events_are_matched_by_uid_or_by_kind_and_name() -> None:
    assert describe.involves(event("e"), AGENT)
    assert not describe.involves(event("e", kind="AgentRun"), AGENT)
    by_uid = event("e")
    by_uid["spec"]["involvedObject"]["uid"] = "someone-else"
    assert not describe.involves(by_uid, AGENT)


SECRETS = ResourceType(group="ops.joch.dev", version="v1alpha1", kind="Secret", plural="secrets", singular="secret",
                       namespaced=True, short_names=("sec",))


def test_a_secret_shows_the_size_of_each_value_never_the_value() -> None:
    secret = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret",
              "metadata": {"name": "keys", "namespace": "default"},
              "spec": {"type": "Opaque", "data": {"token": "czNjcjN0LXZhbHVl", "broken": "not base64!"},
                       "stringData": {"password": "hunter2"}}}
    page = describe.describe(secret, SECRETS, events=[], now=NOW)
    assert "Spec:\n  type:  Opaque\n  data:\n    token:   12 bytes\n    broken:  11 bytes (not valid base64)\n" in page
    assert "  stringData:\n    password:  7 bytes\n" in page
    assert "czNjcjN0" not in page and "hunter2" not in page and "not base64!" not in page
    assert secret["spec"]["data"]["token"] == "czNjcjN0LXZhbHVl"  # the object itself is left alone


ROLE_BINDINGS = ResourceType(group="ops.joch.dev", version="v1alpha1", kind="RoleBinding", plural="rolebindings",
                             singular="rolebinding", namespaced=True, short_names=("rb",))


def test_a_role_binding_shows_its_top_level_fields_and_no_spec_or_status() -> None:
    binding = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "RoleBinding",
               "metadata": {"name": "alice-edits", "namespace": "default"},
               "roleRef": {"apiGroup": "ops.joch.dev", "kind": "Role", "name": "editor"},
               "subjects": [{"kind": "User", "name": "alice"}, {"kind": "Group", "name": "devs"}]}
    page = describe.describe(binding, ROLE_BINDINGS, events=[], now=NOW)
    assert "roleRef:\n  apiGroup:  ops.joch.dev\n  kind:      Role\n  name:      editor\n" in page
    assert "subjects:\n  - kind:  User\n    name:  alice\n  - kind:  Group\n    name:  devs\n" in page
    assert "Spec:" not in page and "Status:" not in page


RUNS = ResourceType(group="runtime.joch.dev", version="v1alpha1", kind="AgentRun", plural="agentruns",
                    singular="agentrun", namespaced=True, short_names=("run",))


def test_a_run_shows_what_ran_and_never_an_env_value() -> None:
    run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun",
           "metadata": {"name": "fix-1", "namespace": "default"},
           "spec": {"agentRef": {"name": "coder"}},
           "status": {"phase": "Succeeded", "attempt": 2, "baseCommit": "3f2a9c", "compiledManifestHash": "sha256:ab",
                      "invocation": {"argv": ["codex", "exec", "fix the bug", "[REDACTED]"],
                                     "env": ["CODEX_API_KEY", "HOME"], "executable": "/usr/bin/codex",
                                     "version": "codex-cli 0.169.0", "sha256": "cd" * 32},
                      "sandbox": {"mode": "bwrap", "user": 65534, "network": "off"},
                      "session": {"id": "s-1", "attempt": 2, "resumedFromAttempt": 1},
                      "omitted": [{"path": "big.bin", "size": 2000000, "message": "over 1 MiB"}]}}
    page = describe.describe(run, RUNS, events=[], now=NOW)
    assert ("Invocation:\n  Executable: /usr/bin/codex\n  Version:    codex-cli 0.169.0\n"
            f"  SHA256:     {'cd' * 32}\n  Argv:       codex exec 'fix the bug' '[REDACTED]'\n"
            "  Env:        CODEX_API_KEY, HOME\n") in page
    assert "Base Commit:    3f2a9c\nManifest Hash:  sha256:ab\n" in page
    assert "Sandbox:        bwrap (user 65534, network off)\n" in page
    assert "Session:        s-1 (resumed from attempt 1)\n" in page
    assert "Omitted from changes.patch:\n" in page and "big.bin   2000000   over 1 MiB" in page
    assert "invocation:" not in page and "baseCommit" not in page  # not again under Status
    run["status"].update(sandbox={"mode": "none", "reason": "bwrap is not installed"},
                         session={"id": "s-2", "attempt": 2})
    page = describe.describe(run, RUNS, events=[], now=NOW)
    assert "Sandbox:        none (bwrap is not installed)\n" in page
    assert "Session:        s-2 (started over)\n" in page
    # A first attempt's session is new, not "started over"; a multi-line prompt stays on the Argv line.
    run["status"].update(session={"id": "s-3", "attempt": 1},
                         invocation={"argv": ["claude", "-p", "--", "Fix it.\n\nIt's\tbroken \\ now"]})
    page = describe.describe(run, RUNS, events=[], now=NOW)
    assert "Session:        s-3 (new session)\n" in page
    assert "  Argv:       claude -p -- $'Fix it.\\n\\nIt\\'s\\tbroken \\\\ now'\n" in page
