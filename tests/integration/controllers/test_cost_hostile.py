"""Hostile usage reports through the run callback: numbers no model bills, sent with a valid run token."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from integration.controllers.test_cost import SLEEPER, Env, agent, make_env, provider, status

__all__ = ["make_env"]


@pytest.mark.parametrize("body", [
    '{"id": "1", "costUsd": Infinity}',
    '{"id": "1", "costUsd": NaN}',
    '{"id": "1", "costUsd": 1e308}',
    '{"id": "1", "inputTokens": 100000000000000000000000000000}',
    '{"id": "1", "outputTokens": 9223372036854775808}',
    '{"events": [{"id": "1", "costUsd": 1e308}, {"id": "2", "costUsd": 1e308}]}',
])
def test_absurd_usage_is_a_422_and_changes_nothing(make_env: Callable[..., Env], body: str) -> None:
    env = make_env()
    env.apply(provider("p", SLEEPER), agent("a", "p"))
    env.create_run("r", agent="a")
    env.wait_phase("r", "Running")
    response = env.http.post("/v1/namespaces/default/agentruns/r/callback", content=body,
                             headers={"Authorization": f"Bearer {env.token('r')}", "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["kind"] == "Status"
    assert status(env.run("r")).get("costUsd") is None
    assert env.callback("r", {"id": "ok", "costUsd": 0.5}, env.token("r")).status_code == 200
    assert status(env.run("r"))["costUsd"] == pytest.approx(0.5)


def test_token_counts_that_would_overflow_the_sums_are_refused(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", SLEEPER), agent("a", "p"))
    env.create_run("r", agent="a")
    env.wait_phase("r", "Running")
    big = 2**62
    events = [{"id": str(i), "inputTokens": big, "outputTokens": big, "costUsd": 0} for i in range(4)]
    response = env.callback("r", {"events": events}, env.token("r"))
    assert response.status_code == 422, response.text
    assert "events[0].inputTokens" in response.text
    assert env.http.get("/v1/cost").status_code == 200  # was a 500 (SQLite integer overflow) for everyone
    assert status(env.run("r")).get("usage") is None
    assert env.http.get("/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns/r").status_code == 200
