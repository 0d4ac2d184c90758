"""The Pod log route of the stand-in cluster: ``GET /api/v1/namespaces/{ns}/pods/{name}/log``
(``follow``, ``tailLines``), as kube-apiserver serves it from the kubelet.

``support.kubelet`` writes each Pod's container output to ``<cluster data dir>/pod-logs/<ns>/<name>``;
this module, imported in the stand-in's process (by ``support.kubekinds.workloads``), adds the route
to every app ``joch server`` builds there and reads those files. Following ends when the Pod has
finished (phase Succeeded or Failed) or is gone, as the kubelet's stream does."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query
from starlette.responses import Response, StreamingResponse

from joch.api import errors

POLL = 0.1


def logs_dir(data_dir: Path) -> Path:
    return data_dir / "pod-logs"


def _data_dir() -> Path:
    args = sys.argv
    for i, arg in enumerate(args):
        if arg == "--data-dir" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--data-dir="):
            return Path(arg.split("=", 1)[1])
    return Path(".joch")


def install() -> None:
    import joch.server.app as app_module
    import joch.server.serving as serving

    original = app_module.create_app
    if getattr(original, "_with_pod_logs", False):
        return

    def create_app(store: Any, **kwargs: Any) -> FastAPI:
        app = original(store, **kwargs)
        _route(app, store, logs_dir(_data_dir()))
        return app

    create_app._with_pod_logs = True  # type: ignore[attr-defined]
    app_module.create_app = create_app  # type: ignore[assignment]
    serving.create_app = create_app  # type: ignore[assignment]


def _route(app: FastAPI, store: Any, root: Path) -> None:
    from support.kubekinds.workloads import POD

    def finished(namespace: str, name: str) -> bool:
        try:
            pod = store.get(POD, namespace, name)
        except errors.NotFound:
            return True
        return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")

    def pod_log(namespace: str, name: str, follow: bool = Query(False),
                tailLines: int | None = Query(None)) -> Response:
        try:
            store.get(POD, namespace, name)
        except errors.NotFound:
            raise errors.NotFound(f'pods "{name}" not found', kind="pods", name=name) from None
        path = root / namespace / name
        if not follow:
            data = path.read_bytes() if path.exists() else b""
            if tailLines is not None:
                data = b"".join(data.splitlines(keepends=True)[-tailLines:]) if tailLines > 0 else b""
            return Response(data, media_type="text/plain")

        def stream() -> Iterator[bytes]:
            position = 0
            while True:
                done = finished(namespace, name)
                try:
                    with open(path, "rb") as log:
                        log.seek(position)
                        while chunk := log.read(65536):
                            position += len(chunk)
                            yield chunk
                except FileNotFoundError:
                    pass
                if done:
                    return
                time.sleep(POLL)

        return StreamingResponse(stream(), media_type="text/plain")

    app.add_api_route("/api/v1/namespaces/{namespace}/pods/{name}/log", pod_log, methods=["GET"],
                      tags=["v1"], summary="read the log of a Pod")
