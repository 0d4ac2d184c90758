"""Several runtimes behind one: ``Runtimes`` hands each call to the runtime the attempt belongs to.

The controllers and the server hold one ``Runtime``. A server with the Kubernetes runtime as well as
the local one gives them a ``Runtimes``: a new attempt goes where its ``RunnerSpec.placement.type``
says (``for_type``), and everything later (status, cancel, logs, artifacts, cleanup) where its
reference's ``type`` says, so runs started on either keep being followed after a restart. Its own
``type`` is the first runtime's (the default one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

from joch.runtime.base import ArtifactRecord, GitSource, Ref, Resume, RunId, RunnerSpec, RunState, Runtime, Workspace


class Runtimes(Runtime):
    def __init__(self, default: Runtime, *others: Runtime) -> None:
        self.runtimes = {r.type: r for r in (default, *others)}
        self.default = default
        self.type = default.type

    def for_type(self, type: str) -> Runtime | None:
        return self.runtimes.get(type)

    def _of(self, ref: Ref) -> Runtime:
        kind = ref.get("type")
        runtime = self.runtimes.get(str(kind)) if kind else self.default
        if runtime is None:
            raise ValueError(f"no {kind} runtime here for the reference {ref.get('id')!r}")
        return runtime

    def workspace(self, run: RunId, git: GitSource | None, *, resume: Resume | None = None) -> Workspace:
        return self.default.workspace(run, git, resume=resume)

    def submit(self, spec: RunnerSpec, *, secrets: Mapping[str, str] | None = None) -> Ref:
        runtime = self.for_type(spec.placement.type)
        if runtime is None:
            raise ValueError(f"no {spec.placement.type} runtime here")
        return runtime.submit(spec, secrets=secrets)

    def status(self, ref: Ref) -> RunState:
        return self._of(ref).status(ref)

    def cancel(self, ref: Ref) -> None:
        self._of(ref).cancel(ref)

    def logs(self, ref: Ref, *, follow: bool = False, offset: int = 0) -> Iterator[bytes]:
        return self._of(ref).logs(ref, follow=follow, offset=offset)

    def open_artifact(self, ref: Ref, name: str) -> tuple[ArtifactRecord, BinaryIO]:
        return self._of(ref).open_artifact(ref, name)

    def cleanup(self, ref: Ref, *, keep_records: bool = True) -> None:
        self._of(ref).cleanup(ref, keep_records=keep_records)

    def subscribe(self, callback: Callable[[RunId], None]) -> None:
        for runtime in self.runtimes.values():
            runtime.subscribe(callback)

    def storage_problem(self) -> str | None:
        return next((p for r in self.runtimes.values() if (p := r.storage_problem()) is not None), None)

    def reports(self) -> Any:
        return next((p for r in self.runtimes.values() if (p := r.reports()) is not None), None)

    def close(self) -> None:
        for runtime in self.runtimes.values():
            runtime.close()
