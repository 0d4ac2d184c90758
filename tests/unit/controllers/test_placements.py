"""Where an attempt runs (``controllers.placements``): the run's choice over its provider's over its
Agent's, and a service account only by the Agent's leave."""

from __future__ import annotations

from typing import Any

import pytest

from joch.controllers.placements import PlacementProblem, placement_of


def manifest(**agent: Any) -> dict[str, Any]:
    return {"spec": {"provider": {"workload": {"image": "provider:1", "resources": {"cpu": "1"}}}, **agent}}


def test_the_run_wins_over_the_provider_which_wins_over_the_agent() -> None:
    agent = manifest(runtime={"type": "kubernetes", "config": {"image": "config:1"}}, resources={"memory": "1Gi"})
    assert placement_of({"spec": {}}, agent).image == "provider:1"
    assert placement_of({"spec": {}}, agent).resources == {"cpu": "1"}
    run = {"spec": {"workload": {"image": "run:1", "resources": {"memory": "2Gi", "ephemeralStorage": "5Gi"}},
                    "runtime": {"type": "local"}}}
    chosen = placement_of(run, agent)
    assert (chosen.type, chosen.image) == ("local", "run:1")
    assert chosen.resources == {"memory": "2Gi", "ephemeral-storage": "5Gi"}
    bare = {"spec": {"runtime": {"type": "kubernetes", "config": {"image": "config:1"}}, "resources": {"cpu": 2}}}
    assert placement_of({"spec": {}}, bare).image == "config:1"
    assert placement_of({"spec": {}}, bare).resources == {"cpu": "2"}
    assert placement_of({"spec": {}}, {"spec": {}}).type == "local"


def test_a_service_account_must_be_one_the_agent_allows() -> None:
    allowed = manifest(runtime={"type": "kubernetes", "config": {"serviceAccountName": "builder"}},
                       security={"allowedServiceAccounts": ["builder"]})
    assert placement_of({"spec": {}}, allowed).service_account == "builder"
    run = {"spec": {"runtime": {"type": "kubernetes", "config": {"serviceAccountName": "cluster-admin"}}}}
    with pytest.raises(PlacementProblem, match="cluster-admin") as caught:
        placement_of(run, allowed)
    assert caught.value.reason == "ServiceAccountNotAllowed"
    assert "allowedServiceAccounts (builder)" in caught.value.message
