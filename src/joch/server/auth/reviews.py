"""Asking the server who you are and what you may do.

* ``GET /v1/whoami``: ``{"username", "groups"[, "uid"]}`` of the caller.
* ``POST /apis/authentication.k8s.io/v1/selfsubjectreviews``: a ``SelfSubjectReview`` whose
  ``status.userInfo`` is the caller (``kubectl auth whoami``).
* ``POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews``: a ``SelfSubjectAccessReview``
  whose ``spec.resourceAttributes`` (namespace, verb, group, resource, subresource, name) or
  ``spec.nonResourceAttributes`` (path, verb) are decided by the server's authorizer for the caller;
  the answer's ``status.allowed`` and ``status.reason`` say how (``kubectl auth can-i create agents
  -n default``). Every authenticated user may ask these about themselves.

kubectl posts both as protobuf (``joch.server.auth.protobuf`` reads an access review; a subject
review's body says nothing the server needs) and reads the JSON answers. kubectl sends bearer
tokens only over HTTPS: put Joch behind a TLS-terminating proxy for kubectl with tokens.

Discovery lists both review resources (``joch.server.discovery.REVIEW_RESOURCES``), which kubectl
needs to find them.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from fastapi import Depends, FastAPI
from starlette.responses import Response

from joch.api import errors
from joch.api.identity import ANONYMOUS, UserInfo, current_user
from joch.server import wire
from joch.server.auth import protobuf, rbac, requests
from joch.server.options import ServerOptions
from joch.server.resources import ContentType

TAGS: list[str | Enum] = ["auth"]
AUTHENTICATION = "authentication.k8s.io/v1"
AUTHORIZATION = "authorization.k8s.io/v1"
ATTRIBUTES = ("namespace", "verb", "group", "resource", "subresource", "name")


def _user() -> UserInfo:
    return current_user() or ANONYMOUS


def access_review(authorizer: rbac.Authorizer, user: UserInfo, review: dict[str, Any]) -> dict[str, Any]:
    spec = review.get("spec")
    if not isinstance(spec, dict):
        raise errors.BadRequest("a SelfSubjectAccessReview needs spec.resourceAttributes or "
                                "spec.nonResourceAttributes")
    resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if (resource is None) == (non_resource is None):
        raise errors.BadRequest("a SelfSubjectAccessReview needs exactly one of spec.resourceAttributes and "
                                "spec.nonResourceAttributes")
    if resource is not None:
        given = _strings(resource, "spec.resourceAttributes", ATTRIBUTES)
        attrs = rbac.Attributes(user=user, verb=given.get("verb") or "get", resource=given.get("resource") or "",
                                api_group=given.get("group") or "", subresource=given.get("subresource") or "",
                                namespace=given.get("namespace") or "", name=given.get("name") or "")
        if not attrs.resource:
            raise errors.BadRequest("spec.resourceAttributes.resource is required (e.g. agents)")
    else:
        given = _strings(non_resource, "spec.nonResourceAttributes", ("path", "verb"))
        path = given.get("path") or "/"
        attrs = rbac.Attributes(user=user, verb=given.get("verb") or "get", path=path,
                                anyone=requests.resolve("GET", path).anyone)
    decision = authorizer.authorize(attrs)
    if not decision.allowed:
        decision = authorizer.authorize(attrs, fresh=True)
    status: dict[str, Any] = {"allowed": decision.allowed, "reason": decision.reason}
    return {"kind": "SelfSubjectAccessReview", "apiVersion": AUTHORIZATION,
            "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}


def _strings(value: Any, where: str, known: tuple[str, ...]) -> dict[str, str]:
    if not isinstance(value, dict):
        raise errors.BadRequest(f"{where} must be an object")
    out: dict[str, str] = {}
    for key, item in value.items():
        if key in known:
            if item is not None and not isinstance(item, str):
                raise errors.BadRequest(f"{where}.{key} must be a string")
            out[key] = item or ""
    return out


def install(app: FastAPI, options: ServerOptions) -> None:
    read_body = wire.body_reader(options.max_body_bytes)

    def whoami() -> Response:
        return wire.json_response(_user().to_dict())

    def self_subject_review() -> Response:
        return wire.json_response({"kind": "SelfSubjectReview", "apiVersion": AUTHENTICATION,
                                   "metadata": {"creationTimestamp": None}, "status": {"userInfo": _user().to_dict()}},
                                  status_code=201)

    def self_subject_access_review(body: bytes = Depends(read_body), content_type: ContentType = None) -> Response:
        if wire.media_type(content_type) == protobuf.MEDIA_TYPE:
            review = protobuf.access_review(body)
        else:
            review = wire.decode_object(body, content_type)
        authorizer: rbac.Authorizer = app.state.authorizer
        return wire.json_response(access_review(authorizer, _user(), review), status_code=201)

    app.add_api_route("/v1/whoami", whoami, methods=["GET"], tags=TAGS, summary="Who the caller is")
    app.add_api_route(f"/apis/{AUTHENTICATION}/selfsubjectreviews", self_subject_review, methods=["POST"], tags=TAGS,
                      status_code=201, summary="Who the caller is (kubectl auth whoami)")
    app.add_api_route(f"/apis/{AUTHORIZATION}/selfsubjectaccessreviews", self_subject_access_review,
                      methods=["POST"], tags=TAGS, status_code=201,
                      summary="Whether the caller may do something (kubectl auth can-i)")
