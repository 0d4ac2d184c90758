"""``--max-log-bytes`` and ``--max-artifact-bytes``: bytes or Kubernetes-style quantities."""

from __future__ import annotations

from pathlib import Path

import pytest

from joch.api import errors
from joch.cli import serving


@pytest.mark.parametrize(("text", "size"), [
    ("1048576", 1 << 20), ("64Mi", 64 << 20), ("1Gi", 1 << 30), ("2Ki", 2048), ("500M", 500_000_000),
    ("1k", 1000), (" 3Ti ", 3 << 40), ("0", None), ("0Mi", None),
])
def test_sizes(text: str, size: int | None) -> None:
    assert serving.parse_size("--max-artifact-bytes", text) == size


@pytest.mark.parametrize("text", ["", "-1", "1.5Gi", "64MB", "Mi", "lots"])
def test_not_sizes(text: str) -> None:
    with pytest.raises(errors.BadRequest, match=r"^--max-log-bytes must be a number of bytes"):
        serving.parse_size("--max-log-bytes", text)


def test_the_limits_reach_the_controller_options() -> None:
    options = serving.controller_options(data_dir=Path("d"), max_concurrent_runs=1,
                                         max_concurrent_runs_per_namespace=None, lease_duration=15, identity=None,
                                         max_log_bytes="1Mi", max_artifact_bytes="0")
    assert (options.max_log_bytes, options.max_artifact_bytes) == (1 << 20, None)
    defaults = serving.controller_options(data_dir=Path("d"), max_concurrent_runs=1,
                                          max_concurrent_runs_per_namespace=None, lease_duration=15, identity=None)
    assert (defaults.max_log_bytes, defaults.max_artifact_bytes) == (64 << 20, 1 << 30)
