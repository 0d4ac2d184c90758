"""The Job (and its Secret) of a run attempt, as plain Kubernetes objects: pure, no client.

One ``batch/v1`` Job per attempt, named ``joch-<run>-<uid8>-<attempt>`` (at most 63 characters: it
becomes a label of its Pod) and labelled with the run's uid and attempt, which is how a restarted
server finds it again (``RUN_UID``, ``ATTEMPT``); the run's namespace/name is an annotation (``RUN``)
so a watch event names the run to reconcile.

* ``backoffLimit: 0`` and ``restartPolicy: Never``: Joch owns retries (a new attempt, a new Job).
* ``activeDeadlineSeconds``: the runner enforces the run's timeout from the agent's start and
  bounds preparing (the clone) by the same length, so the Job's deadline is twice the timeout plus
  the grace period and ``DEADLINE_SLACK`` for start-up and the final report: a backstop for a
  runner that stopped enforcing it, never earlier than the runner.
* ``ttlSecondsAfterFinished``: a finished Job (and its Pod) goes away on its own; the runtime
  deletes it when the run is cleaned up anyway.
* Secret values (the agent's secrets and the run token) live in a Secret of the same name, owned by
  the Job (deleted with it), and reach the container as ``secretKeyRef``s: never in the Job.
* The container gains no privilege (``allowPrivilegeEscalation: false``, every capability dropped,
  the ``RuntimeDefault`` seccomp profile); which user it runs as is the image's.
* The workspace is an ``emptyDir`` at ``MOUNT``: the runner's run directory (``run/``), the checkout
  (``src/``) and the repository mirror (``mirrors/``). The container runs ``joch runner --report``,
  which sends its records, artifacts and log to ``api_url`` (``joch.runtime.reports``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

from joch.runtime.base import RunId, RunnerSpec

MANAGED_BY = "app.kubernetes.io/managed-by"
RUN_UID = "runtime.joch.dev/run-uid"
ATTEMPT = "runtime.joch.dev/attempt"
RUN = "runtime.joch.dev/run"
CONTAINER = "runner"
MOUNT = "/workspace"
RUN_DIR = f"{MOUNT}/run"
SOURCE = f"{MOUNT}/src"
MIRRORS = f"{MOUNT}/mirrors"
DEADLINE_SLACK = 120
SANDBOX_REASON = "the Kubernetes runtime: the Job's container is the agent's sandbox"
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def job_name(run: RunId) -> str:
    uid = re.sub(r"[^a-z0-9]", "", run.uid.lower())[:8] or "run"
    tail = f"-{uid}-{run.attempt}"
    stem = re.sub(r"[^a-z0-9-]+", "-", run.name.lower()).strip("-")[: 63 - len("joch-") - len(tail)].strip("-")
    return f"joch-{stem}{tail}" if stem else f"joch{tail}"


def labels(run: RunId) -> dict[str, str]:
    return {MANAGED_BY: "joch", RUN_UID: run.uid, ATTEMPT: str(run.attempt)}


def secret_keys(names: tuple[str, ...]) -> dict[str, str]:
    """Each secret variable's key in the attempt's Secret: its name where that is a valid key."""
    return {name: name if _SECRET_KEY.match(name) else f"env-{i}" for i, name in enumerate(names)}


def secret(spec: RunnerSpec, namespace: str, values: Mapping[str, str]) -> dict[str, Any]:
    keys = secret_keys(spec.secret_env)
    data = {keys[name]: base64.b64encode(values[name].encode()).decode() for name in spec.secret_env if name in values}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": job_name(spec.run), "namespace": namespace, "labels": labels(spec.run),
                         "annotations": {RUN: f"{spec.run.namespace}/{spec.run.name}"}},
            "data": data}


def owned_by(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    meta = job["metadata"]
    return [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
             "blockOwnerDeletion": True}]


def job(spec: RunnerSpec, *, namespace: str, image: str, api_url: str, runner: tuple[str, ...],
        service_account: str | None, ttl_seconds: int, values: Mapping[str, str]) -> dict[str, Any]:
    name = job_name(spec.run)
    keys = secret_keys(spec.secret_env)
    env = [{"name": n, "valueFrom": {"secretKeyRef": {"name": name, "key": keys[n]}}}
           for n in spec.secret_env if n in values]
    resources = dict(spec.placement.resources)
    container: dict[str, Any] = {
        "name": CONTAINER, "image": spec.placement.image or image, "command": list(runner),
        "args": ["--spec", f"{RUN_DIR}/spec.json", "--spec-json", spec.to_json(), "--workspace", SOURCE,
                 "--cache", MIRRORS, "--api-url", api_url, "--report", "--sandbox", "none",
                 "--sandbox-reason", SANDBOX_REASON],
        "env": env, "workingDir": MOUNT,
        "volumeMounts": [{"name": "workspace", "mountPath": MOUNT}],
        # The agent needs no privilege: none to gain, no capability, the runtime's seccomp profile.
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if resources:
        container["resources"] = {"requests": resources, "limits": resources}
    account = spec.placement.service_account or service_account
    pod: dict[str, Any] = {
        "restartPolicy": "Never", "containers": [container], "volumes": [{"name": "workspace", "emptyDir": {}}],
        "terminationGracePeriodSeconds": int(spec.grace_seconds) + 5,
        # The agent gets a Kubernetes identity only when the Agent allows one by name.
        "automountServiceAccountToken": account is not None,
    }
    if account is not None:
        pod["serviceAccountName"] = account
    meta = {"labels": labels(spec.run), "annotations": {RUN: f"{spec.run.namespace}/{spec.run.name}"}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, **meta},
            "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": ttl_seconds,
                     "activeDeadlineSeconds": int(2 * spec.timeout_seconds + spec.grace_seconds) + DEADLINE_SLACK,
                     "template": {"metadata": meta, "spec": pod}}}


def run_of(obj: Mapping[str, Any]) -> RunId | None:
    """The run attempt a Job, Pod or Secret of this runtime belongs to (None: not one of them)."""
    meta = obj.get("metadata") or {}
    found = meta.get("labels") or {}
    namespace, _, name = str((meta.get("annotations") or {}).get(RUN, "")).partition("/")
    attempt = str(found.get(ATTEMPT, ""))
    if not found.get(RUN_UID) or not attempt.isdigit() or not name:
        return None
    return RunId(namespace=namespace, name=name, uid=str(found[RUN_UID]), attempt=int(attempt))
