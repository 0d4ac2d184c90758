"""The agents, budgets, sources and audit pages over real data: an agent whose run reported $0.80 of
tokens (priced by a Model) shows its success rate and spend, the day's Budget its spend as a bar,
a TriggerRule fired twice its Dispatched and Deduplicated executions, and the audit log what the
admin did, filtered."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from e2e.console.conftest import Console, sign_in
from e2e.console.test_console_governance import eventually
from e2e.test_cost import AGENT as SPENDER  # reports 40k input and 75k output tokens of gpt-test

RUNS = "/apis/runtime.joch.dev/v1alpha1/namespaces/default/agentruns"


def manifests(console: Console) -> list[dict[str, Any]]:
    execution = {"coordinates": {"git": {"url": str(console.repo)}}}
    return [
        {"apiVersion": "model.joch.dev/v1alpha1", "kind": "Model", "metadata": {"name": "gpt-test"},
         "spec": {"provider": "openai", "modelId": "gpt-test-2026",
                  "pricing": {"inputPerMillionUsd": 5.0, "outputPerMillionUsd": 8.0}}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": "python"},
         "spec": {"binary": sys.executable, "argsTemplate": ["-c", SPENDER]}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "spender"},
         "spec": {"providerRef": {"name": "python"}, "modelRoute": "gpt-test", "description": "reports tokens"}},
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Budget", "metadata": {"name": "daily"},
         "spec": {"period": "day", "limitUsd": 2, "onExceed": "deny"}},
        {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Budget", "metadata": {"name": "spender-monthly"},
         "spec": {"period": "month", "limitUsd": 50, "scope": {"agent": "spender"}}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": "acme-web"},
         "spec": {"provider": "github", "suspend": True, "pollIntervalSeconds": 0,
                  "github": {"owner": "acme", "repo": "web",
                             "auth": {"tokenSecretRef": {"name": "github", "key": "token"}}}}},
        {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": "readme-fixer"},
         "spec": {"run": {"agentRef": {"name": "demo"}, "execution": execution,
                          "implementation": {"inline": {"text": "Add a greeting to the README"}}}}},
    ]


@pytest.fixture(scope="module")
def data(console: Console) -> Console:
    """The objects above, a run of the spender that ended Succeeded having spent $0.80, and the rule
    fired twice with one key (Dispatched, then Deduplicated)."""
    r = console.apply(*manifests(console))
    assert r.status_code == 200, r.text
    with console.api() as client:
        run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "spend-once"},
               "spec": {"agentRef": {"name": "spender"}, "implementation": {"inline": {"text": "spend"}}}}
        assert client.post(RUNS, json=run).status_code == 201

        def ended() -> dict[str, Any] | None:
            status: dict[str, Any] = client.get(f"{RUNS}/spend-once").json().get("status") or {}
            return status if status.get("phase") in ("Succeeded", "Failed") else None

        status = eventually(ended, "the spender's run to end")
        assert (status["phase"], status.get("costUsd")) == ("Succeeded", 0.8), (status, console.log.read_text())
        for _ in range(2):
            fired = client.post("/v1/namespaces/default/triggerrules/readme-fixer/fire", json={"key": "readme-1"})
            assert fired.status_code in (200, 201), fired.text

        def counted() -> bool:
            budget = client.get("/apis/ops.joch.dev/v1alpha1/namespaces/default/budgets/daily").json()
            return bool((budget.get("status") or {}).get("spendUsd"))

        eventually(counted, "the daily Budget to count the spend")
    return console


def test_the_agents_page_shows_readiness_success_rate_and_spend(data: Console, page: Any) -> None:
    sign_in(page, data, "viewer")
    page.goto(f"{data.base}/console/#/agents")
    row = page.locator("tr", has_text="spender")
    row.locator("text=100%").wait_for()
    cells = row.inner_text()
    assert "Ready" in cells and "python" in cells and "$0.80" in cells
    row.click()
    page.wait_for_url("**/#/agents/default/spender")
    page.locator("h1", has_text="Agent spender").wait_for()
    facts = page.locator("dl.facts").inner_text()
    assert "reports tokens" in facts and "100%" in facts and "$0.80" in facts
    assert "AgentProvider python" in page.locator(".gov-refs").inner_text()
    assert "Model route gpt-test" in page.locator(".gov-refs").inner_text()
    run = page.locator("tr", has_text="spend-once")
    assert "Succeeded" in run.inner_text() and "$0.80" in run.inner_text()


def test_the_budgets_page_shows_spend_against_the_limit_per_period(data: Console, page: Any) -> None:
    sign_in(page, data, "viewer")
    page.goto(f"{data.base}/console/#/budgets")
    daily = page.locator("[data-budget=daily]")
    daily.wait_for()
    assert "$0.80 of $2.00" in daily.inner_text() and "40% used" in daily.inner_text()
    meter = daily.get_by_role("meter")
    assert (meter.get_attribute("aria-valuenow"), meter.get_attribute("aria-valuemax")) == ("0.8", "2")
    assert page.locator("section[aria-label='Daily budgets']").count() == 1
    monthly = page.locator("section[aria-label='Monthly budgets'] [data-budget=spender-monthly]")
    assert "agent spender" in monthly.inner_text() and "$0.80 of $50.00" in monthly.inner_text()


def test_the_sources_page_shows_sources_rules_and_their_executions(data: Console, page: Any) -> None:
    sign_in(page, data, "admin")
    page.goto(f"{data.base}/console/#/sources")
    source = page.locator("tr", has_text="acme-web")
    source.wait_for()
    assert "github acme/web" in source.inner_text() and "Suspended" in source.inner_text()
    rule = page.locator("[data-rule=readme-fixer]")
    rule.locator("text=Deduplicated").wait_for()
    text = rule.inner_text()
    assert "manual (joch trigger fire) → runs agent demo" in text
    assert "Dispatched" in text and "manual" in text and "by admin" in text
    # the dispatched execution links to its run
    link = rule.locator("tr", has_text="Dispatched").locator("a[href^='#/runs/default/']")
    assert link.count() == 1


def test_the_audit_page_filters_by_user_verb_and_resource(data: Console, page: Any) -> None:
    sign_in(page, data, "admin")
    page.goto(f"{data.base}/console/#/audit")
    page.locator("table").wait_for()
    page.get_by_label("User").fill("admin")
    page.get_by_label("Resource").fill("budgets")
    page.get_by_label("Decision").select_option("denied")
    page.get_by_role("button", name="Filter").click()
    page.locator("text=No audit events match.").wait_for()
    page.get_by_label("Decision").select_option("")
    page.get_by_label("Verb").fill("apply")
    page.get_by_role("button", name="Filter").click()
    page.locator("tr", has_text="Budget/daily").wait_for()
    texts = page.locator("tbody tr").all_inner_texts()
    assert len(texts) == 2 and any("Budget/spender-monthly" in t for t in texts)
    for text in texts:
        assert "admin" in text and "apply" in text and "allowed" in text
