"""``joch crds``: CustomResourceDefinitions that the Kubernetes schemas accept, that are structural,
that say what the registry says, and that match the files committed in ``charts/agents/crds``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from joch.api import REGISTRY
from joch.api.openapi import field
from joch.cli import crds
from joch.cli.main import app
from support.schemas import structural_problems

CHART_CRDS = Path(__file__).parents[3] / "charts" / "agents" / "crds"
REFRESH = "refresh them with `.venv/bin/joch crds --output-dir charts/agents/crds` and commit the result"
KUBERNETES_VERSIONS = ("1.32", "1.37")


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


@pytest.fixture(scope="module")
def printed() -> list[dict[str, Any]]:
    result = invoke("crds")
    assert result.exit_code == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_the_committed_crds_are_up_to_date(tmp_path: Path) -> None:
    expected = {path.name: path.read_text() for path in crds.write(tmp_path, REGISTRY)}
    committed = {path.name: path.read_text() for path in CHART_CRDS.glob("*.yaml")}
    missing, extra = sorted(set(expected) - set(committed)), sorted(set(committed) - set(expected))
    changed = sorted(name for name in set(expected) & set(committed) if expected[name] != committed[name])
    assert not (missing or extra or changed), (
        f"charts/agents/crds is stale (missing {missing}, not generated any more {extra}, changed {changed}): "
        f"{REFRESH}")


def test_one_crd_per_kind_outside_the_core_group(printed: list[dict[str, Any]]) -> None:
    assert [d["metadata"]["name"] for d in printed] == sorted(i.resource for i in REGISTRY if i.group)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_crd_validates_against_the_kubernetes_schemas(printed: list[dict[str, Any]], version: str) -> None:
    for definition in printed:
        kubernetes_validate.validate(definition, version, strict=True)


def test_every_crd_schema_is_structural(printed: list[dict[str, Any]]) -> None:
    for definition in printed:
        for version in definition["spec"]["versions"]:
            problems = structural_problems(version["schema"]["openAPIV3Schema"])
            assert problems == [], definition["metadata"]["name"]


def _by_name(printed: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d for d in printed if d["metadata"]["name"] == name)


def test_a_crd_says_what_the_registry_says(printed: list[dict[str, Any]]) -> None:
    agents = _by_name(printed, "agents.joch.dev")["spec"]
    assert agents["group"] == "joch.dev" and agents["scope"] == "Namespaced"
    assert agents["names"] == {"kind": "Agent", "listKind": "AgentList", "plural": "agents", "singular": "agent",
                               "shortNames": ["ag"], "categories": ["all"]}
    [version] = agents["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    assert version["additionalPrinterColumns"] == [
        {"name": "PROVIDER", "type": "string", "jsonPath": ".spec.providerRef.name"},
        {"name": "READY", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "RUNTIME", "type": "string", "jsonPath": ".spec.runtime.type", "priority": 1},
        {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    assert _by_name(printed, "teams.ops.joch.dev")["spec"]["scope"] == "Cluster"
    bindings = _by_name(printed, "rolebindings.ops.joch.dev")["spec"]
    assert "subresources" not in bindings["versions"][0]  # no status model, no status subresource
    assert "categories" not in bindings["names"]  # not in "all", as on the server
    runs = _by_name(printed, "agentruns.runtime.joch.dev")["spec"]
    assert runs["names"]["shortNames"] == ["run", "runs", "ar"]
    cost = next(c for c in runs["versions"][0]["additionalPrinterColumns"] if c["name"] == "COST")
    assert cost == {"name": "COST", "type": "number", "jsonPath": ".status.costUsd",
                    "description": "USD metered so far (status.costUsd)."}


def test_the_crds_carry_the_rules_admission_checks(printed: list[dict[str, Any]]) -> None:
    policies = _by_name(printed, "policies.joch.dev")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = field(policies, ["spec", "rules"])
    assert rules is not None
    assert rules["x-kubernetes-list-type"] == "map" and rules["x-kubernetes-list-map-keys"] == ["name"]
    assert "requireApproval" in rules["items"]["x-kubernetes-validations"][0]["rule"]


def test_every_printer_column_points_at_a_field_of_the_schema(printed: list[dict[str, Any]]) -> None:
    for definition in printed:
        for version in definition["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            names = [c["name"] for c in version["additionalPrinterColumns"]]
            assert len(names) == len(set(names)), definition["metadata"]["name"]  # the apiserver's rule
            for column in version["additionalPrinterColumns"]:
                path = [p for p in re.sub(r"\[[^\]]*\]", "", column["jsonPath"]).split(".") if p]
                if path[0] == "metadata":
                    continue
                assert field(schema, path) is not None, (definition["metadata"]["name"], column)


def test_output_dir_writes_one_file_per_crd_and_removes_those_of_gone_kinds(tmp_path: Path) -> None:
    gone = tmp_path / "gones.joch.dev.yaml"
    gone.write_text(crds.HEADER + "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
                    "metadata:\n  name: gones.joch.dev\n  labels:\n    app.kubernetes.io/part-of: joch\n")
    other = tmp_path / "someone-elses.yaml"
    other.write_text("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n")
    result = invoke("crds", "--output-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert f"wrote {tmp_path / 'agents.joch.dev.yaml'}" in result.stdout
    assert not gone.exists() and other.exists()
    assert len(list(tmp_path.glob("*.joch.dev.yaml"))) == len([i for i in REGISTRY if i.group])
    # every file is one CRD, as printed
    agents = yaml.safe_load((tmp_path / "agents.joch.dev.yaml").read_text())
    assert agents["kind"] == "CustomResourceDefinition" and agents["spec"]["names"]["kind"] == "Agent"


def test_an_output_dir_that_cannot_be_created_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = invoke("crds", "--output-dir", str(blocker / "crds"))
    assert result.exit_code == 2
    assert f"error: cannot create --output-dir {blocker / 'crds'}" in result.stderr


def test_the_field_selectors_joch_takes_are_selectable_fields_of_the_crds(printed: list[dict[str, Any]]) -> None:
    # A Kubernetes store filters `joch get runs --field-selector status.phase=Failed` on the cluster:
    # only fields a CRD declares in selectableFields can be selected there (Kubernetes 1.31+).
    [version] = _by_name(printed, "agentruns.runtime.joch.dev")["spec"]["versions"]
    paths = [f["jsonPath"] for f in version["selectableFields"]]
    assert ".status.phase" in paths and ".spec.agentRef.name" in paths, paths
    for definition in printed:
        for v in definition["spec"]["versions"]:
            assert len(v.get("selectableFields", [])) <= 8, definition["metadata"]["name"]
