"""Admission of the cost kinds: Model prices, Budget fields, an Agent's modelRoute (a reference that
warns when the Model is missing) and a run's budgetUsd, against the real store."""

from __future__ import annotations

import json
from typing import Any

import pytest

from joch.admission.apply import apply_documents
from joch.admission.documents import load_documents
from joch.api import errors
from joch.store import Store


def apply(store: Store, *objs: dict[str, Any]) -> list[str]:
    result = apply_documents(store, load_documents("\n---\n".join(json.dumps(o) for o in objs)), dry_run=False)
    return result.warnings()


def fields(exc: errors.Invalid) -> list[str]:
    """The field paths of the causes, without the "documents[i] (Kind/name in file)." prefix."""
    return sorted(c.field.split(").", 1)[-1] for c in exc.causes)


def model(**pricing: Any) -> dict[str, Any]:
    return {"apiVersion": "model.joch.dev/v1alpha1", "kind": "Model", "metadata": {"name": "m"},
            "spec": {"provider": "anthropic", "modelId": "claude-x", "pricing": pricing}}


def agent(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
            "spec": {"providerRef": {"name": "p"}, **spec}}


def test_a_model_needs_non_negative_prices(store: Store) -> None:
    with pytest.raises(errors.Invalid) as caught:
        apply(store, model(inputPerMillionUsd=-1, outputPerMillionUsd=15))
    assert fields(caught.value) == ["spec.pricing.inputPerMillionUsd"]
    with pytest.raises(errors.Invalid) as caught:
        apply(store, model(inputPerMillionUsd=3))
    assert fields(caught.value) == ["spec.pricing.outputPerMillionUsd"]
    apply(store, model(inputPerMillionUsd=3, outputPerMillionUsd=15, cachedInputPerMillionUsd=0.3))


def test_an_agents_model_route_names_a_model_and_warns_when_it_is_missing(store: Store) -> None:
    warnings = apply(store, agent(modelRoute="m"))
    assert any('spec.modelRoute: model "m" not found' in w for w in warnings), warnings
    assert not any("modelRoute" in w for w in apply(store, model(inputPerMillionUsd=3, outputPerMillionUsd=15),
                                                    agent(modelRoute="m", description="again")))


def test_budget_and_run_budget_fields_are_checked(store: Store) -> None:
    budget = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Budget", "metadata": {"name": "b"},
              "spec": {"period": "fortnight", "limitUsd": -5, "onExceed": "panic", "scope": {"teem": "x"}}}
    with pytest.raises(errors.Invalid) as caught:
        apply(store, budget)
    assert fields(caught.value) == ["spec.limitUsd", "spec.onExceed", "spec.period", "spec.scope.teem"]
    run = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r"},
           "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}}, "budgetUsd": -1}}
    with pytest.raises(errors.Invalid) as caught:
        apply(store, agent(), run)
    assert fields(caught.value) == ["spec.budgetUsd"]


def test_the_cost_examples_apply_as_they_are(store: Store) -> None:
    from pathlib import Path

    from joch.admission.documents import load_paths

    examples = Path(__file__).resolve().parents[2] / "examples" / "cost"
    result = apply_documents(store, load_paths([str(examples)]), dry_run=False)
    assert sorted(item.name or "" for item in result.items) == ["claude-sonnet", "daily", "demo-monthly",
                                                                "gemini-2.5-pro", "gpt-4.1", "gpt-5-codex"]
