"""Core ``v1`` Secret, as a cluster serves it (``/api/v1/namespaces/{ns}/secrets``): where the
Kubernetes store keeps its shared keys (``KubernetesStore.shared_key``). Only the shape the tests
need: ``type``, ``data`` (base64 values) and ``stringData`` as top-level fields. Registered once:
another stand-in module that declares v1 Secrets too (the Job runtime's) is left to do it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from joch.api.registry import REGISTRY, KindInfo, register


class SecretFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str | None = None
    data: dict[str, str] | None = None
    stringData: dict[str, str] | None = None
    immutable: bool | None = None


if not any(kind.api_version == "v1" and kind.kind == "Secret" for kind in REGISTRY):
    SECRET = register(KindInfo(group="", version="v1", kind="Secret", plural="secrets", spec_model=SecretFields,
                               status_model=None, body="top", categories=()))
