"""Which issue a run writes back to, and whose ``writeBack`` settings win."""

from __future__ import annotations

from typing import Any

from joch.api.integrations import EXECUTION_ANNOTATION, RULE_LABEL, SOURCE_ITEM, SOURCE_LABEL
from joch.api.kinds import CREATED_BY
from joch.controllers.writeback import merged_write_back, origin_of
from joch.controllers.writeintents import content_hash
from joch.store.base import Obj


class Cache:
    def __init__(self, *objs: Obj) -> None:
        self.objs = {(o["metadata"].get("namespace", "default"), o["metadata"]["name"]): o for o in objs}

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.objs.get((namespace, name))


def run(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        spec: str | None = None) -> Obj:
    body: dict[str, Any] = {"agentRef": {"name": "a"}}
    body.update({"implementationRef": {"name": spec}} if spec else {"implementation": {"inline": {"text": "x"}}})
    return {"metadata": {"name": "r", "namespace": "default", "uid": "u1", "labels": labels or {},
                         "annotations": annotations or {}}, "spec": body}


SYNCED = {"metadata": {"name": "gh-acme-web-12", "namespace": "default", "labels": {SOURCE_LABEL: "gh"}},
          "spec": {"text": "t", "summary": "Fix it",
                   "source": {"provider": "github", "externalId": "acme/web#12",
                              "url": "https://ghe.example/acme/web/issues/12"}}}
RULE = {"metadata": {"name": "on-label", "namespace": "default"}, "spec": {"sourceRef": {"name": "gh2"}}}


def test_a_synced_spec_names_the_issue_and_its_source() -> None:
    origin = origin_of(run(spec="gh-acme-web-12"), Cache(), Cache(SYNCED))
    assert origin is not None
    assert (origin.source, origin.item, origin.url, origin.title) == (
        "gh", "github:acme/web#12", "https://ghe.example/acme/web/issues/12", "Fix it")
    assert origin.target == {"provider": "github", "sourceRef": {"name": "gh"}, "owner": "acme", "repo": "web",
                             "number": 12}


TRIGGERED = {CREATED_BY: "system:joch:trigger:default:on-label", EXECUTION_ANNOTATION: "r", SOURCE_ITEM: "linear:ENG-7"}
EXECUTION = {"metadata": {"name": "r", "namespace": "default"},
             "spec": {"ruleRef": {"name": "on-label"}, "decision": "Dispatched", "runRef": {"name": "r"},
                      "event": {"kind": "issue", "item": "linear:ENG-7"}}}


def test_a_triggered_run_takes_its_rules_source_and_item() -> None:
    triggered = run(labels={RULE_LABEL: "on-label"}, annotations=TRIGGERED)
    origin = origin_of(triggered, Cache(RULE), Cache(), Cache(EXECUTION))
    assert origin is not None and origin.rule == "on-label" and origin.source == "gh2"
    assert origin.target == {"provider": "linear", "sourceRef": {"name": "gh2"}, "issueId": "ENG-7",
                             "identifier": "ENG-7"}


def test_a_run_from_nowhere_writes_nothing() -> None:
    assert origin_of(run(), Cache(RULE), Cache(SYNCED)) is None
    unsynced = {**SYNCED, "metadata": {**SYNCED["metadata"], "labels": {}}}
    assert origin_of(run(spec="gh-acme-web-12"), Cache(), Cache(unsynced)) is None
    # a scheduled rule has no source: its runs have no issue to write to
    scheduled = {"metadata": {"name": "nightly", "namespace": "default"}, "spec": {}}
    assert origin_of(run(labels={RULE_LABEL: "nightly"}), Cache(scheduled), Cache()) is None


def test_the_rules_write_back_wins_section_by_section() -> None:
    agent = {"comment": {"enabled": True, "template": "agent's"}, "pullRequest": {"branchPrefix": "bot"},
             "requireApproval": True, "maxAttempts": 3}
    rule = {"comment": {"enabled": True, "template": "rule's"}, "requireApproval": False, "maxAttempts": 5}
    merged = merged_write_back(rule, agent)
    assert merged is not None and merged.comment is not None and merged.pullRequest is not None
    assert merged.comment.template == "rule's" and merged.pullRequest.branchPrefix == "bot"
    assert merged.requireApproval is True and merged.maxAttempts == 5  # either asking is enough
    assert merged_write_back(None, None) is None
    only_rule = merged_write_back({"pullRequest": {}}, None)
    assert only_rule is not None and only_rule.comment is None and only_rule.pullRequest is not None


def test_a_comment_is_sent_again_only_when_its_body_changes() -> None:
    spec = {"type": "comment", "body": "a", "target": {"provider": "github"}}
    assert content_hash(spec) == content_hash({**spec, "target": {"provider": "linear"}})
    assert content_hash(spec) != content_hash({**spec, "body": "b"})


def test_trigger_labels_and_annotations_a_user_wrote_are_not_trusted() -> None:
    """A user who may only create AgentRuns must not point Joch's write-back (with the source's
    token) at any issue by writing the trigger's label and annotations by hand."""
    forged = {**TRIGGERED, SOURCE_ITEM: "github:victim/secret#1"}
    # made by hand (admission records the user as creator): neither the rule nor the item counts
    by_hand = run(labels={RULE_LABEL: "on-label"}, annotations={**forged, CREATED_BY: "alice"})
    assert origin_of(by_hand, Cache(RULE), Cache(), Cache(EXECUTION)) is None
    # no TriggerExecution dispatched this run
    assert origin_of(run(labels={RULE_LABEL: "on-label"}, annotations=forged), Cache(RULE), Cache(), Cache()) is None
    rejected = {**EXECUTION, "spec": {**EXECUTION["spec"], "decision": "Rejected"}}
    assert origin_of(run(labels={RULE_LABEL: "on-label"}, annotations=forged), Cache(RULE), Cache(),
                     Cache(rejected)) is None
    # a triggered run whose item annotation was edited afterwards: the execution's item wins
    origin = origin_of(run(labels={RULE_LABEL: "on-label"}, annotations=forged), Cache(RULE), Cache(),
                       Cache(EXECUTION))
    assert origin is not None and origin.item == "linear:ENG-7"
    # a hand-made run on a synced spec writes to that spec's issue, whatever its annotation says
    origin = origin_of(run(spec="gh-acme-web-12", labels={RULE_LABEL: "on-label"},
                           annotations={SOURCE_ITEM: "github:victim/secret#1", CREATED_BY: "alice"}),
                       Cache(RULE), Cache(SYNCED), Cache(EXECUTION))
    assert origin is not None and origin.item == "github:acme/web#12" and origin.source == "gh"
    assert origin.target["owner"] == "acme" and origin.rule is None
