"""``joch get`` prints the server's columns: a kind the CLI's own registry has never heard of (a
newer server) still prints its declared columns, wide columns and namespaces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from joch.api import REGISTRY, errors
from joch.api.meta import Model, Str
from joch.api.registry import Column, KindInfo, Registry
from joch.cli.main import app
from joch.server.app import create_app
from joch.server.testing import ServerThread
from joch.store import Store, open_store


class GadgetSpec(Model):
    color: Str
    size: int | None = None


class GadgetStatus(Model):
    pass


GADGET = KindInfo(
    group="example.joch.dev", version="v1", kind="Gadget", plural="gadgets", short_names=("gd",),
    spec_model=GadgetSpec, status_model=GadgetStatus,
    columns=(Column("COLOR", "spec.color"), Column("SIZE", "spec.size", wide=True, type="integer"),
             Column("AGE", "metadata.creationTimestamp")),
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'joch.db'}")
    yield s
    s.close()


@pytest.fixture
def newer_server(store: Store) -> Iterator[str]:
    """A server whose registry has one kind more than the CLI's."""
    registry = Registry()
    for info in REGISTRY:
        registry.register(info)
    registry.register(GADGET)
    with ServerThread(create_app(store, registry=registry)) as thread:
        yield thread.url


def gadget(store: Store, name: str, namespace: str, **spec: Any) -> None:
    store.create(GADGET, {"apiVersion": "example.joch.dev/v1", "kind": "Gadget",
                          "metadata": {"name": name, "namespace": namespace},
                          "spec": spec})


def joch(url: str, *args: str) -> list[list[str]]:
    result = CliRunner().invoke(app, list(args), env={"JOCH_SERVER": url, "JOCH_NAMESPACE": None})
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return [line.split() for line in result.stdout.splitlines() if line.strip()]


def test_a_kind_the_cli_does_not_know_prints_the_columns_the_server_declares(
    store: Store, newer_server: str
) -> None:
    with pytest.raises(errors.NotFound, match="gadgets"):
        REGISTRY.resolve("gadgets")  # the premise: the CLI's registry has no such kind
    gadget(store, "sprocket", "default", color="red", size=3)
    gadget(store, "widget", "default", color="blue")
    gadget(store, "far-away", "team-b", color="green", size=1)

    rows = joch(newer_server, "get", "gadgets")
    assert rows[0] == ["NAME", "COLOR", "AGE"]
    assert [r[:2] for r in rows[1:]] == [["sprocket", "red"], ["widget", "blue"]]
    assert all(r[2].endswith("s") for r in rows[1:])  # just created: seconds old

    wide = joch(newer_server, "get", "gd", "-o", "wide")
    assert wide[0] == ["NAME", "COLOR", "SIZE", "AGE"]
    assert [r[:3] for r in wide[1:]] == [["sprocket", "red", "3"], ["widget", "blue", "<none>"]]

    everywhere = joch(newer_server, "get", "gadgets", "-A")
    assert everywhere[0] == ["NAMESPACE", "NAME", "COLOR", "AGE"]
    assert [r[:3] for r in everywhere[1:]] == [
        ["default", "sprocket", "red"], ["default", "widget", "blue"], ["team-b", "far-away", "green"]]

    one = joch(newer_server, "get", "gadget", "sprocket")
    assert one[0] == ["NAME", "COLOR", "AGE"] and one[1][:2] == ["sprocket", "red"]

    several = joch(newer_server, "get", "gadgets,ap")
    assert several[0] == ["NAME", "COLOR", "AGE"] and several[1][:2] == ["gadget.example.joch.dev/sprocket", "red"]
