"""What the Kubernetes runtime asks the cluster for (``runtime.kubernetes.jobs``), and how it keeps
what a Job's runner reports (``runtime.reports.ReportStore``): pure, no cluster."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from joch.runtime.base import ArtifactRecord, Placement, RunId, RunnerSpec, RunState
from joch.runtime.kubernetes import jobs
from joch.runtime.reports import ReportRefused, ReportStore

RUN = RunId(namespace="team", name="a-very-long-run-name-that-goes-on-and-on-well-past-sixty-three-characters",
            uid="0c1151d2-5d83-4b8c-9df1-29dbb2f719f6", attempt=12)


def spec(**placement: object) -> RunnerSpec:
    return RunnerSpec(run=RUN, argv=("agent",), secret_env=("API_KEY", "odd name!", "JOCH_RUN_TOKEN"),
                      timeout_seconds=600, grace_seconds=10, placement=Placement(type="kubernetes", **placement))


def test_a_job_name_is_a_valid_label_value_unique_per_uid_and_attempt() -> None:
    name = jobs.job_name(RUN)
    assert len(name) <= 63 and name.startswith("joch-a-very-long") and name.endswith("-0c1151d2-12")
    assert jobs.job_name(RunId("team", "x", RUN.uid, 13)) != jobs.job_name(RunId("team", "x", RUN.uid, 12))


def test_the_job_holds_secret_refs_never_values() -> None:
    values = {"API_KEY": "sk-live-123456", "odd name!": "v4lue-xyz", "JOCH_RUN_TOKEN": "jrt1_abcdef"}
    job = jobs.job(spec(image="img:1", resources={"memory": "1Gi"}, service_account="builder"), namespace="ns",
                   image="default:1", api_url="http://joch:8080", runner=("joch", "runner"), service_account=None,
                   ttl_seconds=600, values=values)
    text = json.dumps(job)
    assert not any(v in text for v in values.values())
    container = job["spec"]["template"]["spec"]["containers"][0]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert refs["API_KEY"] == {"name": jobs.job_name(RUN), "key": "API_KEY"}
    assert refs["odd name!"]["key"] == "env-1"  # not a valid Secret key: by position
    assert container["image"] == "img:1" and container["resources"]["limits"] == {"memory": "1Gi"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 2 * 600 + 10 + 120
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "builder" and pod["automountServiceAccountToken"] is True
    assert jobs.run_of(job) == RUN
    secret = jobs.secret(spec(), "ns", values)
    assert set(secret["data"]) == {"API_KEY", "env-1", "JOCH_RUN_TOKEN"}


def test_without_a_service_account_no_token_is_mounted() -> None:
    pod = jobs.job(spec(), namespace="ns", image="default:1", api_url="http://joch", runner=("joch", "runner"),
                   service_account=None, ttl_seconds=60, values={})["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod and pod["automountServiceAccountToken"] is False


def _final(artifact: ArtifactRecord) -> bytes:
    state = RunState(phase="Succeeded", reason="Completed", message="done", exit_code=0, artifacts=(artifact,))
    return json.dumps(asdict(state)).encode()


def test_a_final_record_is_refused_until_its_artifacts_arrived_as_listed(tmp_path: Path) -> None:
    reports = ReportStore(tmp_path)
    patch = b"diff --git a/x b/x\n"
    listed = ArtifactRecord(name="changes.patch", path="changes.patch", sha256=hashlib.sha256(patch).hexdigest(),
                            size=len(patch))
    with pytest.raises(ReportRefused, match=r"changes\.patch .* was not uploaded as listed"):
        reports.put_record("u", 1, _final(listed))
    reports.put_artifact("u", 1, "changes.patch", b"something else")
    with pytest.raises(ReportRefused, match=r"record\.artifacts"):
        reports.put_record("u", 1, _final(listed))
    reports.put_artifact("u", 1, "changes.patch", io.BytesIO(patch))  # as the route hands it: a file
    assert reports.put_record("u", 1, _final(listed)).phase == "Succeeded"
    record, stream = reports.open_artifact("u", 1, "changes.patch")
    with stream:
        assert stream.read() == patch and record.sha256 == listed.sha256
    # An attempt ends once: nothing is taken after its final record.
    with pytest.raises(ReportRefused, match="has ended already"):
        reports.put_artifact("u", 1, "changes.patch", b"late")


def test_a_record_that_is_not_one_is_refused_naming_the_field(tmp_path: Path) -> None:
    reports = ReportStore(tmp_path)
    with pytest.raises(ReportRefused, match="record:"):
        reports.put_record("u", 1, b"[1, 2]")
    with pytest.raises(ReportRefused, match=r"record\.phase"):
        reports.put_record("u", 1, json.dumps({"phase": "Lost"}).encode())


def test_the_job_and_its_secret_are_valid_kubernetes_objects() -> None:
    import kubernetes_validate

    values = {"API_KEY": "k", "odd name!": "v", "JOCH_RUN_TOKEN": "t"}
    job = jobs.job(spec(image="img:1", resources={"cpu": "2", "memory": "1Gi", "ephemeral-storage": "5Gi"},
                        service_account="builder"), namespace="ns", image="default:1", api_url="http://joch:8080",
                   runner=("joch", "runner"), service_account=None, ttl_seconds=600, values=values)
    for version in ("1.32.0", "1.37.0"):
        kubernetes_validate.validate(job, version, strict=True)
        kubernetes_validate.validate(jobs.secret(spec(), "ns", values), version, strict=True)


def test_a_record_cannot_list_an_artifact_outside_its_attempt(tmp_path: Path) -> None:
    # Another run's artifact (or any server file whose bytes the agent knows): a final record that
    # names it with ../ must be refused, or open_artifact would serve it as this run's.
    reports = ReportStore(tmp_path)
    secret = b"another run's output\n"
    reports.put_artifact("other", 1, "out.txt", secret)
    sneaky = ArtifactRecord(name="../../../other/1/artifacts/out.txt", path="x",
                            sha256=hashlib.sha256(secret).hexdigest(), size=len(secret))
    with pytest.raises(ReportRefused, match=r"record\.artifacts.*plain file name"):
        reports.put_record("u", 1, _final(sneaky))
    with pytest.raises(KeyError):
        reports.open_artifact("u", 1, sneaky.name)


@pytest.mark.parametrize("name", ["nul\x00byte", "x" * 300, "..", "a/b", ""])
def test_an_artifact_name_the_file_system_cannot_hold_is_refused_not_a_500(tmp_path: Path, name: str) -> None:
    with pytest.raises(ReportRefused, match="plain file name"):
        ReportStore(tmp_path).put_artifact("u", 1, name, b"x")
