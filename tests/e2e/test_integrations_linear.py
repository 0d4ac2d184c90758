"""Issue 10's Linear line of "Done when", end to end: an issue of the fake Linear
(``support.fake_linear``) labelled ``joch:demo`` reaches a real ``joch server`` by a signed webhook,
becomes ``lin-<identifier>``, a run of the demo agent against a real bare repository, and exactly one
comment in the fake Linear that ends up showing Succeeded and the cost; the delivery replayed changes
nothing; a bad signature is a 401 and creates nothing; and with ``pullRequest.sourceRef`` naming a
GitHub source, the run's pull request opens in the fake GitHub and its link is attached to the Linear
issue. The servers and helpers are tests/e2e/test_integrations.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.test_integrations import (
    FULL,
    LABEL,
    SECRET_VALUES,
    Stack,
    assert_shows_cost,
    dispatched,
    git,
    github_source,
    issue_body,
    label_rule,
    settle,
    stack,
)
from support.fake_linear import FakeLinear


@pytest.fixture
def s(tmp_path: Path) -> Iterator[Stack]:
    with stack(tmp_path) as running:
        yield running


@pytest.fixture
def linear() -> Iterator[FakeLinear]:
    with FakeLinear(api_key=SECRET_VALUES["linear-key"], team_key="ENG") as fake:
        yield fake


def linear_source(linear: FakeLinear, *, poll: int = 0) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": "eng"},
            "spec": {"provider": "linear", "pollIntervalSeconds": poll,
                     "linear": {"teamKey": "ENG", "apiUrl": linear.url,
                                "auth": {"apiKeySecretRef": {"name": "trackers", "key": "linear-key"}}},
                     "webhook": {"secretRef": {"name": "trackers", "key": "linear-webhook"}}}}


def test_a_linear_issue_labelled_by_webhook_becomes_a_run_and_one_comment_in_linear(
    s: Stack, linear: FakeLinear,
) -> None:
    issue = linear.create_issue("Greet from Linear", issue_body(6))
    identifier = issue["identifier"]
    execution = {"coordinates": {"git": {"url": str(s.bare), "ref": "main"}}}  # Linear issues name no repository
    rule = label_rule("linear-demo", source="eng", writeBack={"comment": {}, "pullRequest": {"enabled": False}},
                      run={"agentRef": {"name": "demo"}, "execution": execution})
    s.apply_synced(linear_source(linear), rule, source="eng")
    assert s.runs() == []  # not labelled yet; polling off: from now on, webhooks only
    _, updated_from = linear.update_issue(identifier, add_labels=[LABEL])
    delivery = linear.issue_webhook(identifier, "update", secret=SECRET_VALUES["linear-webhook"].encode(),
                                    updated_from=updated_from)
    r = s.post("/v1/webhooks/linear", delivery)
    assert r.status_code in (200, 202), r.text

    spec_name = f"lin-{identifier.lower()}"
    s.wait("the synced spec", lambda: any(x["metadata"]["name"] == spec_name for x in s.specs()))
    run = s.the_one_run()
    assert s.run(run)["spec"]["implementationRef"]["name"] == spec_name
    [execution] = dispatched(s)
    assert execution["spec"]["event"]["item"] == f"linear:{identifier}", execution
    assert s.wait_run_ended(run)["phase"] == "Succeeded", s.tail()

    def final_comment() -> dict[str, Any] | None:
        shown = linear.comments(identifier)
        assert len(shown) <= 1, shown
        return shown[0] if shown and "Succeeded" in shown[0]["body"] else None

    comment = s.wait("the Linear comment to show Succeeded", final_comment)
    assert_shows_cost(s, run, comment["body"])
    assert (s.run(run).get("status") or {}).get("writeBack", {}).get("commentUrl") == comment["url"]

    again = s.post("/v1/webhooks/linear", delivery)
    assert again.status_code == 200 and again.json().get("duplicate") is True, again.text
    settle(s)
    assert len(s.runs()) == 1 and len(linear.comments(identifier)) == 1 and len(dispatched(s)) == 1
    assert len(s.deliveries()) == 1
    assert git(s.bare, "for-each-ref", "refs/heads/").count("refs/heads/") == 1  # only main: no pull request asked


def test_a_linear_delivery_with_a_bad_signature_is_a_401_and_nothing_is_created(
    s: Stack, linear: FakeLinear,
) -> None:
    s.apply_synced(linear_source(linear), label_rule("linear-demo", source="eng", writeBack={"comment": {}}),
                   source="eng")
    issue = linear.create_issue("Forged in Linear", issue_body(9), labels=[LABEL])
    forged = linear.issue_webhook(issue["identifier"], "create", secret=b"not-the-secret")
    r = s.post("/v1/webhooks/linear", forged)
    assert r.status_code == 401 and r.json()["reason"] == "Unauthorized", r.text
    settle(s, 1)
    assert (s.deliveries(), s.specs(), s.executions(), s.runs()) == ([], [], [], [])
    assert linear.comments(issue["identifier"]) == []


def test_a_linear_issue_gets_a_pull_request_in_github_and_its_link_attached(s: Stack, linear: FakeLinear) -> None:
    """The pull request is opened with the GitHub source's credentials (``pullRequest.sourceRef``), and
    Linear gets the link as an attachment and in the comment; still one of each."""
    execution = {"coordinates": {"git": {"url": str(s.bare), "ref": "main"}}}
    rule = label_rule("linear-pr", source="eng", writeBack={"comment": {}, "pullRequest": {"sourceRef": "web"}},
                      run={"agentRef": {"name": "demo"}, "execution": execution})
    s.apply_synced(github_source(s))
    s.apply_synced(linear_source(linear), rule, source="eng")
    issue = linear.create_issue("Greet from Linear with a PR", issue_body(10))
    identifier = issue["identifier"]
    _, updated_from = linear.update_issue(identifier, add_labels=[LABEL])
    r = s.post("/v1/webhooks/linear", linear.issue_webhook(
        identifier, "update", secret=SECRET_VALUES["linear-webhook"].encode(), updated_from=updated_from))
    assert r.status_code in (200, 202), r.text
    run = s.the_one_run()
    assert s.wait_run_ended(run)["phase"] == "Succeeded", s.tail()

    [pr] = s.wait("the pull request", lambda: s.github.pulls(FULL))
    assert pr["head"]["ref"] == f"joch/{run}" and pr["base"]["ref"] == "main", pr
    assert git(s.bare, "show", f"joch/{run}:README.md") == "# web\nHello from issue 10\n"
    [attachment] = s.wait("the link attached in Linear", lambda: linear.attachments(identifier))
    assert attachment["url"] == pr["html_url"], attachment

    def final_comment() -> dict[str, Any] | None:
        shown = linear.comments(identifier)
        assert len(shown) <= 1, shown
        return shown[0] if shown and "Succeeded" in shown[0]["body"] and pr["html_url"] in shown[0]["body"] else None

    comment = s.wait("the Linear comment to show Succeeded and the pull request", final_comment)
    assert_shows_cost(s, run, comment["body"])
    settle(s)
    assert len(s.github.pulls(FULL)) == 1 and len(linear.attachments(identifier)) == 1
    assert len(linear.comments(identifier)) == 1 and len(s.runs()) == 1
    assert (s.run(run).get("status") or {}).get("writeBack", {}).get("pullRequest", {}).get("url") == pr["html_url"]
