"""A runner's record, artifacts and log sent to the Joch API, for runtimes whose runner runs where
the server cannot read its files (the Kubernetes runtime's Job container).

Routes (``joch.server.runreports``; every one authenticated by the attempt's run token, like the
usage callback, and only while the attempt is the run's current one and it is Running)::

    PUT /v1/namespaces/{ns}/agentruns/{name}/attempts/{n}/artifacts/{artifact}   the bytes
    PUT /v1/namespaces/{ns}/agentruns/{name}/attempts/{n}/log                    the whole log
    PUT /v1/namespaces/{ns}/agentruns/{name}/attempts/{n}/record                 state.json's body

* **Runner side** (``Reporter``, standard library only: it loads in every run): with ``--report``
  the runner sends each record it writes. Records of an unfinished attempt are best effort (one
  try, a short timeout: the runtime also sees the Pod); the final one is sent after the artifacts
  (``changes.patch`` included) and the log, and retried with the same body for up to ``patience``
  seconds while the server cannot be reached or answers 5xx — a server restarting meanwhile (kill -9,
  a rollout) still gets it.
* **Server side** (``ReportStore``): below the runtime's directory, ``<uid>/<attempt>/`` holds
  ``state.json``, ``log`` and ``artifacts/<name>``, laid out like a local run directory so the
  runner's own readers (``runner.read_state``) read them. An artifact is hashed as it is received;
  a final record is accepted only when every artifact it lists arrived with the sha256 and size it
  names (422 otherwise), so a run never ends Succeeded with an artifact that cannot be served, and
  a record is refused once a finished one is there (an attempt ends once).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from joch.runtime.base import ArtifactRecord, RunId, RunState

RECORD = "state.json"
LOG = "log"
ARTIFACTS = "artifacts"
CANCEL = "cancel-requested"
REPORT_PATIENCE = 300.0  # how long the runner keeps trying to deliver its final record
_TIMEOUT = 30.0          # one request of the final report (artifacts can be large)
_PROGRESS_TIMEOUT = 3.0  # one request of a record while the run goes on: it must not hold the run up


class ReportRefused(Exception):
    """What a report cannot be (``field`` names the part at fault: the fix is in the message)."""


def attempt_url(api_url: str, run: RunId) -> str:
    quote = urllib.parse.quote
    return (f"{api_url.rstrip('/')}/v1/namespaces/{quote(run.namespace, safe='')}/agentruns/"
            f"{quote(run.name, safe='')}/attempts/{run.attempt}")


# --- runner side -----------------------------------------------------------------------------------

class Reporter:
    def __init__(self, api_url: str, run: RunId, token: str | None, *, patience: float = REPORT_PATIENCE) -> None:
        self.base = attempt_url(api_url, run)
        self.token = token
        self.patience = patience

    def report(self, run_dir: Path, record: bytes, *, finished: bool, artifacts: Iterable[ArtifactRecord] = ()
               ) -> str | None:
        """Send one record (and, for the final one, the artifacts and log first); why it was not
        delivered, or None."""
        if not self.token:
            return "no run token (JOCH_RUN_TOKEN) to report with"
        patience = self.patience if finished else 0.0
        if finished:
            for artifact in artifacts:
                failed = self._put_file(f"/artifacts/{urllib.parse.quote(artifact.name, safe='')}",
                                        run_dir / ARTIFACTS / artifact.path, patience)
                if failed:
                    return f"artifact {artifact.name}: {failed}"
            failed = self._put_file("/log", run_dir / LOG, patience)
            if failed:
                return f"log: {failed}"
        return self._put("/record", record, "application/json", patience,
                         timeout=_TIMEOUT if finished else _PROGRESS_TIMEOUT)

    def _put_file(self, path: str, source: Path, patience: float) -> str | None:
        try:
            data = source.read_bytes()
        except FileNotFoundError:
            data = b""
        return self._put(path, data, "application/octet-stream", patience)

    def _put(self, path: str, body: bytes, content_type: str, patience: float, *,
             timeout: float = _TIMEOUT) -> str | None:
        import urllib.error  # here, not at the top: the runner's start-up time is every run's latency
        import urllib.request
        until = time.monotonic() + patience
        delay = 0.2
        while True:
            request = urllib.request.Request(self.base + path, data=body, method="PUT", headers={  # noqa: S310
                "Content-Type": content_type, "Authorization": f"Bearer {self.token}"})
            try:
                with urllib.request.urlopen(request, timeout=timeout):  # noqa: S310 - http(s) from --api-url
                    return None
            except urllib.error.HTTPError as exc:
                failure = f"{exc.code}: {_message(exc)}"
                if exc.code != 429 and exc.code < 500:
                    return failure
            except (urllib.error.URLError, OSError, ValueError) as exc:
                failure = str(getattr(exc, "reason", None) or exc)
            if time.monotonic() + delay > until:
                return failure
            time.sleep(delay)
            delay = min(5.0, delay * 2)


def _message(exc: Any) -> str:
    with contextlib.suppress(Exception):
        return str(json.loads(exc.read()).get("message"))
    return str(exc.reason)


# --- server side -----------------------------------------------------------------------------------

class ReportStore:
    """``limit``: the most bytes one upload (an artifact, the log) may have (None: no limit); the
    runner holds artifacts and the log to the server's ``--max-artifact-bytes``/``--max-log-bytes``
    already, so only a runner that does not (or an agent holding the token) meets it."""

    def __init__(self, root: Path, *, limit: int | None = None) -> None:
        self.root = Path(root)
        self.limit = limit

    def dir(self, uid: str, attempt: int) -> Path:
        if not uid or "/" in uid or uid in (".", "..") or attempt < 1:
            raise ValueError(f"not a run attempt: {uid!r}/{attempt!r}")
        return self.root / uid / str(attempt)

    def state(self, uid: str, attempt: int) -> RunState | None:
        from joch.runtime import runner
        try:
            return runner.read_state(self.dir(uid, attempt) / RECORD)
        except (ValueError, TypeError, KeyError):
            return None

    def put_artifact(self, uid: str, attempt: int, name: str, data: bytes | BinaryIO) -> ArtifactRecord:
        """Keep an artifact (``data``: its bytes, or a file to copy them from), hashed as written."""
        _check_name(name, "artifact name")
        self._open_for_writes(uid, attempt)
        target = self.dir(uid, attempt) / ARTIFACTS / name
        target.parent.mkdir(parents=True, exist_ok=True)
        digest, size = _copy(target, data)
        return ArtifactRecord(name=name, path=name, sha256=digest, size=size)

    def put_log(self, uid: str, attempt: int, data: bytes | BinaryIO) -> None:
        self._open_for_writes(uid, attempt)
        self.dir(uid, attempt).mkdir(parents=True, exist_ok=True)
        _copy(self.dir(uid, attempt) / LOG, data)

    def put_record(self, uid: str, attempt: int, body: bytes) -> RunState:
        """Keep a runner's record; ``ReportRefused`` when it is not one, or lists an artifact that
        did not arrive as it says."""
        from joch.runtime import runner
        self._open_for_writes(uid, attempt)
        directory = self.dir(uid, attempt)
        directory.mkdir(parents=True, exist_ok=True)
        try:
            record = json.loads(body)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            probe = directory / ".record.check"
            _write(probe, json.dumps(record).encode())
            state = runner.read_state(probe)
            probe.unlink()
        except (ValueError, TypeError, KeyError) as exc:
            raise ReportRefused(f"record: not a runner record ({exc})") from None
        if state is None or state.phase not in ("Preparing", "Running", "Succeeded", "Failed", "Cancelled"):
            raise ReportRefused("record.phase: must be Preparing, Running, Succeeded, Failed or Cancelled")
        for artifact in state.artifacts if state.finished else ():
            _check_name(artifact.name, "record.artifacts")
            stored = directory / ARTIFACTS / artifact.name
            if artifact.path != artifact.name:
                state = _renamed(state, artifact)
            digest = _sha256(stored)
            if digest is None or digest != artifact.sha256 or stored.stat().st_size != artifact.size:
                raise ReportRefused(f"record.artifacts: {artifact.name} (sha256 {artifact.sha256}, {artifact.size} "
                                    "bytes) was not uploaded as listed: PUT it to .../artifacts/"
                                    f"{artifact.name} before the final record")
        from dataclasses import asdict
        _write(directory / RECORD, json.dumps({**record, **asdict(state)}, sort_keys=True).encode())
        return state

    def write_state(self, uid: str, attempt: int, state: RunState) -> None:
        """An ending the runtime decided (the runner could not report one): kept like a runner's."""
        from dataclasses import asdict
        directory = self.dir(uid, attempt)
        directory.mkdir(parents=True, exist_ok=True)
        _write(directory / RECORD, json.dumps(asdict(state), sort_keys=True).encode())

    def _open_for_writes(self, uid: str, attempt: int) -> None:
        current = self.state(uid, attempt)
        if current is not None and current.finished:
            raise ReportRefused(f"attempt {attempt} has ended already ({current.phase}); its record is final")

    def open_artifact(self, uid: str, attempt: int, name: str) -> tuple[ArtifactRecord, BinaryIO]:
        state = self.state(uid, attempt)
        for record in state.artifacts if state is not None else ():
            if record.name == name and record.path == name and "/" not in name and name not in (".", ".."):
                return record, open(self.dir(uid, attempt) / ARTIFACTS / record.path, "rb")  # the caller closes it
        raise KeyError(f"run {uid}/{attempt} has no artifact {name!r}")

    def log(self, uid: str, attempt: int) -> Path:
        return self.dir(uid, attempt) / LOG

    def request_cancel(self, uid: str, attempt: int) -> None:
        directory = self.dir(uid, attempt)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CANCEL).touch()

    def cancel_requested(self, uid: str, attempt: int) -> bool:
        return (self.dir(uid, attempt) / CANCEL).exists()

    def remove(self, uid: str, attempt: int | None = None) -> None:
        target = self.root / uid if attempt is None else self.dir(uid, attempt)
        if attempt is None and (not uid or "/" in uid or uid in (".", "..")):
            return
        shutil.rmtree(target, ignore_errors=True)


NAME_MAX = 200  # bytes of an artifact's file name (a file system holds 255; the spool adds a prefix)


def _check_name(name: object, field: str) -> None:
    """An artifact's name is one plain file name in its attempt's directory: never a path out of it
    (``../`` would let a record claim another run's file), nor what the file system cannot hold."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\x00" in name or len(name.encode("utf-8", "surrogatepass")) > NAME_MAX):
        raise ReportRefused(f"{field}: {name!r} is not an artifact name: use a plain file name "
                            f"(no / or NUL, at most {NAME_MAX} bytes)")


def _renamed(state: RunState, artifact: ArtifactRecord) -> RunState:
    import dataclasses
    artifacts = tuple(dataclasses.replace(a, path=a.name) if a is artifact else a for a in state.artifacts)
    return dataclasses.replace(state, artifacts=artifacts)


def _sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


def _copy(path: Path, data: bytes | BinaryIO) -> tuple[str, int]:
    """Write ``data`` to ``path`` atomically; its sha256 and size."""
    digest = hashlib.sha256()
    size = 0
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as out:
        chunks = iter([data]) if isinstance(data, bytes) else iter(lambda: data.read(1 << 20), b"")
        for chunk in chunks:
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    os.replace(tmp, path)
    return digest.hexdigest(), size


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
