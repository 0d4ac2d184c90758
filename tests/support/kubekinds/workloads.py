"""``batch/v1`` Jobs, ``v1`` Pods and ``v1`` Secrets for the stand-in cluster (``support.kubecluster``),
as far as the Kubernetes Job runtime and the Kubernetes store (its shared keys) use them.

Their bodies are open (any field the Kubernetes schema has is kept as written): the stand-in stores
and serves them, and ``support.kubelet`` plays the Job controller and the kubelet on them. A Secret
keeps its ``data`` top-level as Kubernetes has it. Importing this module also adds the Pod log route
(``GET /api/v1/namespaces/{ns}/pods/{name}/log``), served from the files ``support.kubelet`` writes
(see ``support.kubelogs``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from joch.api.registry import Column, KindInfo, register


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class SecretBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    data: dict[str, Any] | None = None
    stringData: dict[str, Any] | None = None
    type: str | None = None


AGE = Column("AGE", "metadata.creationTimestamp")

JOB = register(KindInfo(
    group="batch", version="v1", kind="Job", plural="jobs", spec_model=Open, status_model=Open,
    categories=("all",), columns=(Column("STATUS", "status.conditions[-1].type"), AGE)))
POD = register(KindInfo(
    group="", version="v1", kind="Pod", plural="pods", spec_model=Open, status_model=Open, short_names=("po",),
    categories=("all",), columns=(Column("STATUS", "status.phase"), AGE), initial_phase="Pending"))
SECRET = register(KindInfo(
    group="", version="v1", kind="Secret", plural="secrets", spec_model=SecretBody, status_model=None,
    body="top", categories=(), history="latest", columns=(AGE,)))

from support import kubelogs  # noqa: E402 - the route module patches the app factory once the kinds exist

kubelogs.install()
