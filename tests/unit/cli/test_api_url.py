"""``--api-url`` (joch server, joch controller): the URL agents report usage to."""

from __future__ import annotations

from pathlib import Path

import pytest

from joch.api import errors
from joch.cli.serving import controller_options


def options(api_url: str | None) -> str | None:
    return controller_options(data_dir=Path(".joch"), max_concurrent_runs=1, max_concurrent_runs_per_namespace=None,
                              lease_duration=15.0, identity=None, api_url=api_url).api_url


def test_an_api_url_is_kept_without_its_trailing_slash() -> None:
    assert options("http://joch.internal:8080/") == "http://joch.internal:8080"
    assert options(None) is None


def test_an_api_url_must_be_http() -> None:
    with pytest.raises(errors.BadRequest, match="--api-url must be an http:// or https:// URL"):
        options("joch.internal:8080")
