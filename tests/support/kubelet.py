"""A test kubelet and Job controller for the stand-in cluster (``support.kubecluster``).

No kube-apiserver or kubelet runs on these machines, so this plays both against the stand-in's
API, over HTTP in the Kubernetes wire format, the way the real ones would:

* **Job controller**: a Job without a Pod gets one from its template (``job-name`` and
  ``controller-uid`` labels, an ownerReference to the Job); the Pod's end becomes the Job's
  ``Complete`` or ``Failed`` condition (``backoffLimit: 0``: no second Pod); a Job past its
  ``activeDeadlineSeconds`` loses its Pod and fails ``DeadlineExceeded``; a finished Job is deleted
  ``ttlSecondsAfterFinished`` after it finished; Pods and Secrets whose owning Job is gone are deleted
  (what the garbage collector does after a delete with ``propagationPolicy: Background``).
* **kubelet**: a Pod's container runs as a local process (its ``command`` + ``args``, its ``env``
  with ``secretKeyRef``s read from the stand-in's Secrets, ``emptyDir`` and ``secret`` volumes as
  directories below ``root``). A process has no container file system, so every string of its
  command line and environment that names a ``volumeMounts[].mountPath`` is rewritten to the
  volume's directory. Output goes to ``<logs>/<ns>/<pod>``, which the stand-in's Pod log route
  serves (``support.kubelogs``). Status is written as the kubelet writes it: ``Running`` with a
  ``running`` container state, then ``Succeeded``/``Failed`` with the exit code and reason
  (``Completed``, ``Error``, ``OOMKilled``). A deleted Pod's processes get SIGTERM, then SIGKILL after
  its grace period (at most ``max_grace``) — every process the container started, not only its
  first: processes are followed as they appear.
* What a node refuses, for the failure-reason tests: an image whose tag is ``missing`` cannot be
  pulled (``ErrImagePull``, then ``ImagePullBackOff``); a Pod requesting more CPU than ``cpus`` is
  ``Unschedulable``; a container whose processes' resident memory exceeds its memory limit is
  killed ``OOMKilled`` (exit code 137).

Run it in its own process (``python -m support.kubelet --server URL --root DIR``, or ``start``), so
that killing the process under test leaves the "cluster" running, as it would in real life."""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import os
import secrets as random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

POLL = 0.1
MERGE = {"content-type": "application/merge-patch+json"}


def stamp(moment: float | None = None) -> str:
    return dt.datetime.fromtimestamp(moment or time.time(), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def quantity(text: Any) -> float:
    """A Kubernetes quantity as a number (``500m`` → 0.5, ``64Mi`` → 67108864)."""
    value = str(text)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


@dataclass
class Container:
    process: subprocess.Popen[bytes]
    namespace: str
    pod: str
    uid: str
    grace: float
    memory_limit: float | None
    seen: dict[int, int] = field(default_factory=dict)  # pid → start time: every process it started
    killed_for: str | None = None

    def follow(self) -> None:
        """Note the processes below the container's first (they may leave its tree later)."""
        for pid in _descendants(self.process.pid):
            start = _start(pid)
            if start is not None:
                self.seen.setdefault(pid, start)

    def alive(self) -> list[int]:
        return [pid for pid, start in self.seen.items() if _start(pid) == start and not _zombie(pid)]

    def signal_all(self, signum: int) -> None:
        self.follow()
        targets = [self.process.pid, *self.alive()] if self.process.poll() is None else self.alive()
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def rss(self) -> int:
        total = 0
        for pid in [self.process.pid, *self.alive()]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total


class Kubelet:
    def __init__(self, server: str, root: Path, *, logs: Path | None = None, cpus: float = 8.0,
                 max_grace: float = 5.0) -> None:
        self.http = httpx.Client(base_url=server, timeout=60)
        self.root = root
        self.logs = logs or root / "pod-logs"
        self.cpus = cpus
        self.max_grace = max_grace
        self.containers: dict[str, Container] = {}  # pod uid → its running container
        self.stopping: list[tuple[Container, float]] = []
        self.pulls: dict[str, float] = {}  # pod uid → when the image pull failed
        self.created: set[str] = set()  # the Jobs (uids) this controller made a Pod for
        self._stop = threading.Event()

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except httpx.HTTPError as exc:
                print(f"kubelet: {exc}", file=sys.stderr, flush=True)
            time.sleep(POLL)
        for container in list(self.containers.values()):
            self._kill(container)

    def stop(self) -> None:
        self._stop.set()

    def tick(self) -> None:
        jobs = self._list("/apis/batch/v1/jobs")
        pods = self._list("/api/v1/pods")
        job_uids = {j["metadata"]["uid"] for j in jobs}
        self._collect_garbage(job_uids, pods)
        pods = [p for p in pods if not _orphan(p, job_uids)]
        by_job: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            by_job.setdefault((pod["metadata"].get("labels") or {}).get("controller-uid", ""), []).append(pod)
        for job in jobs:
            self._reconcile_job(job, by_job.get(job["metadata"]["uid"], []))
        live = {p["metadata"]["uid"] for p in pods}
        for uid, container in list(self.containers.items()):
            if uid not in live:  # the Pod was deleted: stop what it runs
                del self.containers[uid]
                self._begin_stop(container)
        for pod in pods:
            self._sync_pod(pod)
        self._finish_stops()

    # --- the Job controller -----------------------------------------------------------------------

    def _reconcile_job(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
        path = f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{meta['name']}"
        finished = _job_finished(job)
        if finished is not None:
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and time.time() >= (parse(status.get("completionTime")) or
                                                   parse(finished.get("lastTransitionTime")) or 0) + ttl:
                self._delete(path)
            return
        started = parse(status.get("startTime"))
        if not pods and meta["uid"] in self.created:
            # Its Pod was deleted before it ended (evicted, kubectl delete): with backoffLimit 0, the
            # Job has failed (podReplacementPolicy: Failed, as Jobs whose Pods may not run twice want).
            self._end_job(path, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit",
                          failed=1)
            return
        if not pods and not (status.get("failed") or status.get("succeeded")):
            self.created.add(meta["uid"])
            self._create_pod(job)
            if started is None:
                self._patch(path + "/status", {"status": {"startTime": stamp(), "active": 1}})
            return
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and started is not None and time.time() > started + deadline:
            for pod in pods:
                self._delete(_pod_path(pod))
            self._end_job(path, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline",
                          failed=len(pods))
            return
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Succeeded":
                self._end_job(path, "Complete", "CompletionsReached", "Reached expected number of succeeded pods",
                              succeeded=1)
            elif phase == "Failed":
                self._end_job(path, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit",
                              failed=1)

    def _end_job(self, path: str, condition: str, reason: str, message: str, **counts: int) -> None:
        now = stamp()
        conditions = [{"type": "SuccessCriteriaMet" if condition == "Complete" else "FailureTarget", "status": "True",
                       "reason": reason, "message": message, "lastTransitionTime": now},
                      {"type": condition, "status": "True", "reason": reason, "message": message,
                       "lastTransitionTime": now}]
        body: dict[str, Any] = {"conditions": conditions, "active": 0, **counts}
        if condition == "Complete":
            body["completionTime"] = now
        self._patch(path + "/status", {"status": body})

    def _create_pod(self, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        template = (job.get("spec") or {}).get("template") or {}
        labels = {**((template.get("metadata") or {}).get("labels") or {}), "job-name": meta["name"],
                  "batch.kubernetes.io/job-name": meta["name"], "controller-uid": meta["uid"],
                  "batch.kubernetes.io/controller-uid": meta["uid"]}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{meta['name'][:57]}-{random.token_hex(3)[:5]}", "namespace": meta["namespace"],
                            "labels": labels, "ownerReferences": [
                                {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}]},
               "spec": template.get("spec") or {}}
        self.http.post(f"/api/v1/namespaces/{meta['namespace']}/pods", json=pod).raise_for_status()

    def _collect_garbage(self, job_uids: set[str], pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            if _orphan(pod, job_uids) and self._owner_gone(pod):
                self._delete(_pod_path(pod))
        for secret in self._list("/api/v1/secrets"):
            if _orphan(secret, job_uids) and self._owner_gone(secret):
                self._delete(f"/api/v1/namespaces/{secret['metadata']['namespace']}/secrets/"
                             f"{secret['metadata']['name']}")

    def _owner_gone(self, obj: dict[str, Any]) -> bool:
        """Asked of the API, as the garbage collector does: the Job list may predate the owner."""
        for owner in obj["metadata"].get("ownerReferences") or []:
            response = self.http.get(f"/apis/batch/v1/namespaces/{obj['metadata']['namespace']}/jobs/{owner['name']}")
            if response.status_code == 200 and response.json()["metadata"]["uid"] == owner.get("uid"):
                return False
        return True

    # --- the kubelet ------------------------------------------------------------------------------

    def _sync_pod(self, pod: dict[str, Any]) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        uid = meta["uid"]
        container = self.containers.get(uid)
        if container is not None:
            self._watch_container(pod, container)
            return
        if status.get("phase") in ("Succeeded", "Failed", "Running"):
            return
        spec = pod.get("spec") or {}
        main = (spec.get("containers") or [{}])[0]
        requested = ((main.get("resources") or {}).get("requests") or {}).get("cpu")
        if requested is not None and quantity(requested) > self.cpus:
            self._pending(pod, scheduled=False, message="0/1 nodes are available: 1 Insufficient cpu.")
            return
        if str(main.get("image", "")).endswith(":missing"):
            first = self.pulls.setdefault(uid, time.monotonic())
            reason = "ErrImagePull" if time.monotonic() - first < 1.0 else "ImagePullBackOff"
            self._pending(pod, scheduled=True, waiting={
                "reason": reason, "message": f'Back-off pulling image "{main.get("image")}"' if reason ==
                "ImagePullBackOff" else f'failed to pull image "{main.get("image")}": not found'})
            return
        try:
            self._start(pod, main)
        except _ConfigError as exc:
            self._pending(pod, scheduled=True, waiting={"reason": "CreateContainerConfigError", "message": str(exc)})

    def _pending(self, pod: dict[str, Any], *, scheduled: bool, message: str = "",
                 waiting: dict[str, str] | None = None) -> None:
        conditions = [{"type": "PodScheduled", "status": "True" if scheduled else "False",
                       "lastTransitionTime": stamp(),
                       **({} if scheduled else {"reason": "Unschedulable", "message": message})}]
        status: dict[str, Any] = {"phase": "Pending", "conditions": conditions}
        if waiting is not None:
            name = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name", "main")
            status["containerStatuses"] = [{"name": name, "ready": False, "restartCount": 0,
                                            "image": "", "imageID": "", "state": {"waiting": waiting}}]
        current = pod.get("status") or {}
        if current.get("conditions", [{}])[0].get("status") == conditions[0]["status"] and \
                current.get("containerStatuses") == status.get("containerStatuses"):
            return
        self._patch(_pod_path(pod) + "/status", {"status": status})

    def _start(self, pod: dict[str, Any], main: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        pod_dir = self.root / "pods" / meta["namespace"] / meta["name"]
        mounts = self._volumes(pod, main, pod_dir)
        env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
               "HOME": str(pod_dir / "home"), "HOSTNAME": meta["name"],
               **{k: v for k, v in os.environ.items() if k in ("LANG", "PYTHONPATH", "TMPDIR")}}
        (pod_dir / "home").mkdir(parents=True, exist_ok=True)
        # The image's git identity (the Dockerfile configures one): the agent's commits need it.
        (pod_dir / "home" / ".gitconfig").write_text("[user]\n\tname = Joch Runner\n\temail = runner@joch.invalid\n")
        for item in main.get("env") or []:
            env[item["name"]] = self._env_value(meta["namespace"], item)
        argv = [*(main.get("command") or []), *(main.get("args") or [])]
        if not argv:
            raise _ConfigError("the stand-in kubelet runs a container's command: the container has none")

        def mapped(text: str) -> str:
            for mount, host in mounts:
                text = text.replace(mount + "/", host + "/")
                if text == mount:
                    text = host
            return text

        argv = [mapped(a) for a in argv]
        env = {k: mapped(v) for k, v in env.items()}
        log = self.logs / meta["namespace"] / meta["name"]
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            process = subprocess.Popen(argv, env=env, cwd=mapped(main.get("workingDir") or str(pod_dir)),
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        limit = ((main.get("resources") or {}).get("limits") or {}).get("memory")
        grace = min(float(spec.get("terminationGracePeriodSeconds", 30)), self.max_grace)
        self.containers[meta["uid"]] = Container(process, meta["namespace"], meta["name"], meta["uid"], grace,
                                                 quantity(limit) if limit is not None else None)
        now = stamp()
        self._patch(_pod_path(pod) + "/status", {"status": {
            "phase": "Running", "startTime": now, "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                           {"type": "Ready", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [{"name": main.get("name", "main"), "ready": True, "restartCount": 0,
                                   "image": main.get("image", ""), "imageID": "", "started": True,
                                   "state": {"running": {"startedAt": now}}}]}})

    def _volumes(self, pod: dict[str, Any], main: dict[str, Any], pod_dir: Path) -> list[tuple[str, str]]:
        volumes = {v["name"]: v for v in (pod.get("spec") or {}).get("volumes") or []}
        mounts: list[tuple[str, str]] = []
        for mount in main.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise _ConfigError(f'volume "{mount["name"]}" not found')
            host = pod_dir / "volumes" / mount["name"]
            host.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                data = self._secret(pod["metadata"]["namespace"], volume["secret"]["secretName"])
                items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] not in data:
                        raise _ConfigError(f'couldn\'t find key {item["key"]} in Secret '
                                           f'{pod["metadata"]["namespace"]}/{volume["secret"]["secretName"]}')
                    (host / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
            mounts.append((mount["mountPath"].rstrip("/"), str(host)))
        return sorted(mounts, key=lambda m: -len(m[0]))

    def _env_value(self, namespace: str, item: dict[str, Any]) -> str:
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref is None:
            return str(item.get("value", ""))
        data = self._secret(namespace, ref["name"])
        if ref["key"] not in data:
            raise _ConfigError(f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}")
        return base64.b64decode(data[ref["key"]]).decode()

    def _secret(self, namespace: str, name: str) -> dict[str, str]:
        response = self.http.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if response.status_code == 404:
            raise _ConfigError(f'secret "{name}" not found')
        response.raise_for_status()
        return dict(response.json().get("data") or {})

    def _watch_container(self, pod: dict[str, Any], container: Container) -> None:
        container.follow()
        if container.memory_limit is not None and container.killed_for is None and \
                container.rss() > container.memory_limit:
            container.killed_for = "OOMKilled"
            container.signal_all(signal.SIGKILL)
        code = container.process.poll()
        if code is None:
            return
        container.signal_all(signal.SIGKILL)  # what the container left behind dies with it
        del self.containers[container.uid]
        code = 128 - code if code < 0 else code
        reason = container.killed_for or ("Completed" if code == 0 else "Error")
        if reason == "OOMKilled":
            code = 137
        now = stamp()
        main = ((pod.get("spec") or {}).get("containers") or [{}])[0]
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        started = ((statuses[0].get("state") or {}).get("running") or {}).get("startedAt", now)
        self._patch(_pod_path(pod) + "/status", {"status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                           {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}],
            "containerStatuses": [{"name": main.get("name", "main"), "ready": False, "restartCount": 0,
                                   "image": main.get("image", ""), "imageID": "", "started": False,
                                   "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": started,
                                                            "finishedAt": now}}}]}})

    # --- stopping ---------------------------------------------------------------------------------

    def _begin_stop(self, container: Container) -> None:
        container.signal_all(signal.SIGTERM)
        self.stopping.append((container, time.monotonic() + container.grace))

    def _finish_stops(self) -> None:
        left = []
        for container, until in self.stopping:
            container.follow()
            container.process.poll()
            if not container.alive() and container.process.returncode is not None:
                continue
            if time.monotonic() >= until:
                container.signal_all(signal.SIGKILL)
                container.process.poll()
            left.append((container, until))
        self.stopping = left

    def _kill(self, container: Container) -> None:
        container.signal_all(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            container.process.wait(5)

    # --- HTTP -------------------------------------------------------------------------------------

    def _list(self, path: str) -> list[dict[str, Any]]:
        response = self.http.get(path)
        response.raise_for_status()
        return list(response.json().get("items") or [])

    def _patch(self, path: str, body: dict[str, Any]) -> None:
        response = self.http.patch(path, json=body, headers=MERGE)
        if response.status_code != 404:
            response.raise_for_status()

    def _delete(self, path: str) -> None:
        response = self.http.delete(path)
        if response.status_code not in (404, 409):
            response.raise_for_status()


class _ConfigError(Exception):
    pass


def _pod_path(pod: dict[str, Any]) -> str:
    return f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"


def _orphan(obj: dict[str, Any], job_uids: set[str]) -> bool:
    owners = [o for o in obj["metadata"].get("ownerReferences") or [] if o.get("kind") == "Job"]
    return bool(owners) and all(o.get("uid") not in job_uids for o in owners)


def _job_finished(job: dict[str, Any]) -> dict[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return dict(condition)
    return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _start(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@dataclass(frozen=True)
class Handle:
    process: subprocess.Popen[str]
    root: Path


@contextmanager
def start(server: str, root: Path, *, logs: Path, cpus: float = 8.0) -> Iterator[Handle]:
    """A kubelet process for the stand-in at ``server``; stopped (its containers killed) on exit."""
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    root.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "support.kubelet", "--server", server, "--root", str(root), "--logs", str(logs),
         "--cpus", str(cpus)], stdout=(root / "kubelet.log").open("a"), stderr=subprocess.STDOUT, text=True,
        env=env, cwd=tests)
    try:
        yield Handle(process, root)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m support.kubelet")
    parser.add_argument("--server", required=True)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--logs", type=Path)
    parser.add_argument("--cpus", type=float, default=8.0)
    args = parser.parse_args()
    kubelet = Kubelet(args.server, args.root, logs=args.logs, cpus=args.cpus)
    signal.signal(signal.SIGTERM, lambda *_: kubelet.stop())
    kubelet.run()


if __name__ == "__main__":
    main()
