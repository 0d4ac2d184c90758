"""Fixtures of the chart tests: ``charts/agents`` loaded with the Helm SDK (``helm_python``: Helm's
Go library embedded, no ``helm`` binary, no cluster) and rendered offline.

``render(values)`` returns the manifests as dicts; Helm's own errors (a value ``values.schema.json``
rejects, a ``fail`` in a template) propagate as ``helm_python.HelmError``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import helm_python as helm
import pytest

from support.helmchart import CHART, NAMESPACE, RELEASE, manifests

Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart: helm.Chart) -> Render:
    def render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        return manifests(chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True))

    return render
