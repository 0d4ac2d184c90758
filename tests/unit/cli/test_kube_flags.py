"""``joch server --kube-*`` (``cli.serving.kube_settings``, ``kube_hosts``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from joch.api import errors
from joch.cli import serving
from joch.runtime.kubernetes.settings import DEFAULT_IMAGE


def settings(**given: object) -> object:
    flags: dict[str, object] = {"kubeconfig": None, "in_cluster": False, "context": None, "namespace": None,
                                "image": None, "api_url": None, "service_account": None}
    return serving.kube_settings(**{**flags, **given})  # type: ignore[arg-type]


def test_without_a_config_there_is_no_kubernetes_runtime() -> None:
    assert settings() is None


def test_the_flags_become_the_runtimes_settings(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("{}")
    made = serving.kube_settings(kubeconfig=config, in_cluster=False, context="c", namespace="agents", image=None,
                                 api_url="http://joch.joch-system.svc:8080/", service_account="runner")
    assert made is not None
    assert (made.kubeconfig, made.context, made.namespace, made.image) == (config, "c", "agents", DEFAULT_IMAGE)
    assert made.api_url == "http://joch.joch-system.svc:8080" and made.service_account == "runner"
    # Run Pods send the Service's name in Host: the server accepts it without --allowed-host.
    assert serving.kube_hosts(made) == ("joch.joch-system.svc",)
    assert serving.kube_hosts(None) == ()


def test_a_bad_api_url_names_the_flag() -> None:
    with pytest.raises(errors.BadRequest, match="--kube-api-url must be an http"):
        settings(in_cluster=True, api_url="joch:8080")
