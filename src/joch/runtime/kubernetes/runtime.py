"""The Kubernetes runtime: each run attempt is a ``batch/v1`` Job whose container runs ``joch runner``.

What the Job looks like is ``jobs``; this module creates, follows, cancels and removes it with
lightkube, against a kubeconfig or the in-cluster configuration.

* **Submitting is creating the Job by its name.** The name is a function of the run's uid and the
  attempt, so a second submit (another thread, a server that crashed after creating it) gets a 409
  from the API and returns the same reference: nothing starts twice. The Secret goes first (the
  Pod needs it), then the Job, then the Secret is given the Job as owner so it goes with it.
* **The runner reports, the cluster confirms.** The container's runner sends its records,
  artifacts and log to the Joch API (``joch.runtime.reports``), which keeps them in a
  ``ReportStore`` below this runtime's directory; ``status`` answers from the last record, and from
  the Job and its Pod for what a runner cannot say: an image that cannot be pulled
  (``ErrImagePull``/``ImagePullBackOff`` for longer than ``pull_grace``, ``InvalidImageName``), a
  container that cannot be configured (``CreateContainerConfigError``), a container killed for its
  memory (``OOMKilled``), the Job's deadline (``DeadlineExceeded``), a container or Job that ended
  without the runner's final record (``RunnerLost``). A Pod that cannot be scheduled stays
  ``Preparing`` with reason ``Unschedulable`` and the scheduler's message (a node may come). An
  ending decided here is written into the ReportStore like a runner's, so the answer is the same
  every time and for every replica, and a late report is refused.
* **Re-adoption needs nothing but the reference.** ``status`` reads the Job by name (and its Pod by
  the run's labels) every time; a server restarted after ``kill -9`` follows the Job it finds.
* **Watching** the Jobs and Pods labelled ``managed-by: joch`` (one thread per kind, restarted with
  backoff) only wakes the run controller (``subscribe``), at once and again a second later (its
  cache may not have the start yet); a report arriving wakes it too.
* **Cancel** leaves a marker, then deletes the Job with ``propagationPolicy: Background``: the Pod
  gets SIGTERM (the runner stops the agent and reports ``Cancelled``), then SIGKILL after its grace
  period. A Job that is gone with no final record and no Pod left is ``Cancelled`` when the marker is
  there, else ``RunnerLost``.
* **Logs** come from the Pod log API while the Pod is there (the runner echoes the agent's redacted
  output to its stdout) and from the log the runner uploaded once it has ended.
* **An API that cannot be reached** makes ``status`` answer ``Running``/``Unreachable`` (the
  controller then neither starts nor ends anything on a guess).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

import httpx2
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import CascadeType, PatchType

from joch.runtime import reports as reporting
from joch.runtime.base import (
    LOG_IDLE_SECONDS,
    ArtifactRecord,
    GitSource,
    Ref,
    Resume,
    RunId,
    RunnerPhase,
    RunnerSpec,
    RunState,
    Runtime,
    Workspace,
    is_own_ref,
)
from joch.runtime.kubernetes import jobs
from joch.runtime.kubernetes.settings import KubeSettings

logger = logging.getLogger(__name__)

TYPE = "kubernetes"
PULL_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff"})
REPORT_GRACE = 15.0  # seconds a Job that ended without its runner's final report waits for it
RENOTIFY = 1.0  # seconds after a watch event, the subscribers are woken again (_notify_again)
FATAL_WAITING = frozenset({"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
                           "CreateContainerError"})


class KubernetesRuntime(Runtime):
    type = TYPE

    def __init__(self, root: Path, settings: KubeSettings, *, client: Client | None = None,
                 report_limit: int | None = None) -> None:
        """``report_limit``: the most bytes one upload of a runner (an artifact, its log) may have."""
        if not settings.api_url:
            raise ValueError("the Kubernetes runtime needs the Joch API URL its Jobs report to (--kube-api-url)")
        self.settings = settings
        # lightkube's HTTP client logs every request at INFO: a line per status poll drowns the server's log.
        logging.getLogger("httpx2").setLevel(max(logging.WARNING, logging.getLogger("httpx2").level))
        self.reports_store = reporting.ReportStore(Path(root) / "kubernetes", limit=report_limit)
        if client is None:
            config = KubeConfig.from_file(str(settings.kubeconfig)) if settings.kubeconfig \
                else KubeConfig.from_service_account()
            client = Client(config.get(context_name=settings.context) if settings.context else config,
                            namespace=settings.namespace, field_manager="joch")
        self.client = client
        self.namespace = settings.namespace or client.namespace or "default"
        self._callbacks: list[Callable[[RunId], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._again: dict[tuple[str, int], threading.Timer] = {}

    # --- paths, as the container sees them ------------------------------------------------------------

    def workspace(self, run: RunId, git: GitSource | None, *, resume: Resume | None = None) -> Workspace:
        path = jobs.SOURCE
        if git is not None and git.path not in ("", "."):
            clean = os.path.normpath(git.path)
            if clean.startswith("..") or os.path.isabs(clean):
                raise ValueError(f'path "{git.path}" must stay inside the checkout')
            path = f"{jobs.SOURCE}/{clean}"
        return Workspace(root=jobs.SOURCE, path=path, inputs=f"{jobs.RUN_DIR}/inputs",
                         outputs=f"{jobs.RUN_DIR}/outputs", home=f"{jobs.RUN_DIR}/home")

    # --- submit ---------------------------------------------------------------------------------------

    def submit(self, spec: RunnerSpec, *, secrets: Mapping[str, str] | None = None) -> Ref:
        try:
            return self._submit(spec, secrets)
        except ApiError as exc:
            raise RuntimeError(f"the Kubernetes API refused: {exc.status.message}") from None
        except httpx2.HTTPError as exc:
            raise RuntimeError(f"cannot reach the Kubernetes API: {exc}") from None

    def _submit(self, spec: RunnerSpec, secrets: Mapping[str, str] | None) -> Ref:
        if spec.resume is not None:
            # A Job's emptyDir goes with its Pod: there is no earlier worktree to continue in.
            spec = dataclasses.replace(spec, resume=None)
        ref = self._ref(spec.run)
        values = {k: v for k, v in (secrets or {}).items() if k in spec.secret_env}
        existing = self._get(Job, ref["job"])
        if existing is not None:
            return self._adopted(ref, existing)
        secret = jobs.secret(spec, self.namespace, values)
        try:
            self.client.create(cast(Secret, Secret.from_dict(secret)))
        except ApiError as exc:
            if exc.status.code != 409:
                raise RuntimeError(f"cannot create Secret {self.namespace}/{ref['job']}: "
                                   f"{exc.status.message}") from None
            self.client.replace(cast(Secret, Secret.from_dict(secret)))
        manifest = jobs.job(spec, namespace=self.namespace, image=self.settings.image, api_url=self.settings.api_url,
                            runner=self.settings.runner, service_account=self.settings.service_account,
                            ttl_seconds=self.settings.ttl_seconds, values=values)
        try:
            created = self.client.create(cast(Job, Job.from_dict(manifest)))
        except ApiError as exc:
            if exc.status.code == 409:
                found = self._get(Job, ref["job"])
                if found is not None:
                    return self._adopted(ref, found)
            raise RuntimeError(f"cannot create Job {self.namespace}/{ref['job']}: {exc.status.message}") from None
        with contextlib.suppress(ApiError, httpx2.HTTPError):
            self.client.patch(Secret, ref["job"], {"metadata": {"ownerReferences": jobs.owned_by(created.to_dict())}},
                              namespace=self.namespace, patch_type=PatchType.MERGE)
        self._watching()
        return ref

    def _adopted(self, ref: Ref, job: Job) -> Ref:
        found = (job.metadata.labels or {}) if job.metadata else {}
        if found.get(jobs.RUN_UID) != ref["id"].rsplit("/", 1)[0]:
            raise RuntimeError(f"Job {self.namespace}/{ref['job']} exists and belongs to another run: delete it")
        self._watching()
        return ref

    def _ref(self, run: RunId) -> Ref:
        return {"type": TYPE, "id": f"{run.uid}/{run.attempt}", "job": jobs.job_name(run), "namespace": self.namespace}

    # --- status ---------------------------------------------------------------------------------------

    def status(self, ref: Ref) -> RunState:
        uid, attempt = self._id(ref)
        state = self.reports_store.state(uid, attempt)
        if state is not None and state.finished:
            if state.phase == "Cancelled" and state.reason == "Cancelled" and \
                    not self.reports_store.cancel_requested(uid, attempt):
                return self._stopped_by_cluster(ref, uid, attempt, state)
            return state
        self._watching()
        try:
            ref = self._named(ref)
            job = self._get(Job, ref["job"], ref.get("namespace")) if ref.get("job") else None
            pod = self._pod(uid, attempt, ref.get("namespace"))
        except httpx2.HTTPError as exc:
            return RunState(phase="Running", reason="Unreachable",
                            message=f"the Kubernetes API cannot be reached to see Job {ref.get('job')}: {exc}")
        ended = self._ended(ref, uid, attempt, state, job, pod)
        if ended is not None:
            return self._conclude(uid, attempt, ended, state)
        waiting = _scheduling(pod)
        current = state or RunState(phase="Preparing")
        if waiting is not None and current.phase == "Preparing":
            return dataclasses.replace(current, reason=waiting[0], message=waiting[1])
        return current

    def _ended(self, ref: Ref, uid: str, attempt: int, state: RunState | None, job: Job | None,
               pod: Pod | None) -> RunState | None:
        """How the attempt ended, as far as the cluster says (None: it has not)."""
        def end(phase: RunnerPhase, reason: str, message: str, exit_code: int | None = None) -> RunState:
            return RunState(phase=phase, reason=reason, message=message, exit_code=exit_code,
                            started_at=state.started_at if state is not None else None, finished_at=time.time(),
                            pid=state.pid if state is not None else None)

        where = f"Job {ref.get('namespace') or self.namespace}/{ref.get('job') or '(none)'}"
        container = _container(pod)
        terminated = (container.get("state") or {}).get("terminated") if container else None
        waiting = (container.get("state") or {}).get("waiting") if container else None
        gone = pod is None or _pod_finished(pod) or not _container_started(pod) or bool(terminated)
        if job is None and gone and self.reports_store.cancel_requested(uid, attempt):
            # Joch deleted the Job, and its runner was stopped (or never started) without a report.
            said = "cancelled before the agent started" if state is None or state.pid is None else \
                "cancelled; the agent's Job was deleted"
            return end("Cancelled", "Cancelled", said)
        if terminated:
            code = terminated.get("exitCode")
            if terminated.get("reason") == "OOMKilled":
                limit = _memory_limit(pod)
                return end("Failed", "OOMKilled", (
                    f"the runner's container was killed for using more memory than its limit ({limit or 'none set'}): "
                    "raise workload.resources.memory (or the Agent's resources.memory)"), code)
            return end("Lost", "RunnerLost", (
                f"the runner's container in {where} exited with code {code} ({terminated.get('reason')}) without "
                "reporting how the run ended (see joch logs; was the Joch API reachable from the Pod?)"), code)
        if waiting and pod is not None:
            reason = str(waiting.get("reason") or "")
            said = waiting.get("message") or reason
            image = _image(pod)
            if reason in FATAL_WAITING or (reason in PULL_ERRORS and self._pulling_too_long(job)):
                hint = ("fix workload.image, or give the cluster access to its registry" if reason in PULL_ERRORS
                        or "Image" in reason else "see the Pod's events")
                return end("Failed", reason, f'the Job\'s Pod cannot start image "{image}": {said}; {hint}')
        condition = _job_failed(job)
        if condition is not None:
            if condition.get("reason") == "DeadlineExceeded":
                deadline = ((job.to_dict().get("spec") or {}).get("activeDeadlineSeconds")) if job else None
                return end("Failed", "DeadlineExceeded",
                           f"{where} ran longer than its activeDeadlineSeconds ({deadline} s) and was stopped")
            if (pod is None or _pod_finished(pod)) and not _recent(condition):
                return end("Lost", "RunnerLost", (
                    f"{where} failed ({condition.get('reason')}: {condition.get('message')}) without the "
                    "runner's report"))
        if job is None and gone:
            return end("Lost", "RunnerLost", f"{where} is gone and its runner did not report how the run ended")
        complete = _job_complete(job) if job is not None else None
        if complete is not None and (pod is None or _pod_finished(pod)) and not _recent(complete):
            return end("Lost", "RunnerLost", f"{where} completed, but its runner's final report never arrived")
        return None

    def _stopped_by_cluster(self, ref: Ref, uid: str, attempt: int, state: RunState) -> RunState:
        """A runner that reports ``Cancelled`` when Joch asked nothing was stopped by Kubernetes: the
        Job's deadline (its Pod deleted), an eviction, a drained node, a ``kubectl delete``. Say which,
        once (the record is rewritten): a deadline is ``DeadlineExceeded``, anything else
        ``RunnerLost`` (retried like a lost local runner)."""
        try:
            ref = self._named(ref)
            job = self._get(Job, ref["job"], ref.get("namespace")) if ref.get("job") else None
        except httpx2.HTTPError as exc:
            return RunState(phase="Running", reason="Unreachable",
                            message=f"the Kubernetes API cannot be reached to see Job {ref.get('job')}: {exc}")
        where = f"Job {ref.get('namespace') or self.namespace}/{ref.get('job') or '(none)'}"
        condition = _job_failed(job)
        if condition is not None and condition.get("reason") == "DeadlineExceeded":
            deadline = (job.to_dict().get("spec") or {}).get("activeDeadlineSeconds") if job else None
            judged = dataclasses.replace(state, phase="Failed", reason="DeadlineExceeded", message=(
                f"{where} ran longer than its activeDeadlineSeconds ({deadline} s): Kubernetes stopped the runner"))
        else:
            judged = dataclasses.replace(state, phase="Lost", reason="RunnerLost", message=(
                f"Kubernetes stopped the runner of {where} (its Pod was deleted or evicted), not Joch: "
                f"{state.message}"))
        with self._lock:
            self.reports_store.write_state(uid, attempt, judged)
        return judged

    def _pulling_too_long(self, job: Job | None) -> bool:
        created = job.metadata.creationTimestamp if job is not None and job.metadata else None
        if created is None:
            return True
        return time.time() - created.timestamp() >= self.settings.pull_grace

    def _conclude(self, uid: str, attempt: int, ended: RunState, state: RunState | None) -> RunState:
        if state is not None:
            ended = dataclasses.replace(ended, invocation=state.invocation, base_commit=state.base_commit,
                                        sandbox=state.sandbox, session=state.session)
        with self._lock:
            again = self.reports_store.state(uid, attempt)
            if again is not None and again.finished:
                return again  # the runner's own report arrived meanwhile
            self.reports_store.write_state(uid, attempt, ended)
        return ended

    # --- cancel, cleanup ------------------------------------------------------------------------------

    def cancel(self, ref: Ref) -> None:
        uid, attempt = self._id(ref)
        state = self.reports_store.state(uid, attempt)
        if state is not None and state.finished:
            return
        self.reports_store.request_cancel(uid, attempt)
        with contextlib.suppress(httpx2.HTTPError):
            ref = self._named(ref)
        self._delete_job(ref)

    def cleanup(self, ref: Ref, *, keep_records: bool = True) -> None:
        uid, _ = self._id(ref)
        if not self.status(ref).finished:
            self.cancel(ref)
        with contextlib.suppress(httpx2.HTTPError):
            ref = self._named(ref)
        self._delete_job(ref)
        with contextlib.suppress(ApiError, httpx2.HTTPError):
            if ref.get("job"):
                self.client.delete(Secret, ref["job"], namespace=ref.get("namespace") or self.namespace)
        if not keep_records:
            self.reports_store.remove(uid)

    def _delete_job(self, ref: Ref) -> None:
        if not ref.get("job"):
            return
        try:
            self.client.delete(Job, ref["job"], namespace=ref.get("namespace") or self.namespace,
                               cascade=CascadeType.BACKGROUND)
        except ApiError as exc:
            if exc.status.code != 404:
                raise RuntimeError(f"cannot delete Job {ref['job']}: {exc.status.message}") from None
        except httpx2.HTTPError as exc:
            logger.warning("kubernetes runtime: could not delete Job %s: %s", ref.get("job"), exc)

    # --- logs and artifacts ---------------------------------------------------------------------------

    def logs(self, ref: Ref, *, follow: bool = False, offset: int = 0) -> Iterator[bytes]:
        uid, attempt = self._id(ref)
        position = 0
        while True:
            finished = self.status(ref).finished
            uploaded = self.reports_store.log(uid, attempt)
            if finished and uploaded.exists():
                with open(uploaded, "rb") as log:
                    log.seek(max(position, offset))
                    while chunk := log.read(65536):
                        yield chunk
                return
            pod = None
            with contextlib.suppress(httpx2.HTTPError):
                pod = self._pod(uid, attempt, ref.get("namespace"))
            started = pod is not None and _container_started(pod)
            if started and pod is not None:
                for chunk in self._pod_log(pod, follow=follow and not finished):
                    if position + len(chunk) > offset:
                        yield chunk[max(0, offset - position):]
                    position += len(chunk)
                if not follow:
                    return
            elif not follow or finished:
                return
            else:
                yield b""
                self._stop.wait(LOG_IDLE_SECONDS / 2)

    def _pod_log(self, pod: Pod, *, follow: bool) -> Iterator[bytes]:
        name, namespace = str(pod.metadata.name), pod.metadata.namespace  # type: ignore[union-attr]
        if not follow:
            with contextlib.suppress(ApiError, httpx2.HTTPError):
                yield "".join(self.client.log(name, namespace=namespace)).encode()
            return
        lines: queue.Queue[bytes | None] = queue.Queue()

        def read() -> None:
            try:
                for line in self.client.log(name, namespace=namespace, follow=True):
                    lines.put(line.encode())
            except (ApiError, httpx2.HTTPError):
                pass
            finally:
                lines.put(None)

        threading.Thread(target=read, name=f"joch-pod-log-{name}", daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=LOG_IDLE_SECONDS)
            except queue.Empty:
                yield b""  # the reader may have gone (see Runtime.logs)
                continue
            if line is None:
                return
            yield line

    def open_artifact(self, ref: Ref, name: str) -> tuple[ArtifactRecord, BinaryIO]:
        uid, attempt = self._id(ref)
        return self.reports_store.open_artifact(uid, attempt, name)

    # --- reports and watching -------------------------------------------------------------------------

    def reports(self) -> Any:
        return self.reports_store, self._reported

    def _reported(self, run: RunId) -> None:
        self._notify(run)

    def subscribe(self, callback: Callable[[RunId], None]) -> None:
        with self._lock:
            self._callbacks.append(callback)
        self._watching()

    def _notify_again(self, run: RunId) -> None:
        """Wake the subscribers once more ``RENOTIFY`` seconds after a watch event: an event that
        arrives while the controller still writes the start (its cache a step behind) is otherwise
        spent on the stale run, and a Pod that then waits (Unschedulable) sends no other."""
        key = (run.uid, run.attempt)
        with self._lock:
            if key in self._again or self._stop.is_set():
                return

            def fire() -> None:
                with self._lock:
                    self._again.pop(key, None)
                self._notify(run)

            timer = self._again[key] = threading.Timer(RENOTIFY, fire)
            timer.daemon = True
        timer.start()

    def _notify(self, run: RunId) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(run)
            except Exception:  # one subscriber's bug must not stop the others
                logger.exception("kubernetes runtime: a subscriber failed for run %s/%s", run.uid, run.attempt)

    def _watching(self) -> None:
        with self._lock:
            if self._threads or self._stop.is_set():
                return
            for kind in (Job, Pod):
                thread = threading.Thread(target=self._watch, args=(kind,), name=f"joch-kube-watch-{kind.__name__}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()

    def _watch(self, kind: Any) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                for _, obj in self.client.watch(kind, namespace=self.namespace, labels={jobs.MANAGED_BY: "joch"}):
                    delay = 0.5
                    if self._stop.is_set():
                        return
                    run = jobs.run_of(obj.to_dict())
                    if run is not None:
                        self._notify(run)
                        self._notify_again(run)
            except (ApiError, httpx2.HTTPError) as exc:
                logger.info("kubernetes runtime: watching %s: %s; watching again", kind.__name__, exc)
            except Exception:
                logger.exception("kubernetes runtime: watching %s failed; watching again", kind.__name__)
            self._stop.wait(delay)
            delay = min(10.0, delay * 2)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            timers = list(self._again.values())
            self._again.clear()
        for timer in timers:
            timer.cancel()

    # --- helpers --------------------------------------------------------------------------------------

    def _id(self, ref: Ref) -> tuple[str, int]:
        if ref.get("type") != TYPE:
            raise ValueError(f"not a kubernetes runtime reference: {ref!r}")
        uid, _, attempt = str(ref.get("id", "")).rpartition("/")
        if not uid or not attempt.isdigit() or not is_own_ref(ref, uid):
            raise ValueError(f"malformed kubernetes runtime reference id: {ref.get('id')!r}")
        return uid, int(attempt)

    def _named(self, ref: Ref) -> Ref:
        """``ref`` with its Job's name: a reference the controller made itself (a pending start's,
        an earlier attempt's) has only the run's uid and the attempt, so the Job (or, before it
        exists, the Secret) is found by their labels."""
        if isinstance(ref.get("job"), str):
            return ref
        uid, attempt = self._id(ref)
        namespace = ref.get("namespace") or self.namespace
        labels: dict[str, Any] = {jobs.RUN_UID: uid, jobs.ATTEMPT: str(attempt)}
        kinds: tuple[Any, ...] = (Job, Secret)
        for kind in kinds:
            for found in self.client.list(kind, namespace=namespace, labels=labels):
                name = (found.to_dict().get("metadata") or {}).get("name")
                if name:
                    return {**ref, "job": name, "namespace": namespace}
        return {**ref, "job": None, "namespace": namespace}

    def _get(self, kind: Any, name: str, namespace: str | None = None) -> Any:
        try:
            return self.client.get(kind, name, namespace=namespace or self.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    def _pod(self, uid: str, attempt: int, namespace: str | None) -> Pod | None:
        pods = list(self.client.list(Pod, namespace=namespace or self.namespace,
                                     labels={jobs.RUN_UID: uid, jobs.ATTEMPT: str(attempt)}))
        pods.sort(key=lambda p: p.metadata.creationTimestamp.timestamp() if p.metadata and
                  p.metadata.creationTimestamp else 0)
        return pods[-1] if pods else None


def _container(pod: Pod | None) -> dict[str, Any] | None:
    if pod is None or pod.status is None:
        return None
    for status in pod.status.containerStatuses or []:
        if status.name == jobs.CONTAINER:
            return dict(status.to_dict())
    return None


def _container_started(pod: Pod) -> bool:
    container = _container(pod)
    state = (container or {}).get("state") or {}
    return bool(state.get("running") or state.get("terminated"))


def _pod_finished(pod: Pod) -> bool:
    return pod.status is not None and pod.status.phase in ("Succeeded", "Failed")


def _scheduling(pod: Pod | None) -> tuple[str, str] | None:
    """Why the Pod is not running yet, when a person can act on it: (reason, message)."""
    if pod is None or pod.status is None:
        return None
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
            return ("Unschedulable", f"the Job's Pod cannot be scheduled: {condition.message}; lower "
                                     "workload.resources or add capacity to the cluster")
    container = _container(pod)
    waiting = ((container or {}).get("state") or {}).get("waiting")
    if waiting and waiting.get("reason") in PULL_ERRORS:
        return (str(waiting["reason"]), f'pulling image "{_image(pod)}": {waiting.get("message")}')
    return None


def _job_failed(job: Job | None) -> dict[str, Any] | None:
    for condition in ((job.to_dict().get("status") or {}).get("conditions") or []) if job is not None else []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            return dict(condition)
    return None


def _job_complete(job: Job) -> dict[str, Any] | None:
    for condition in (job.to_dict().get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Complete" and condition.get("status") == "True":
            return dict(condition)
    return None


def _recent(condition: Mapping[str, Any]) -> bool:
    """Whether the Job's end is newer than ``REPORT_GRACE``: its runner, stopped with its Pod, may
    still be sending its report (the Pod object can be gone before its processes are)."""
    moment = condition.get("lastTransitionTime")
    if moment is None:
        return False
    when = moment.timestamp() if hasattr(moment, "timestamp") else _parse_time(str(moment))
    return when is not None and time.time() - when < REPORT_GRACE


def _parse_time(text: str) -> float | None:
    import datetime as dt
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _image(pod: Pod) -> str:
    containers = pod.spec.containers if pod.spec is not None else []
    return str(containers[0].image) if containers else ""


def _memory_limit(pod: Pod | None) -> str | None:
    if pod is None or pod.spec is None or not pod.spec.containers:
        return None
    resources = pod.spec.containers[0].resources
    return str((resources.limits or {}).get("memory")) if resources is not None and resources.limits else None
