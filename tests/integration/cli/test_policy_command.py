"""``joch policy test``: the real console script, offline (no server: none is started or reachable)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

NOWHERE = "http://127.0.0.1:9"  # no server: the command must not need one
Result = Any

POLICIES = """\
apiVersion: ops.joch.dev/v1alpha1
kind: Environment
metadata: {name: prod}
spec: {namespaces: [shop]}
---
apiVersion: joch.dev/v1alpha1
kind: Policy
metadata: {name: binaries, namespace: joch-system}
spec:
  selector: {kinds: [Agent]}
  rules:
  - name: allow-list
    expression: provider != null && !(provider.spec.binary in ["codex", "claude"])
    message: the provider's binary is not on the allow-list
  - name: labels
    action: warn
    expression: '!has(object.metadata.labels)'
    message: label your agents
---
apiVersion: joch.dev/v1alpha1
kind: Policy
metadata: {name: main-ref, namespace: shop}
spec:
  selector: {kinds: [AgentRun], environments: [prod]}
  rules:
  - name: main-needs-approval
    phase: dispatch
    action: requireApproval
    expression: run.spec.execution.coordinates.git.ref == "main" && request.user != "release-bot"
    message: runs on main need a human
"""

OBJECTS = """\
apiVersion: joch.dev/v1alpha1
kind: AgentProvider
metadata: {name: %(provider)s, namespace: shop}
spec: {binary: %(binary)s}
---
apiVersion: joch.dev/v1alpha1
kind: Agent
metadata: {name: coder, namespace: shop, labels: {team: shop}}
spec: {providerRef: {name: %(provider)s}}
---
apiVersion: runtime.joch.dev/v1alpha1
kind: AgentRun
metadata: {name: fix, namespace: shop}
spec:
  agentRef: {name: coder}
  implementation: {inline: {text: fix it}}
  execution: {coordinates: {git: {url: "https://example.com/shop.git", ref: main}}}
"""


def files(tmp_path: Path, binary: str) -> list[str]:
    (tmp_path / "policy.yaml").write_text(POLICIES)
    (tmp_path / "objects.yaml").write_text(OBJECTS % {"provider": "p", "binary": binary})
    return ["-f", str(tmp_path / "policy.yaml"), "-f", str(tmp_path / "objects.yaml")]


def test_a_denied_object_is_reported_per_rule_with_exit_code_10(tmp_path: Path,
                                                                 joch_at: Callable[..., Result]) -> None:
    result = joch_at(NOWHERE, "policy", "test", *files(tmp_path, "/bin/sh"))
    assert result.code == 10, result.err
    assert result.out.splitlines() == [
        "AgentProvider shop/p",
        "  (no rule applies)",
        "Agent shop/coder",
        "  DENY             joch-system/binaries allow-list (admission): the provider's binary is not on the "
        "allow-list",
        "  ALLOW            joch-system/binaries labels (admission)",
        "AgentRun shop/fix",
        "  REQUIRE-APPROVAL shop/main-ref main-needs-approval (dispatch): runs on main need a human",
    ]
    assert "Traceback" not in result.err


def test_nothing_denied_exits_0_and_request_user_is_settable(tmp_path: Path, joch_at: Callable[..., Result]) -> None:
    result = joch_at(NOWHERE, "policy", "test", *files(tmp_path, "codex"), "--user", "release-bot")
    assert result.code == 0, result.err
    assert "  ALLOW            shop/main-ref main-needs-approval (dispatch)" in result.out.splitlines()


def test_a_rule_that_does_not_compile_is_exit_code_2_with_line_and_column(tmp_path: Path,
                                                                          joch_at: Callable[..., Result]) -> None:
    args = files(tmp_path, "codex")
    (tmp_path / "policy.yaml").write_text(POLICIES.replace('request.user != "release-bot"', "request.usr("))
    result = joch_at(NOWHERE, "policy", "test", *args)
    assert result.code == 2 and result.out == ""
    assert "spec.rules[0].expression: rule \"main-needs-approval\" does not compile: line 1, column" in result.err
    assert "Traceback" not in result.err


def test_without_a_policy_it_says_what_is_missing(tmp_path: Path, joch_at: Callable[..., Result]) -> None:
    (tmp_path / "objects.yaml").write_text(OBJECTS % {"provider": "p", "binary": "codex"})
    result = joch_at(NOWHERE, "policy", "test", "-f", str(tmp_path / "objects.yaml"))
    assert result.code == 2 and "no Policy in the files" in result.err


def test_the_readme_example_policy_works_as_written(tmp_path: Path, joch_at: Callable[..., Result]) -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme[readme.index("## Policies"):]
    example = section[section.index("```yaml\n") + len("```yaml\n"):]
    (tmp_path / "policy.yaml").write_text(example[:example.index("```")])
    (tmp_path / "objects.yaml").write_text(OBJECTS % {"provider": "p", "binary": "aider"})
    result = joch_at(NOWHERE, "policy", "test", "-f", str(tmp_path / "policy.yaml"), "-f",
                     str(tmp_path / "objects.yaml"))
    assert result.code == 10, result.err
    lines = result.out.splitlines()
    assert ("  DENY             joch-system/guardrails binary-allow-list (admission): agents may run codex or claude "
            "only") in lines
    assert ("  REQUIRE-APPROVAL joch-system/guardrails main-needs-approval (dispatch): runs on main need a second "
            "pair of eyes") in lines


def test_an_invalid_policy_says_nothing_was_tested_not_applied(tmp_path: Path,
                                                               joch_at: Callable[..., Result]) -> None:
    # `joch policy test -n shop` with a Policy in joch-system: the namespace clash is reported, but the
    # message said "nothing was applied", as if the test could have applied something.
    result = joch_at(NOWHERE, "policy", "test", *files(tmp_path, "codex"), "-n", "shop")
    assert result.code == 2 and result.out == ""
    assert "is invalid; nothing was tested" in result.err and "applied" not in result.err


def test_a_write_intent_is_tested_against_the_write_back_rules(tmp_path: Path,
                                                               joch_at: Callable[..., Result]) -> None:
    (tmp_path / "policy.yaml").write_text("""\
apiVersion: joch.dev/v1alpha1
kind: Policy
metadata: {name: reviewed, namespace: shop}
spec:
  selector: {kinds: [AgentRun]}
  rules:
  - name: prs-need-a-human
    phase: writeBack
    action: requireApproval
    expression: object.spec.type == "pullRequest" && run.spec.agentRef.name == "coder"
    message: a person opens every pull request
""")
    (tmp_path / "objects.yaml").write_text(OBJECTS % {"provider": "p", "binary": "codex"} + """\
---
apiVersion: runtime.joch.dev/v1alpha1
kind: WriteIntent
metadata: {name: fix-pr, namespace: shop}
spec:
  runRef: {name: fix}
  runUid: u1
  type: pullRequest
  target: {provider: github, sourceRef: {name: gh}, owner: acme, repo: shop}
""")
    result = joch_at(NOWHERE, "policy", "test", "-f", str(tmp_path / "policy.yaml"), "-f",
                     str(tmp_path / "objects.yaml"))
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[lines.index("WriteIntent shop/fix-pr") + 1:] == [
        "  REQUIRE-APPROVAL shop/reviewed prs-need-a-human (writeBack): a person opens every pull request"]
