"""Just enough of Kubernetes' protobuf encoding to read the self-reviews kubectl sends.

kubectl (client-go's typed clients) posts ``SelfSubjectAccessReview`` and ``SelfSubjectReview`` as
``application/vnd.kubernetes.protobuf`` whatever discovery says; JSON is fine for the answer (its
``Accept`` lists it). The body is the ``k8s\\x00`` magic and a ``runtime.Unknown`` whose ``raw``
field holds the object (k8s.io/apimachinery/pkg/runtime/types_proto.go, k8s.io/api/authorization/
v1/generated.proto). Only the fields an access review needs are read; anything malformed is a 400.
"""

from __future__ import annotations

from typing import Any

from joch.api import errors

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
RESOURCE_ATTRIBUTES = {1: "namespace", 2: "verb", 3: "group", 4: "version", 5: "resource", 6: "subresource",
                       7: "name"}
NON_RESOURCE_ATTRIBUTES = {1: "path", 2: "verb"}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def entries(data: bytes) -> list[tuple[int, bytes]]:
    """Every length-delimited field of a message, repeated ones included, in order; others skipped."""
    out: list[tuple[int, bytes]] = []
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = _varint(data, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ValueError("truncated field")
            out.append((number, data[at:at + size]))
            at += size
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def fields(data: bytes) -> dict[int, bytes]:
    """The length-delimited fields of a message by number (the last of a repeated one); others skipped."""
    return dict(entries(data))


def _strings(data: bytes, names: dict[int, str]) -> dict[str, str]:
    return {names[n]: value.decode() for n, value in fields(data).items() if n in names}


def access_review(body: bytes) -> dict[str, Any]:
    """A protobuf ``SelfSubjectAccessReview`` as the JSON object it stands for."""
    try:
        if not body.startswith(MAGIC):
            raise ValueError("no k8s protobuf magic")
        raw = fields(body[len(MAGIC):]).get(2, b"")
        spec = fields(fields(raw).get(2, b""))
        out: dict[str, Any] = {}
        if 1 in spec:
            out["resourceAttributes"] = _strings(spec[1], RESOURCE_ATTRIBUTES)
        if 2 in spec:
            out["nonResourceAttributes"] = _strings(spec[2], NON_RESOURCE_ATTRIBUTES)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.BadRequest(f"the protobuf body is not a SelfSubjectAccessReview ({exc}); send it as "
                                "application/json") from None
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": out}
