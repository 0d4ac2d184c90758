"""The integration kinds as a new user meets them through the real ``joch`` CLI and a real server:
every file of ``examples/integrations`` applies as-is, a bad ImplementationSource or TriggerRule is a
422 naming the document, the field and the fix (nothing written), and ``joch sync source`` against a
tracker it cannot reach says what to check instead of hanging or printing a traceback."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples" / "integrations").glob("*.yaml"))
INTEGRATION_KINDS = "implementationsources,triggerrules,triggerexecutions,writeintents,webhookdeliveries"


def names(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if line.strip()}


def test_there_are_integration_examples() -> None:
    assert len(EXAMPLES) >= 4, EXAMPLES


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_integration_example_applies_as_is(joch, example: Path) -> None:
    documents = [d for d in yaml.safe_load_all(example.read_text()) if d]
    expected = {f"{d['kind'].lower()}.{d['apiVersion'].split('/')[0]}/{d['metadata']['name']}" for d in documents}

    dry = joch.ok("apply", "-f", str(example), "--dry-run=server")
    assert names(dry.out) == {f"{name} created (server dry run)" for name in expected}, dry.out
    assert "No resources found" in joch("get", INTEGRATION_KINDS).err  # a dry run writes nothing

    applied = joch.ok("apply", "-f", str(example))
    assert names(applied.out) == {f"{name} created" for name in expected}, applied.out
    again = joch.ok("apply", "-f", str(example))
    assert names(again.out) == {f"{name} unchanged" for name in expected}, again.out


def test_the_examples_apply_together_with_the_quickstart(joch) -> None:
    joch.ok("apply", "-f", str(ROOT / "examples" / "quickstart"))
    for example in EXAMPLES:
        joch.ok("apply", "-f", str(example))
    sources = joch.ok("get", "sources").out
    assert sources.split()[:6] == ["NAME", "PROVIDER", "READY", "ISSUES", "LAST-SYNC", "AGE"], sources
    rules = joch.ok("get", "triggers", "-o", "name").out
    assert names(rules) == {f"triggerrule.joch.dev/{n}" for n in
                            ("demo-on-label", "demo-on-command", "eng-on-label", "nightly-docs", "on-deploy")}
    # The schedule example evaluates (a time zone this machine knows, a cron that fires).
    nightly = joch.ok("get", "trigger", "nightly-docs", "-o", "yaml").out
    assert "cron: 0 2 * * 1-5" in nightly


SECRET = {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": "s"},
          "spec": {"stringData": {"k": "v"}}}


def source(name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "ImplementationSource", "metadata": {"name": name},
            "spec": spec}


def rule(name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "TriggerRule", "metadata": {"name": name},
            "spec": {"run": {"agentRef": {"name": "demo"}}, **spec}}


TOKEN = {"tokenSecretRef": {"name": "s", "key": "k"}}
BAD = [
    pytest.param(rule("bad-cron", schedule={"cron": "0 25 * * *"}), "triggerrules", "spec.schedule.cron",
                 'cron "0 25 * * *" is not valid', id="cron-out-of-range"),
    pytest.param(rule("bad-cron", schedule={"cron": "every night"}), "triggerrules", "spec.schedule.cron",
                 "has 2 fields: write five fields", id="cron-words"),
    pytest.param(rule("bad-cron", schedule={"cron": "@daily"}), "triggerrules", "spec.schedule.cron",
                 'e.g. "0 0 * * *" for daily', id="cron-macro"),
    pytest.param(rule("bad-cron", schedule={"cron": "0 0 30 2 *"}), "triggerrules", "spec.schedule.cron",
                 "is not valid (Bad day-of-month)", id="cron-no-such-day"),
    pytest.param(rule("bad-tz", schedule={"cron": "0 2 * * *", "timeZone": "Mars/Olympus"}), "triggerrules",
                 "spec.schedule.timeZone", 'use an IANA name such as "UTC"', id="time-zone"),
    pytest.param(rule("two", sourceRef={"name": "acme-web"}, issue={"label": "x"}, schedule={"cron": "0 2 * * *"}),
                 "triggerrules", "spec.schedule", "split it into one TriggerRule per trigger", id="two-triggers"),
    pytest.param(rule("nosrc", issue={"label": "x"}), "triggerrules", "spec.sourceRef", "set spec.sourceRef.name",
                 id="issue-without-source"),
    pytest.param(source("ghlin", provider="github", github={"owner": "a", "repo": "b", "auth": TOKEN},
                        linear={"teamKey": "ENG", "auth": {"apiKeySecretRef": {"name": "s", "key": "k"}}}),
                 "implementationsources", "spec.linear", 'provider is "github": remove spec.linear',
                 id="github-with-linear"),
    pytest.param(source("both", provider="github", github={"owner": "a", "repo": "b", "auth": {
        **TOKEN, "app": {"appId": 1, "installationId": 2, "privateKeySecretRef": {"name": "s", "key": "pem"}}}}),
        "implementationsources", "spec.github.auth", "set exactly one of tokenSecretRef", id="token-and-app"),
    pytest.param(source("plain", provider="github", github={"owner": "a", "repo": "b", "apiUrl": "http://example.com",
                                                            "auth": TOKEN}),
                 "implementationsources", "spec.github.apiUrl", "unencrypted; use https", id="github-plain-http"),
    pytest.param(source("plain", provider="linear", linear={"teamKey": "ENG", "apiUrl": "ftp://linear.example",
                                                            "auth": {"apiKeySecretRef": {"name": "s", "key": "k"}}}),
                 "implementationsources", "spec.linear.apiUrl", "give an https URL", id="linear-not-http"),
    pytest.param(source("creds", provider="github", github={"owner": "a", "repo": "b", "auth": TOKEN,
                                                            "apiUrl": "https://me:hunter2@ghe.example/api/v3"}),
                 "implementationsources", "spec.github.apiUrl", "leave credentials to the auth Secret",
                 id="github-url-with-password"),
]


@pytest.mark.parametrize(("document", "plural", "field", "fix"), BAD)
def test_a_bad_integration_object_is_refused_naming_document_field_and_fix(
        joch, tmp_path: Path, document: dict[str, object], plural: str, field: str, fix: str) -> None:
    name = document["metadata"]["name"]  # type: ignore[index]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all([SECRET, document]))

    result = joch("apply", "-f", str(path))
    assert result.code != 0, result.out
    assert "Traceback" not in result.err
    assert f"{document['kind']}/{name} in {path}:9" in result.err, result.err
    assert f"{field}: " in result.err and fix in result.err, result.err
    assert "hunter2" not in result.err
    assert "No resources found" in joch("get", "secrets,sources,triggers").err  # nothing of the file was written

    # The API says it the same way: a 422 Invalid Status with the field as the cause.
    response = httpx.post(f"{joch.server.url}/apis/joch.dev/v1alpha1/namespaces/default/{plural}", json=document,
                          timeout=10)
    assert response.status_code == 422, response.text
    causes = response.json()["details"]["causes"]
    assert any(c["field"] == field and fix in c["message"] for c in causes), causes


def test_http_api_url_to_this_machine_is_admitted(joch, tmp_path: Path) -> None:
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump_all([SECRET, source("local", provider="github", pollIntervalSeconds=0, github={
        "owner": "a", "repo": "b", "apiUrl": "http://127.0.0.1:9/api/v3", "auth": TOKEN})]))
    joch.ok("apply", "-f", str(path))


def test_sync_source_against_an_unreachable_tracker_says_what_to_check(joch, tmp_path: Path, closed_port: int) -> None:
    path = tmp_path / "refused.yaml"
    path.write_text(yaml.safe_dump_all([SECRET, source("refused", provider="github", pollIntervalSeconds=0, github={
        "owner": "acme", "repo": "web", "apiUrl": f"http://127.0.0.1:{closed_port}", "auth": TOKEN})]))
    joch.ok("apply", "-f", str(path))

    result = joch("sync", "source", "refused", "--timeout", "30")
    assert result.code == 1, (result.out, result.err)
    assert "implementationsource.joch.dev/refused sync requested" in result.out
    assert "Traceback" not in result.err
    error = [line for line in result.err.splitlines() if line.strip()]
    assert len(error) == 1 and error[0].startswith("error: GitHub at http://127.0.0.1:"), result.err
    assert f"GitHub at http://127.0.0.1:{closed_port} could not be reached" in error[0], result.err
    assert "check spec.github.apiUrl" in error[0], result.err
    described = joch.ok("describe", "source", "refused").out
    assert "check spec.github.apiUrl" in described, described


def test_the_generic_webhook_example_starts_one_run_per_deployment(joch) -> None:
    """What the comment of schedule-and-webhook.yaml tells a user to send: a signed JSON body. The run's
    text renders ``event.payload``; the same deployment id again starts nothing."""
    joch.ok("apply", "-f", str(ROOT / "examples" / "quickstart"))
    joch.ok("apply", "-f", str(ROOT / "examples" / "integrations" / "schedule-and-webhook.yaml"))
    body = b'{"deployment": {"id": "d-1", "version": "1.2.3"}}'
    signature = "sha256=" + hmac.new(b"replace-me", body, hashlib.sha256).hexdigest()
    url = f"{joch.server.url}/v1/webhooks/default/on-deploy"
    headers = {"Content-Type": "application/json", "X-Joch-Signature-256": signature}
    for _ in range(2):
        response = httpx.post(url, content=body, headers=headers, timeout=10)
        assert response.status_code == 200, response.text

    api = f"{joch.server.url}/apis/runtime.joch.dev/v1alpha1/namespaces/default"
    deadline = time.monotonic() + 15
    while True:
        executions = httpx.get(f"{api}/triggerexecutions", timeout=10).json()["items"]
        if executions or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [x["spec"]["decision"] for x in executions] == ["Dispatched"], executions
    run = executions[0]["spec"]["runRef"]["name"]
    made = httpx.get(f"{api}/agentruns/{run}", timeout=10).json()
    assert made["spec"]["implementation"]["inline"]["text"] == \
        'Add a line "Deployed 1.2.3" to the end of CHANGELOG.md.'
