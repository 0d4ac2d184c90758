"""``values.schema.json`` refuses bad values before anything renders, naming the value: Helm checks
it at install, upgrade, lint and template time, so a typo is an error, not a silently ignored key."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from support.helmchart import CHART, NAMESPACE

BAD: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-top-level-key": ({"replicas": 2}, "additional properties 'replicas' not allowed"),
    "misspelt-nested-key": ({"store": {"existingSecret": {"nmae": "db"}}}, "/store/existingSecret"),
    "negative-replicas": ({"replicaCount": -1}, "/replicaCount"),
    "replicas-as-string": ({"replicaCount": "two"}, "/replicaCount"),
    "pull-policy-not-kubernetes": ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    "empty-repository": ({"image": {"repository": ""}}, "/image/repository"),
    "digest-without-algorithm": ({"image": {"digest": "abc123"}}, "/image/digest"),
    "ingress-is-not-in-this-chart": ({"ingress": {"enabled": True}}, "additional properties 'ingress' not allowed"),
    "bundled-postgres-is-not-in-this-chart": ({"postgresql": {"enabled": True}}, "'postgresql' not allowed"),
    "service-port-out-of-range": ({"service": {"port": 70000}}, "/service/port"),
    "service-type-unknown": ({"service": {"type": "Ingress"}}, "/service/type"),
    "sandbox-mode-unknown": ({"server": {"sandbox": "docker"}}, "/server/sandbox"),
    "zero-concurrent-runs": ({"server": {"maxConcurrentRuns": 0}}, "/server/maxConcurrentRuns"),
    "lease-duration-zero": ({"server": {"leaderElection": {"leaseDuration": 0}}},
                            "/server/leaderElection/leaseDuration"),
    "audit-retention-unit-unknown": ({"server": {"auditRetention": "3 months"}}, "/server/auditRetention"),
    "allowed-origin-with-a-path": ({"server": {"allowedOrigins": ["https://app.example/x"]}},
                                   "/server/allowedOrigins/0"),
    "store-url-of-an-unknown-scheme": ({"store": {"url": "mysql://db/joch"}}, "/store/url"),
    "secret-name-not-dns": ({"store": {"existingSecret": {"name": "Joch_DB"}}}, "/store/existingSecret/name"),
    "oidc-issuer-over-http": ({"auth": {"oidc": {"issuerUrl": "http://issuer", "clientId": "x"}}},
                              "/auth/oidc/issuerUrl"),
    "oidc-issuer-without-client-id": ({"auth": {"oidc": {"issuerUrl": "https://issuer"}}}, "/auth/oidc/clientId"),
    "oidc-ca-not-pem": ({"auth": {"oidc": {"caPem": "not a certificate"}}}, "/auth/oidc/caPem"),
    "token-generate-not-boolean": ({"auth": {"tokens": {"generate": "yes"}}}, "/auth/tokens/generate"),
    "manifest-file-name-not-yaml": ({"manifests": {"agent.txt": "kind: Agent"}},
                                    "at '/manifests': additional properties 'agent.txt' not allowed"),
    "persistence-size-not-a-quantity": ({"persistence": {"size": "ten gigs"}}, "/persistence/size"),
    "persistence-access-mode-unknown": ({"persistence": {"accessModes": ["ReadWriteSometimes"]}},
                                        "/persistence/accessModes/0"),
    "runtime-namespace-not-dns": ({"kubernetesRuntime": {"namespace": "Runs!"}}, "/kubernetesRuntime/namespace"),
    "env-without-name": ({"env": [{"value": "x"}]}, "/env/0"),
    "resources-not-quantities": ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
    "probe-period-zero": ({"readinessProbe": {"periodSeconds": 0}}, "/readinessProbe/periodSeconds"),
}


@pytest.fixture(scope="module")
def chart() -> Any:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


@pytest.mark.parametrize("case", BAD)
def test_values_schema_rejects_a_bad_value_naming_it(chart: helm.Chart, case: str) -> None:
    values, named = BAD[case]
    with pytest.raises(helm.HelmValuesError) as raised:
        chart.render(values, name="joch", namespace=NAMESPACE)
    assert named in str(raised.value), str(raised.value)
    report = helm.lint(CHART, values, namespace=NAMESPACE)
    assert report["errors"] or [m for m in report["messages"] if m["severity"] == 3], "lint let it through"


def test_the_default_values_pass_the_schema(chart: helm.Chart) -> None:
    chart.validate_schema(chart.merge_values({}))
